//! Headless Chromium (Debian's `chromium`, installed by `scripts/setup
//! --tests`) driven through the DevTools protocol, for the browser tests.
//!
//! The protocol client is this file: JSON commands over one WebSocket
//! (tungstenite, already in the build), the browser started with
//! `--remote-debugging-port=0` and its address read from its stderr. Four
//! commands are all the tests need (navigate, evaluate, dispatch a mouse
//! click, screenshot); a CDP crate would bring its own async runtime or a
//! browser downloader for that.
//!
//! Every wait is bounded; console messages and page exceptions are kept and
//! printed when a test fails, with the browser's stderr.

#![allow(dead_code)] // each test binary uses a subset of these helpers

use base64::Engine;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// Bound on starting the browser and on one protocol command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// One browser at a time per test binary: two cores carry one Chromium and
/// its daemon comfortably, several at once make the tests slow, not better.
static ONE_BROWSER: Mutex<()> = Mutex::new(());

/// The Chromium binary: `$MOSHID_CHROMIUM`, else Debian's `chromium`.
pub fn chromium_binary() -> String {
    std::env::var("MOSHID_CHROMIUM").unwrap_or_else(|_| "chromium".to_string())
}

/// Whether Chromium can run here: a missing one fails the test, unless
/// `MOSHID_SKIP` names chromium (see `moshid_testkit::peers`).
pub fn need_chromium() -> bool {
    let bin = chromium_binary();
    let found = if bin.contains('/') {
        if Path::new(&bin).exists() {
            Ok(())
        } else {
            Err(format!("MOSHID_CHROMIUM={bin} does not exist"))
        }
    } else {
        moshid_testkit::peers::on_path(&bin)
    };
    moshid_testkit::peers::require("chromium", found)
}

/// The microphone the browser is given.
#[derive(Debug, Clone, Copy)]
pub enum Mic<'a> {
    /// A fake device playing this WAV file in a loop; permission granted.
    Wav(&'a Path),
    /// A fake device, but every permission prompt is answered "block".
    Denied,
}

/// A headless Chromium with one page and a fake microphone.
pub struct Browser {
    child: Child,
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// Console messages and exceptions of the page.
    pub console: Vec<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    _profile: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Browser {
    /// Starts Chromium with the flags of a root CI machine (no sandbox, no
    /// GPU, no network of its own), a fresh profile, a fake microphone
    /// playing `mic_wav` and `extra_flags`; attaches to a blank page.
    pub fn launch(mic_wav: &Path, extra_flags: &[String]) -> Browser {
        Self::launch_with(Mic::Wav(mic_wav), extra_flags)
    }

    /// [`Browser::launch`] with the microphone `mic`.
    pub fn launch_with(mic: Mic<'_>, extra_flags: &[String]) -> Browser {
        let serial = ONE_BROWSER.lock().unwrap_or_else(|p| p.into_inner());
        let profile = tempfile::Builder::new()
            .prefix("moshid-chromium-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a profile folder");
        let mut cmd = Command::new(chromium_binary());
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
            "--use-fake-device-for-media-stream",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
        match mic {
            Mic::Wav(wav) => {
                cmd.arg("--use-fake-ui-for-media-stream").arg(format!(
                    "--use-file-for-fake-audio-capture={}",
                    wav.display()
                ));
            }
            Mic::Denied => {
                cmd.arg("--deny-permission-prompts");
            }
        }
        cmd.args(extra_flags)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start `{}` ({e}): install it with `scripts/setup --tests` (Debian package chromium)",
                chromium_binary()
            )
        });
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<String>();
        {
            let stderr = stderr.clone();
            thread::spawn(move || {
                for line in BufReader::new(stderr_pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(url) = line.strip_prefix("DevTools listening on ") {
                        let _ = tx.send(url.trim().to_string());
                    }
                    let mut log = stderr.lock().unwrap_or_else(|p| p.into_inner());
                    if log.len() < 2000 {
                        log.push(line);
                    }
                }
            });
        }
        let url = match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "Chromium did not print its DevTools address within {COMMAND_TIMEOUT:?}; stderr:\n{}",
                    stderr.lock().unwrap().join("\n")
                );
            }
        };
        let rest = url.strip_prefix("ws://").expect("a ws:// DevTools URL");
        let host = rest.split('/').next().expect("host:port");
        let tcp = TcpStream::connect(host).expect("connecting to DevTools");
        tcp.set_read_timeout(Some(COMMAND_TIMEOUT)).unwrap();
        tcp.set_write_timeout(Some(COMMAND_TIMEOUT)).unwrap();
        let (ws, _) = tungstenite::client(url.as_str(), tcp).expect("DevTools WebSocket");
        // Short reads from now on: `send` loops over them up to its deadline.
        ws.get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            console: Vec::new(),
            stderr,
            _profile: profile,
            _serial: serial,
        };
        let target = b.browser_call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached = b.browser_call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_string();
        b.call("Runtime.enable", json!({}));
        b.call("Page.enable", json!({}));
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 900, "height": 1100, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    /// A command to the browser itself.
    fn browser_call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None)
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(method, params, Some(&session))
    }

    fn send(&mut self, method: &str, params: Value, session: Option<&str>) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            assert!(
                Instant::now() < deadline,
                "DevTools {method}: no answer within {COMMAND_TIMEOUT:?}"
            );
            let text = match self.ws.read() {
                Ok(Message::Text(t)) => t,
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => panic!("DevTools {method}: {e}"),
            };
            let v: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
            if v["id"] == id {
                if let Some(err) = v.get("error") {
                    panic!("DevTools {method} failed: {err}");
                }
                return v["result"].clone();
            }
            self.on_event(&v);
        }
    }

    fn on_event(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.consoleAPICalled") => {
                let args: Vec<String> = p["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        a.get("value")
                            .map(|x| x.to_string())
                            .or_else(|| a["description"].as_str().map(str::to_string))
                            .unwrap_or_default()
                    })
                    .collect();
                self.console
                    .push(format!("console.{}: {}", p["type"], args.join(" ")));
            }
            Some("Runtime.exceptionThrown") => {
                self.console
                    .push(format!("exception: {}", p["exceptionDetails"]));
            }
            _ => {}
        }
    }

    /// Opens `url` in the page.
    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its
    /// value; an exception fails the test.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("evaluating `{expr}` threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` every 100 ms until `done` holds for its value; returns
    /// it. Fails after `timeout` with the last value.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        expr: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(expr);
            if done(&v) {
                return v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; last value: {v:#}\n{}",
                    self.diagnostics()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the middle of the element `selector` with real mouse events
    /// (a user gesture to the page, as a person's click is).
    pub fn click(&mut self, selector: &str) {
        let js = format!(
            "(() => {{ const r = document.querySelector({}).getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()",
            serde_json::to_string(selector).unwrap()
        );
        let at = self.eval(&js);
        let (x, y) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Types `text` into the focused element.
    pub fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({"text": text}));
    }

    /// A PNG of the whole page, 900 CSS pixels wide.
    pub fn screenshot(&mut self, path: &Path) {
        let metrics = self.call("Page.getLayoutMetrics", json!({}));
        let height = metrics["cssContentSize"]["height"]
            .as_f64()
            .unwrap_or(1100.0)
            .ceil();
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": 900, "height": height, "scale": 1},
            }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        std::fs::write(path, png).expect("writing the screenshot");
    }

    /// Console messages and the browser's stderr, for failure messages.
    pub fn diagnostics(&self) -> String {
        let stderr = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let tail = stderr.len().saturating_sub(40);
        format!(
            "---- page console ----\n{}\n---- chromium stderr (tail) ----\n{}",
            self.console.join("\n"),
            stderr[tail..].join("\n")
        )
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
        // Ask it to close (its helper processes go with it), then make sure.
        self.next_id += 1;
        let close = json!({"id": self.next_id, "method": "Browser.close"});
        let _ = self.ws.send(Message::Text(close.to_string().into()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `seconds` of a voiced test signal (a 48 kHz, 16-bit mono WAV:
/// a tone with vibrato, harmonics and a syllable-rate envelope) for the
/// fake microphone.
pub fn write_voice_wav(path: &Path, seconds: f64) {
    let mut phase = 0.0f64;
    moshid_testkit::audio::write_wav(path, 48_000, seconds, |t| {
        let f = 180.0 * (1.0 + 0.08 * (2.0 * std::f64::consts::PI * 2.5 * t).sin());
        phase += 2.0 * std::f64::consts::PI * f / 48_000.0;
        let env = (2.0 * std::f64::consts::PI * 2.0 * t).sin().abs();
        0.35 * env * (phase.sin() + 0.4 * (2.0 * phase).sin() + 0.2 * (3.0 * phase).sin())
    });
}
