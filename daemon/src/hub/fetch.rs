//! The hub's file protocol, as Kyutai's official tools speak it
//! (`huggingface_hub.hf_hub_download`):
//!
//! 1. `HEAD {endpoint}/{repo}/resolve/{revision}/{file}` with redirects not
//!    followed (relative ones are: renamed repositories), answered with
//!    `X-Repo-Commit` (the commit the revision names), `X-Linked-Etag` and
//!    `X-Linked-Size` for large-file storage (the etag is the sha256 of the
//!    bytes) or `ETag` and `Content-Length` for a small file (the etag is its
//!    git blob id), and a `Location` to download from; errors carry
//!    `X-Error-Code` (`GatedRepo`, `RepoNotFound`, `RevisionNotFound`,
//!    `EntryNotFound`).
//! 2. `GET` of that location, with `Range: bytes=N-` to resume a partial
//!    download; the token is sent to the endpoint's host only (a redirect
//!    to a storage host carries its own signature).
//!
//! Every byte is hashed as it is written; a file whose sha256 (or git blob
//! id) differs from the hub's is deleted, never renamed into the cache.

use super::cache::RepoCache;
use super::error::HubError;
use super::progress::Progress;
use super::RepoRef;
use sha1::Digest as _;
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

/// Attempts at one download before giving up (each resumes the last).
const ATTEMPTS: u32 = 5;

/// What the hub says about one file at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// The commit the revision names.
    pub commit: String,
    /// The blob's name: sha256 (large-file storage) or git blob id.
    pub etag: String,
    /// Bytes.
    pub size: u64,
    /// Where to download it from.
    pub url: String,
}

/// A hub client: endpoint, token, one HTTP agent.
pub struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or("")
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    &url[..end]
}

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// An etag as the cache names blobs: without `W/` and quotes.
fn clean_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

enum Hasher {
    Sha256(sha2::Sha256),
    GitSha1(sha1::Sha1),
}

impl Hasher {
    fn for_etag(etag: &str, size: u64) -> Option<Hasher> {
        let hex = |n| etag.len() == n && etag.bytes().all(|b| b.is_ascii_hexdigit());
        if hex(64) {
            Some(Hasher::Sha256(sha2::Sha256::new()))
        } else if hex(40) {
            let mut h = sha1::Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            Some(Hasher::GitSha1(h))
        } else {
            None
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::GitSha1(h) => h.update(b),
        }
    }

    fn algo(&self) -> &'static str {
        match self {
            Hasher::Sha256(_) => "sha256",
            Hasher::GitSha1(_) => "git blob id",
        }
    }

    fn hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::GitSha1(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl Client {
    /// A client of `endpoint` (no trailing slash) with an optional token.
    pub fn new(endpoint: &str, token: Option<String>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(30)))
            // A stalled transfer fails (and is resumed) instead of hanging.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(format!("moshid/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn network(&self, e: ureq::Error) -> HubError {
        HubError::Network {
            endpoint: self.endpoint.clone(),
            cause: e.to_string(),
        }
    }

    fn with_auth<B>(&self, req: ureq::RequestBuilder<B>, url: &str) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) if host_of(url) == host_of(&self.endpoint) => {
                req.header("Authorization", format!("Bearer {t}"))
            }
            _ => req,
        }
    }

    /// Resolves `file` of `repo` (step 1 of the protocol). `why` says why the
    /// file is needed, for a missing-file error.
    pub fn resolve(&self, repo: &RepoRef, file: &str, why: &str) -> Result<FileMeta, HubError> {
        let mut url = format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint,
            repo.name,
            encode(&repo.revision, false),
            encode(file, true)
        );
        let protocol = |what: String| HubError::Protocol {
            repo: repo.name.clone(),
            file: file.to_string(),
            what,
        };
        let mut hops = 0;
        let resp = loop {
            let r = self
                .with_auth(self.agent.head(&url), &url)
                .header("Accept-Encoding", "identity")
                .call()
                .map_err(|e| self.network(e))?;
            let status = r.status().as_u16();
            match header(&r, "location") {
                Some(loc) if (300..400).contains(&status) && loc.starts_with('/') && hops < 5 => {
                    url = format!("{}{loc}", origin(&url));
                    hops += 1;
                }
                _ => break r,
            }
        };
        let status = resp.status().as_u16();
        let code = header(&resp, "x-error-code").unwrap_or_default();
        let code_note = if code.is_empty() {
            String::new()
        } else {
            format!(", X-Error-Code: {code}")
        };
        if !(200..400).contains(&status) {
            return Err(match (status, code.as_str()) {
                (401 | 403, "RepoNotFound") | (404, "RepoNotFound") => HubError::NoRepository {
                    repo: repo.name.clone(),
                    status,
                    code: code_note,
                },
                (401 | 403, _) => HubError::Gated {
                    repo: repo.name.clone(),
                    status,
                    code: code_note,
                    token: if self.token.is_some() {
                        "The token given (HF_TOKEN, or HF_HOME's token file) was refused: \
                         it must belong to an account granted access."
                    } else {
                        "No token was given: set HF_TOKEN to an access token of an account \
                         granted access (or log in with the official tools, whose token file \
                         under HF_HOME is read too)."
                    },
                },
                (404, "RevisionNotFound") => HubError::NoRevision {
                    repo: repo.name.clone(),
                    revision: repo.revision.clone(),
                },
                (404, _) => HubError::MissingFile {
                    repo: repo.name.clone(),
                    revision: repo.revision.clone(),
                    file: file.to_string(),
                    why: why.to_string(),
                },
                _ => protocol(format!("HTTP {status}{code_note}")),
            });
        }
        let commit = header(&resp, "x-repo-commit")
            .ok_or_else(|| protocol("no X-Repo-Commit header".into()))?;
        let etag = header(&resp, "x-linked-etag")
            .or_else(|| header(&resp, "etag"))
            .map(|e| clean_etag(&e))
            .ok_or_else(|| protocol("no ETag header".into()))?;
        let size = header(&resp, "x-linked-size")
            .or_else(|| header(&resp, "content-length"))
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| protocol("no size (X-Linked-Size / Content-Length)".into()))?;
        let url = match header(&resp, "location") {
            Some(loc) if (300..400).contains(&status) => loc,
            _ => url,
        };
        if Hasher::for_etag(&etag, size).is_none() {
            return Err(protocol(format!(
                "etag `{etag}` is neither a sha256 nor a git blob id: the file cannot be verified"
            )));
        }
        Ok(FileMeta {
            commit,
            etag,
            size,
            url,
        })
    }

    /// Downloads `meta` into `cache` (step 2), resuming a partial download,
    /// verifying it, and renaming it into `blobs/`. Returns the blob's path.
    pub fn download(
        &self,
        cache: &RepoCache,
        file: &str,
        meta: &FileMeta,
    ) -> Result<std::path::PathBuf, HubError> {
        let blob = cache.blob(&meta.etag);
        let _lock = cache.lock(&meta.etag)?;
        // Another process may have finished it while we waited for the lock.
        if blob.is_file() {
            return Ok(blob);
        }
        let mut part = Partial::open(cache.incomplete(&meta.etag), file, meta)?;
        let mut progress = Progress::start(file, meta.size, part.have);
        let mut attempt = 0;
        let mut buf = vec![0u8; 1 << 20];
        while part.have < meta.size {
            attempt += 1;
            let resp = match self.get_from(meta, part.have) {
                Ok(r) => r,
                Err(e) if attempt < ATTEMPTS => {
                    eprintln!("pull: {file}: {e}; retrying ({attempt}/{ATTEMPTS})");
                    std::thread::sleep(Duration::from_millis(500 * attempt as u64));
                    continue;
                }
                Err(e) => return Err(self.network(e)),
            };
            part.accept_answer(&resp, cache, &mut progress)?;
            let cut = part.copy_body(resp, &mut buf, &mut progress)?;
            if part.have < meta.size {
                self.cut_short(&part, cut, attempt)?;
            }
        }
        part.verify_into(&blob)?;
        progress.finish();
        Ok(blob)
    }

    /// Sends step 2's `GET`, asking for the bytes from `have` on when there
    /// is a partial download to resume.
    fn get_from(
        &self,
        meta: &FileMeta,
        have: u64,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut req = self.with_auth(self.agent.get(&meta.url), &meta.url);
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        req.call()
    }

    /// After a body that ended before the file's last byte (`cut` is the
    /// read error, if one ended it): gives up once `attempt` reaches
    /// [`ATTEMPTS`], keeping the partial file for the next pull; else logs
    /// and backs off before the caller resumes.
    fn cut_short(
        &self,
        part: &Partial<'_>,
        cut: Option<std::io::Error>,
        attempt: u32,
    ) -> Result<(), HubError> {
        let (file, have, size) = (part.file, part.have, part.meta.size);
        let why = cut.map_or("the connection closed early".to_string(), |e| e.to_string());
        if attempt >= ATTEMPTS {
            return Err(HubError::Network {
                endpoint: self.endpoint.clone(),
                cause: format!(
                    "{file}: {why} at {have} of {size} bytes, {ATTEMPTS} times; \
                     the partial download is kept and the next pull resumes it"
                ),
            });
        }
        eprintln!("pull: {file}: {why} at {have} of {size} bytes; resuming ({attempt}/{ATTEMPTS})");
        std::thread::sleep(Duration::from_millis(500 * attempt as u64));
        Ok(())
    }
}

/// An [`HubError::Io`] maker for errors on `p`, for `map_err`.
fn io_at(p: &Path) -> impl FnOnce(std::io::Error) -> HubError {
    let p = p.to_path_buf();
    move |source| HubError::Io { path: p, source }
}

/// A download in progress: the blob's `.incomplete` file in `blobs/`.
///
/// Invariant: `hasher` has seen exactly the file's first `have` bytes, so
/// the checksum covers the whole file even when the download was resumed.
struct Partial<'a> {
    out: std::fs::File,
    path: std::path::PathBuf,
    file: &'a str,
    meta: &'a FileMeta,
    have: u64,
    hasher: Hasher,
}

impl<'a> Partial<'a> {
    /// Opens (or creates) `path`, empties a partial file longer than the
    /// blob (it cannot be a prefix of it), refuses when the disk cannot
    /// hold the rest, and hashes the bytes already there.
    fn open(path: std::path::PathBuf, file: &'a str, meta: &'a FileMeta) -> Result<Self, HubError> {
        let dir = path.parent().expect("blobs/ has a parent");
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_at(&path))?;
        let mut have = out.metadata().map_err(io_at(&path))?.len();
        if have > meta.size {
            out.set_len(0).map_err(io_at(&path))?;
            have = 0;
        }
        let needed = meta.size - have;
        if let Some(free) = super::cache::free_bytes(dir) {
            if free < needed {
                return Err(HubError::DiskFull {
                    path: dir.to_path_buf(),
                    file: file.to_string(),
                    needed,
                    free,
                });
            }
        }
        let hasher = Hasher::for_etag(&meta.etag, meta.size).expect("checked by resolve");
        let mut part = Partial {
            out,
            path,
            file,
            meta,
            have,
            hasher,
        };
        part.hash_existing()?;
        Ok(part)
    }

    /// The `blobs/` folder the file is in.
    fn dir(&self) -> &Path {
        self.path.parent().expect("blobs/ has a parent")
    }

    /// A resumed download: hashes what is already there first.
    fn hash_existing(&mut self) -> Result<(), HubError> {
        if self.have == 0 {
            return Ok(());
        }
        self.out
            .seek(std::io::SeekFrom::Start(0))
            .map_err(io_at(&self.path))?;
        let mut left = self.have;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let n = (buf.len() as u64).min(left) as usize;
            self.out
                .read_exact(&mut buf[..n])
                .map_err(io_at(&self.path))?;
            self.hasher.update(&buf[..n]);
            left -= n as u64;
        }
        Ok(())
    }

    /// Checks a `GET`'s status: a 206 must start at `have`; a 200 to a
    /// ranged request means the server ignored the range, so the file
    /// starts over; anything else is an error.
    fn accept_answer(
        &mut self,
        resp: &ureq::http::Response<ureq::Body>,
        cache: &RepoCache,
        progress: &mut Progress,
    ) -> Result<(), HubError> {
        let have = self.have;
        let status = resp.status().as_u16();
        match status {
            206 => {
                let start = header(resp, "content-range").and_then(|c| {
                    c.strip_prefix("bytes ")?
                        .split('-')
                        .next()?
                        .parse::<u64>()
                        .ok()
                });
                if start != Some(have) {
                    return Err(HubError::Protocol {
                        repo: cache.folder.clone(),
                        file: self.file.to_string(),
                        what: format!("asked for bytes {have}-, got Content-Range {start:?}"),
                    });
                }
            }
            200 => {
                if have > 0 {
                    // The server ignored the range: start over.
                    self.out.set_len(0).map_err(io_at(&self.path))?;
                    self.have = 0;
                    self.hasher = Hasher::for_etag(&self.meta.etag, self.meta.size)
                        .expect("checked by resolve");
                    progress.restart(0);
                }
            }
            _ => {
                return Err(HubError::Protocol {
                    repo: cache.folder.clone(),
                    file: self.file.to_string(),
                    what: format!("download answered HTTP {status}"),
                })
            }
        }
        Ok(())
    }

    /// Writes the body at `have`, hashing as it goes, until the body ends
    /// or the file is complete (extra bytes are dropped). Returns the read
    /// error that cut the body short, if one did: the caller resumes; a
    /// write error is returned as the error, since retrying cannot help.
    fn copy_body(
        &mut self,
        resp: ureq::http::Response<ureq::Body>,
        buf: &mut [u8],
        progress: &mut Progress,
    ) -> Result<Option<std::io::Error>, HubError> {
        let size = self.meta.size;
        self.out
            .seek(std::io::SeekFrom::Start(self.have))
            .map_err(io_at(&self.path))?;
        let mut body = resp.into_body().into_reader();
        let cut = loop {
            let n = match body.read(buf) {
                Ok(0) => break None,
                Ok(n) => n.min((size - self.have) as usize),
                Err(e) => break Some(e),
            };
            if n == 0 {
                break None;
            }
            if let Err(e) = self.out.write_all(&buf[..n]) {
                return Err(self.write_error(e));
            }
            self.hasher.update(&buf[..n]);
            self.have += n as u64;
            progress.advance(n as u64);
            if self.have == size {
                break None;
            }
        };
        Ok(cut)
    }

    /// The error for a failed write: a full disk (with what is still
    /// needed and what is free) or plain I/O.
    fn write_error(&mut self, e: std::io::Error) -> HubError {
        if is_disk_full(&e) {
            let _ = self.out.flush();
            let dir = self.dir();
            return HubError::DiskFull {
                path: dir.to_path_buf(),
                file: self.file.to_string(),
                needed: self.meta.size - self.have,
                free: super::cache::free_bytes(dir).unwrap_or(0),
            };
        }
        HubError::Io {
            path: self.path.clone(),
            source: e,
        }
    }

    /// Syncs the complete file, then renames it to `blob` if its hash is
    /// the hub's etag; a file that does not match is deleted.
    fn verify_into(self, blob: &Path) -> Result<(), HubError> {
        let Partial {
            out,
            path,
            file,
            meta,
            hasher,
            ..
        } = self;
        out.sync_all().map_err(io_at(&path))?;
        drop(out);
        let algo = hasher.algo();
        let found = hasher.hex();
        if found != meta.etag {
            let _ = std::fs::remove_file(&path);
            return Err(HubError::Checksum {
                file: file.to_string(),
                algo,
                expected: meta.etag.clone(),
                found,
            });
        }
        std::fs::rename(&path, blob).map_err(io_at(blob))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_hashes() {
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("a b/c.json", true), "a%20b/c.json");
        assert_eq!(host_of("http://127.0.0.1:8/x/y"), "127.0.0.1:8");
        assert_eq!(origin("http://127.0.0.1:8/x/y"), "http://127.0.0.1:8");
        assert_eq!(clean_etag("W/\"abc\""), "abc");
        // git's blob id of "hello\n" (`git hash-object`).
        let mut h = Hasher::for_etag("ce013625030ba8dba906f756967f9e9ca394464a", 6).unwrap();
        h.update(b"hello\n");
        assert_eq!(h.hex(), "ce013625030ba8dba906f756967f9e9ca394464a");
        let mut h = Hasher::for_etag(&"0".repeat(64), 0).unwrap();
        h.update(b"abc");
        assert_eq!(
            h.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(Hasher::for_etag("xyz", 1).is_none());
    }
}
