//! `moshid client`: stream a WAV file to a chat endpoint, record the answer.
//!
//! One thread does it all, on a [`ChatConnection`] (whose I/O thread does the
//! socket work): frame `i` is sent at `start + i * 80 ms` (absolute
//! deadlines, so lateness never accumulates), and until each deadline the
//! thread waits on received events, so receiving never pauses while sending.
//! With `realtime: false` frames go out as fast as the connection takes them
//! (backpressure from the socket) and events are drained between frames.
//!
//! After the last frame the client keeps receiving until the server has
//! answered every frame sent (it has sent back at least as many 80 ms frames
//! of audio), the server closes, or no event came for `idle_timeout`; then it
//! closes the connection, still taking what the server sent before it saw
//! the close. Received audio goes to the output WAV as it comes,
//! text pieces to the text output (stdout) as they come, flushed; a summary
//! goes to stderr. A server error message ends the run with
//! [`ClientError::Server`], after the output WAV has been finalized.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::session::{ChatConnection, ServerEvent};
use super::wav::{frames_from_samples, read_wav_24k_mono, OutputFormat, WavOutput};
use super::ClientError;
use crate::codec::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

/// Default endpoint of a local `moshid serve`.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:8998/api/chat";
/// Duration of one frame (80 ms).
pub const FRAME_DURATION: Duration = Duration::from_millis(80);

/// What [`run`] does.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// WAV file to send (any rate, channels, bit depth).
    pub input: PathBuf,
    /// WAV file to write (24 kHz mono).
    pub output: PathBuf,
    /// Endpoint; see [`super::session::chat_url`] for what may be left out.
    pub url: String,
    /// Session parameters, appended to the URL query string.
    pub params: Vec<(String, String)>,
    /// Pace frames at real time; otherwise send as fast as the server takes them.
    pub realtime: bool,
    /// Bound on connecting (TCP, upgrade, waiting for the handshake).
    pub connect_timeout: Duration,
    /// After the last frame, give up waiting for answers after this long without an event.
    pub idle_timeout: Duration,
    pub output_format: OutputFormat,
}

impl ClientOptions {
    /// Options with the CLI's defaults.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            url: DEFAULT_URL.to_string(),
            params: Vec::new(),
            realtime: true,
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(2),
            output_format: OutputFormat::Pcm16,
        }
    }
}

/// What a run sent and received.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientReport {
    /// Frames in the input (after resampling and padding).
    pub frames_total: u64,
    pub frames_sent: u64,
    /// 24 kHz samples received (and written to the output).
    pub audio_samples_received: u64,
    /// All text pieces, concatenated.
    pub text: String,
    pub metadata: Vec<Value>,
    /// Duration of the input, in seconds.
    pub input_seconds: f64,
    /// From connected to closed.
    pub elapsed: Duration,
    /// Whether the server confirmed that every frame in flight was answered
    /// (its final metadata, after the client said its input was finished).
    pub all_answered: bool,
    /// Whether the server closed the connection before the client did.
    pub server_closed: bool,
}

impl ClientReport {
    /// Whole 80 ms frames of audio received.
    pub fn frames_received(&self) -> u64 {
        self.audio_samples_received / FRAME_SAMPLES as u64
    }

    /// Seconds of audio received.
    pub fn seconds_received(&self) -> f64 {
        self.audio_samples_received as f64 / f64::from(SAMPLE_RATE_HZ)
    }

    /// One line for humans.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "sent {}/{} frames ({:.2} s), received {} frames ({:.2} s of audio), {} characters of text, {} metadata messages, in {:.2} s",
            self.frames_sent,
            self.frames_total,
            self.frames_sent as f64 * FRAME_DURATION.as_secs_f64(),
            self.frames_received(),
            self.seconds_received(),
            self.text.chars().count(),
            self.metadata.len(),
            self.elapsed.as_secs_f64(),
        );
        if !self.all_answered {
            line.push_str("; the server did not confirm the end of the session");
        }
        if self.server_closed {
            line.push_str("; the server closed the connection");
        }
        line
    }
}

/// Runs a session, printing text to stdout (see the module docs).
pub fn run(opts: &ClientOptions) -> Result<ClientReport, ClientError> {
    run_with_text_output(opts, &mut std::io::stdout())
}

/// [`run`], with text pieces written to `text_out` instead of stdout.
pub fn run_with_text_output(
    opts: &ClientOptions,
    text_out: &mut dyn Write,
) -> Result<ClientReport, ClientError> {
    let audio = read_wav_24k_mono(&opts.input)?;
    let frames = frames_from_samples(&audio.samples);
    if frames.is_empty() {
        return Err(ClientError::EmptyInput(opts.input.clone()));
    }
    // Create the output first: a bad path should fail before taking a session.
    let output = WavOutput::create(&opts.output, opts.output_format)?;
    let mut conn = match ChatConnection::connect(&opts.url, &opts.params, opts.connect_timeout) {
        Ok(conn) => conn,
        Err(e) => {
            drop(output);
            let _ = std::fs::remove_file(&opts.output);
            return Err(e);
        }
    };
    eprintln!(
        "moshid client: connected to {}; sending {:.2} s of audio ({} frames){}",
        conn.url(),
        audio.seconds(),
        frames.len(),
        if opts.realtime {
            " in real time"
        } else {
            " as fast as the server takes it"
        }
    );

    let mut state = Received {
        output,
        text_out,
        text: String::new(),
        metadata: Vec::new(),
        server_error: None,
        closed: false,
    };
    let started = Instant::now();
    let mut outcome = stream(&mut conn, &frames, opts, &mut state);
    let frames_sent = conn.frames_sent();
    // What the server sent before it saw the close (e.g. text that trails
    // the last audio) still counts.
    for event in conn.close() {
        if let Err(e) = state.handle(event) {
            outcome = outcome.and(Err(e));
        }
    }
    let elapsed = started.elapsed();

    if !state.text.is_empty() && !state.text.ends_with('\n') {
        let _ = state.text_out.write_all(b"\n");
        let _ = state.text_out.flush();
    }
    // The server's final metadata says every frame in flight was answered
    // (the model's delay means the last frames of a stream have no answer).
    let all_answered = state
        .metadata
        .iter()
        .any(|m| m["session"]["end_reason"]["kind"] == "input_finished");
    let report = ClientReport {
        frames_total: frames.len() as u64,
        frames_sent,
        audio_samples_received: state.output.samples(),
        text: std::mem::take(&mut state.text),
        metadata: std::mem::take(&mut state.metadata),
        input_seconds: audio.seconds(),
        elapsed,
        all_answered,
        server_closed: state.closed,
    };
    let finalized = state.output.finalize();
    eprintln!(
        "moshid client: {}; audio written to {}",
        report.summary(),
        opts.output.display()
    );
    outcome?;
    finalized?;
    if let Some(message) = state.server_error {
        return Err(ClientError::Server(message));
    }
    if report.frames_sent < report.frames_total {
        return Err(ClientError::ClosedEarly {
            frames_sent: report.frames_sent,
            frames_total: report.frames_total,
        });
    }
    Ok(report)
}

/// What has come back so far.
struct Received<'a> {
    output: WavOutput,
    text_out: &'a mut dyn Write,
    text: String,
    metadata: Vec<Value>,
    server_error: Option<String>,
    closed: bool,
}

impl Received<'_> {
    fn handle(&mut self, event: ServerEvent) -> Result<(), ClientError> {
        match event {
            ServerEvent::Audio(pcm) => self.output.write(&pcm)?,
            ServerEvent::Text(piece) => {
                // A closed stdout must not end the session: the text is kept.
                let _ = self.text_out.write_all(piece.as_bytes());
                let _ = self.text_out.flush();
                self.text.push_str(&piece);
            }
            ServerEvent::Metadata(value) => self.metadata.push(value),
            ServerEvent::Error(message) => {
                self.server_error.get_or_insert(message);
            }
            ServerEvent::Closed => self.closed = true,
        }
        Ok(())
    }

    /// Nothing more will come, or nothing more should be sent.
    fn done(&self) -> bool {
        self.closed || self.server_error.is_some()
    }
}

fn stream(
    conn: &mut ChatConnection,
    frames: &[[f32; FRAME_SAMPLES]],
    opts: &ClientOptions,
    state: &mut Received<'_>,
) -> Result<(), ClientError> {
    let start = Instant::now();
    for (index, frame) in frames.iter().enumerate() {
        if opts.realtime {
            let deadline = start + FRAME_DURATION * index as u32;
            while !state.done() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match conn.recv_event(left)? {
                    Some(event) => state.handle(event)?,
                    None => break,
                }
            }
        } else {
            while !state.done() {
                match conn.recv_event(Duration::ZERO)? {
                    Some(event) => state.handle(event)?,
                    None => break,
                }
            }
        }
        if state.done() {
            break;
        }
        match conn.send_frame(frame) {
            Ok(()) => {}
            // The I/O thread has ended; its events say why.
            Err(ClientError::Disconnected) => break,
            Err(e) => return Err(e),
        }
    }

    // Tell the server the input is over: it answers what is in flight, sends
    // the session's metadata and closes. The loop ends on that close, or on
    // the idle timeout with a server that does not know the message.
    if !state.done() {
        match conn.send_message(crate::protocol::END_OF_INPUT_MESSAGE.to_vec()) {
            Ok(()) | Err(ClientError::Disconnected) => {}
            Err(e) => return Err(e),
        }
    }
    let mut last_event = Instant::now();
    while !state.done() {
        let idle = last_event.elapsed();
        if idle >= opts.idle_timeout {
            break;
        }
        if let Some(event) = conn.recv_event(opts.idle_timeout - idle)? {
            state.handle(event)?;
            last_event = Instant::now();
        }
    }
    Ok(())
}
