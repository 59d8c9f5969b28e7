//! `engine.*`: phase groups, the budget's margin, the engine's queue per
//! slot and its warm-up.

use super::{invalid, ConfigError};
use crate::engine::grouping::{MaxGroups, MAX_FIXED_GROUPS};
use serde::{Deserialize, Serialize};

/// `engine.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Most phase groups: a number 1..=4 or `"auto"` (up to 16). The engine
    /// uses as many as load allows, each ticking 80/G ms after the previous.
    #[serde(with = "max_groups_serde")]
    pub phase_groups: MaxGroups,
    /// Time kept free in each group's budget, in milliseconds.
    pub budget_margin_ms: f64,
    /// Frames a slot may have queued at the engine before new ones are dropped.
    pub queued_frames_per_slot: usize,
    /// Model steps per batch size during warm-up.
    pub warmup_steps: usize,
    /// Frames of prompt prefill work (voice encodes, transformer positions)
    /// the engine does per tick, before stepping the tick's streams.
    pub prompt_frames_per_tick: usize,
    /// Prefilled prompt states kept for reuse (one per voice and role text).
    pub prompt_cache_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            phase_groups: MaxGroups::Auto,
            budget_margin_ms: 10.0,
            queued_frames_per_slot: 4,
            warmup_steps: 3,
            prompt_frames_per_tick: 8,
            prompt_cache_entries: 16,
        }
    }
}

/// `engine.phase_groups` as JSON: a number, or `"auto"`.
mod max_groups_serde {
    use super::MaxGroups;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &MaxGroups, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(v, s)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(usize),
        Word(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MaxGroups, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(MaxGroups::Fixed(n)),
            Raw::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl EngineConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = self;
        if let MaxGroups::Fixed(n) = e.phase_groups {
            if !(1..=MAX_FIXED_GROUPS).contains(&n) {
                return Err(invalid(
                    "engine.phase_groups",
                    "must be between 1 and 4, or \"auto\"",
                ));
            }
        }
        if !(0.0..crate::FRAME_MS).contains(&e.budget_margin_ms) {
            return Err(invalid(
                "engine.budget_margin_ms",
                format!(
                    "must be at least 0 and below the frame period {} ms",
                    crate::FRAME_MS
                ),
            ));
        }
        if e.prompt_frames_per_tick == 0 || e.prompt_frames_per_tick > 4096 {
            return Err(invalid(
                "engine.prompt_frames_per_tick",
                "must be between 1 and 4096",
            ));
        }
        if e.prompt_cache_entries > 4096 {
            return Err(invalid(
                "engine.prompt_cache_entries",
                "must be at most 4096",
            ));
        }
        if e.queued_frames_per_slot == 0 || e.queued_frames_per_slot > 64 {
            return Err(invalid(
                "engine.queued_frames_per_slot",
                "must be between 1 and 64",
            ));
        }
        if e.warmup_steps == 0 || e.warmup_steps > 100 {
            return Err(invalid("engine.warmup_steps", "must be between 1 and 100"));
        }
        Ok(())
    }
}
