//! What the control API can see of an RTP session from any I/O core: its
//! fixed description, counters, gauges, event log and stop flag, behind an
//! `Arc` held by the session and by the daemon's [`Registry`].
//!
//! The session task is the only writer. It keeps its counters in plain
//! integers and publishes them here (relaxed atomic stores) once per send
//! or release tick, so reading them costs the data path nothing; events
//! (rare: latching, SSRC changes, DTMF) go through a mutex.
//!
//! Invariants: the event log is bounded ([`EVENT_LOG_CAPACITY`] entries,
//! oldest dropped and counted); a session is in the registry from its
//! creation until its task ends — the registry holds no ended session, so
//! it empties with the sessions.

use moshid_telephony::rtp::dtmf::DtmfEvent;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Events kept per session (the newest; older ones are dropped and counted).
pub const EVENT_LOG_CAPACITY: usize = 64;

macro_rules! counters {
    ($($(#[doc = $d:literal])+ $name:ident,)*) => {
        /// A session's counters (only ever grow).
        #[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
        pub struct RtpCounters {
            $($(#[doc = $d])+ pub $name: u64,)*
        }

        impl RtpCounters {
            /// Field by field, `self` + `other`.
            pub fn plus(&self, other: &RtpCounters) -> RtpCounters {
                RtpCounters { $($name: self.$name + other.$name,)* }
            }
        }

        /// [`RtpCounters`] readable from any thread.
        #[derive(Debug, Default)]
        pub struct AtomicCounters {
            $($name: AtomicU64,)*
        }

        impl AtomicCounters {
            /// Publishes a snapshot (single writer).
            pub fn store(&self, c: &RtpCounters) {
                $(self.$name.store(c.$name, Ordering::Relaxed);)*
            }

            /// Reads the last snapshot.
            pub fn load(&self) -> RtpCounters {
                RtpCounters { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// RTP packets of the latched stream received (audio and events).
    received,
    /// Packets never received by their playout time.
    lost,
    /// Packets that arrived after their playout time (dropped).
    late,
    /// Packets received twice (dropped).
    duplicate,
    /// Packets that arrived after a newer one.
    reordered,
    /// Concealment episodes.
    concealed,
    /// Audio synthesised by concealment, in milliseconds.
    concealed_ms,
    /// Packets from sources other than the latched one (ignored).
    hijack_attempts,
    /// RTCP packets (recognised, ignored).
    rtcp_packets,
    /// Datagrams that are not valid RTP.
    malformed,
    /// RTP packets of a payload type this session does not use.
    wrong_payload_type,
    /// Packets too long to buffer.
    oversize,
    /// SSRC changes (each resyncs the jitter buffer).
    ssrc_changes,
    /// Timeline resyncs (sequence restarts, long pauses, overflow).
    resyncs,
    /// Unconfirmed sequence-number jumps ignored.
    seq_jumps,
    /// Times the jitter buffer ran dry while playing.
    underruns,
    /// Packets the jitter buffer could not hold.
    overflow,
    /// Payloads the decoder refused.
    decode_errors,
    /// Audio dropped to bring the jitter buffer back to its target, in ms.
    dropped_ms,
    /// Frames released while (re)buffering.
    buffering_frames,
    /// RFC 4733 packets received.
    dtmf_packets,
    /// DTMF digits reported.
    dtmf_events,
    /// Frame-release ticks (one per engine tick of the session's group).
    release_ticks,
    /// Release deadlines the executor woke too late for (skipped).
    missed_release_deadlines,
    /// Frames sent to the engine.
    frames_to_engine,
    /// Engine answers received (one per frame sent).
    frames_answered,
    /// Answers with model audio.
    engine_outputs,
    /// Answers without output yet (the model's delay).
    engine_no_output,
    /// Frames the engine dropped (its queue for the slot was full).
    engine_dropped,
    /// Frames not sent because the lane to the engine was full.
    lane_full,
    /// Release ticks skipped because too many frames were in flight.
    backlog_skips,
    /// RTP packets sent.
    packets_sent,
    /// Packets of comfort silence sent (before the model speaks, underruns).
    comfort_silence_packets,
    /// Times the outgoing audio ran dry while talking.
    output_underruns,
    /// Outgoing audio dropped because its queue was full, in samples.
    output_overflow_samples,
    /// Send failures.
    send_errors,
    /// Receive failures other than timeouts.
    recv_errors,
}

/// Values that go up and down.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct RtpGauges {
    /// RFC 3550 interarrival jitter, in milliseconds.
    pub jitter_ms: f64,
    /// Jitter buffer target depth, in milliseconds.
    pub target_depth_ms: f64,
    /// Audio buffered after the last release, in milliseconds.
    pub depth_ms: f64,
    /// Frames sent to the engine and not answered yet.
    pub in_flight: u64,
    /// Smoothed time from a frame's release to the engine's answer, in
    /// milliseconds: the release lead before the group's tick plus the
    /// model step (about 10 ms plus the step when phase-locked).
    pub engine_wait_ms: f64,
}

#[derive(Debug, Default)]
struct AtomicGauges {
    jitter_ms: AtomicU64,
    target_depth_ms: AtomicU64,
    depth_ms: AtomicU64,
    in_flight: AtomicU64,
    engine_wait_ms: AtomicU64,
}

/// Session life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// No valid RTP yet.
    Waiting,
    /// Latched onto a source.
    Active,
    /// Ended.
    Ended,
}

/// Something that happened in a session.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RtpEvent {
    /// The session latched onto its source.
    Latched {
        /// `ip:port` of the source.
        source: String,
    },
    /// A new synchronisation source (the jitter buffer resynced).
    SsrcChanged {
        /// The new SSRC.
        ssrc: u32,
    },
    /// A DTMF digit ended.
    Dtmf(DtmfEvent),
    /// The codec or the far end's address changed (a SIP re-INVITE).
    MediaChanged {
        /// The codec now.
        codec: &'static str,
        /// Its payload type.
        payload_type: u8,
        /// Where RTP goes now, if known.
        remote: Option<String>,
    },
}

/// An event with its place in the session.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedEvent {
    /// Counts every event of the session from 0.
    pub index: u64,
    /// Milliseconds since the session was created.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: RtpEvent,
}

/// The fixed description of a session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    /// Codec name.
    pub codec: &'static str,
    /// Payload type of audio.
    pub payload_type: u8,
    /// The codec's sample rate.
    pub sample_rate: u32,
    /// Packet duration sent, in milliseconds.
    pub ptime_ms: u32,
    /// Payload type of RFC 4733 events, if any.
    pub dtmf_payload_type: Option<u8>,
    /// Address RTP should be sent to.
    pub address: String,
    /// Its port.
    pub port: u16,
    /// The configured remote (`ip:port`), if any.
    pub remote: Option<String>,
    /// The I/O core running the session.
    pub core: usize,
    /// Delay of the inbound resampler, in milliseconds.
    pub resample_in_ms: f64,
    /// Delay of the outbound resampler, in milliseconds.
    pub resample_out_ms: f64,
}

#[derive(Debug, Default)]
struct Mutable {
    latched: Option<SocketAddr>,
    events: VecDeque<LoggedEvent>,
    events_total: u64,
    end: Option<serde_json::Value>,
}

/// A session as the control API sees it.
pub struct SessionHandle {
    /// The API id.
    pub id: String,
    /// Its description.
    pub info: SessionInfo,
    created: Instant,
    stop: AtomicBool,
    /// On hold (SIP re-INVITE `sendonly`/`inactive`): send nothing, and no
    /// inactivity timeout.
    send_paused: AtomicBool,
    state: AtomicU8,
    counters: AtomicCounters,
    gauges: AtomicGauges,
    mutable: Mutex<Mutable>,
    /// The session's event sink, from its creation until its task takes it.
    events: Mutex<Option<crate::events::EventSink>>,
    /// A codec or address change asked for (SIP re-INVITE), taken by the
    /// session's task at its next turn; `media_change_pending` says so
    /// without the lock, so the task's loop reads one atomic per turn.
    media_change: Mutex<Option<moshid_telephony::rtp::SessionSpec>>,
    media_change_pending: AtomicBool,
}

impl SessionHandle {
    /// A handle for a session created now.
    pub fn new(id: String, info: SessionInfo) -> Self {
        SessionHandle {
            id,
            info,
            created: Instant::now(),
            stop: AtomicBool::new(false),
            send_paused: AtomicBool::new(false),
            state: AtomicU8::new(0),
            counters: AtomicCounters::default(),
            gauges: AtomicGauges::default(),
            mutable: Mutex::new(Mutable {
                events: VecDeque::with_capacity(EVENT_LOG_CAPACITY),
                ..Mutable::default()
            }),
            events: Mutex::new(None),
            media_change: Mutex::new(None),
            media_change_pending: AtomicBool::new(false),
        }
    }

    /// Asks the session to carry on with `spec` (another codec, payload
    /// types or far end); the latest request wins.
    pub fn request_media_change(&self, spec: moshid_telephony::rtp::SessionSpec) {
        *self.media_change.lock().unwrap_or_else(|p| p.into_inner()) = Some(spec);
        self.media_change_pending.store(true, Ordering::Release);
    }

    /// The change asked for, once (the session's task).
    pub fn take_media_change(&self) -> Option<moshid_telephony::rtp::SessionSpec> {
        // A plain load first: the task asks on every turn, and a change is rare.
        if !self.media_change_pending.load(Ordering::Acquire)
            || !self.media_change_pending.swap(false, Ordering::AcqRel)
        {
            return None;
        }
        self.media_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Hands the session's event sink (registered before the session's id
    /// is given out) to its task.
    pub fn attach_events(&self, sink: crate::events::EventSink) {
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// The event sink attached at creation, once (the task takes it).
    pub fn take_events(&self) -> Option<crate::events::EventSink> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn lock(&self) -> MutexGuard<'_, Mutable> {
        self.mutable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the session to end (`DELETE`).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether `DELETE` asked the session to end.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Puts the session on hold (nothing sent, no inactivity timeout) or
    /// takes it off.
    pub fn set_send_paused(&self, paused: bool) {
        self.send_paused.store(paused, Ordering::Release);
    }

    /// Whether the session is on hold.
    pub fn send_paused(&self) -> bool {
        self.send_paused.load(Ordering::Acquire)
    }

    /// The session's state.
    pub fn state(&self) -> SessionState {
        match self.state.load(Ordering::Acquire) {
            0 => SessionState::Waiting,
            1 => SessionState::Active,
            _ => SessionState::Ended,
        }
    }

    /// Records the latched source.
    pub fn set_latched(&self, source: SocketAddr) {
        self.lock().latched = Some(source);
        self.state.store(1, Ordering::Release);
        self.push_event(RtpEvent::Latched {
            source: source.to_string(),
        });
    }

    /// Appends an event (the oldest is dropped beyond the capacity).
    pub fn push_event(&self, event: RtpEvent) {
        let at_ms = self.created.elapsed().as_millis() as u64;
        let mut m = self.lock();
        if m.events.len() == EVENT_LOG_CAPACITY {
            m.events.pop_front();
        }
        let index = m.events_total;
        m.events.push_back(LoggedEvent {
            index,
            at_ms,
            event,
        });
        m.events_total += 1;
    }

    /// Publishes the counters and gauges.
    pub fn publish(&self, c: &RtpCounters, g: &RtpGauges) {
        self.counters.store(c);
        self.gauges
            .jitter_ms
            .store(g.jitter_ms.to_bits(), Ordering::Relaxed);
        self.gauges
            .target_depth_ms
            .store(g.target_depth_ms.to_bits(), Ordering::Relaxed);
        self.gauges
            .depth_ms
            .store(g.depth_ms.to_bits(), Ordering::Relaxed);
        self.gauges.in_flight.store(g.in_flight, Ordering::Relaxed);
        self.gauges
            .engine_wait_ms
            .store(g.engine_wait_ms.to_bits(), Ordering::Relaxed);
    }

    /// The last published counters.
    pub fn counters(&self) -> RtpCounters {
        self.counters.load()
    }

    fn gauges(&self) -> RtpGauges {
        let f = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        RtpGauges {
            jitter_ms: f(&self.gauges.jitter_ms),
            target_depth_ms: f(&self.gauges.target_depth_ms),
            depth_ms: f(&self.gauges.depth_ms),
            in_flight: self.gauges.in_flight.load(Ordering::Relaxed),
            engine_wait_ms: f(&self.gauges.engine_wait_ms),
        }
    }

    /// Marks the session ended with its final record (JSON).
    pub fn set_ended(&self, record: serde_json::Value) {
        self.lock().end = Some(record);
        self.state.store(2, Ordering::Release);
    }

    /// Everything the events endpoint answers.
    pub fn to_json(&self) -> serde_json::Value {
        let m = self.lock();
        let events: Vec<&LoggedEvent> = m.events.iter().collect();
        serde_json::json!({
            "id": self.id,
            "state": self.state(),
            "info": self.info,
            "latched_source": m.latched.map(|a| a.to_string()),
            "counters": self.counters(),
            "gauges": self.gauges(),
            "events": events,
            "events_total": m.events_total,
            "events_dropped": m.events_total - m.events.len() as u64,
            "event_log_capacity": EVENT_LOG_CAPACITY,
            "session": m.end,
        })
    }
}

/// The daemon's RTP sessions by id, for the control API on every core.
#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, Arc<SessionHandle>>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<SessionHandle>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a session unless `max` are live; false when full.
    pub fn insert(&self, handle: Arc<SessionHandle>, max: usize) -> bool {
        let mut s = self.lock();
        if s.len() >= max {
            return false;
        }
        s.insert(handle.id.clone(), handle);
        true
    }

    /// Looks a session up.
    pub fn get(&self, id: &str) -> Option<Arc<SessionHandle>> {
        self.lock().get(id).cloned()
    }

    /// Removes a session (its task ended).
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Ids and states of the live sessions.
    pub fn list(&self) -> Vec<(String, SessionState)> {
        let mut v: Vec<_> = self
            .lock()
            .values()
            .map(|h| (h.id.clone(), h.state()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> SessionInfo {
        SessionInfo {
            codec: "PCMU",
            payload_type: 0,
            sample_rate: 8000,
            ptime_ms: 20,
            dtmf_payload_type: Some(101),
            address: "127.0.0.1".into(),
            port: 4000,
            remote: None,
            core: 0,
            resample_in_ms: 10.0,
            resample_out_ms: 10.0,
        }
    }

    #[test]
    fn event_log_is_bounded_and_counts_drops() {
        let h = SessionHandle::new("1".into(), info());
        for i in 0..100u32 {
            h.push_event(RtpEvent::SsrcChanged { ssrc: i });
        }
        let j = h.to_json();
        assert_eq!(j["events"].as_array().unwrap().len(), EVENT_LOG_CAPACITY);
        assert_eq!(j["events_dropped"], 36);
        assert_eq!(j["events"][0]["index"], 36);
        assert_eq!(j["events"][0]["kind"], "ssrc_changed");
        assert_eq!(j["state"], "waiting");
    }

    #[test]
    fn registry_bounds_and_empties() {
        let r = Registry::default();
        assert!(r.insert(Arc::new(SessionHandle::new("a".into(), info())), 1));
        assert!(!r.insert(Arc::new(SessionHandle::new("b".into(), info())), 1));
        assert!(r.get("a").is_some());
        r.remove("a");
        assert!(r.is_empty());
    }
}
