//! End to end with a PersonaPlex-shaped model (the `personaplex-tiny`
//! golden fixture on the CPU backend): a WebSocket session with
//! `voice_prompt` and `text_prompt` gets the handshake only after its prompt
//! ran, then converses; bad voice names (a path, a missing file, a file that
//! is not audio, a corrupt `.pt`) are refused for that session only.

use moshid_testkit::prelude::*;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden-next/personaplex-tiny")
}

/// A daemon serving the fixture with a voice folder of its own.
fn daemon(voices: &Path) -> Daemon {
    let config = serde_json::json!({
        "model": {
            "dir": fixture(),
            "backend": "cpu",
            "max_slots": 2,
            "allow_slow": true,
            "voice_dir": voices,
        },
        "session": {"idle_timeout_ms": 1500, "max_frames_in_flight": 4},
        "engine": {"prompt_frames_per_tick": 4, "prompt_cache_entries": 2},
    });
    daemon!().config(&config.to_string()).start()
}

fn voices() -> tempfile::TempDir {
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for f in ["voice_a.wav", "voice_b.pt"] {
        std::fs::copy(fixture().join(f), t.path().join(f)).unwrap();
    }
    std::fs::write(t.path().join("notes.wav"), b"these are not samples").unwrap();
    let mut pt = std::fs::read(fixture().join("voice_b.pt")).unwrap();
    let n = pt.len();
    pt.truncate(n / 2);
    std::fs::write(t.path().join("torn.pt"), pt).unwrap();
    t
}

#[test]
fn prompted_sessions_handshake_after_the_prompt_and_bad_names_are_refused() {
    let v = voices();
    let daemon = daemon(v.path());
    let model = daemon.get_json("/v1/model");
    assert_eq!(model["model"]["type"], "personaplex", "{model}");
    assert_eq!(model["defaults"]["pad_mult"], 0.0, "{model}");
    for (i, query) in [
        "voice_prompt=voice_b.pt&text_prompt=you%20are%20nice",
        "voice_prompt=voice_a.wav&text_prompt=hello&pad_mult=0.5",
        // The same prompt again: its state comes from the cache.
        "voice_prompt=voice_b.pt&text_prompt=you%20are%20nice&repetition_penalty=1.2",
        // Neither key: the silence frames only (NVIDIA's server needs both).
        "seed=4",
    ]
    .into_iter()
    .enumerate()
    {
        let t = std::time::Instant::now();
        // The handshake must be the first message.
        let client = ChatClient::connect(daemon.addr, query)
            .unwrap_or_else(|e| panic!("{query}: handshake first: {e:?}"));
        // Session start (connect → handshake), for the notes: the first
        // session runs its prompt, the third starts from the cache.
        eprintln!(
            "start {i} ({query}): {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        // Four frames, then the session ends by the idle timeout.
        let kinds = client.run(&signal(3, 4), Pace::Burst).kinds;
        // PersonaPlex answers from the first frame on (the prompt filled its delay).
        assert_eq!(
            kinds.iter().filter(|&&k| k == kind::AUDIO).count(),
            4,
            "{query}: {kinds:?}"
        );
    }
    for (query, why) in [
        ("voice_prompt=..%2Fx.pt", "voice_prompt"),
        ("voice_prompt=missing.pt", "no voice named"),
        ("voice_prompt=notes.wav", "notes.wav"),
        ("voice_prompt=torn.pt", "torn.pt"),
        ("text_prompt=hi&cfg_coef=2", "cfg_coef"),
    ] {
        let text = match ChatClient::connect(daemon.addr, query) {
            Err(NotStarted::Refused(text)) => text,
            Ok(_) => panic!("{query}: started a session"),
            Err(e) => panic!("{query}: not an error message: {e:?}"),
        };
        assert!(text.contains(why), "{query}: {text}");
        assert!(
            !text.contains(v.path().to_str().unwrap()),
            "{query}: the voice folder leaked: {text}"
        );
    }
    // The daemon still serves.
    ChatClient::start(daemon.addr, "text_prompt=good%20evening").close();
    daemon.wait_idle();
}
