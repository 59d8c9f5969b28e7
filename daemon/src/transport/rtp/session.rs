//! One RTP session on the I/O core that created it: two tasks over one UDP
//! socket.
//!
//! * The **receiver** task reads datagrams and hands them to the
//!   [`Inbound`] state: RTCP is recognised and ignored, the first source of
//!   valid RTP of the expected payload type is latched (from the configured
//!   remote's IP only, when one is given) and every other source is ignored
//!   and counted, audio goes to the jitter buffer, RFC 4733 events to the
//!   DTMF detector and the event log. It is never cancelled mid-read while
//!   the session lives (a cancelled io_uring read could lose a datagram).
//! * The **clock** task (the session's own future) releases one frame per
//!   engine tick from the jitter buffer to the engine ([`ReleaseClock`]),
//!   turns the engine's answers into outgoing audio, and sends one RTP
//!   packet every `ptime` from absolute deadlines — comfort silence until
//!   the model has audio.
//!
//! Invariants: exactly one frame is released per release tick once the
//! session has latched (silence or concealment when the network gave
//! nothing), so the model is fed on schedule and the call never stalls;
//! frames in flight never exceed `session.max_frames_in_flight` (a tick at
//! the bound is counted and skipped); every buffer is made before the slot
//! is taken; whatever ends the session, its slot is released, its record
//! logged and its registry entry removed.
//!
//! The audio path a session runs on is [`MediaPath`] ([`super::media`]).
//!
//! Events: the session's [`EventSink`] (made by the control call, or here
//! for sessions made another way) gets the latching (`active`), every DTMF
//! digit and every text piece; its final record is set when the session
//! ends. Stage metrics (read once per release tick, per batch of answers
//! and per packet; no clock read while off): `decode` per released frame
//! (jitter-buffer playout with payload decoding or concealment, and the
//! resampling to 24 kHz), `encode` per 80 ms of outgoing audio (the
//! resampling of the model's frame and the payload encoding of its
//! packets), `send` per packet written to the socket.

use super::media::MediaPath;
use super::state::{Registry, RtpCounters, RtpEvent, RtpGauges, SessionHandle};
use crate::app::CoreApp;
use crate::engine::admission::Ticket;
use crate::engine::records::{FromEngine, FromEngineKind};
use crate::events::{EventSink, SessionState};
use crate::io::mailbox::Mailbox;
use crate::log_record::{LogLine, Record};
use crate::metrics::Stage;
use crate::session::record::{EndReason, SessionRecord};
use crate::{FRAME_MS, FRAME_SAMPLES};
use glommio::net::UdpSocket;
use moshid_telephony::rtp::clock::ReleaseClock;
use moshid_telephony::rtp::dtmf::DtmfDetector;
use moshid_telephony::rtp::jitter::{JitterBuffer, PacketKind};
use moshid_telephony::rtp::packet;
use moshid_telephony::rtp::sender::Outbound;
use moshid_telephony::rtp::SessionSpec;
use moshid_telephony::FrameResampler;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receive buffer; a datagram filling it is counted as oversize.
pub const RECV_BUFFER_BYTES: usize = 4096;
/// Longest the clock task sleeps without a deadline (to notice `DELETE`,
/// shutdown and inactivity).
const HOUSEKEEPING: Duration = Duration::from_millis(50);
/// How long the engine may leave a frame unanswered.
const ENGINE_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most packets sent at once when the executor woke late; beyond, packet
/// times are skipped.
const MAX_SEND_CATCH_UP: u32 = 3;

/// Receive-side state, shared by the two tasks of the session.
struct Inbound {
    jitter: JitterBuffer,
    dtmf: DtmfDetector,
    handle: Arc<SessionHandle>,
    payload_type: u8,
    dtmf_payload_type: Option<u8>,
    remote: Option<SocketAddr>,
    latched: Option<SocketAddr>,
    epoch: Instant,
    last_packet: Instant,
    hijack_attempts: u64,
    rtcp_packets: u64,
    malformed: u64,
    wrong_payload_type: u64,
    oversize: u64,
    dtmf_packets: u64,
    /// Event packets of another SSRC than the audio (not in the jitter buffer).
    dtmf_unbuffered: u64,
    dtmf_events: u64,
    recv_errors: u64,
    /// Taken at the end (the final record).
    events: Option<EventSink>,
}

/// Reports one DTMF digit to the control API's log and the event stream.
fn report_dtmf(
    handle: &SessionHandle,
    count: &mut u64,
    events: Option<&mut EventSink>,
    e: moshid_telephony::rtp::dtmf::DtmfEvent,
) {
    *count += 1;
    if let Some(events) = events {
        let digit = if e.digit.is_ascii() {
            e.digit as u8
        } else {
            b'?'
        };
        events.dtmf(digit, e.duration_ms);
    }
    handle.push_event(RtpEvent::Dtmf(e));
}

impl Inbound {
    fn on_datagram(&mut self, data: &[u8], src: SocketAddr) {
        let now = Instant::now();
        if data.len() >= RECV_BUFFER_BYTES {
            self.oversize += 1;
            return;
        }
        if packet::is_rtcp(data) {
            // RTCP (muxed, or a peer's RTCP sent to this port) is ignored.
            self.rtcp_packets += 1;
            return;
        }
        let Ok(pkt) = packet::parse(data) else {
            self.malformed += 1;
            return;
        };
        match self.latched {
            Some(s) if s != src => {
                self.hijack_attempts += 1;
                return;
            }
            Some(_) => {}
            None => {
                if self.remote.is_some_and(|r| r.ip() != src.ip()) {
                    self.hijack_attempts += 1;
                    return;
                }
                if pkt.payload_type != self.payload_type {
                    self.wrong_payload_type += 1;
                    return;
                }
                self.latched = Some(src);
                self.handle.set_latched(src);
                if let Some(events) = self.events.as_mut() {
                    events.state(SessionState::Active);
                }
            }
        }
        self.last_packet = now;
        let arrival = (now - self.epoch).as_secs_f64();
        if pkt.payload_type == self.payload_type {
            let before = self.jitter.stats().ssrc_changes;
            self.jitter.insert(&pkt, PacketKind::Audio, arrival);
            if self.jitter.stats().ssrc_changes != before {
                self.handle
                    .push_event(RtpEvent::SsrcChanged { ssrc: pkt.ssrc });
                let (handle, count, events) =
                    (&self.handle, &mut self.dtmf_events, &mut self.events);
                self.dtmf
                    .restart(|e| report_dtmf(handle, count, events.as_mut(), e));
            }
        } else if Some(pkt.payload_type) == self.dtmf_payload_type {
            self.dtmf_packets += 1;
            // Events share the audio's sequence numbers (RFC 4733 §2.1):
            // the jitter buffer must not mistake them for lost audio.
            if self.jitter.ssrc() == Some(pkt.ssrc) {
                self.jitter.insert(&pkt, PacketKind::NoAudio, arrival);
            } else {
                self.dtmf_unbuffered += 1;
            }
            let (handle, count, events) = (&self.handle, &mut self.dtmf_events, &mut self.events);
            let r = self.dtmf.on_packet(pkt.timestamp, pkt.payload, |e| {
                report_dtmf(handle, count, events.as_mut(), e)
            });
            if r.is_err() {
                self.malformed += 1;
            }
        } else {
            self.wrong_payload_type += 1;
        }
    }
}

/// Reads datagrams until cancelled.
async fn receive_loop(socket: Rc<UdpSocket>, inbound: Rc<RefCell<Inbound>>) {
    let mut buf = vec![0u8; RECV_BUFFER_BYTES];
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((n, src)) => inbound.borrow_mut().on_datagram(&buf[..n], src),
            Err(_) => {
                inbound.borrow_mut().recv_errors += 1;
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Clock-side counters.
#[derive(Default)]
struct ClockCounters {
    release_ticks: u64,
    missed_release_deadlines: u64,
    frames_to_engine: u64,
    frames_answered: u64,
    engine_outputs: u64,
    engine_no_output: u64,
    engine_dropped: u64,
    lane_full: u64,
    backlog_skips: u64,
    send_errors: u64,
    packets_sent: u64,
}

struct Session {
    app: CoreApp,
    registry: Arc<Registry>,
    handle: Arc<SessionHandle>,
    spec: SessionSpec,
    socket: Rc<UdpSocket>,
    inbound: Rc<RefCell<Inbound>>,
    ticket: Ticket,
    mailbox: Rc<Mailbox>,
    rec: SessionRecord,
    res_in: FrameResampler,
    res_out: FrameResampler,
    outbound: Outbound,
    frame_media: Vec<f32>,
    frame24: Box<[f32; FRAME_SAMPLES]>,
    out_media: Vec<f32>,
    record: Box<FromEngine>,
    clock: Option<ReleaseClock>,
    next_send: Option<Instant>,
    ptime: Duration,
    in_flight: usize,
    /// When each frame in flight was released (oldest at `released_head`).
    released_at: Vec<Instant>,
    released_head: usize,
    /// Smoothed release-to-answer time, in milliseconds.
    engine_wait_ms: f64,
    last_progress: Instant,
    c: ClockCounters,
    /// Encoding time of the outgoing audio not yet recorded (stage metrics),
    /// and the packets it covers.
    encode_unrecorded: Duration,
    encode_packets: u32,
    /// The audio paths' counters before the last media switch.
    media_carried: RtpCounters,
}

/// Everything a session needs, made by the control handler.
pub struct NewSession {
    /// The control API's view.
    pub handle: Arc<SessionHandle>,
    /// The bound socket.
    pub socket: UdpSocket,
    /// What was asked.
    pub spec: SessionSpec,
    /// The audio path.
    pub media: MediaPath,
    /// The admitted slot.
    pub ticket: Ticket,
    /// Its mailbox.
    pub mailbox: Rc<Mailbox>,
    /// The session's record.
    pub rec: SessionRecord,
    /// The registry the session is listed in (left at its end).
    pub registry: Arc<Registry>,
}

/// Runs a session to its end.
pub async fn run(new: NewSession, app: CoreApp) {
    let NewSession {
        handle,
        socket,
        spec,
        media,
        ticket,
        mailbox,
        rec,
        registry,
    } = new;
    let now = Instant::now();
    let events = handle.take_events().unwrap_or_else(|| {
        app.shared.events.open(
            &rec,
            None,
            app.ctx.core,
            SessionState::Waiting,
            crate::events::webhook::default_for(&app.shared.config),
        )
    });
    let frame_media = media.jitter.frame_samples();
    let inbound = Rc::new(RefCell::new(Inbound {
        jitter: media.jitter,
        dtmf: DtmfDetector::new(spec.codec.rtp_clock_hz()),
        handle: handle.clone(),
        payload_type: spec.payload_type,
        dtmf_payload_type: spec.dtmf_payload_type,
        remote: spec.remote,
        latched: None,
        epoch: now,
        last_packet: now,
        hijack_attempts: 0,
        rtcp_packets: 0,
        malformed: 0,
        wrong_payload_type: 0,
        oversize: 0,
        dtmf_packets: 0,
        dtmf_unbuffered: 0,
        dtmf_events: 0,
        recv_errors: 0,
        events: Some(events),
    }));
    let socket = Rc::new(socket);
    let receiver = glommio::spawn_local(receive_loop(socket.clone(), inbound.clone()));
    let out_frame = media.res_out.out_frame();
    // The release ring holds every frame that may be in flight.
    let app_in_flight = app.shared.config.session.max_frames_in_flight.max(1);
    let mut s = Session {
        registry,
        app,
        handle,
        spec,
        socket,
        inbound,
        ticket,
        mailbox,
        rec,
        res_in: media.res_in,
        res_out: media.res_out,
        outbound: media.outbound,
        frame_media: vec![0.0; frame_media],
        frame24: Box::new([0.0; FRAME_SAMPLES]),
        out_media: vec![0.0; out_frame],
        record: Box::default(),
        clock: None,
        next_send: None,
        ptime: Duration::from_millis(spec.ptime_ms as u64),
        in_flight: 0,
        released_at: vec![now; app_in_flight],
        released_head: 0,
        engine_wait_ms: 0.0,
        last_progress: now,
        c: ClockCounters::default(),
        encode_unrecorded: Duration::ZERO,
        encode_packets: 0,
        media_carried: RtpCounters::default(),
    };
    let reason = s.serve().await;
    receiver.cancel().await;
    s.finish(reason);
}

impl Session {
    async fn serve(&mut self) -> EndReason {
        let cfg = &self.app.shared.config;
        let inactivity = Duration::from_millis(cfg.rtp.inactivity_timeout_ms);
        let max_secs = cfg.session.max_session_seconds;
        let max_in_flight = cfg.session.max_frames_in_flight;
        let mut was_paused = false;
        loop {
            if self.handle.stop_requested() {
                return EndReason::ClientClosed;
            }
            if let Some(spec) = self.handle.take_media_change() {
                self.switch_media(spec);
            }
            if self.mailbox.shutdown_requested() {
                return EndReason::ServerShutdown;
            }
            if max_secs > 0 && self.rec.elapsed_secs() > max_secs as f64 {
                return EndReason::MaxDuration;
            }
            let paused = self.handle.send_paused();
            if paused != was_paused {
                // Off hold: the peer may have sent nothing meanwhile.
                self.inbound.borrow_mut().last_packet = Instant::now();
                self.next_send = None;
                was_paused = paused;
            }
            let (latched, last_packet) = {
                let i = self.inbound.borrow();
                (i.latched, i.last_packet)
            };
            if !paused && last_packet.elapsed() > inactivity {
                return EndReason::IdleTimeout;
            }
            if let Some(reason) = self.pump_outputs() {
                return reason;
            }
            if self.in_flight > 0 && self.last_progress.elapsed() > ENGINE_ANSWER_TIMEOUT {
                return EndReason::EngineStalled;
            }
            let now = Instant::now();
            if self.clock.is_none() && latched.is_some() {
                self.clock = Some(ReleaseClock::new(now));
            }
            if let Some(clock) = self.clock.as_mut() {
                if now >= clock.next() {
                    self.c.missed_release_deadlines += clock.advance(now);
                    self.release(max_in_flight, now);
                }
            }
            let dest = self.spec.remote.or(latched).filter(|_| !paused);
            if let Some(dest) = dest {
                let due = *self.next_send.get_or_insert(now);
                if now >= due {
                    self.send_due(dest, due, now).await;
                }
            }
            self.publish();
            let mut wake = now + HOUSEKEEPING;
            if let Some(c) = &self.clock {
                wake = wake.min(c.next());
            }
            if let Some(t) = self.next_send.filter(|_| !paused) {
                wake = wake.min(t);
            }
            let now = Instant::now();
            if wake > now {
                let mailbox = self.mailbox.clone();
                futures_lite::future::or(glommio::timer::sleep(wake - now), async move {
                    mailbox.ready().await;
                })
                .await;
            }
        }
    }

    /// Carries on with `spec` (a SIP re-INVITE changed the codec or the
    /// far end): a new audio path at the next frame boundary — jitter
    /// buffer, resamplers, payload types, a new outgoing stream (new SSRC)
    /// — and, for a new far end, a new latch. The model's slot, its
    /// state and the release clock go on untouched. Allocates (a rare
    /// control-plane event, not per frame).
    fn switch_media(&mut self, spec: SessionSpec) {
        let cfg = &self.app.shared.config.rtp;
        let media = match MediaPath::configured(&spec, cfg) {
            Ok(m) => m,
            Err(e) => {
                // The SIP side checked the spec before answering; keep the
                // old path rather than end the call.
                eprintln!(
                    "<4>rtp session {}: cannot switch to {}: {e}",
                    self.handle.id,
                    spec.codec.name()
                );
                return;
            }
        };
        // The counters of the path being replaced carry over.
        let before = self.media_counters(&self.inbound.borrow());
        self.media_carried = self.media_carried.plus(&before);
        {
            let mut i = self.inbound.borrow_mut();
            let i = &mut *i;
            let (handle, count, events) = (&i.handle, &mut i.dtmf_events, &mut i.events);
            i.dtmf
                .flush(|e| report_dtmf(handle, count, events.as_mut(), e));
            i.dtmf = DtmfDetector::new(spec.codec.rtp_clock_hz());
            i.jitter = media.jitter;
            i.payload_type = spec.payload_type;
            i.dtmf_payload_type = spec.dtmf_payload_type;
            if spec.remote.is_some() && spec.remote != i.remote {
                i.remote = spec.remote;
                i.latched = None;
            }
            self.frame_media = vec![0.0; i.jitter.frame_samples()];
        }
        self.out_media = vec![0.0; media.res_out.out_frame()];
        self.res_in = media.res_in;
        self.res_out = media.res_out;
        self.outbound = media.outbound;
        self.ptime = Duration::from_millis(spec.ptime_ms as u64);
        self.next_send = None;
        if spec.remote.is_some() {
            self.spec.remote = spec.remote;
        }
        self.spec = SessionSpec {
            remote: self.spec.remote,
            ..spec
        };
        self.handle.push_event(RtpEvent::MediaChanged {
            codec: spec.codec.name(),
            payload_type: spec.payload_type,
            remote: self.spec.remote.map(|r| r.to_string()),
        });
        LogLine::new(Record::RtpSessionMedia)
            .field("id", &self.handle.id)
            .field("codec", spec.codec.name())
            .field("pt", spec.payload_type)
            .field("ptime_ms", spec.ptime_ms)
            .opt("remote", self.spec.remote)
            .emit();
    }

    /// Sends the packets due since `due` (at most a few; further packet
    /// times are skipped so that the stream stays in step with the clock).
    async fn send_due(&mut self, dest: SocketAddr, mut due: Instant, now: Instant) {
        let mut sent = 0;
        let metrics_on = self.app.ctx.metrics_on();
        if !metrics_on {
            (self.encode_unrecorded, self.encode_packets) = (Duration::ZERO, 0);
        }
        let packets_per_frame = (FRAME_MS as u32 / self.spec.ptime_ms).max(1);
        while due <= now && sent < MAX_SEND_CATCH_UP {
            let t = metrics_on.then(Instant::now);
            let pkt = self.outbound.next_packet();
            let t = t.map(|t| {
                let encoded = Instant::now();
                self.encode_unrecorded += encoded - t;
                encoded
            });
            let result = self.socket.send_to(pkt, dest).await;
            if let Some(t) = t {
                let stages = &self.app.ctx.stages;
                stages.record(Stage::Send, t.elapsed());
                self.encode_packets += 1;
                if self.encode_packets >= packets_per_frame {
                    stages.record(Stage::Encode, self.encode_unrecorded);
                    (self.encode_unrecorded, self.encode_packets) = (Duration::ZERO, 0);
                }
            }
            if result.is_err() {
                self.c.send_errors += 1;
            } else {
                self.c.packets_sent += 1;
            }
            due += self.ptime;
            sent += 1;
        }
        if due <= now {
            let behind = ((now - due).as_nanos() / self.ptime.as_nanos()) as u32 + 1;
            self.outbound.skip(behind);
            due += self.ptime * behind;
        }
        self.next_send = Some(due);
    }

    /// Releases one frame from the jitter buffer to the engine.
    fn release(&mut self, max_in_flight: usize, now: Instant) {
        self.c.release_ticks += 1;
        let metrics_on = self.app.ctx.metrics_on();
        let t = metrics_on.then(Instant::now);
        self.inbound.borrow_mut().jitter.pull(&mut self.frame_media);
        self.res_in
            .process(&self.frame_media, &mut self.frame24[..]);
        if let Some(t) = t {
            self.app.ctx.stages.record(Stage::Decode, t.elapsed());
        }
        if self.in_flight >= max_in_flight {
            self.c.backlog_skips += 1;
            return;
        }
        let pushed_at = metrics_on.then(Instant::now);
        match self
            .app
            .ctx
            .send_frame_at(self.ticket, &self.frame24, pushed_at)
        {
            Ok(()) => {
                if self.in_flight == 0 {
                    self.last_progress = now;
                }
                let n = self.released_at.len();
                self.released_at[(self.released_head + self.in_flight) % n] = now;
                self.in_flight += 1;
                self.c.frames_to_engine += 1;
                self.rec.frames_in += 1;
            }
            Err(_) => {
                self.c.lane_full += 1;
                self.rec.frames_dropped += 1;
            }
        }
    }

    /// Takes the engine's answers; `Some` ends the session.
    fn pump_outputs(&mut self) -> Option<EndReason> {
        let mut now = None;
        let mut metrics_on = None;
        while self.mailbox.take(&mut self.record) {
            if self.record.kind == FromEngineKind::PromptReady {
                // Answers no frame: the prompt ran before the first frames.
                continue;
            }
            let t = *now.get_or_insert_with(Instant::now);
            if self.in_flight > 0 {
                let released = self.released_at[self.released_head];
                self.released_head = (self.released_head + 1) % self.released_at.len();
                let wait_ms = t.saturating_duration_since(released).as_secs_f64() * 1000.0;
                self.engine_wait_ms += (wait_ms - self.engine_wait_ms) / 8.0;
            }
            self.in_flight = self.in_flight.saturating_sub(1);
            self.last_progress = t;
            self.c.frames_answered += 1;
            if self.record.late {
                self.rec.late_frames += 1;
            }
            match self.record.kind {
                FromEngineKind::Fault => return Some(EndReason::ModelFault),
                FromEngineKind::Dropped => {
                    self.c.engine_dropped += 1;
                    self.rec.frames_dropped += 1;
                    continue;
                }
                FromEngineKind::NoOutputYet => self.c.engine_no_output += 1,
                FromEngineKind::PromptReady => {}
                FromEngineKind::Output => {
                    self.c.engine_outputs += 1;
                    self.rec.frames_out += 1;
                    self.rec.text_tokens += 1;
                    let on = *metrics_on.get_or_insert_with(|| self.app.ctx.metrics_on());
                    let t = on.then(Instant::now);
                    self.res_out.process(&self.record.pcm, &mut self.out_media);
                    self.outbound.push_audio(&self.out_media);
                    if let Some(t) = t {
                        self.encode_unrecorded += t.elapsed();
                    }
                    let token = self.record.text_token;
                    if let Some(piece) = self.app.shared.pieces.text_for_token(token) {
                        if let Some(events) = self.inbound.borrow_mut().events.as_mut() {
                            events.text(self.rec.frames_out - 1, token, piece);
                        }
                    }
                }
            }
            // Stepped answers come right after the group's tick: phase-lock.
            if let Some(clock) = self.clock.as_mut() {
                let engine = &self.app.ctx.engine;
                let batch = engine.open_slots.load(Ordering::Relaxed).max(1) as usize;
                let step =
                    Duration::from_secs_f64(engine.step_times.predict_ms(batch).max(0.0) / 1000.0);
                clock.observe(t, step, self.in_flight);
            }
        }
        None
    }

    /// The counters kept by the audio path (jitter buffer, outgoing
    /// stream), which a media switch replaces: carried over then.
    fn media_counters(&self, i: &Inbound) -> RtpCounters {
        let j = i.jitter.stats();
        let o = self.outbound.stats();
        let media_hz = self.spec.codec.media_rate_hz() as u64;
        RtpCounters {
            received: j.received,
            lost: j.lost,
            late: j.late,
            duplicate: j.duplicate,
            reordered: j.reordered,
            concealed: j.concealed,
            concealed_ms: j.concealed_samples * 1000 / media_hz,
            oversize: j.oversize,
            ssrc_changes: j.ssrc_changes,
            resyncs: j.resyncs,
            seq_jumps: j.seq_jumps,
            underruns: j.underruns,
            overflow: j.overflow,
            decode_errors: j.decode_errors,
            dropped_ms: j.dropped_samples * 1000 / media_hz,
            buffering_frames: j.buffering_frames,
            comfort_silence_packets: o.comfort_silence,
            output_underruns: o.underruns,
            output_overflow_samples: o.overflow_samples,
            ..RtpCounters::default()
        }
    }

    fn counters(&self) -> (RtpCounters, RtpGauges) {
        let i = self.inbound.borrow();
        let media = self.media_counters(&i).plus(&self.media_carried);
        let c = RtpCounters {
            received: media.received + i.dtmf_unbuffered,
            hijack_attempts: i.hijack_attempts,
            rtcp_packets: i.rtcp_packets,
            malformed: i.malformed,
            wrong_payload_type: i.wrong_payload_type,
            oversize: i.oversize + media.oversize,
            dtmf_packets: i.dtmf_packets,
            dtmf_events: i.dtmf_events,
            release_ticks: self.c.release_ticks,
            missed_release_deadlines: self.c.missed_release_deadlines,
            frames_to_engine: self.c.frames_to_engine,
            frames_answered: self.c.frames_answered,
            engine_outputs: self.c.engine_outputs,
            engine_no_output: self.c.engine_no_output,
            engine_dropped: self.c.engine_dropped,
            lane_full: self.c.lane_full,
            backlog_skips: self.c.backlog_skips,
            packets_sent: self.c.packets_sent,
            send_errors: self.c.send_errors,
            recv_errors: i.recv_errors,
            ..media
        };
        let g = RtpGauges {
            jitter_ms: i.jitter.jitter_ms(),
            target_depth_ms: i.jitter.target_ms(),
            depth_ms: i.jitter.level_ms(),
            in_flight: self.in_flight as u64,
            engine_wait_ms: self.engine_wait_ms,
        };
        (c, g)
    }

    fn publish(&self) {
        let (c, g) = self.counters();
        self.handle.publish(&c, &g);
    }

    /// Ends the session: events flushed, record kept for `DELETE`, registry
    /// entry removed, slot released, log written.
    fn finish(mut self, reason: EndReason) {
        {
            let mut i = self.inbound.borrow_mut();
            let i = &mut *i;
            let (handle, count, events) = (&i.handle, &mut i.dtmf_events, &mut i.events);
            i.dtmf
                .flush(|e| report_dtmf(handle, count, events.as_mut(), e));
        }
        self.rec.end(reason);
        if let Some(events) = self.inbound.borrow_mut().events.take() {
            events.finish(&self.rec);
        }
        self.publish();
        let (c, _) = self.counters();
        self.handle
            .set_ended(serde_json::json!({ "record": self.rec, "counters": c }));
        self.registry.remove(&self.handle.id);
        self.app.ctx.end_session(self.ticket);
        self.rec.log();
        LogLine::new(Record::RtpSessionEnd)
            .field("id", &self.handle.id)
            .field("codec", self.spec.codec.name())
            .field("received", c.received)
            .field("wrong_payload_type", c.wrong_payload_type)
            .field("lost", c.lost)
            .field("late", c.late)
            .field("duplicate", c.duplicate)
            .field("reordered", c.reordered)
            .field("concealed_ms", c.concealed_ms)
            .field("hijack_attempts", c.hijack_attempts)
            .field("dtmf_events", c.dtmf_events)
            .field("release_ticks", c.release_ticks)
            .field("frames_to_engine", c.frames_to_engine)
            .field("packets_sent", c.packets_sent)
            .emit();
    }
}

/// Binds a session's socket.
pub fn bind(ip: std::net::IpAddr) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(|e| std::io::Error::other(e.to_string()))
}
