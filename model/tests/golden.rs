//! The `golden` target: every fixture folder (every folder of
//! `../shared/golden`, `../shared/golden-next/hibiki-zero-tiny`, and the
//! folders of `MOSHID_GOLDEN`, colon-separated) against the official
//! implementation's numbers — Mimi codes exact and audio within 1e-4
//! relative error (`mimi::`), LM tokens exact, text logits within 1e-4 and
//! slot reuse exact (`lm::`) — and the whole CPU step allocation-free
//! (`cpu::`). Failures name the tensor, stream, step and codebook.

#[path = "golden_alloc.rs"]
mod alloc_count;
#[path = "golden/cpu.rs"]
mod cpu;
#[path = "golden_fixtures.rs"]
mod fixtures;
#[path = "golden/lm.rs"]
mod lm;
#[path = "golden/mimi.rs"]
mod mimi;
#[path = "golden/persona.rs"]
mod persona;
#[path = "golden/text_rules.rs"]
mod text_rules;
