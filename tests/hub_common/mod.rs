//! A hub on loopback for the pull tests: a small HTTP/1.1 server that speaks
//! the Hugging Face hub's file-resolve protocol over a folder of files, as
//! the hub does: `HEAD`/`GET /{owner}/{name}/resolve/{revision}/{file}`
//! answers a large file (`*.safetensors`) with a redirect to `/cdn/{sha256}`
//! and `X-Linked-Etag` / `X-Linked-Size`, a small one directly with its git
//! blob id as `ETag`; `X-Repo-Commit` on both; errors with `X-Error-Code`
//! (`GatedRepo`, `RepoNotFound`, `RevisionNotFound`, `EntryNotFound`); byte
//! ranges on `/cdn/`. Behaviours for the tests: a token it requires, a
//! download it cuts or stalls half way, bytes it corrupts. Every request is
//! logged for the tests' assertions.

#![allow(dead_code)]

use sha1::Digest as _;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The fake repository's commit.
pub const COMMIT: &str = "3f1c0de5a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// One file of the repository.
#[derive(Clone)]
pub struct File {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// sha256 (hex).
    pub sha256: String,
    /// git blob id (hex).
    pub git: String,
}

impl File {
    fn new(bytes: Vec<u8>) -> File {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let sha256 = hex(&sha2::Sha256::digest(&bytes));
        let mut g = sha1::Sha1::new();
        g.update(format!("blob {}\0", bytes.len()).as_bytes());
        g.update(&bytes);
        File {
            git: hex(&g.finalize()),
            sha256,
            bytes,
        }
    }

    /// Whether the hub keeps it in large-file storage.
    pub fn is_lfs(name: &str) -> bool {
        name.ends_with(".safetensors")
    }
}

/// What the server does beyond serving.
#[derive(Default, Clone)]
pub struct Behaviour {
    /// Requests without `Authorization: Bearer TOKEN` get 401 GatedRepo.
    pub token: Option<String>,
    /// The next `/cdn/` download sends this many bytes, then closes.
    pub cut_after: Option<u64>,
    /// The next `/cdn/` download sends this many bytes, then hangs.
    pub stall_after: Option<u64>,
    /// `/cdn/` downloads have their middle byte flipped.
    pub corrupt: bool,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// HEAD or GET.
    pub method: String,
    /// The path.
    pub path: String,
    /// The Range header.
    pub range: Option<String>,
    /// Whether it carried a bearer token.
    pub auth: bool,
}

/// The running server.
pub struct Hub {
    /// Where it listens.
    pub addr: SocketAddr,
    /// `OWNER/NAME` it serves.
    pub repo: String,
    /// Its files.
    pub files: BTreeMap<String, File>,
    /// What it does.
    pub behaviour: Arc<Mutex<Behaviour>>,
    /// What it saw.
    pub log: Arc<Mutex<Vec<Seen>>>,
}

impl Hub {
    /// `HF_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    /// Downloads (`GET /cdn/…`) seen so far.
    pub fn downloads(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path.starts_with("/cdn/"))
            .collect()
    }
}

/// The golden `moshi-tiny` fixture as a hub repository in the published
/// layout: `config.json` (its `lm_config.json` with the file-name keys),
/// `lm.safetensors`, `mimi.safetensors`, `mimi_config.json`, `tokenizer.model`.
/// `tokenizer_name` can be overridden (to name a missing file).
pub fn golden_repo(tokenizer_name: &str) -> BTreeMap<String, Vec<u8>> {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden");
    let g = golden.join("moshi-tiny");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join("lm_config.json")).unwrap()).unwrap();
    let o = config.as_object_mut().unwrap();
    o.insert("moshi_name".into(), "lm.safetensors".into());
    o.insert("mimi_name".into(), "mimi.safetensors".into());
    o.insert("tokenizer_name".into(), tokenizer_name.into());
    o.insert("mimi_config_name".into(), "mimi_config.json".into());
    let mut files = BTreeMap::new();
    files.insert(
        "config.json".to_string(),
        serde_json::to_vec_pretty(&config).unwrap(),
    );
    for f in ["lm.safetensors", "mimi.safetensors", "mimi_config.json"] {
        files.insert(f.to_string(), std::fs::read(g.join(f)).unwrap());
    }
    files.insert(
        "tokenizer.model".to_string(),
        std::fs::read(golden.join("tokenizer_tiny.model")).unwrap(),
    );
    files
}

/// Starts a hub serving `files` as repository `repo` at revision `main`.
pub fn start(repo: &str, files: BTreeMap<String, Vec<u8>>) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let files: BTreeMap<String, File> = files.into_iter().map(|(k, v)| (k, File::new(v))).collect();
    let hub = Hub {
        addr,
        repo: repo.to_string(),
        files: files.clone(),
        behaviour: Arc::default(),
        log: Arc::default(),
    };
    let (behaviour, log, repo) = (hub.behaviour.clone(), hub.log.clone(), repo.to_string());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (behaviour, log, files, repo) =
                (behaviour.clone(), log.clone(), files.clone(), repo.clone());
            std::thread::spawn(move || {
                let _ = serve(conn, &repo, &files, &behaviour, &log, addr);
            });
        }
    });
    hub
}

fn respond(
    s: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    s.write_all(out.as_bytes())?;
    if !head_only {
        s.write_all(body)?;
    }
    s.flush()
}

fn serve(
    mut s: TcpStream,
    repo: &str,
    files: &BTreeMap<String, File>,
    behaviour: &Mutex<Behaviour>,
    log: &Mutex<Vec<Seen>>,
    addr: SocketAddr,
) -> std::io::Result<()> {
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut range = None;
    let mut auth = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let v = v.trim().to_string();
            match k.to_ascii_lowercase().as_str() {
                "range" => range = Some(v),
                "authorization" => auth = Some(v),
                _ => {}
            }
        }
    }
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        auth: auth.is_some(),
    });
    let head = method == "HEAD";
    let b = behaviour.lock().unwrap().clone();
    let commit = ("X-Repo-Commit", COMMIT.to_string());
    if let Some(t) = &b.token {
        if auth.as_deref() != Some(&format!("Bearer {t}")) {
            return respond(
                &mut s,
                "401 Unauthorized",
                &[("X-Error-Code", "GatedRepo".into())],
                b"Access to this model is restricted.",
                head,
            );
        }
    }
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let Some(f) = files.values().find(|f| f.sha256 == sha) else {
            return respond(&mut s, "404 Not Found", &[], b"", head);
        };
        let mut bytes = f.bytes.clone();
        if b.corrupt {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x5a;
        }
        let total = bytes.len() as u64;
        let start = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split('-').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let body = &bytes[start as usize..];
        let (status, mut headers) = if range.is_some() {
            (
                "206 Partial Content",
                vec![(
                    "Content-Range",
                    format!("bytes {start}-{}/{total}", total - 1),
                )],
            )
        } else {
            ("200 OK", vec![])
        };
        headers.push(("Content-Length", body.len().to_string()));
        let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in &headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        s.write_all(out.as_bytes())?;
        if head {
            return Ok(());
        }
        let limit = {
            let mut bh = behaviour.lock().unwrap();
            if let Some(n) = bh.cut_after.take() {
                Some((n, false))
            } else {
                bh.stall_after.take().map(|n| (n, true))
            }
        };
        match limit {
            Some((n, stall)) => {
                let n = (n as usize).min(body.len());
                s.write_all(&body[..n])?;
                s.flush()?;
                if stall {
                    std::thread::sleep(Duration::from_secs(3600));
                }
                return Ok(());
            }
            None => {
                for chunk in body.chunks(64 << 10) {
                    s.write_all(chunk)?;
                }
            }
        }
        return s.flush();
    }
    // /{owner}/{name}/resolve/{revision}/{file}
    let p = path.trim_start_matches('/');
    let mut it = p.splitn(5, '/');
    let (owner, name, resolve, rev, file) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    );
    if resolve != "resolve" || format!("{owner}/{name}") != repo {
        return respond(
            &mut s,
            "404 Not Found",
            &[("X-Error-Code", "RepoNotFound".into())],
            b"Repository not found",
            head,
        );
    }
    if rev != "main" && rev != COMMIT {
        return respond(
            &mut s,
            "404 Not Found",
            &[("X-Error-Code", "RevisionNotFound".into())],
            b"Invalid rev id",
            head,
        );
    }
    let Some(f) = files.get(file) else {
        return respond(
            &mut s,
            "404 Not Found",
            &[("X-Error-Code", "EntryNotFound".into()), commit],
            b"Entry not found",
            head,
        );
    };
    if File::is_lfs(file) {
        respond(
            &mut s,
            "302 Found",
            &[
                commit,
                ("X-Linked-Etag", format!("\"{}\"", f.sha256)),
                ("X-Linked-Size", f.bytes.len().to_string()),
                ("ETag", format!("\"{}\"", f.git)),
                ("Location", format!("http://{addr}/cdn/{}", f.sha256)),
                ("Content-Length", "0".into()),
            ],
            b"",
            head,
        )
    } else {
        respond(
            &mut s,
            "200 OK",
            &[commit, ("ETag", format!("\"{}\"", f.git))],
            &f.bytes,
            head,
        )
    }
}
