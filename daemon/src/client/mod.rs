//! The client side of the chat protocol: `moshid client` and a blocking
//! client library for tools and end-to-end tests.
//!
//! - [`protocol`]: message kinds of Kyutai's WebSocket protocol.
//! - [`session`]: [`ChatConnection`], a blocking connection whose sending and
//!   receiving halves can run on two threads (one I/O thread owns the socket).
//! - [`wav`]: WAV in (any format, converted to 24 kHz mono) and out.
//! - [`run`](mod@run): the `moshid client` command: stream a WAV file at real
//!   time, write the audio that comes back to a WAV and the text to stdout.
//!
//! Only plain `ws://` is supported (no TLS). Nothing here is on the daemon's
//! serving path: this module may allocate and block freely.

pub mod run;
pub mod session;
pub mod wav;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub use run::{run, run_with_text_output, ClientOptions, ClientReport, DEFAULT_URL};
pub use session::{
    chat_url, decode_audio, is_closed, percent_encode, would_block, ChatConnection, ChatReceiver,
    ChatSender, ServerEvent,
};
pub use wav::OutputFormat;

use crate::codec::CodecError;

/// Everything that can go wrong on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("no moshid at {url}: is `moshid serve` running?")]
    NoServer { url: String },
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {after:?} {what}")]
    Timeout { what: &'static str, after: Duration },
    #[error("WebSocket upgrade with {url} failed: {reason}")]
    Handshake { url: String, reason: String },
    /// The server sent an error message instead of the session handshake.
    #[error("{url} refused the session: {message}")]
    Rejected { url: String, message: String },
    #[error("{url} closed the connection before the session started")]
    ClosedBeforeHandshake { url: String },
    /// The server sent an error message during the session.
    #[error("the server reported an error: {0}")]
    Server(String),
    #[error("the server closed the connection after {frames_sent} of {frames_total} frames")]
    ClosedEarly { frames_sent: u64, frames_total: u64 },
    /// The connection is closed (sending after the end of the session).
    #[error("the connection is closed")]
    Disconnected,
    #[error("WebSocket error: {0}")]
    WebSocket(#[from] tungstenite::Error),
    #[error("audio codec error: {0}")]
    Codec(#[from] CodecError),
    #[error("{}: {source}", path.display())]
    Wav {
        path: PathBuf,
        #[source]
        source: hound::Error,
    },
    #[error("{}: no audio in the file", .0.display())]
    EmptyInput(PathBuf),
    #[error("{0}")]
    Audio(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// `moshid client`: stream a WAV file to a running moshid in real time; write
/// the audio it answers to a WAV file and its text to stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// WAV file to send (any sample rate, channel count and bit depth).
    #[arg(long, short = 'i', value_name = "WAV")]
    pub input: PathBuf,
    /// WAV file to write the answer to (24 kHz mono).
    #[arg(long, short = 'o', value_name = "WAV")]
    pub output: PathBuf,
    /// Chat endpoint (`ws://` only; the path defaults to /api/chat).
    #[arg(long, default_value = DEFAULT_URL)]
    pub url: String,
    /// Session parameter passed in the URL query string; repeatable
    /// (e.g. `--param text_temperature=0.7 --param seed=42`).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// Send at real time (80 ms per frame); `false` sends as fast as the
    /// server takes the audio.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub realtime: bool,
    /// Seconds to wait for the connection and the session handshake.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_seconds)]
    pub connect_timeout: Duration,
    /// Seconds without anything from the server, after the last frame, before
    /// finishing (the model answers a frame within a few ticks; its last
    /// `delay` frames are never answered, so the client ends on this wait).
    #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = parse_seconds)]
    pub idle_timeout: Duration,
    /// Sample format of the output WAV.
    #[arg(long, value_enum, default_value_t = OutputFormat::Pcm16)]
    pub output_format: OutputFormat,
}

impl From<ClientArgs> for ClientOptions {
    fn from(args: ClientArgs) -> Self {
        Self {
            input: args.input,
            output: args.output,
            url: args.url,
            params: args.params,
            realtime: args.realtime,
            connect_timeout: args.connect_timeout,
            idle_timeout: args.idle_timeout,
            output_format: args.output_format,
        }
    }
}

/// Parses `KEY=VALUE` (the value may be empty or contain `=`).
pub fn parse_param(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// Parses a positive number of seconds.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {text:?}"))?;
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!(
            "expected a positive number of seconds, got {text:?}"
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Entry point of `moshid client`: runs it and turns errors into a message
/// on stderr and a failure exit code.
pub fn main_client(args: ClientArgs) -> ExitCode {
    match run(&ClientOptions::from(args)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moshid client: error: {e}");
            ExitCode::FAILURE
        }
    }
}
