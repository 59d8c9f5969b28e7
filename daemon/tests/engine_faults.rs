//! The engine under faults, driven tick by tick through its real lanes (no
//! sockets needed): a model that fails for one slot ends only that stream,
//! a slot whose engine queue is full gets its extra frames answered
//! `Dropped` while the others are untouched, and a full lane is reported to
//! the pushing core instead of blocking it.

use moshid::engine::records::{FromEngine, FromEngineKind, ToEngine, ToEngineKind};
use moshid::engine::thread::Engine;
use moshid::engine::{core_links, CorePort, EngineShared};
use moshid_model::streaming::{Batch, ModelError, SessionParams, SlotFault, StreamingModel};
use moshid_ringbuf::PushError;
use std::sync::Arc;

/// Echoes each slot's first input sample back as its text token; fails for
/// `faulty_slot` once that slot's input reaches `fail_at` (warm-up steps
/// feed small values, so they never fail).
struct FaultyModel {
    max_slots: usize,
    faulty_slot: usize,
    fail_at: f32,
}

impl StreamingModel for FaultyModel {
    fn max_slots(&self) -> usize {
        self.max_slots
    }
    fn frame_samples(&self) -> usize {
        moshid::FRAME_SAMPLES
    }
    fn audio_codebooks(&self) -> usize {
        1
    }
    fn reset_slot(&mut self, _slot: usize, _params: &SessionParams) -> Result<(), ModelError> {
        Ok(())
    }
    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError> {
        for s in 0..self.max_slots {
            batch.fault[s] = None;
            batch.has_output[s] = batch.exec[s];
            if batch.exec[s] {
                let n = batch.frame_samples();
                let (input, output) = (&batch.input_pcm[s * n..(s + 1) * n], s * n);
                let first = input[0];
                batch.output_pcm[output..output + n].fill(first);
                batch.text_token[s] = first as u32;
                if s == self.faulty_slot && first >= self.fail_at {
                    batch.fault[s] = Some(SlotFault::NonFinite);
                }
            }
        }
        Ok(())
    }
}

struct Rig {
    engine: Engine,
    port: CorePort,
    shared: Arc<EngineShared>,
    tickets: Vec<(u32, u32)>,
    rec: Box<ToEngine>,
}

impl Rig {
    fn new(streams: usize, lane_frames: usize, queue_depth: usize, model: FaultyModel) -> Rig {
        let shared = Arc::new(EngineShared::new(streams, 1, 10.0, 1));
        let (links, mut ports) = core_links(1, lane_frames);
        let mut engine = Engine::new(Box::new(model), links, shared.clone(), queue_depth, 1);
        engine.warm_up();
        let mut rig = Rig {
            engine,
            port: ports.remove(0),
            shared,
            tickets: Vec::new(),
            rec: Box::default(),
        };
        for _ in 0..streams {
            let t = rig
                .shared
                .admission()
                .admit(
                    SessionParams::default(),
                    &rig.shared.step_times,
                    f64::INFINITY,
                )
                .expect("admitted");
            rig.push(ToEngineKind::Open, t.slot, t.generation, 0.0)
                .expect("room for opens");
            rig.tickets.push((t.slot, t.generation));
        }
        rig.engine.tick(0);
        rig
    }

    fn push(
        &mut self,
        kind: ToEngineKind,
        slot: u32,
        generation: u32,
        value: f32,
    ) -> Result<(), PushError> {
        self.rec.kind = kind;
        self.rec.slot = slot;
        self.rec.generation = generation;
        self.rec.pcm.fill(value);
        self.port.to_engine.try_push(&self.rec)
    }

    /// Pushes one frame for stream `i` whose samples all equal `value`.
    fn frame(&mut self, i: usize, value: f32) -> Result<(), PushError> {
        let (slot, generation) = self.tickets[i];
        self.push(ToEngineKind::Frame, slot, generation, value)
    }

    /// Every record the engine sent back: (slot, kind, text token).
    fn outputs(&mut self) -> Vec<(u32, FromEngineKind, u32)> {
        let mut out = Vec::new();
        self.port
            .from_engine
            .drain(|r: &FromEngine| out.push((r.slot, r.kind, r.text_token)));
        out
    }
}

#[test]
fn a_fault_for_one_slot_ends_only_that_stream() {
    let model = FaultyModel {
        max_slots: 3,
        faulty_slot: 1,
        fail_at: 12.0,
    };
    let mut rig = Rig::new(3, 64, 4, model);
    rig.outputs();
    let mut faults = 0;
    for step in 0..8u32 {
        for i in 0..3 {
            rig.frame(i, (10 * i as u32 + step) as f32).expect("room");
        }
        rig.engine.tick(0);
        for (slot, kind, token) in rig.outputs() {
            let i = rig
                .tickets
                .iter()
                .position(|t| t.0 == slot)
                .expect("known slot");
            if i == 1 && step >= 2 {
                assert_eq!(kind, FromEngineKind::Fault, "step {step}");
                faults += 1;
            } else {
                // The other streams get exactly their own answer, every step.
                assert_eq!(kind, FromEngineKind::Output, "stream {i} step {step}");
                assert_eq!(token, 10 * i as u32 + step, "stream {i} step {step}");
            }
        }
    }
    assert!(faults > 0);
    assert!(rig.shared.stats.snapshot().faults >= faults);
}

#[test]
fn a_full_slot_queue_drops_only_that_slots_frames() {
    let model = FaultyModel {
        max_slots: 2,
        faulty_slot: usize::MAX,
        fail_at: f32::INFINITY,
    };
    let queue_depth = 2;
    let mut rig = Rig::new(2, 64, queue_depth, model);
    rig.outputs();
    // Stream 0 sends five frames before the next tick; stream 1 sends one.
    for k in 0..5 {
        rig.frame(0, k as f32).expect("lane has room");
    }
    rig.frame(1, 100.0).expect("lane has room");
    rig.engine.tick(0);
    let out = rig.outputs();
    let s0 = rig.tickets[0].0;
    let dropped = out
        .iter()
        .filter(|(s, k, _)| *s == s0 && *k == FromEngineKind::Dropped)
        .count();
    assert_eq!(dropped, 5 - queue_depth, "{out:?}");
    // Stream 1 is answered as usual; stream 0's first queued frame too.
    assert!(
        out.contains(&(rig.tickets[1].0, FromEngineKind::Output, 100)),
        "{out:?}"
    );
    assert!(out.contains(&(s0, FromEngineKind::Output, 0)), "{out:?}");
    // The second queued frame of stream 0 is stepped at the next tick.
    rig.engine.tick(0);
    assert_eq!(rig.outputs(), vec![(s0, FromEngineKind::Output, 1)]);
    assert_eq!(
        rig.shared.stats.snapshot().dropped_frames,
        (5 - queue_depth) as u64
    );
}

#[test]
fn a_full_lane_is_reported_not_waited_on() {
    let model = FaultyModel {
        max_slots: 1,
        faulty_slot: usize::MAX,
        fail_at: f32::INFINITY,
    };
    let lane_frames = 3;
    let mut rig = Rig::new(1, lane_frames, 8, model);
    rig.outputs();
    for k in 0..lane_frames {
        rig.frame(0, k as f32).expect("room");
    }
    assert_eq!(rig.frame(0, 9.0), Err(PushError::Full));
    // The engine empties the lane at its tick; the core can push again.
    rig.engine.tick(0);
    assert_eq!(rig.outputs().len(), 1);
    rig.frame(0, 9.0).expect("room after the tick");
}
