//! Checkpoints by name: `moshid pull OWNER/NAME[@REVISION]` and
//! `moshid serve --model-repo OWNER/NAME[@REVISION]` fetch a checkpoint from
//! the Hugging Face hub the way Kyutai's own tools do, into the same cache.
//!
//! Which files a repository needs follows the official loader
//! (`moshi.models.loaders.CheckpointInfo.from_hf_repo`): `config.json`,
//! whose `moshi_name`, `mimi_name`, `tokenizer_name` (and an optional
//! `mimi_config_name`) name the others; a repository without one (the
//! published Moshi 7B ones) is a Moshi 7B with the default names
//! (`model.safetensors`, `tokenizer-e351c8d8-checkpoint125.safetensors`,
//! `tokenizer_spm_32k_3.model`). The snapshot folder the pull fills is then
//! an ordinary checkpoint folder (`model.dir`).
//!
//! Settings come from the environment, as for the official tools:
//! `HF_ENDPOINT` (default the public hub), `HF_TOKEN` (else the token file
//! `HF_TOKEN_PATH`, else `$HF_HOME/token`), `HF_HUB_CACHE` (default
//! `$HF_HOME/hub`, `HF_HOME` default `$XDG_CACHE_HOME/huggingface` or
//! `~/.cache/huggingface`), `HF_HUB_OFFLINE=1` (the cache only).
//!
//! Why not the `hf-hub` crate: its 0.4 blocking client resumes downloads
//! (`.part` files), but verifies no checksum, names partial files and locks
//! differently from the official tools (so the two would not share a
//! partial download or exclude each other), reads no `HF_TOKEN` and has no
//! timeouts; its 1.0 client is asynchronous (tokio, reqwest and the Xet
//! storage client: hundreds of crates more to build) and neither resumes
//! nor verifies. The protocol is small; this module speaks it over `ureq`
//! (HTTP) and `sha2`/`sha1` (checksums).

pub mod cache;
pub mod error;
pub mod fetch;
pub mod progress;

use cache::RepoCache;
pub use error::HubError;
use fetch::Client;
use std::path::{Path, PathBuf};

/// The public hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// `OWNER/NAME[@REVISION]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `OWNER/NAME`.
    pub name: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
}

impl RepoRef {
    /// Parses `OWNER/NAME[@REVISION]`.
    pub fn parse(s: &str) -> Result<RepoRef, HubError> {
        let (name, revision) = match s.split_once('@') {
            Some((n, r)) => (n, r),
            None => (s, "main"),
        };
        let ok_part = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let parts: Vec<&str> = name.split('/').collect();
        let rev_ok = !revision.is_empty()
            && !revision.split('/').any(|p| p.is_empty() || p == "..")
            && !revision
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control());
        if parts.len() != 2 || !parts.iter().all(|p| ok_part(p)) || !rev_ok {
            return Err(HubError::BadName(s.to_string()));
        }
        Ok(RepoRef {
            name: name.to_string(),
            revision: revision.to_string(),
        })
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.revision)
    }
}

/// Where and how to fetch, from the environment.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// `HF_ENDPOINT`.
    pub endpoint: String,
    /// `HF_TOKEN` or a token file.
    pub token: Option<String>,
    /// The cache root (`HF_HUB_CACHE`).
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE`.
    pub offline: bool,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

impl HubSettings {
    /// Reads the official tools' variables.
    pub fn from_env() -> HubSettings {
        let home = env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let token_file = env("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("token"));
        let token = env("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(token_file)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        HubSettings {
            endpoint: env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token,
            cache: env("HF_HUB_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join("hub")),
            offline,
        }
    }
}

/// Fetches one file (or finds it in the cache) and returns its snapshot path.
fn fetch_file(
    client: &Client,
    settings: &HubSettings,
    cache: &RepoCache,
    repo: &RepoRef,
    file: &str,
    why: &str,
) -> Result<PathBuf, HubError> {
    let cached = || {
        cache
            .commit_for(&repo.revision)
            .map(|c| cache.snapshot(&c).join(file))
            .filter(|p| p.is_file())
    };
    if settings.offline {
        return cached().ok_or_else(|| HubError::NotCached {
            repo: repo.name.clone(),
            revision: repo.revision.clone(),
            file: file.to_string(),
            cache: cache.dir(),
        });
    }
    let meta = match client.resolve(repo, file, why) {
        Ok(m) => m,
        // No network: what the cache holds for this revision will do, as the
        // official tools do.
        Err(e @ HubError::Network { .. }) => {
            return match cached() {
                Some(p) => {
                    eprintln!("pull: {file}: the hub cannot be reached; using the cached copy");
                    Ok(p)
                }
                None => Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let pointer = cache.snapshot(&meta.commit).join(file);
    if !pointer.is_file() {
        let blob = cache.blob(&meta.etag);
        if !blob.is_file() {
            client.download(cache, file, &meta)?;
        } else {
            eprintln!("pull: {file}: already in the hub cache");
        }
        cache.link(&meta.commit, file, &meta.etag)?;
    } else {
        eprintln!("pull: {file}: already in the hub cache");
    }
    cache.write_ref(&repo.revision, &meta.commit)?;
    Ok(pointer)
}

/// The names of the files a checkpoint needs, from its `config.json` (or
/// the Moshi 7B defaults), each with the key that names it.
fn checkpoint_files(
    repo: &RepoRef,
    config: Option<&Path>,
) -> Result<Vec<(String, String)>, HubError> {
    let defaults = moshid_model::config::CheckpointFiles::default();
    let raw = match config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| HubError::Io {
                path: p.to_path_buf(),
                source,
            })?;
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| HubError::Config {
                repo: repo.name.clone(),
                what: format!("not valid JSON: {e}"),
            })?
        }
        None => serde_json::json!({}),
    };
    let mut out = Vec::new();
    for (key, default) in [
        ("moshi_name", Some(defaults.lm.as_str())),
        ("mimi_name", Some(defaults.mimi.as_str())),
        ("tokenizer_name", Some(defaults.tokenizer.as_str())),
        ("mimi_config_name", None),
    ] {
        let name = match raw.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Null) | None => match default {
                Some(d) => d.to_string(),
                None => continue,
            },
            Some(other) => {
                return Err(HubError::Config {
                    repo: repo.name.clone(),
                    what: format!("`{key}` must be a file name, not {other}"),
                })
            }
        };
        if name.starts_with("hf://")
            || name.starts_with("file://")
            || name.starts_with('/')
            || name.split('/').any(|p| p == "..")
        {
            return Err(HubError::Config {
                repo: repo.name.clone(),
                what: format!(
                    "`{key}` is `{name}`: only files of the repository itself are fetched \
                     (names in other repositories or on disk are not supported yet)"
                ),
            });
        }
        out.push((key.to_string(), name));
    }
    Ok(out)
}

/// A pulled checkpoint.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The snapshot folder: a checkpoint folder in the published layout.
    pub dir: PathBuf,
    /// Files it holds, with their sizes.
    pub files: Vec<(String, u64)>,
}

/// Pulls every file the checkpoint in `repo` needs into the hub cache.
pub fn pull(repo: &RepoRef, settings: &HubSettings) -> Result<Pulled, HubError> {
    let client = Client::new(&settings.endpoint, settings.token.clone());
    let cache = RepoCache::new(&settings.cache, &repo.name);
    let config = match fetch_file(
        &client,
        settings,
        &cache,
        repo,
        "config.json",
        "the model's configuration",
    ) {
        Ok(p) => Some(p),
        // As the official loader: no config.json is a legacy Moshi 7B repository.
        Err(HubError::MissingFile { .. }) => {
            eprintln!("pull: {repo} has no config.json: a Moshi 7B repository (built-in config)");
            None
        }
        Err(HubError::NotCached { .. })
            if cache.commit_for(&repo.revision).is_some_and(|c| {
                cache
                    .snapshot(&c)
                    .join(moshid_model::config::CheckpointFiles::default().lm)
                    .is_file()
            }) =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    let mut dir = config
        .as_ref()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    if let Some(p) = &config {
        files.push((
            "config.json".to_string(),
            std::fs::metadata(p).map_or(0, |m| m.len()),
        ));
    }
    for (key, name) in checkpoint_files(repo, config.as_deref())? {
        let why = format!(
            "{}`{key}`",
            if config.is_some() {
                "named by config.json's "
            } else {
                "the Moshi 7B default for "
            }
        );
        let p = fetch_file(&client, settings, &cache, repo, &name, &why)?;
        let snapshot = p
            .ancestors()
            .nth(name.split('/').count())
            .expect("a snapshot entry is inside its snapshot")
            .to_path_buf();
        dir.get_or_insert(snapshot);
        files.push((name, std::fs::metadata(&p).map_or(0, |m| m.len())));
    }
    Ok(Pulled {
        dir: dir.expect("at least the LM weights were fetched"),
        files,
    })
}

/// Pulls `repo` for `serve --model-repo`, returning the checkpoint folder.
pub fn pull_command_dir(repo: &str) -> Result<PathBuf, HubError> {
    let r = RepoRef::parse(repo)?;
    let settings = HubSettings::from_env();
    eprintln!(
        "<6>pull: {r} from {} into {}",
        settings.endpoint,
        settings.cache.display()
    );
    Ok(pull(&r, &settings)?.dir)
}

/// The `moshid pull` command: fetches, validates from the headers, and says
/// where the checkpoint is and how to serve it.
pub fn pull_command(repo: &str) -> std::process::ExitCode {
    use std::process::ExitCode;
    let r = match RepoRef::parse(repo) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let settings = HubSettings::from_env();
    eprintln!(
        "pull: {r} from {} into {}",
        settings.endpoint,
        settings.cache.display()
    );
    let pulled = match pull(&r, &settings) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let total: u64 = pulled.files.iter().map(|(_, n)| n).sum();
    println!(
        "{r}: {} files, {:.2} GB, in {}",
        pulled.files.len(),
        total as f64 / 1e9,
        pulled.dir.display()
    );
    match moshid_model::checkpoint::CheckpointDir::open(&pulled.dir).and_then(|d| d.check()) {
        Ok(report) => {
            println!(
                "  {:?}, {} LM parameters: serve it with `moshid serve --model-repo {}`",
                report.model_type, report.lm_params, repo
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {r} was fetched but moshid cannot serve it: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names() {
        let r = RepoRef::parse("kyutai/hibiki-zero-3b-pytorch-bf16").unwrap();
        assert_eq!(
            (r.name.as_str(), r.revision.as_str()),
            ("kyutai/hibiki-zero-3b-pytorch-bf16", "main")
        );
        let r = RepoRef::parse("kyutai/moshiko-pytorch-bf16@v0.1").unwrap();
        assert_eq!(r.revision, "v0.1");
        for bad in [
            "kyutai",
            "a/b/c",
            "../x",
            "a/b@",
            "a b/c",
            "a/..",
            "a/b@x/../y",
        ] {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn files_follow_the_official_loader() {
        let r = RepoRef::parse("a/b").unwrap();
        let names: Vec<String> = checkpoint_files(&r, None)
            .unwrap()
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(
            names,
            [
                "model.safetensors",
                "tokenizer-e351c8d8-checkpoint125.safetensors",
                "tokenizer_spm_32k_3.model"
            ]
        );
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"moshi_name": "lm.safetensors", "mimi_config_name": "m.json", "dim": 4}"#,
        )
        .unwrap();
        let names: Vec<String> = checkpoint_files(&r, Some(&p))
            .unwrap()
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(names[0], "lm.safetensors");
        assert_eq!(names[3], "m.json");
        std::fs::write(&p, r#"{"mimi_name": "hf://kyutai/other/mimi.safetensors"}"#).unwrap();
        let e = checkpoint_files(&r, Some(&p)).unwrap_err().to_string();
        assert!(e.contains("mimi_name") && e.contains("hf://"), "{e}");
    }
}
