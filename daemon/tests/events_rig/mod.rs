//! A session's events with a subscriber attached, for the hot-path
//! allocation tests: per model frame the session writes a text piece (and
//! now and then a DTMF digit) to its sink, records a stage sample, and the
//! subscriber drains its ring into a reusable SSE buffer — as the daemon
//! does, minus the sockets.

#![allow(dead_code)] // each test binary uses a subset

use moshid::events::{EventHub, EventSink, EventsConfig, SessionState, Subscription};
use moshid::metrics::{Owner, Registry, Stage, StageRecorder};
use moshid::session::record::SessionRecord;
use moshid_model::spm::{PieceKind, PieceTable};
use std::time::Duration;

/// The events side of one session, set up (allocations allowed here).
pub struct EventsRig {
    _hub: EventHub,
    sink: EventSink,
    sub: Subscription,
    pieces: PieceTable,
    sse: Vec<u8>,
    _metrics: Registry,
    stages: StageRecorder,
    frame: u64,
    /// Events the subscriber has rendered.
    pub rendered: u64,
}

impl EventsRig {
    /// A registered session with one subscriber and stage metrics on.
    pub fn new() -> Self {
        let hub = EventHub::new(&EventsConfig::default());
        let rec = SessionRecord::start(1, "test");
        let sink = hub.open(&rec, Some("alias".into()), 0, SessionState::Waiting, None);
        let sub = hub.subscribe("1", 1).expect("subscribing");
        let pieces = PieceTable::from_pieces([
            ("<unk>".to_string(), 0.0, PieceKind::Unknown),
            ("▁hello".to_string(), 0.0, PieceKind::Normal),
            ("\"quoted\"".to_string(), 0.0, PieceKind::Normal),
        ])
        .expect("piece table");
        let metrics = Registry::new(true);
        let stages = metrics.register(Owner::Core(0), 1, 8);
        let mut rig = EventsRig {
            _hub: hub,
            sink,
            sub,
            pieces,
            sse: Vec::with_capacity(64 * 1024),
            _metrics: metrics,
            stages,
            frame: 0,
            rendered: 0,
        };
        rig.sink.state(SessionState::Active);
        rig
    }

    /// One model frame's events: a text piece, a DTMF digit every tenth
    /// frame, a stage sample, and the subscriber's drain.
    pub fn frame(&mut self) {
        let token = 1 + (self.frame % 2) as u32;
        let piece = self.pieces.text_for_token(token).expect("a piece");
        self.sink.text(self.frame, token, piece);
        if self.frame.is_multiple_of(10) {
            self.sink.dtmf(b'5', 120);
        }
        self.stages.record(Stage::Encode, Duration::from_micros(3));
        self.frame += 1;
        let (pieces, sse) = (&self.pieces, &mut self.sse);
        let mut n = 0;
        let lost = self.sub.drain(|seq, e| {
            e.write_sse(seq, pieces, sse);
            n += 1;
        });
        assert_eq!(lost, 0);
        self.rendered += n;
        // The SSE bytes went to the socket.
        self.sse.clear();
    }
}
