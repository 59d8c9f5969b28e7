//! Prompt prefills inside the engine (models with prompts: PersonaPlex):
//! which slots are still running their prompt, the bounded work done for
//! them each tick, and the bounded cache of prefilled states.
//!
//! A slot opened with a prompt either starts from a cached state of the same
//! prompt (copied in at once) or begins the prefill; every tick the engine
//! spends at most `engine.prompt_frames_per_tick` frames of prompt work,
//! slot after slot, before stepping the tick's group, so other streams'
//! ticks are delayed by at most that much work. A finished prompt's state is
//! cached under its key (least recently used out beyond
//! `engine.prompt_cache_entries`), and the session is told
//! ([`FromEngineKind::PromptReady`](super::records::FromEngineKind)); its
//! frames are not stepped before.
//!
//! Invariants: the cache never holds more than its bound; a closed slot has
//! no prompt work; nothing here allocates per frame (a finished prompt
//! allocates its snapshot, once per session at most).

use moshid_model::streaming::{ModelError, Prompt, PromptProgress, SlotSnapshot, StreamingModel};

/// What opening a slot with a prompt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The model takes no prompts: the slot steps at once.
    NoPrompt,
    /// A cached state was copied in: the slot is ready.
    FromCache,
    /// The prefill began.
    Started,
}

/// Prompt state of every slot and the cache.
pub struct Prompts {
    running: Vec<bool>,
    keys: Vec<Option<String>>,
    /// Most recently used last.
    cache: Vec<(String, SlotSnapshot)>,
    max_entries: usize,
    frames_per_tick: usize,
    /// Next slot to serve (round robin).
    next: usize,
    /// Slots whose prompt ended in the last [`Prompts::advance`], and how
    /// (`true`: ready); capacity `max_slots`, never grown.
    finished: Vec<(usize, bool)>,
    /// Counters: prompts run, started from the cache.
    pub ran: u64,
    /// Prompts whose state came from the cache.
    pub cache_hits: u64,
}

impl Prompts {
    /// State for `max_slots` slots.
    pub fn new(max_slots: usize, max_entries: usize, frames_per_tick: usize) -> Self {
        Prompts {
            running: vec![false; max_slots],
            keys: vec![None; max_slots],
            cache: Vec::with_capacity(max_entries),
            max_entries,
            frames_per_tick: frames_per_tick.max(1),
            next: 0,
            finished: Vec::with_capacity(max_slots),
            ran: 0,
            cache_hits: 0,
        }
    }

    /// Whether `slot` is still running its prompt (its frames wait).
    pub fn running(&self, slot: usize) -> bool {
        self.running[slot]
    }

    /// Entries cached.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Opens `slot` (already reset) with `prompt`.
    pub fn open(
        &mut self,
        model: &mut dyn StreamingModel,
        slot: usize,
        prompt: &Prompt,
    ) -> Result<Opened, ModelError> {
        self.running[slot] = false;
        self.keys[slot] = None;
        if !model.takes_prompts() {
            return Ok(Opened::NoPrompt);
        }
        if let Some(key) = &prompt.cache_key {
            if let Some(i) = self.cache.iter().position(|(k, _)| k == key) {
                let entry = self.cache.remove(i);
                let restored = model.restore_slot(slot, &entry.1);
                self.cache.push(entry);
                restored?;
                self.cache_hits += 1;
                return Ok(Opened::FromCache);
            }
        }
        model.begin_prompt(slot, prompt)?;
        self.running[slot] = true;
        self.keys[slot] = prompt.cache_key.clone();
        Ok(Opened::Started)
    }

    /// Forgets `slot`'s prompt work (the session ended).
    pub fn close(&mut self, slot: usize) {
        self.running[slot] = false;
        self.keys[slot] = None;
    }

    /// Slots whose prompt ended in the last [`Prompts::advance`] (`true`:
    /// ready, `false`: failed).
    pub fn finished(&self) -> &[(usize, bool)] {
        &self.finished
    }

    /// Does this tick's prompt work; [`Prompts::finished`] then lists the
    /// slots whose prompt ended.
    pub fn advance(&mut self, model: &mut dyn StreamingModel) {
        self.finished.clear();
        let n = self.running.len();
        let mut budget = self.frames_per_tick;
        for i in 0..n {
            if budget == 0 {
                break;
            }
            let s = (self.next + i) % n;
            if !self.running[s] {
                continue;
            }
            match model.prompt_chunk(s, budget) {
                Ok(PromptProgress::Pending { .. }) => {
                    // The slot used the budget; the next tick serves the next one.
                    self.next = (s + 1) % n;
                    budget = 0;
                }
                Ok(PromptProgress::Done) => {
                    self.running[s] = false;
                    self.ran += 1;
                    if let Some(key) = self.keys[s].take() {
                        if let Ok(snap) = model.snapshot_slot(s) {
                            self.insert(key, snap);
                        }
                    }
                    self.finished.push((s, true));
                    // Done in fewer frames than the budget: the rest is not
                    // counted (a prompt's last call may be short).
                    budget = budget.saturating_sub(1);
                }
                Err(_) => {
                    self.close(s);
                    self.finished.push((s, false));
                }
            }
        }
    }

    fn insert(&mut self, key: String, snap: SlotSnapshot) {
        if self.max_entries == 0 {
            return;
        }
        self.cache.retain(|(k, _)| *k != key);
        while self.cache.len() >= self.max_entries {
            self.cache.remove(0);
        }
        self.cache.push((key, snap));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::checkpoint::CheckpointDir;
    use moshid_model::cpu::CpuModel;
    use moshid_model::streaming::SessionParams;

    fn persona() -> CpuModel {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/golden-next/personaplex-tiny");
        CpuModel::load(&CheckpointDir::open(&dir).unwrap(), 3).unwrap()
    }

    fn prompt(i: usize) -> Prompt {
        Prompt {
            text_tokens: vec![4 + (i % 50) as u32, 9],
            cache_key: Some(format!("prompt {i}")),
            ..Prompt::default()
        }
    }

    #[test]
    fn bounded_work_then_cached_with_its_bound() {
        let mut m = persona();
        let mut p = Prompts::new(3, 4, 5);
        let mut ready = Vec::new();
        for i in 0..10 {
            let slot = i % 3;
            m.reset_slot(slot, &SessionParams::default()).unwrap();
            assert_eq!(p.open(&mut m, slot, &prompt(i)).unwrap(), Opened::Started);
            let mut ticks = 0;
            while p.running(slot) {
                p.advance(&mut m);
                for &(s, ok) in p.finished() {
                    assert!(ok);
                    ready.push(s);
                }
                ticks += 1;
            }
            // 2 text frames + 12 silence frames: 13 positions, 5 per tick.
            assert_eq!(ticks, 3, "prompt {i}");
            assert!(p.cached() <= 4);
        }
        assert_eq!(p.cached(), 4);
        // A recent prompt comes from the cache, an evicted one runs again.
        m.reset_slot(0, &SessionParams::default()).unwrap();
        assert_eq!(p.open(&mut m, 0, &prompt(9)).unwrap(), Opened::FromCache);
        m.reset_slot(0, &SessionParams::default()).unwrap();
        assert_eq!(p.open(&mut m, 0, &prompt(0)).unwrap(), Opened::Started);
        assert_eq!(ready.len(), 10);
    }
}
