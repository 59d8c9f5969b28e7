//! The engine's warm-up times real steps: for a model whose sessions start
//! with a prompt (PersonaPlex), each warm-up slot gets the empty prompt
//! first, so no timed step is one the model refused for a missing prompt
//! (refused steps cost nearly nothing, and admission and the phase groups
//! would price the model's steps at that).

use moshid::engine::thread::Engine;
use moshid::engine::{core_links, EngineShared};
use moshid_model::streaming::{
    Batch, ModelError, Prompt, PromptProgress, SessionParams, SlotFault, StreamingModel,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Steps a slot only once its prompt is done, as PersonaPlex's backends
/// do; counts the slot-steps it ran and those it refused.
struct PromptedModel {
    max_slots: usize,
    /// Frames of prompt work each slot has left; `None`: no prompt begun.
    prompt_left: Vec<Option<usize>>,
    ready: Vec<bool>,
    stepped: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

/// Frames of the empty prompt (PersonaPlex's: the silence frames).
const EMPTY_PROMPT_FRAMES: usize = 12;

impl StreamingModel for PromptedModel {
    fn max_slots(&self) -> usize {
        self.max_slots
    }
    fn frame_samples(&self) -> usize {
        moshid::FRAME_SAMPLES
    }
    fn audio_codebooks(&self) -> usize {
        1
    }
    fn reset_slot(&mut self, slot: usize, _params: &SessionParams) -> Result<(), ModelError> {
        self.ready[slot] = false;
        self.prompt_left[slot] = None;
        Ok(())
    }
    fn takes_prompts(&self) -> bool {
        true
    }
    fn begin_prompt(&mut self, slot: usize, prompt: &Prompt) -> Result<(), ModelError> {
        assert!(prompt.text_tokens.is_empty() && prompt.cache_key.is_none());
        self.prompt_left[slot] = Some(EMPTY_PROMPT_FRAMES);
        Ok(())
    }
    fn prompt_chunk(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<PromptProgress, ModelError> {
        let left = self.prompt_left[slot]
            .ok_or_else(|| ModelError::Params("no prompt begun".into()))?
            .saturating_sub(max_frames.min(5));
        self.prompt_left[slot] = Some(left);
        if left == 0 {
            self.ready[slot] = true;
            Ok(PromptProgress::Done)
        } else {
            Ok(PromptProgress::Pending { frames_left: left })
        }
    }
    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError> {
        for s in 0..self.max_slots {
            batch.fault[s] = None;
            batch.has_output[s] = false;
            if !batch.exec[s] {
                continue;
            }
            if self.ready[s] {
                self.stepped.fetch_add(1, Ordering::Relaxed);
                batch.has_output[s] = true;
            } else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                batch.fault[s] = Some(SlotFault::NoPrompt);
            }
        }
        Ok(())
    }
}

#[test]
fn warm_up_steps_of_a_model_with_prompts_are_real_steps() {
    let max_slots = 4;
    let (stepped, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let model = PromptedModel {
        max_slots,
        prompt_left: vec![None; max_slots],
        ready: vec![false; max_slots],
        stepped: stepped.clone(),
        refused: refused.clone(),
    };
    let shared = Arc::new(EngineShared::new(max_slots, 1, 10.0, 1));
    let (links, _ports) = core_links(1, 4);
    let mut engine = Engine::new(Box::new(model), links, shared.clone(), 4, 2);
    engine.warm_up();
    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "warm-up steps refused for a missing prompt"
    );
    assert!(stepped.load(Ordering::Relaxed) > 0, "no warm-up step ran");
    assert!(shared.ready.load(Ordering::Acquire));
}
