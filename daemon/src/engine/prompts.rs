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
//! `engine.prompt_cache_entries` entries or `engine.prompt_cache_mib` of
//! memory; room is made before the state is copied, so on the CUDA backend
//! the copy finds its device memory free), and the session is told
//! ([`FromEngineKind::PromptReady`](super::records::FromEngineKind)); its
//! frames are not stepped before.
//!
//! Invariants: the cache never holds more than its bounds (entries and
//! bytes, each entry counted at [`SlotSnapshot::bytes`]); a closed slot has
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

/// The bounds of the cache of prefilled states (`engine.prompt_cache_entries`,
/// `engine.prompt_cache_mib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBounds {
    /// States kept.
    pub entries: usize,
    /// Bytes they may hold together.
    pub bytes: usize,
}

/// Prompt state of every slot and the cache.
pub struct Prompts {
    running: Vec<bool>,
    keys: Vec<Option<String>>,
    /// Most recently used last.
    cache: Vec<(String, SlotSnapshot)>,
    max_entries: usize,
    /// Bytes the cached states may hold together, and hold now.
    max_bytes: usize,
    cached_bytes: usize,
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
    pub fn new(max_slots: usize, bounds: CacheBounds, frames_per_tick: usize) -> Self {
        Prompts {
            running: vec![false; max_slots],
            keys: vec![None; max_slots],
            cache: Vec::with_capacity(bounds.entries),
            max_entries: bounds.entries,
            max_bytes: bounds.bytes,
            cached_bytes: 0,
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

    /// Bytes the cached states hold.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
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
                        self.keep(model, s, key);
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

    /// Caches `slot`'s finished state under `key`, dropping the least
    /// recently used states until it fits both bounds (first, so that the
    /// memory they held is free for the copy). A state the model cannot
    /// copy, or larger than the whole bound, is not kept: the next session
    /// with this prompt runs it again.
    fn keep(&mut self, model: &mut dyn StreamingModel, slot: usize, key: String) {
        let need = match model.snapshot_bytes(slot) {
            Ok(n) if self.max_entries > 0 && n <= self.max_bytes => n,
            _ => return,
        };
        if let Some(i) = self.cache.iter().position(|(k, _)| *k == key) {
            self.drop_entry(i);
        }
        while !self.cache.is_empty()
            && (self.cache.len() >= self.max_entries || self.cached_bytes + need > self.max_bytes)
        {
            self.drop_entry(0);
        }
        if let Ok(snap) = model.snapshot_slot(slot) {
            self.cached_bytes += snap.bytes;
            self.cache.push((key, snap));
        }
    }

    fn drop_entry(&mut self, i: usize) {
        let (_, snap) = self.cache.remove(i);
        self.cached_bytes -= snap.bytes;
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
        let mut p = Prompts::new(
            3,
            CacheBounds {
                entries: 4,
                bytes: usize::MAX,
            },
            5,
        );
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
        // A recent prompt comes from the cache (no prompt work), an evicted
        // one runs again.
        let work = m.prompt_work();
        m.reset_slot(0, &SessionParams::default()).unwrap();
        assert_eq!(p.open(&mut m, 0, &prompt(9)).unwrap(), Opened::FromCache);
        assert_eq!(m.prompt_work(), work);
        m.reset_slot(0, &SessionParams::default()).unwrap();
        assert_eq!(p.open(&mut m, 0, &prompt(0)).unwrap(), Opened::Started);
        assert_eq!(ready.len(), 10);
    }

    /// Runs `prompt(i)` in `slot` to its end.
    fn run(p: &mut Prompts, m: &mut CpuModel, slot: usize, i: usize) -> Opened {
        m.reset_slot(slot, &SessionParams::default()).unwrap();
        let opened = p.open(m, slot, &prompt(i)).unwrap();
        while p.running(slot) {
            p.advance(m);
        }
        opened
    }

    #[test]
    fn the_byte_bound_holds_and_makes_room_least_recently_used_first() {
        let mut m = persona();
        // Every prompt here has the same length: find one state's size.
        let mut probe = Prompts::new(
            1,
            CacheBounds {
                entries: 1,
                bytes: usize::MAX,
            },
            64,
        );
        run(&mut probe, &mut m, 0, 0);
        let one = probe.cached_bytes();
        assert!(one > 0);
        // Room for two and a half states, entries to spare.
        let mut p = Prompts::new(
            2,
            CacheBounds {
                entries: 100,
                bytes: 2 * one + one / 2,
            },
            64,
        );
        for i in 0..20 {
            assert_eq!(run(&mut p, &mut m, i % 2, i), Opened::Started);
            assert!(p.cached_bytes() <= 2 * one + one / 2);
            assert_eq!(p.cached(), (i + 1).min(2));
        }
        assert_eq!(p.cached_bytes(), 2 * one);
        // Using 18 makes 19 the least recently used: 20 pushes 19 out.
        assert_eq!(run(&mut p, &mut m, 0, 18), Opened::FromCache);
        assert_eq!(run(&mut p, &mut m, 1, 20), Opened::Started);
        assert_eq!(run(&mut p, &mut m, 0, 18), Opened::FromCache);
        assert_eq!(run(&mut p, &mut m, 1, 19), Opened::Started);
        // A bound smaller than one state keeps none.
        let mut tiny = Prompts::new(
            1,
            CacheBounds {
                entries: 100,
                bytes: one - 1,
            },
            64,
        );
        run(&mut tiny, &mut m, 0, 0);
        assert_eq!((tiny.cached(), tiny.cached_bytes()), (0, 0));
        assert_eq!(run(&mut tiny, &mut m, 0, 0), Opened::Started);
    }
}
