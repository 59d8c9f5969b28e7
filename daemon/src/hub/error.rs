//! Why a pull failed, in words a user can act on.

use std::path::PathBuf;

/// A pull that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `owner/name[@revision]` was malformed.
    #[error("`{0}` is not a hub repository name (expected OWNER/NAME or OWNER/NAME@REVISION)")]
    BadName(String),
    /// The hub could not be reached.
    #[error(
        "cannot reach the hub at {endpoint}: {cause}. No network? A mirror can be named with \
         HF_ENDPOINT; files already in the hub cache are used with HF_HUB_OFFLINE=1"
    )]
    Network {
        /// The endpoint.
        endpoint: String,
        /// What failed.
        cause: String,
    },
    /// 401/403: gated or private, and no (or the wrong) token.
    #[error(
        "{repo}: the hub refused access ({status}{code}): the repository is gated or private. \
         {token} Accept the model's terms on its page on the hub with that account first"
    )]
    Gated {
        /// The repository.
        repo: String,
        /// HTTP status.
        status: u16,
        /// `, X-Error-Code: …` when the hub said.
        code: String,
        /// What to do about the token.
        token: &'static str,
    },
    /// 404 for the repository.
    #[error(
        "{repo}: no such repository on the hub ({status}{code}); a private one needs HF_TOKEN"
    )]
    NoRepository {
        /// The repository.
        repo: String,
        /// HTTP status.
        status: u16,
        /// `, X-Error-Code: …`.
        code: String,
    },
    /// 404 for the revision.
    #[error("{repo}: no revision `{revision}` on the hub")]
    NoRevision {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
    },
    /// 404 for a file the checkpoint needs.
    #[error("{repo}@{revision}: the repository has no file `{file}` ({why})")]
    MissingFile {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The file.
        file: String,
        /// Why it is needed.
        why: String,
    },
    /// Another answer the protocol does not expect.
    #[error("{repo}: `{file}`: unexpected answer from the hub: {what}")]
    Protocol {
        /// The repository.
        repo: String,
        /// The file.
        file: String,
        /// What was wrong.
        what: String,
    },
    /// The download does not match the hub's checksum.
    #[error(
        "{file}: the download does not match the hub's {algo} ({expected}); got {found}. \
         Nothing was kept: run the pull again (a proxy rewriting downloads would cause this)"
    )]
    Checksum {
        /// The file.
        file: String,
        /// sha256 or git-sha1.
        algo: &'static str,
        /// The hub's value.
        expected: String,
        /// The download's.
        found: String,
    },
    /// The disk is full (or the quota reached).
    #[error(
        "{path}: the disk is full: {file} needs {needed} more bytes, {free} are free there. \
         Free some space or point HF_HOME (or HF_HUB_CACHE) at a larger disk; the partial \
         download is kept and resumes"
    )]
    DiskFull {
        /// Where.
        path: PathBuf,
        /// The file.
        file: String,
        /// Bytes still to write.
        needed: u64,
        /// Bytes free.
        free: u64,
    },
    /// Offline and not in the cache.
    #[error(
        "{repo}@{revision}: `{file}` is not in the hub cache ({cache}) and HF_HUB_OFFLINE is set"
    )]
    NotCached {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The file.
        file: String,
        /// The cache folder.
        cache: PathBuf,
    },
    /// The repository's config names files this version does not fetch.
    #[error("{repo}: config.json: {what}")]
    Config {
        /// The repository.
        repo: String,
        /// What is wrong.
        what: String,
    },
    /// A local file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}
