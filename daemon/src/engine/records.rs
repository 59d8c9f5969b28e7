//! The fixed-size records that cross the lanes between I/O cores and the
//! engine thread.
//!
//! Invariants: records are `Copy` and self-contained (no pointers into
//! session memory), so a lane moves one with a single copy. Every record
//! names its slot and the slot's generation: the engine and the I/O cores
//! ignore records of an older generation, so a reused slot never receives a
//! previous session's frames.

use crate::FRAME_SAMPLES;
use std::time::Instant;

/// What an I/O core asks of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToEngineKind {
    /// A session was admitted to the slot: reset it (parameters are in the
    /// admission table) and start stepping it.
    #[default]
    Open,
    /// One input frame for the slot.
    Frame,
    /// The session ended: free the slot.
    Close,
    /// The session's input is over: the next step of the slot feeds the
    /// model's end-of-stream input instead of audio (Hibiki's drain).
    EndOfInput,
}

/// A record from an I/O core to the engine.
#[derive(Debug, Clone, Copy)]
pub struct ToEngine {
    /// What this record is.
    pub kind: ToEngineKind,
    /// The slot.
    pub slot: u32,
    /// The slot's generation (bumped at each admission).
    pub generation: u32,
    /// When the frame was pushed, set only while stage metrics are on (the
    /// engine's `frame_wait` sample); `None` costs no clock read.
    pub pushed_at: Option<Instant>,
    /// When the frame's last sample reached its I/O core, for transports
    /// whose client decides when frames complete (WebSocket): the engine
    /// measures the stream's phase from it. `None` where the transport
    /// places the frame cut itself (telephony: aligned to its group's tick).
    pub completed_at: Option<Instant>,
    /// 24 kHz mono samples (meaningful for `Frame`).
    pub pcm: [f32; FRAME_SAMPLES],
}

impl Default for ToEngine {
    fn default() -> Self {
        ToEngine {
            kind: ToEngineKind::Open,
            slot: 0,
            generation: 0,
            pushed_at: None,
            completed_at: None,
            pcm: [0.0; FRAME_SAMPLES],
        }
    }
}

/// What the engine reports for one input frame of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FromEngineKind {
    /// The frame was stepped and produced audio and a text token.
    #[default]
    Output,
    /// The frame was stepped; the model has no output yet (its delay).
    NoOutputYet,
    /// The frame was dropped: the slot's queue at the engine was full.
    Dropped,
    /// The model failed for this slot; the session must end.
    Fault,
    /// The slot's prompt prefill is done (models with prompts): the session
    /// may now announce itself (WebSocket: the handshake byte). Answers no
    /// frame.
    PromptReady,
}

/// A record from the engine to an I/O core.
#[derive(Debug, Clone, Copy)]
pub struct FromEngine {
    /// What this record is.
    pub kind: FromEngineKind,
    /// The slot.
    pub slot: u32,
    /// The slot's generation.
    pub generation: u32,
    /// The text token generated with this frame (for `Output`).
    pub text_token: u32,
    /// The tick that stepped this frame started late.
    pub late: bool,
    /// 24 kHz mono output samples (for `Output`).
    pub pcm: [f32; FRAME_SAMPLES],
}

impl Default for FromEngine {
    fn default() -> Self {
        FromEngine {
            kind: FromEngineKind::Output,
            slot: 0,
            generation: 0,
            text_token: 0,
            late: false,
            pcm: [0.0; FRAME_SAMPLES],
        }
    }
}
