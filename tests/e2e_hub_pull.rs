//! `moshid pull`, end to end: the real binary against a hub on loopback
//! (`hub_common`) serving the golden `moshi-tiny` fixture as a repository.
//! A fresh download into the official cache layout (and, where Python's
//! `huggingface_hub` is installed, that tool reading our cache and we
//! reading its), a resume after the pulling process was killed half way and
//! after a cut connection, a corrupted download refused, a gated repository
//! with and without the token, a missing file, no network, a full disk.
//! Nothing leaves 127.0.0.1.

mod hub_common;

use hub_common::{golden_repo, start, Hub, COMMIT};
use moshid_testkit::peers::{need_python, python, require};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const REPO: &str = "kyutai/moshi-tiny";

fn moshid(hf_home: &Path, endpoint: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moshid"));
    c.env("HF_HOME", hf_home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN_PATH")
        .env_remove("HF_HUB_OFFLINE")
        .stdin(Stdio::null());
    c
}

fn pull(hf_home: &Path, hub: &Hub, extra_env: &[(&str, &str)]) -> Output {
    let mut c = moshid(hf_home, &hub.endpoint());
    c.args(["pull", REPO]);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn repo_dir(hf_home: &Path) -> PathBuf {
    hf_home.join("hub/models--kyutai--moshi-tiny")
}

/// The layout the official tools write and read.
fn assert_official_layout(hf_home: &Path, hub: &Hub) {
    let d = repo_dir(hf_home);
    assert_eq!(
        std::fs::read_to_string(d.join("refs/main")).unwrap().trim(),
        COMMIT
    );
    for (name, f) in &hub.files {
        let etag = if hub_common::File::is_lfs(name) {
            &f.sha256
        } else {
            &f.git
        };
        let pointer = d.join("snapshots").join(COMMIT).join(name);
        assert_eq!(
            std::fs::read_link(&pointer).unwrap(),
            Path::new("../../blobs").join(etag),
            "{name}"
        );
        assert_eq!(std::fs::read(&pointer).unwrap(), f.bytes, "{name}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(d.join("blobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_fresh_pull_fills_the_official_cache_and_is_reused() {
    let hub = start(REPO, golden_repo("tokenizer.model"));
    let t = tempfile::tempdir().unwrap();
    let o = pull(t.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("serve it with `moshid serve --model-repo"),
        "{}",
        text(&o)
    );
    // Plain progress lines, not a redrawn bar: stderr is not a terminal.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pull: lm.safetensors: done") && !err.contains('\r'),
        "{err}"
    );
    assert_official_layout(t.path(), &hub);
    assert_eq!(hub.downloads().len(), 2, "{:?}", hub.seen());

    // Again: nothing downloaded (the hub is asked which commit main is).
    let o = pull(t.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(hub.downloads().len(), 2);
    // Offline, and with the hub gone: the cache serves.
    let o = moshid(t.path(), "http://127.0.0.1:1")
        .args(["pull", REPO])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = moshid(t.path(), "http://127.0.0.1:1")
        .args(["pull", REPO])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("using the cached copy"),
        "{}",
        text(&o)
    );
    // The snapshot is a checkpoint folder.
    let snap = repo_dir(t.path()).join("snapshots").join(COMMIT);
    let o = moshid(t.path(), &hub.endpoint())
        .args([
            "check-checkpoint",
            snap.to_str().unwrap(),
            "--backend",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // The interoperability half needs the official tool (see moshid_testkit::peers).
    if !need_python("huggingface_hub") {
        return;
    }
    // The official tool reads what we fetched, offline...
    let script = "import sys, huggingface_hub as h; \
                  print(h.hf_hub_download(sys.argv[1], 'lm.safetensors'))";
    let o = Command::new(python())
        .args(["-c", script, REPO])
        .env("HF_HOME", t.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .ends_with(&format!("snapshots/{COMMIT}/lm.safetensors")),
        "{}",
        text(&o)
    );
    // ...and we reuse what it fetched: it downloads every file from our hub...
    let theirs = tempfile::tempdir().unwrap();
    let script = "import sys, huggingface_hub as h; \
                  [h.hf_hub_download(sys.argv[1], f) for f in sys.argv[2:]]";
    let mut c = Command::new(python());
    c.args(["-c", script, REPO])
        .args(hub.files.keys())
        .env("HF_HOME", theirs.path())
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN");
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let before = hub.downloads().len();
    // ...and our pull downloads nothing.
    let o = pull(theirs.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(hub.downloads().len(), before, "{:?}", hub.seen());
}

#[test]
fn a_killed_pull_resumes_where_it_stopped() {
    let hub = start(REPO, golden_repo("tokenizer.model"));
    let lm = hub.files["lm.safetensors"].clone();
    let half = lm.bytes.len() as u64 / 2;
    hub.behaviour.lock().unwrap().stall_after = Some(half);
    let t = tempfile::tempdir().unwrap();
    let mut child = moshid(t.path(), &hub.endpoint())
        .args(["pull", REPO])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let part = repo_dir(t.path()).join(format!("blobs/{}.incomplete", lm.sha256));
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < half {
        assert!(
            Instant::now() < deadline,
            "the partial download never reached half"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let o = pull(t.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("resuming at"),
        "{}",
        text(&o)
    );
    let ranged: Vec<_> = hub
        .downloads()
        .into_iter()
        .filter(|s| s.path.ends_with(&lm.sha256))
        .map(|s| s.range)
        .collect();
    assert_eq!(
        ranged,
        [None, Some(format!("bytes={half}-"))],
        "{:?}",
        hub.seen()
    );
    assert_official_layout(t.path(), &hub);

    // A connection cut half way is resumed within the same pull.
    let t = tempfile::tempdir().unwrap();
    hub.behaviour.lock().unwrap().cut_after = Some(half);
    let o = pull(t.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("resuming (1/5)"),
        "{}",
        text(&o)
    );
    assert_official_layout(t.path(), &hub);
}

#[test]
fn a_corrupted_download_is_refused_and_not_kept() {
    let hub = start(REPO, golden_repo("tokenizer.model"));
    hub.behaviour.lock().unwrap().corrupt = true;
    let t = tempfile::tempdir().unwrap();
    let o = pull(t.path(), &hub, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not match the hub's sha256"),
        "{}",
        text(&o)
    );
    assert!(!err.contains("panicked"), "{err}");
    let d = repo_dir(t.path());
    let lm = &hub.files["lm.safetensors"];
    assert!(!d.join("blobs").join(&lm.sha256).exists());
    assert!(!d.join(format!("blobs/{}.incomplete", lm.sha256)).exists());
    assert!(!d
        .join("snapshots")
        .join(COMMIT)
        .join("lm.safetensors")
        .exists());
}

#[test]
fn a_gated_repository_needs_the_token() {
    let hub = start(REPO, golden_repo("tokenizer.model"));
    hub.behaviour.lock().unwrap().token = Some("hf_granted".into());
    let t = tempfile::tempdir().unwrap();
    let o = pull(t.path(), &hub, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("gated") && err.contains("401") && err.contains("set HF_TOKEN"),
        "{err}"
    );
    assert!(hub.downloads().is_empty());
    let o = pull(t.path(), &hub, &[("HF_TOKEN", "hf_wrong")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("was refused"),
        "{}",
        text(&o)
    );
    // The token file the official tools' login writes works as well as HF_TOKEN.
    std::fs::write(t.path().join("token"), "hf_granted\n").unwrap();
    let o = pull(t.path(), &hub, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(hub.downloads().iter().all(|s| s.auth));
}

#[test]
fn missing_files_and_no_network_are_said_in_words() {
    let hub = start(REPO, golden_repo("tokenizer_spm_missing.model"));
    let t = tempfile::tempdir().unwrap();
    let o = pull(t.path(), &hub, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("has no file `tokenizer_spm_missing.model`") && err.contains("tokenizer_name"),
        "{err}"
    );
    let o = moshid(t.path(), &hub.endpoint())
        .args(["pull", "kyutai/not-there"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no such repository"),
        "{}",
        text(&o)
    );
    let o = moshid(t.path(), &hub.endpoint())
        .args(["pull", &format!("{REPO}@v9")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no revision `v9`"),
        "{}",
        text(&o)
    );
    // A port nothing listens on: no network.
    let o = moshid(t.path(), "http://127.0.0.1:1")
        .args(["pull", "kyutai/other"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot reach the hub"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_full_disk_is_said_in_words() {
    let hub = start(REPO, golden_repo("tokenizer.model"));
    let t = tempfile::tempdir().unwrap();
    // A 1 MiB tmpfs in a mount namespace of its own (root and unshare needed).
    let script = format!(
        "mount -t tmpfs -o size=1m tmpfs {0} && HF_HOME={0} {1} pull {REPO}",
        t.path().display(),
        env!("CARGO_BIN_EXE_moshid")
    );
    let o = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .env("HF_ENDPOINT", hub.endpoint())
        .env_remove("HF_TOKEN")
        .output();
    let o = match o {
        Ok(o)
            if !String::from_utf8_lossy(&o.stderr).contains("mount:")
                && !String::from_utf8_lossy(&o.stderr).contains("unshare:") =>
        {
            o
        }
        other => {
            let why = format!("no mount namespace with a tmpfs here (needs root): {other:?}");
            // Fails the test unless MOSHID_SKIP names unshare.
            require("unshare", Err(why));
            return;
        }
    };
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("the disk is full"),
        "{}",
        text(&o)
    );
}
