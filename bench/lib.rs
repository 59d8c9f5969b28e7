//! Shared pieces of moshid's benchmarks and load generator.
//!
//! [`ZeroCostModel`] is a model whose step does no work, so that a bench
//! measures what moshid itself costs per stream-frame (lanes, batch fill,
//! doorbells, codecs) rather than the model. [`signal`] is the benchmarks'
//! speech-like test signal, [`percentiles`] their nearest-rank statistics.

pub mod percentiles;
pub mod signal;

use moshid_model::streaming::{Batch, ModelError, SessionParams, StreamingModel};

/// A model whose step costs nothing: every stepped slot "produces" its input
/// frame back and text token 0. For measuring the daemon's own overhead only.
pub struct ZeroCostModel {
    max_slots: usize,
}

impl ZeroCostModel {
    /// A zero-cost model of `max_slots` slots.
    pub fn new(max_slots: usize) -> Self {
        ZeroCostModel { max_slots }
    }
}

impl StreamingModel for ZeroCostModel {
    fn max_slots(&self) -> usize {
        self.max_slots
    }

    fn frame_samples(&self) -> usize {
        moshid::FRAME_SAMPLES
    }

    fn audio_codebooks(&self) -> usize {
        8
    }

    fn reset_slot(&mut self, _slot: usize, _params: &SessionParams) -> Result<(), ModelError> {
        Ok(())
    }

    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError> {
        for s in 0..self.max_slots {
            batch.has_output[s] = batch.exec[s];
            batch.text_token[s] = 0;
        }
        Ok(())
    }
}

/// Admits `streams` sessions and sends their open records through `port`,
/// as an I/O core does; the engine opens them at its next tick. For benches
/// that drive [`moshid::engine::thread::Engine::tick`] directly.
pub fn open_slots(
    shared: &moshid::engine::EngineShared,
    port: &mut moshid::engine::CorePort,
    streams: usize,
) -> Vec<moshid::engine::admission::Ticket> {
    use moshid::engine::records::{ToEngine, ToEngineKind};
    let mut rec = Box::<ToEngine>::default();
    rec.kind = ToEngineKind::Open;
    (0..streams)
        .map(|_| {
            let t = shared
                .admission()
                .admit(SessionParams::default(), &shared.step_times, f64::INFINITY)
                .expect("a zero-cost model admits every slot");
            rec.slot = t.slot;
            rec.generation = t.generation;
            port.to_engine
                .try_push(&rec)
                .expect("lane sized for every slot");
            t
        })
        .collect()
}
