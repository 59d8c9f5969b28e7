//! The Hugging Face hub cache, laid out exactly as Kyutai's official tools
//! (`huggingface_hub`) lay it out, so each reuses what the other fetched:
//!
//! ```text
//! $HF_HUB_CACHE (default $HF_HOME/hub, $HF_HOME default ~/.cache/huggingface)
//!   models--OWNER--NAME/
//!     blobs/ETAG                      the files' bytes, named by their etag
//!     blobs/ETAG.incomplete           a download in progress (resumed from its length)
//!     snapshots/COMMIT/PATH           relative symlinks to ../../blobs/ETAG
//!     refs/REVISION                   the commit a branch or tag pointed to
//!   .locks/models--OWNER--NAME/ETAG.lock   flock(2)ed while a blob is written
//! ```
//!
//! For a file in the hub's large-file storage the etag is the sha256 of
//! its bytes; for a small file, its git blob id.
//!
//! Invariants: a blob appears under its final name only once complete and
//! verified (renamed from `.incomplete`); a snapshot entry is made only
//! after its blob; the lock is `flock`, as Python's `filelock` takes it on
//! Linux, so the two tools never write the same blob at once.

use super::error::HubError;
use std::fs::File;
use std::path::{Path, PathBuf};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    /// `$HF_HUB_CACHE`.
    pub root: PathBuf,
    /// `models--OWNER--NAME`.
    pub folder: String,
}

impl RepoCache {
    /// The folder of model repository `repo` (`OWNER/NAME`) under `root`.
    pub fn new(root: &Path, repo: &str) -> Self {
        RepoCache {
            root: root.to_path_buf(),
            folder: format!("models--{}", repo.replace('/', "--")),
        }
    }

    /// `models--OWNER--NAME/`.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.folder)
    }

    /// `blobs/ETAG`.
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir().join("blobs").join(etag)
    }

    /// `blobs/ETAG.incomplete`.
    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir().join("blobs").join(format!("{etag}.incomplete"))
    }

    /// `snapshots/COMMIT/`.
    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir().join("snapshots").join(commit)
    }

    /// The commit `revision` names: itself for a full commit hash, else the
    /// one recorded in `refs/REVISION`.
    pub fn commit_for(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.dir().join("refs").join(revision)).ok()?;
        let c = text.trim();
        is_commit(c).then(|| c.to_string())
    }

    /// Records `refs/REVISION = COMMIT` (not for a revision that is the commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let p = self.dir().join("refs").join(revision);
        std::fs::create_dir_all(p.parent().expect("refs/ has a parent")).map_err(io(&p))?;
        let tmp = p.with_extension("moshid-tmp");
        std::fs::write(&tmp, commit).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &p).map_err(io(&p))
    }

    /// Links `snapshots/COMMIT/FILE` to `blobs/ETAG` (relative, as the
    /// official tools do), replacing nothing that exists.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let pointer = self.snapshot(commit).join(file);
        if pointer.exists() {
            return Ok(pointer);
        }
        let parent = pointer.parent().expect("a snapshot entry has a parent");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        // snapshots/COMMIT/a/b/FILE → ../../../../blobs/ETAG
        let depth = file.split('/').count() + 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        // A dangling link left by an interrupted run is replaced.
        let _ = std::fs::remove_file(&pointer);
        std::os::unix::fs::symlink(&target, &pointer).map_err(io(&pointer))?;
        Ok(pointer)
    }

    /// Takes the writer's lock of blob `etag` (waits while another process,
    /// ours or the official tools', holds it).
    pub fn lock(&self, etag: &str) -> Result<BlobLock, HubError> {
        let p = self
            .root
            .join(".locks")
            .join(&self.folder)
            .join(format!("{etag}.lock"));
        std::fs::create_dir_all(p.parent().expect("a lock has a parent")).map_err(io(&p))?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io(&p))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor this function owns (kept open
        // in the returned guard, which releases the lock by closing it).
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(HubError::Io {
                path: p,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(BlobLock { _file: file })
    }
}

/// Held while a blob is written; closing the file releases the lock.
pub struct BlobLock {
    _file: File,
}

/// Whether `s` is a full commit hash (40 lowercase hex digits).
pub fn is_commit(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Bytes free for an unprivileged writer on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes one struct through a valid pointer; `c` is a
    // NUL-terminated path that lives across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_official_tools() {
        let t = tempfile::tempdir().unwrap();
        let c = RepoCache::new(t.path(), "kyutai/moshiko-pytorch-bf16");
        assert!(c.dir().ends_with("models--kyutai--moshiko-pytorch-bf16"));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(c.blob("e").parent().unwrap()).unwrap();
        std::fs::write(c.blob("e"), b"x").unwrap();
        let p = c.link(commit, "sub/dir/f.bin", "e").unwrap();
        assert_eq!(
            std::fs::read_link(&p).unwrap(),
            Path::new("../../../../blobs/e")
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        let p = c.link(commit, "f", "e").unwrap();
        assert_eq!(std::fs::read_link(&p).unwrap(), Path::new("../../blobs/e"));
        c.write_ref("main", commit).unwrap();
        assert_eq!(c.commit_for("main").as_deref(), Some(commit));
        assert_eq!(c.commit_for(commit).as_deref(), Some(commit));
        assert_eq!(c.commit_for("v2"), None);
        let _l = c.lock("e").unwrap();
        assert!(t
            .path()
            .join(".locks/models--kyutai--moshiko-pytorch-bf16/e.lock")
            .exists());
        assert!(free_bytes(t.path()).unwrap() > 0);
    }
}
