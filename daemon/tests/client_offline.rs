//! The client (`moshid::client`) against fake WebSocket servers started in
//! the test: no daemon, no model. Each fake serves one connection on
//! 127.0.0.1:0 from a std thread and gives up after a few seconds of silence,
//! so every test is bounded in time.

use std::net::TcpListener;
use std::path::Path;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Parser;
use moshid::client::wav::read_wav_24k_mono;
use moshid::client::{
    main_client, run_with_text_output, ChatConnection, ClientArgs, ClientError, ClientOptions,
    ServerEvent, DEFAULT_URL,
};
use moshid::codec::resample::resampled_len;
use moshid::codec::FRAME_SAMPLES;
use serde_json::json;
use tungstenite::handshake::server::{Request, Response};
use tungstenite::Message;

const SERVER_READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Behaviour {
    /// Handshake (with version bytes) after a delay, a metadata message and
    /// messages of kinds the client must ignore, then for every audio
    /// message: the same bytes back as audio, and a text "hi".
    Echo { handshake_delay: Duration },
    /// An error message instead of the handshake, then close.
    Reject(&'static str),
    /// Upgrade, then never send anything.
    Silent,
    /// Handshake, then never answer.
    HandshakeOnly,
    /// Echo `frames` audio messages, then an error message and close.
    EchoThenError {
        frames: usize,
        message: &'static str,
    },
}

#[derive(Debug, Default)]
struct ServerLog {
    /// Request target of the upgrade (path and query).
    uri: String,
    audio_arrivals: Vec<Instant>,
}

struct FakeServer {
    url: String,
    thread: JoinHandle<ServerLog>,
}

impl FakeServer {
    fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("ws://{}/api/chat", listener.local_addr().unwrap());
        let thread = thread::spawn(move || serve_one(listener, behaviour));
        Self { url, thread }
    }

    fn log(self) -> ServerLog {
        self.thread.join().expect("fake server panicked")
    }
}

// tungstenite's upgrade callback returns its (large) error response type.
#[allow(clippy::result_large_err)]
fn serve_one(listener: TcpListener, behaviour: Behaviour) -> ServerLog {
    let (stream, _) = listener.accept().unwrap();
    stream.set_read_timeout(Some(SERVER_READ_TIMEOUT)).unwrap();
    let mut log = ServerLog::default();
    let uri = &mut log.uri;
    let mut ws = tungstenite::accept_hdr(stream, |request: &Request, response: Response| {
        *uri = request.uri().to_string();
        Ok(response)
    })
    .unwrap();
    let binary = |bytes: &[u8]| Message::Binary(bytes.to_vec().into());
    let mut echo_limit = usize::MAX;
    match behaviour {
        Behaviour::Reject(message) => {
            let mut bytes = vec![0x05];
            bytes.extend_from_slice(message.as_bytes());
            ws.send(binary(&bytes)).unwrap();
            let _ = ws.close(None);
            while ws.read().is_ok() {}
            return log;
        }
        Behaviour::Silent => {}
        Behaviour::HandshakeOnly => ws.send(binary(&[0x00])).unwrap(),
        Behaviour::Echo { handshake_delay } => {
            thread::sleep(handshake_delay);
            ws.send(binary(&[0x00, 0x00, 0x01])).unwrap();
            ws.send(binary(b"\x04{\"model\":\"fake\"}")).unwrap();
            // All of these must be ignored by the client.
            ws.send(binary(&[0x07, 1, 2, 3])).unwrap();
            ws.send(binary(&[0x03, 0x01])).unwrap();
            ws.send(binary(&[0x06])).unwrap();
            ws.send(binary(&[0x00, 0x09])).unwrap();
            ws.send(binary(&[])).unwrap();
            ws.send(Message::Text("not part of the protocol".into()))
                .unwrap();
            ws.send(Message::Ping(vec![1].into())).unwrap();
        }
        Behaviour::EchoThenError { frames, .. } => {
            ws.send(binary(&[0x00])).unwrap();
            echo_limit = frames;
        }
    }
    let echo = matches!(
        behaviour,
        Behaviour::Echo { .. } | Behaviour::EchoThenError { .. }
    );
    loop {
        match ws.read() {
            Ok(Message::Binary(data)) if data.first() == Some(&0x01) => {
                log.audio_arrivals.push(Instant::now());
                if !echo {
                    continue;
                }
                if log.audio_arrivals.len() > echo_limit {
                    if let Behaviour::EchoThenError { message, .. } = behaviour {
                        let mut bytes = vec![0x05];
                        bytes.extend_from_slice(message.as_bytes());
                        ws.send(binary(&bytes)).unwrap();
                        let _ = ws.close(None);
                        while ws.read().is_ok() {}
                        return log;
                    }
                }
                ws.send(Message::Binary(data)).unwrap();
                ws.send(binary(b"\x02hi")).unwrap();
            }
            // End of input, as the daemon answers it: every frame was
            // answered, so the session's record, then a close.
            Ok(Message::Binary(data)) if echo && data[..] == [0x03, 0x01] => {
                let record = br#"{"session":{"end_reason":{"kind":"input_finished"}}}"#;
                ws.send(binary(&[&[0x04][..], &record[..]].concat()))
                    .unwrap();
                let _ = ws.close(None);
                while ws.read().is_ok() {}
                return log;
            }
            Ok(_) => {}
            Err(_) => return log,
        }
    }
}

fn sine(rate: u32, frames: usize, freq: f32, amplitude: f32) -> Vec<f32> {
    (0..frames)
        .map(|i| amplitude * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
        .collect()
}

/// Writes 16-bit PCM; `channels` holds one signal per channel.
fn write_wav_i16(path: &Path, rate: u32, channels: &[Vec<f32>]) {
    let spec = hound::WavSpec {
        channels: channels.len() as u16,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..channels[0].len() {
        for channel in channels {
            writer
                .write_sample((channel[i] * f32::from(i16::MAX)).round() as i16)
                .unwrap();
        }
    }
    writer.finalize().unwrap();
}

fn read_wav(path: &Path) -> (hound::WavSpec, Vec<f32>) {
    let mut reader = hound::WavReader::open(path).unwrap();
    let spec = reader.spec();
    let samples = reader
        .samples::<i16>()
        .map(|s| f32::from(s.unwrap()) / f32::from(i16::MAX))
        .collect();
    (spec, samples)
}

fn rms(samples: &[f32]) -> f32 {
    (samples.iter().map(|x| x * x).sum::<f32>() / samples.len().max(1) as f32).sqrt()
}

fn zero_crossings(samples: &[f32]) -> usize {
    samples
        .windows(2)
        .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
        .count()
}

fn options(dir: &Path, url: &str) -> ClientOptions {
    let mut opts = ClientOptions::new(dir.join("in.wav"), dir.join("out.wav"));
    opts.url = url.to_string();
    opts.realtime = false;
    opts.connect_timeout = Duration::from_secs(5);
    opts.idle_timeout = Duration::from_secs(3);
    opts
}

#[test]
fn connect_waits_for_the_handshake() {
    let server = FakeServer::start(Behaviour::Echo {
        handshake_delay: Duration::from_millis(300),
    });
    let started = Instant::now();
    let mut conn = ChatConnection::connect(&server.url, &[], Duration::from_secs(5)).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "connect returned before the handshake"
    );
    // The first event is the metadata: the junk kinds produced none.
    let event = conn.recv_event(Duration::from_secs(5)).unwrap();
    assert_eq!(event, Some(ServerEvent::Metadata(json!({"model": "fake"}))));
    conn.send_frame(&[0.25; FRAME_SAMPLES]).unwrap();
    let mut audio = 0;
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while (audio < FRAME_SAMPLES || text.is_empty()) && Instant::now() < deadline {
        match conn.recv_event(Duration::from_millis(100)).unwrap() {
            Some(ServerEvent::Audio(pcm)) => audio += pcm.len(),
            Some(ServerEvent::Text(piece)) => text.push_str(&piece),
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    assert_eq!(audio, FRAME_SAMPLES);
    assert_eq!(text, "hi");
    assert_eq!(conn.recv_event(Duration::from_millis(50)).unwrap(), None);
    let closing = Instant::now();
    conn.close();
    assert!(closing.elapsed() < Duration::from_secs(2));
    assert_eq!(server.log().uri, "/api/chat");
}

#[test]
fn error_instead_of_handshake_is_surfaced() {
    let server = FakeServer::start(Behaviour::Reject("server full"));
    let result = ChatConnection::connect(&server.url, &[], Duration::from_secs(5));
    match result {
        Err(ClientError::Rejected { message, .. }) => assert_eq!(message, "server full"),
        Err(other) => panic!("expected Rejected, got {other}"),
        Ok(_) => panic!("expected Rejected, got a connection"),
    }
    server.log();

    // The command says so too, and leaves no output file behind.
    let dir = tempfile::tempdir().unwrap();
    write_wav_i16(&dir.path().join("in.wav"), 24_000, &[vec![0.1; 4_000]]);
    let server = FakeServer::start(Behaviour::Reject("server full"));
    let opts = options(dir.path(), &server.url);
    let error = run_with_text_output(&opts, &mut Vec::new()).unwrap_err();
    assert!(error.to_string().contains("server full"), "{error}");
    assert!(!opts.output.exists());
    server.log();
}

#[test]
fn http_refusal_of_the_upgrade_is_surfaced() {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}/api/chat", listener.local_addr().unwrap());
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(SERVER_READ_TIMEOUT)).unwrap();
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
            request.push(byte[0]);
        }
        stream
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\nserver full")
            .unwrap();
    });
    let error = ChatConnection::connect(&url, &[], Duration::from_secs(5))
        .err()
        .expect("the upgrade was refused");
    assert!(
        matches!(error, ClientError::Handshake { .. }) && error.to_string().contains("503"),
        "{error}"
    );
    server.join().unwrap();
}

#[test]
fn missing_handshake_times_out() {
    let server = FakeServer::start(Behaviour::Silent);
    let started = Instant::now();
    let result = ChatConnection::connect(&server.url, &[], Duration::from_millis(300));
    assert!(
        matches!(result, Err(ClientError::Timeout { .. })),
        "{:?}",
        result.err()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    server.log();
}

#[test]
fn no_server_gives_a_clear_message() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("ws://127.0.0.1:{port}/api/chat");
    let error = ChatConnection::connect(&url, &[], Duration::from_secs(2))
        .err()
        .expect("nothing listens there");
    assert_eq!(
        error.to_string(),
        format!("no moshid at {url}: is `moshid serve` running?")
    );

    let dir = tempfile::tempdir().unwrap();
    write_wav_i16(&dir.path().join("in.wav"), 24_000, &[vec![0.1; 4_000]]);
    let args = ClientArgs {
        input: dir.path().join("in.wav"),
        output: dir.path().join("out.wav"),
        url,
        params: Vec::new(),
        realtime: false,
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(1),
        output_format: Default::default(),
    };
    assert_eq!(main_client(args), std::process::ExitCode::FAILURE);
}

#[test]
fn audio_round_trip_writes_the_wav_and_prints_the_text() {
    let dir = tempfile::tempdir().unwrap();
    // 1 s: 12.5 frames, so the last frame is padded.
    write_wav_i16(
        &dir.path().join("in.wav"),
        24_000,
        &[sine(24_000, 24_000, 440.0, 0.5)],
    );
    let server = FakeServer::start(Behaviour::Echo {
        handshake_delay: Duration::ZERO,
    });
    let mut opts = options(dir.path(), &server.url);
    opts.params = vec![
        ("text_temperature".into(), "0.7".into()),
        ("seed".into(), "42".into()),
    ];
    let started = Instant::now();
    let mut text_out = Vec::new();
    let report = run_with_text_output(&opts, &mut text_out).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));

    assert_eq!(report.frames_total, 13);
    assert_eq!(report.frames_sent, 13);
    assert_eq!(report.audio_samples_received, 13 * FRAME_SAMPLES as u64);
    assert_eq!(report.frames_received(), 13);
    assert!(report.all_answered, "{report:?}");
    assert_eq!(report.text, "hi".repeat(13));
    assert_eq!(String::from_utf8(text_out).unwrap(), "hi".repeat(13) + "\n");
    assert_eq!(
        report.metadata,
        vec![
            json!({"model": "fake"}),
            json!({"session": {"end_reason": {"kind": "input_finished"}}})
        ]
    );

    let (spec, samples) = read_wav(&opts.output);
    assert_eq!((spec.sample_rate, spec.channels), (24_000, 1));
    assert_eq!(samples.len(), 13 * FRAME_SAMPLES);
    let level = rms(&samples[2_000..22_000]);
    assert!((level - 0.354).abs() < 0.05, "rms {level}");
    let crossings = zero_crossings(&samples[2_000..22_000]);
    assert!(
        (crossings as i64 - 733).abs() < 10,
        "{crossings} zero crossings"
    );

    let log = server.log();
    assert_eq!(log.uri, "/api/chat?text_temperature=0.7&seed=42");
    assert_eq!(log.audio_arrivals.len(), 13);
}

#[test]
fn realtime_sends_one_frame_per_80_ms() {
    let dir = tempfile::tempdir().unwrap();
    write_wav_i16(
        &dir.path().join("in.wav"),
        24_000,
        &[sine(24_000, 5 * FRAME_SAMPLES, 200.0, 0.3)],
    );
    let server = FakeServer::start(Behaviour::Echo {
        handshake_delay: Duration::ZERO,
    });
    let mut opts = options(dir.path(), &server.url);
    opts.realtime = true;
    let report = run_with_text_output(&opts, &mut Vec::new()).unwrap();
    assert_eq!(report.frames_sent, 5);
    assert!(report.all_answered);
    assert!(report.elapsed >= Duration::from_millis(320), "{report:?}");
    assert!(report.elapsed < Duration::from_secs(3), "{report:?}");
    let arrivals = server.log().audio_arrivals;
    assert_eq!(arrivals.len(), 5);
    let span = arrivals[4] - arrivals[0];
    assert!(
        span >= Duration::from_millis(250) && span < Duration::from_millis(1500),
        "frames 0 to 4 arrived {span:?} apart"
    );
}

#[test]
fn split_halves_send_and_receive_concurrently() {
    let server = FakeServer::start(Behaviour::Echo {
        handshake_delay: Duration::ZERO,
    });
    let conn = ChatConnection::connect(&server.url, &[], Duration::from_secs(5)).unwrap();
    let (mut sender, mut receiver) = conn.split();
    let frames = 6;
    let sending = thread::spawn(move || {
        for _ in 0..frames {
            sender.send_frame(&[0.1; FRAME_SAMPLES]).unwrap();
            thread::sleep(Duration::from_millis(80));
        }
        let done = Instant::now();
        // Dropping the sender closes the connection.
        drop(sender);
        done
    });
    let mut audio = 0;
    let mut texts = 0;
    let mut first_audio = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no Closed event");
        match receiver.recv_event(Duration::from_millis(100)).unwrap() {
            Some(ServerEvent::Audio(pcm)) => {
                first_audio.get_or_insert_with(Instant::now);
                audio += pcm.len();
            }
            Some(ServerEvent::Text(_)) => texts += 1,
            Some(ServerEvent::Metadata(_)) | None => {}
            Some(ServerEvent::Closed) => break,
            Some(ServerEvent::Error(e)) => panic!("server error {e}"),
        }
    }
    let sending_done = sending.join().unwrap();
    assert!(
        first_audio.unwrap() < sending_done,
        "audio only came after sending ended"
    );
    assert_eq!(audio, frames * FRAME_SAMPLES);
    assert_eq!(texts, frames);
    assert!(receiver.is_closed());
    assert_eq!(
        receiver.recv_event(Duration::ZERO).unwrap(),
        Some(ServerEvent::Closed)
    );
    server.log();
}

#[test]
fn server_error_mid_session_ends_the_run_with_a_valid_wav() {
    let dir = tempfile::tempdir().unwrap();
    write_wav_i16(
        &dir.path().join("in.wav"),
        24_000,
        &[sine(24_000, 10 * FRAME_SAMPLES, 300.0, 0.3)],
    );
    let server = FakeServer::start(Behaviour::EchoThenError {
        frames: 2,
        message: "engine overloaded",
    });
    let opts = options(dir.path(), &server.url);
    let started = Instant::now();
    match run_with_text_output(&opts, &mut Vec::new()) {
        Err(ClientError::Server(message)) => assert_eq!(message, "engine overloaded"),
        other => panic!("expected a server error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, samples) = read_wav(&opts.output);
    assert_eq!(samples.len(), 2 * FRAME_SAMPLES);
    server.log();
}

#[test]
fn idle_timeout_bounds_the_wait_for_answers() {
    let dir = tempfile::tempdir().unwrap();
    write_wav_i16(&dir.path().join("in.wav"), 24_000, &[vec![0.2; 3 * 1920]]);
    let server = FakeServer::start(Behaviour::HandshakeOnly);
    let mut opts = options(dir.path(), &server.url);
    opts.idle_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let report = run_with_text_output(&opts, &mut Vec::new()).unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    assert_eq!(report.frames_sent, 3);
    assert_eq!(report.audio_samples_received, 0);
    assert!(!report.all_answered);
    assert_eq!(read_wav(&opts.output).1.len(), 0);
    assert_eq!(server.log().audio_arrivals.len(), 3);
}

#[test]
fn sixteen_khz_stereo_becomes_24_khz_mono() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.wav");
    let tone = sine(16_000, 16_000, 300.0, 0.5);
    write_wav_i16(&path, 16_000, &[tone.clone(), tone.clone()]);
    let audio = read_wav_24k_mono(&path).unwrap();
    assert_eq!(audio.samples.len(), 24_000);
    assert_eq!((audio.source_rate_hz, audio.source_channels), (16_000, 2));
    assert_eq!(audio.source_frames, 16_000);
    let middle = &audio.samples[1_000..23_000];
    assert!((rms(middle) - 0.354).abs() < 0.01, "rms {}", rms(middle));
    // 300 Hz: 600 crossings per second, 550 in 22000 samples at 24 kHz.
    assert!((zero_crossings(middle) as i64 - 550).abs() <= 2);

    // Downmix averages: opposite channels cancel.
    let inverted: Vec<f32> = tone.iter().map(|x| -x).collect();
    write_wav_i16(&path, 16_000, &[tone, inverted]);
    assert!(rms(&read_wav_24k_mono(&path).unwrap().samples) < 1e-3);
}

#[test]
fn other_wav_formats_are_converted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.wav");
    let cases = [
        (44_100, 24, hound::SampleFormat::Int, 3),
        (48_000, 32, hound::SampleFormat::Float, 1),
        (8_000, 8, hound::SampleFormat::Int, 1),
        (24_000, 32, hound::SampleFormat::Int, 2),
    ];
    for (rate, bits, format, channels) in cases {
        let frames = rate as usize * 7 / 10; // 0.7 s
        let spec = hound::WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: format,
        };
        let tone = sine(rate, frames, 250.0, 0.5);
        let mut writer = hound::WavWriter::create(&path, spec).unwrap();
        for &x in &tone {
            for _ in 0..channels {
                match format {
                    hound::SampleFormat::Float => writer.write_sample(x).unwrap(),
                    hound::SampleFormat::Int => {
                        let full_scale = ((1i64 << (bits - 1)) - 1) as f32;
                        writer.write_sample((x * full_scale) as i32).unwrap()
                    }
                }
            }
        }
        writer.finalize().unwrap();
        let audio = read_wav_24k_mono(&path).unwrap();
        assert_eq!(
            audio.samples.len(),
            resampled_len(frames, rate),
            "{rate} Hz"
        );
        assert_eq!(audio.samples.len(), 16_800, "{rate} Hz");
        let level = rms(&audio.samples[1_000..15_000]);
        assert!(
            (level - 0.354).abs() < 0.02,
            "{rate} Hz {bits} bits: rms {level}"
        );
    }
}

#[test]
fn resampled_input_is_sent_as_24_khz_frames() {
    let dir = tempfile::tempdir().unwrap();
    let tone = sine(16_000, 16_000, 300.0, 0.5);
    write_wav_i16(&dir.path().join("in.wav"), 16_000, &[tone.clone(), tone]);
    let server = FakeServer::start(Behaviour::Echo {
        handshake_delay: Duration::ZERO,
    });
    let report = run_with_text_output(&options(dir.path(), &server.url), &mut Vec::new()).unwrap();
    // 24000 samples: 12.5 frames, padded to 13.
    assert_eq!(report.frames_sent, 13);
    assert!((report.input_seconds - 1.0).abs() < 1e-9);
    server.log();
}

#[derive(clap::Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Client(ClientArgs),
}

#[test]
fn cli_arguments() {
    let Command::Client(args) = Cli::try_parse_from([
        "moshid",
        "client",
        "-i",
        "a.wav",
        "--output",
        "b.wav",
        "--param",
        "seed=42",
        "--param",
        "x=a=b",
        "--realtime",
        "false",
        "--idle-timeout",
        "0.5",
    ])
    .unwrap()
    .command;
    assert_eq!(args.input, Path::new("a.wav"));
    assert_eq!(args.output, Path::new("b.wav"));
    assert_eq!(args.url, DEFAULT_URL);
    assert_eq!(
        args.params,
        vec![
            ("seed".to_string(), "42".to_string()),
            ("x".to_string(), "a=b".to_string())
        ]
    );
    assert!(!args.realtime);
    assert_eq!(args.idle_timeout, Duration::from_millis(500));
    assert_eq!(args.connect_timeout, Duration::from_secs(30));

    let Command::Client(args) =
        Cli::try_parse_from(["moshid", "client", "-i", "a.wav", "-o", "b.wav"])
            .unwrap()
            .command;
    assert!(args.realtime);
    assert!(args.params.is_empty());

    assert!(
        Cli::try_parse_from(["moshid", "client", "-i", "a", "-o", "b", "--param", "novalue"])
            .is_err()
    );
    assert!(Cli::try_parse_from([
        "moshid",
        "client",
        "-i",
        "a",
        "-o",
        "b",
        "--idle-timeout",
        "-1"
    ])
    .is_err());
}
