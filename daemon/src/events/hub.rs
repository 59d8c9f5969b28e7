//! The daemon's live sessions as event sources: each session's
//! [`Channel`] (its ring, state and final record), the session's writing
//! end ([`EventSink`]) and the subscribers' reading ends
//! ([`Subscription`]).
//!
//! A session lives on one I/O core; its subscribers may be on any. They
//! share only the session's `Arc<Channel>`: the session writes its ring
//! (no lock, never waits), each subscriber reads it with its own cursor
//! and is woken by the core it is on ([`super::relay`]), never by the
//! session. The registry's mutex is taken when a session starts or ends and
//! when a subscription is made — never per frame.
//!
//! Invariants:
//! * A session is in the registry from its [`EventHub::open`] until its
//!   sink is dropped (finished or not): the registry and the alias table
//!   hold live sessions only and empty with them.
//! * Subscribers are bounded per session and per daemon; a subscription's
//!   place is given back when it is dropped.
//! * The final record is set once, before the channel reads as ended.
//! * The sink's buffers (text, DTMF digits) are allocated when the session
//!   opens, never grown: text beyond `events.max_text_bytes` is streamed
//!   but not kept (`text_truncated`).

use super::event::{Event, SessionState};
use super::ring::{Cursor, EventRing, WORDS};
use super::webhook::{WebhookSettings, WebhookUrl, Webhooks};
use super::EventsConfig;
use crate::session::record::SessionRecord;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// DTMF digits kept per session for its final record.
pub const MAX_DTMF_DIGITS: usize = 256;

/// One session as its subscribers see it.
pub struct Channel {
    /// The session id (the transports' record id).
    pub id: u64,
    /// The transport (`ws`, `rtp`, `audiosocket`, `media_stream`).
    pub transport: &'static str,
    /// A second name the transport knows the session by (AudioSocket's
    /// call UUID, Media Streams' `streamSid`).
    pub alias: Option<String>,
    /// The I/O core it runs on.
    pub core: usize,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    started: Instant,
    ring: EventRing,
    state: AtomicU8,
    subscribers: AtomicU32,
    final_record: OnceLock<String>,
    ended: AtomicBool,
}

impl Channel {
    /// The event ring.
    pub fn ring(&self) -> &EventRing {
        &self.ring
    }

    /// The latest state.
    pub fn state(&self) -> SessionState {
        match self.state.load(Ordering::Relaxed) {
            1 => SessionState::Waiting,
            3 => SessionState::Draining,
            _ => SessionState::Active,
        }
    }

    /// The final record once the session has ended.
    pub fn final_record(&self) -> Option<&str> {
        if self.ended.load(Ordering::Acquire) {
            self.final_record.get().map(String::as_str)
        } else {
            None
        }
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> u32 {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// Microseconds since the session started.
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }
}

/// Counters of the events machinery (always on; `GET /metrics`).
#[derive(Debug, Default)]
pub struct HubCounters {
    /// Subscriptions made.
    pub subscriptions: AtomicU64,
    /// Subscriptions refused: unknown session.
    pub refused_unknown: AtomicU64,
    /// Subscriptions refused: the session has ended.
    pub refused_ended: AtomicU64,
    /// Subscriptions refused: too many subscribers.
    pub refused_full: AtomicU64,
    /// Events subscribers lost because they fell behind.
    pub events_lost: AtomicU64,
    /// Subscribers closed because they did not read in time.
    pub slow_subscribers_closed: AtomicU64,
    /// Events written by sessions.
    pub events_emitted: AtomicU64,
}

#[derive(Default)]
struct Live {
    by_id: HashMap<u64, Arc<Channel>>,
    by_alias: HashMap<String, u64>,
}

struct HubInner {
    config: EventsConfig,
    live: Mutex<Live>,
    subscribers: AtomicUsize,
    counters: HubCounters,
}

impl HubInner {
    fn lock(&self) -> MutexGuard<'_, Live> {
        // Nothing panics while the lock is held; recover from poisoning anyway.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self, channel: &Channel) {
        let mut live = self.lock();
        live.by_id.remove(&channel.id);
        if let Some(a) = &channel.alias {
            if live.by_alias.get(a) == Some(&channel.id) {
                live.by_alias.remove(a);
            }
        }
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscribeError {
    /// No such session (404).
    Unknown(String),
    /// The session has ended, or was refused before it started (410).
    Ended(u64),
    /// The session has `events.max_subscribers_per_session` (429).
    SessionFull(u64, usize),
    /// The daemon has `events.max_subscribers` (503).
    DaemonFull(usize),
}

impl SubscribeError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            SubscribeError::Unknown(_) => 404,
            SubscribeError::Ended(_) => 410,
            SubscribeError::SessionFull(..) => 429,
            SubscribeError::DaemonFull(_) => 503,
        }
    }
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubscribeError::Unknown(id) => write!(f, "no session `{id}`"),
            SubscribeError::Ended(id) => write!(
                f,
                "session {id} is not live: it has ended (or was refused before it started)"
            ),
            SubscribeError::SessionFull(id, n) => write!(
                f,
                "session {id} already has {n} subscribers (events.max_subscribers_per_session)"
            ),
            SubscribeError::DaemonFull(n) => write!(
                f,
                "the daemon already serves {n} subscribers (events.max_subscribers)"
            ),
        }
    }
}

/// The daemon's event sources and webhooks.
pub struct EventHub {
    inner: Arc<HubInner>,
    /// Final records to webhooks.
    pub webhooks: Arc<Webhooks>,
}

/// Sizes of the hub's tables (leak checks; `/capacity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HubSizes {
    /// Live sessions registered.
    pub live_sessions: usize,
    /// Aliases registered.
    pub aliases: usize,
    /// Subscribers connected.
    pub subscribers: usize,
    /// Final records waiting for or in webhook delivery.
    pub webhook_pending: u64,
}

impl EventHub {
    /// A hub with `config`'s bounds (no thread starts here).
    pub fn new(config: &EventsConfig) -> Self {
        let webhooks = Webhooks::new(WebhookSettings {
            workers: config.webhook_workers,
            queue: config.webhook_queue,
            timeout: Duration::from_millis(config.webhook_timeout_ms),
            retries: config.webhook_retries,
            ca_file: config.webhook_ca_file.clone(),
        });
        EventHub {
            inner: Arc::new(HubInner {
                config: config.clone(),
                live: Mutex::new(Live::default()),
                subscribers: AtomicUsize::new(0),
                counters: HubCounters::default(),
            }),
            webhooks,
        }
    }

    /// The bounds.
    pub fn config(&self) -> &EventsConfig {
        &self.inner.config
    }

    /// The counters.
    pub fn counters(&self) -> &HubCounters {
        &self.inner.counters
    }

    /// Registers a session starting now (allocates its ring and buffers)
    /// and returns its writing end. An alias another live session already
    /// holds stays with that session (this one is reachable by its id).
    pub fn open(
        &self,
        record: &SessionRecord,
        alias: Option<String>,
        core: usize,
        state: SessionState,
        webhook: Option<WebhookUrl>,
    ) -> EventSink {
        let cfg = &self.inner.config;
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let channel = Arc::new(Channel {
            id: record.id,
            transport: record.transport,
            alias,
            core,
            started_unix_ms,
            started: Instant::now(),
            ring: EventRing::new(cfg.ring_events),
            state: AtomicU8::new(state as u8),
            subscribers: AtomicU32::new(0),
            final_record: OnceLock::new(),
            ended: AtomicBool::new(false),
        });
        {
            let mut live = self.inner.lock();
            live.by_id.insert(channel.id, channel.clone());
            if let Some(a) = &channel.alias {
                if live.by_alias.contains_key(a) {
                    eprintln!(
                        "<4>events: session {} is not reachable as `{a}`: a live session already is",
                        channel.id
                    );
                } else {
                    live.by_alias.insert(a.clone(), channel.id);
                }
            }
        }
        EventSink {
            channel,
            hub: self.inner.clone(),
            webhooks: self.webhooks.clone(),
            webhook,
            text: Vec::with_capacity(cfg.max_text_bytes),
            text_pieces: 0,
            text_truncated: false,
            dtmf: String::with_capacity(MAX_DTMF_DIGITS),
            dtmf_digits: 0,
            finished: false,
        }
    }

    /// Subscribes to session `key` (its id, or its alias); `issued_ids` is
    /// how many session ids the daemon has handed out (to tell an ended
    /// session from one that never was).
    pub fn subscribe(&self, key: &str, issued_ids: u64) -> Result<Subscription, SubscribeError> {
        let c = &self.inner.counters;
        let refuse = |e: SubscribeError, n: &AtomicU64| {
            n.fetch_add(1, Ordering::Relaxed);
            Err(e)
        };
        let channel = {
            let live = self.inner.lock();
            let id = key
                .parse::<u64>()
                .ok()
                .or_else(|| live.by_alias.get(key).copied());
            match id.and_then(|id| live.by_id.get(&id)) {
                Some(ch) => ch.clone(),
                None => {
                    return match id {
                        Some(id) if id >= 1 && id < issued_ids + 1 => {
                            refuse(SubscribeError::Ended(id), &c.refused_ended)
                        }
                        _ => refuse(SubscribeError::Unknown(key.to_string()), &c.refused_unknown),
                    }
                }
            }
        };
        if channel.is_ended() {
            return refuse(SubscribeError::Ended(channel.id), &c.refused_ended);
        }
        let cfg = &self.inner.config;
        let took_daemon = self
            .inner
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < cfg.max_subscribers).then_some(n + 1)
            })
            .is_ok();
        if !took_daemon {
            return refuse(
                SubscribeError::DaemonFull(cfg.max_subscribers),
                &c.refused_full,
            );
        }
        let per_session = cfg.max_subscribers_per_session as u32;
        let took_session = channel
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < per_session).then_some(n + 1)
            })
            .is_ok();
        if !took_session {
            self.inner.subscribers.fetch_sub(1, Ordering::AcqRel);
            return refuse(
                SubscribeError::SessionFull(channel.id, per_session as usize),
                &c.refused_full,
            );
        }
        c.subscriptions.fetch_add(1, Ordering::Relaxed);
        let head = channel.ring.head();
        Ok(Subscription {
            cursor: Cursor {
                next: head.saturating_sub(channel.ring.capacity()),
            },
            channel,
            hub: self.inner.clone(),
        })
    }

    /// `(id, transport, alias, state, subscribers)` of every live session,
    /// by id.
    pub fn list(&self) -> Vec<serde_json::Value> {
        let mut v: Vec<Arc<Channel>> = self.inner.lock().by_id.values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v.iter()
            .map(|c| {
                serde_json::json!({
                    "id": c.id.to_string(),
                    "transport": c.transport,
                    "alias": c.alias,
                    "core": c.core,
                    "state": c.state().label(),
                    "started_unix_ms": c.started_unix_ms,
                    "subscribers": c.subscribers(),
                    "events": format!("/v1/sessions/{}/events", c.id),
                })
            })
            .collect()
    }

    /// The tables' sizes.
    pub fn sizes(&self) -> HubSizes {
        let live = self.inner.lock();
        HubSizes {
            live_sessions: live.by_id.len(),
            aliases: live.by_alias.len(),
            subscribers: self.inner.subscribers.load(Ordering::Relaxed),
            webhook_pending: self.webhooks.counters.pending.load(Ordering::Relaxed),
        }
    }
}

/// A session's writing end: owned by the session's task, neither `Clone`
/// nor shared. Dropping it (finished or not) unregisters the session.
pub struct EventSink {
    channel: Arc<Channel>,
    hub: Arc<HubInner>,
    webhooks: Arc<Webhooks>,
    webhook: Option<WebhookUrl>,
    text: Vec<u8>,
    text_pieces: u64,
    text_truncated: bool,
    dtmf: String,
    dtmf_digits: u64,
    finished: bool,
}

impl EventSink {
    /// The session's channel.
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    #[inline]
    fn push(&self, event: Event) {
        let words: [u64; WORDS] = event.encode();
        self.channel.ring.push(words);
    }

    /// A text piece of output frame `frame` (its token and its text).
    /// No allocation: the ring takes the token, the kept text its bytes
    /// while they fit.
    #[inline]
    pub fn text(&mut self, frame: u64, token: u32, piece: &str) {
        self.push(Event::Text {
            frame,
            at_us: self.channel.now_us(),
            token,
        });
        self.text_pieces += 1;
        if self.text.len() + piece.len() <= self.text.capacity() {
            self.text.extend_from_slice(piece.as_bytes());
        } else {
            self.text_truncated = true;
        }
    }

    /// A DTMF digit (`duration_ms` 0 where the transport does not say).
    pub fn dtmf(&mut self, digit: u8, duration_ms: u32) {
        self.push(Event::Dtmf {
            at_us: self.channel.now_us(),
            digit,
            duration_ms,
        });
        self.dtmf_digits += 1;
        if self.dtmf.len() < MAX_DTMF_DIGITS {
            self.dtmf.push(if digit.is_ascii_graphic() {
                digit as char
            } else {
                '?'
            });
        }
    }

    /// A state change (ignored when the state is the same).
    pub fn state(&mut self, state: SessionState) {
        if self.channel.state.swap(state as u8, Ordering::Relaxed) != state as u8 {
            self.push(Event::State {
                at_us: self.channel.now_us(),
                state,
            });
        }
    }

    /// The final record: the session's own record and everything it said.
    pub fn final_json(&self, record: &SessionRecord) -> serde_json::Value {
        serde_json::json!({
            "session": record,
            "transport": self.channel.transport,
            "alias": self.channel.alias,
            "started_unix_ms": self.channel.started_unix_ms,
            "text": String::from_utf8_lossy(&self.text),
            "text_pieces": self.text_pieces,
            "text_truncated": self.text_truncated,
            "dtmf": self.dtmf,
            "dtmf_digits": self.dtmf_digits,
            "events_total": self.channel.ring.head(),
        })
    }

    /// Ends the session's events: the final record goes to the subscribers
    /// and, when the session has one, to its webhook; the session leaves
    /// the registry.
    pub fn finish(mut self, record: &SessionRecord) {
        let body = self.final_json(record).to_string();
        if let Some(url) = self.webhook.take() {
            self.webhooks
                .enqueue(url, body.clone().into_bytes(), self.channel.id);
        }
        let _ = self.channel.final_record.set(body);
        self.channel.ended.store(true, Ordering::Release);
        self.finished = true;
        self.hub
            .counters
            .events_emitted
            .fetch_add(self.channel.ring.head(), Ordering::Relaxed);
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        if !self.finished {
            // Ended without its record (a task dropped mid-way): subscribers
            // still learn that it is over.
            let _ = self.channel.final_record.set(
                serde_json::json!({"session": {"id": self.channel.id}, "incomplete": true})
                    .to_string(),
            );
            self.channel.ended.store(true, Ordering::Release);
        }
        self.hub.close(&self.channel);
    }
}

/// One subscriber's reading end; dropping it gives its place back.
pub struct Subscription {
    channel: Arc<Channel>,
    cursor: Cursor,
    hub: Arc<HubInner>,
}

impl Subscription {
    /// The session's channel.
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    /// The sequence number of the next event this subscriber reads.
    pub fn next_seq(&self) -> u64 {
        self.cursor.next
    }

    /// Resumes after the event whose SSE id is `last_event_id` (a client's
    /// `Last-Event-ID`), where the ring still holds what follows it.
    pub fn resume_after(&mut self, last_event_id: u64) {
        let head = self.channel.ring.head();
        self.cursor.next = last_event_id
            .min(head)
            .max(head.saturating_sub(self.channel.ring.capacity()));
    }

    /// Hands every new event to `f` (with its sequence number); returns how
    /// many were lost because this subscriber fell behind (also counted in
    /// the hub).
    pub fn drain(&mut self, mut f: impl FnMut(u64, Event)) -> u64 {
        let lost = self.cursor.drain(&self.channel.ring, |seq, words| {
            if let Some(e) = Event::decode(words) {
                f(seq, e)
            }
        });
        if lost > 0 {
            self.hub
                .counters
                .events_lost
                .fetch_add(lost, Ordering::Relaxed);
        }
        lost
    }

    /// Whether events wait beyond what was read.
    pub fn has_news(&self) -> bool {
        self.channel.ring.head() > self.cursor.next || self.channel.is_ended()
    }

    /// Counts this subscriber as closed for not reading in time.
    pub fn note_slow(&self) {
        self.hub
            .counters
            .slow_subscribers_closed
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.channel.subscribers.fetch_sub(1, Ordering::AcqRel);
        self.hub.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(per_session: usize, total: usize) -> EventHub {
        EventHub::new(&EventsConfig {
            ring_events: 16,
            max_subscribers_per_session: per_session,
            max_subscribers: total,
            max_text_bytes: 8,
            ..EventsConfig::default()
        })
    }

    #[test]
    fn subscriptions_are_bounded_and_tables_empty_with_the_session() {
        let h = hub(2, 3);
        let mut rec = SessionRecord::start(5, "rtp");
        let mut sink = h.open(&rec, Some("abc".into()), 0, SessionState::Waiting, None);
        let mut a = h.subscribe("5", 5).unwrap();
        let b = h.subscribe("abc", 5).unwrap();
        assert_eq!(
            h.subscribe("5", 5).err().map(|e| e.status()),
            Some(429),
            "third subscriber of one session"
        );
        let other = SessionRecord::start(6, "ws");
        let _sink2 = h.open(&other, None, 1, SessionState::Active, None);
        let _c = h.subscribe("6", 6).unwrap();
        assert_eq!(h.subscribe("6", 6).err().map(|e| e.status()), Some(503));
        assert_eq!(h.subscribe("9", 6).err().map(|e| e.status()), Some(404));
        assert_eq!(h.subscribe("nope", 6).err().map(|e| e.status()), Some(404));
        assert_eq!(h.subscribe("4", 6).err().map(|e| e.status()), Some(410));
        drop(b);

        sink.state(SessionState::Active);
        sink.state(SessionState::Active);
        sink.text(0, 7, "héllo");
        sink.text(1, 8, " world");
        sink.dtmf(b'5', 120);
        let mut seen = Vec::new();
        assert_eq!(a.drain(|s, e| seen.push((s, e))), 0);
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(matches!(
            seen[1].1,
            Event::Text {
                frame: 0,
                token: 7,
                ..
            }
        ));
        rec.frames_out = 2;
        sink.finish(&rec);
        assert!(a.has_news());
        let fin: serde_json::Value =
            serde_json::from_str(a.channel().final_record().unwrap()).unwrap();
        // 8 bytes of text kept: the second piece did not fit.
        assert_eq!(fin["text"], "héllo");
        assert_eq!(fin["text_truncated"], true);
        assert_eq!(fin["text_pieces"], 2);
        assert_eq!(fin["dtmf"], "5");
        assert_eq!(fin["session"]["frames_out"], 2);
        assert_eq!(fin["alias"], "abc");
        assert_eq!(h.subscribe("5", 6).err().map(|e| e.status()), Some(410));
        let s = h.sizes();
        assert_eq!((s.live_sessions, s.aliases, s.subscribers), (1, 0, 2));
        drop(a);
        drop(_c);
        drop(_sink2);
        let s = h.sizes();
        assert_eq!((s.live_sessions, s.aliases, s.subscribers), (0, 0, 0));
    }

    #[test]
    fn a_slow_subscriber_loses_events_and_resumes() {
        let h = hub(1, 1);
        let rec = SessionRecord::start(1, "ws");
        let mut sink = h.open(&rec, None, 0, SessionState::Active, None);
        let mut sub = h.subscribe("1", 1).unwrap();
        for f in 0..40 {
            sink.text(f, 1, "x");
        }
        let mut frames = Vec::new();
        let lost = sub.drain(|_, e| {
            if let Event::Text { frame, .. } = e {
                frames.push(frame)
            }
        });
        assert_eq!(lost, 24);
        assert_eq!(frames, (24..40).collect::<Vec<_>>());
        assert_eq!(h.counters().events_lost.load(Ordering::Relaxed), 24);
        // Last-Event-ID 38 (= sequence 37 read): resumes at sequence 38.
        sub.resume_after(38);
        let mut n = 0;
        sub.drain(|_, _| n += 1);
        assert_eq!(n, 2);
        // An id beyond the head resumes at the head; one long gone at the oldest kept.
        sub.resume_after(1000);
        assert_eq!(sub.next_seq(), 40);
        sub.resume_after(0);
        assert_eq!(sub.next_seq(), 24);
    }
}
