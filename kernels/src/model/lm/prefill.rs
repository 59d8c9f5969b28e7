//! Prompt prefills on the device (PersonaPlex), as the CPU reference's
//! `moshid_model::lm::prefill`: the transformer positions of a prefill run
//! as causal passes of up to [`PREFILL_CHUNK_POSITIONS`] rows of one slot
//! (the temporal ring has that many spare entries, so writing a pass's keys
//! before its attention overwrites nothing a query still sees); then the
//! slot gets the ring, forced flags and offset the bookkeeping computed.
//! Snapshots copy the KV entries a later query can see, the ring, its flags
//! and the offset into the model's snapshot arena ([`crate::model::arena`]),
//! and back into any slot, device to device.
//!
//! Invariants: only the given slot's cache rows, ring and offset change;
//! these run between steps (not captured); snapshot copies are
//! stream-ordered, so a restore issued after a snapshot reads what it wrote.

use super::GpuLm;
use super::LmKernels;
use crate::device::{as_bytes, DType, DevPtr, Device, DeviceResult};
use crate::model::arena::{ArenaSpan, SnapshotArena};
use crate::model::tensor::scratch;
use crate::ops::types::RowInfo;
use moshid_model::lm::prefill::{PositionInput, Replay, Simulated};
use moshid_model::lm::PREFILL_CHUNK_POSITIONS;
use std::sync::Arc;

/// Device buffers of a prefill pass.
pub struct PrefillBufs {
    x: DevPtr,
    rows: DevPtr,
    tokens: DevPtr,
    scratch: super::stack::StackScratch,
    host_rows: Vec<RowInfo>,
    host_tokens: Vec<u32>,
}

impl PrefillBufs {
    /// Buffers for a model of `dim` and `codebooks` streams.
    pub fn new<D: Device + ?Sized>(
        dev: &mut D,
        shape: &super::stack::StackShape,
        codebooks: usize,
        act: DType,
    ) -> DeviceResult<Self> {
        let n = PREFILL_CHUNK_POSITIONS;
        Ok(PrefillBufs {
            x: scratch(dev, n * shape.dim, DType::F32)?,
            rows: dev.alloc(n * std::mem::size_of::<RowInfo>())?,
            tokens: dev.alloc(n * codebooks * 4)?,
            scratch: super::stack::StackScratch::new(dev, n, &[shape], act)?,
            host_rows: vec![RowInfo::default(); n],
            host_tokens: vec![0; n * codebooks],
        })
    }
}

/// A prefilled slot's LM state in the snapshot arena: `[layers][2][positions]`
/// KV records, then the token ring (`u32`), its forced flags (`i32`) and
/// the offset (`i32`).
#[derive(Debug)]
pub struct GpuLmSnapshot {
    /// Steps run.
    pub offset: usize,
    first_pos: usize,
    kv_bytes: usize,
    ring_bytes: usize,
    span: ArenaSpan,
}

impl GpuLmSnapshot {
    /// Whether the snapshot lies in `arena`.
    pub fn is_in(&self, arena: &Arc<SnapshotArena>) -> bool {
        self.span.is_in(arena)
    }

    /// Bytes held in the arena.
    pub fn bytes(&self) -> usize {
        self.span.bytes()
    }
}

impl GpuLm {
    /// Runs prefill positions `t0..t0 + n` of `slot` (see the module doc).
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_pass<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        k: &LmKernels,
        slot: usize,
        sim: &Simulated,
        replay: Option<&Replay>,
        t0: usize,
        n: usize,
    ) -> DeviceResult<()> {
        let kk = self.tc_shape.codebooks;
        let dim = self.cfg.dim;
        let Some(pf) = self.prefill.as_mut() else {
            return Err(crate::device::DeviceError::shape(
                "prefill",
                "the model has no prefill",
            ));
        };
        assert!(n <= PREFILL_CHUNK_POSITIONS && t0 + n <= sim.positions());
        for i in 0..n {
            let t = t0 + i;
            pf.host_rows[i] = RowInfo {
                kv: (slot * self.rps) as i32,
                pos: t as i32,
                last: t as i32,
                step: i as i32,
                active: 1,
            };
            let toks = &mut pf.host_tokens[i * kk..(i + 1) * kk];
            match sim.inputs[t] {
                PositionInput::Tokens(at) => toks.copy_from_slice(&sim.tokens[at..at + kk]),
                PositionInput::Embedding(_) => toks.fill(0),
            }
        }
        dev.upload(pf.rows, as_bytes(&pf.host_rows[..n]))?;
        dev.upload(pf.tokens, as_bytes(&pf.host_tokens[..n * kk]))?;
        k.embed.sum(
            dev,
            self.act,
            pf.x,
            self.audio_emb.ptr,
            self.text_emb.ptr,
            self.cond,
            pf.rows,
            n,
            pf.tokens,
            kk,
            self.cfg.card,
            dim,
        )?;
        for i in 0..n {
            if let PositionInput::Embedding(e) = sim.inputs[t0 + i] {
                let r = replay.expect("a replayed position needs its voice");
                let v = &r.embeddings[e * dim..(e + 1) * dim];
                dev.upload(pf.x + (i * dim * 4) as u64, as_bytes(v))?;
            }
        }
        self.temporal
            .forward(dev, k, 0, n, pf.x, pf.rows, &pf.scratch)
    }

    /// Gives `slot` a ring, forced flags and offset (a prefill's end).
    pub fn set_ring<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        offset: usize,
        cache: &[u32],
        forced: &[i32],
    ) -> DeviceResult<()> {
        let per_slot = self.tc_shape.codebooks * self.tc_shape.ring;
        dev.upload(
            self.tc.cache + (slot * per_slot * 4) as u64,
            as_bytes(cache),
        )?;
        dev.upload(
            self.tc.forced + (slot * per_slot * 4) as u64,
            as_bytes(forced),
        )?;
        dev.upload(
            self.tc.offset + (slot * 4) as u64,
            as_bytes(&[offset as i32]),
        )
    }

    /// The ring a frame-by-frame prefill of `sim` leaves, given to `slot`.
    pub fn install_prefill<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        sim: &Simulated,
    ) -> DeviceResult<()> {
        let forced: Vec<i32> = sim.forced.iter().map(|&f| f as i32).collect();
        self.set_ring(dev, slot, sim.positions(), &sim.cache, &forced)
    }

    /// Where a snapshot of `slot` after `offset` steps keeps its parts:
    /// (first position, KV bytes, ring bytes, arena bytes).
    fn snapshot_layout(&self, offset: usize) -> (usize, usize, usize, usize) {
        let sh = self.temporal.shape();
        let first_pos = offset.saturating_sub(sh.context.saturating_sub(1));
        let kv_bytes = 2 * sh.layers * (offset - first_pos) * self.temporal.kv_position_bytes();
        let ring_bytes = self.tc_shape.codebooks * self.tc_shape.ring * 4;
        let total = crate::model::arena::rounded(kv_bytes + 2 * ring_bytes + 4);
        (first_pos, kv_bytes, ring_bytes, total)
    }

    /// The arena bytes a snapshot of a slot after `offset` steps takes.
    pub fn snapshot_bytes(&self, offset: usize) -> usize {
        self.snapshot_layout(offset).3
    }

    /// A copy of `slot`'s state after `offset` steps in `arena` (`None`:
    /// the arena has not the room).
    pub fn snapshot_slot<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        arena: &Arc<SnapshotArena>,
        slot: usize,
        offset: usize,
    ) -> DeviceResult<Option<GpuLmSnapshot>> {
        let (first_pos, kv_bytes, ring_bytes, total) = self.snapshot_layout(offset);
        let Some(span) = arena.take(total) else {
            return Ok(None);
        };
        self.temporal
            .position_runs(slot * self.rps, first_pos, offset, |cache, at, n| {
                span.pieces(at, n, |a, within, m| {
                    dev.copy_on_device(a, cache + within as u64, m)
                })
            })?;
        for (i, (src, len)) in self.ring_parts(slot, ring_bytes).into_iter().enumerate() {
            let at = kv_bytes + [0, ring_bytes, 2 * ring_bytes][i];
            span.pieces(at, len, |a, within, m| {
                dev.copy_on_device(a, src + within as u64, m)
            })?;
        }
        Ok(Some(GpuLmSnapshot {
            offset,
            first_pos,
            kv_bytes,
            ring_bytes,
            span,
        }))
    }

    /// The device ring of `slot`: its tokens, forced flags and offset.
    fn ring_parts(&self, slot: usize, ring_bytes: usize) -> [(DevPtr, usize); 3] {
        let at = (slot * ring_bytes) as u64;
        [
            (self.tc.cache + at, ring_bytes),
            (self.tc.forced + at, ring_bytes),
            (self.tc.offset + (slot * 4) as u64, 4),
        ]
    }

    /// Writes `snap` into `slot` (reset with its session's parameters).
    pub fn restore_slot<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        snap: &GpuLmSnapshot,
    ) -> DeviceResult<()> {
        let span = &snap.span;
        self.temporal.position_runs(
            slot * self.rps,
            snap.first_pos,
            snap.offset,
            |cache, at, n| {
                span.pieces(at, n, |a, within, m| {
                    dev.copy_on_device(cache + within as u64, a, m)
                })
            },
        )?;
        let (kv, rb) = (snap.kv_bytes, snap.ring_bytes);
        for (i, (dst, len)) in self.ring_parts(slot, rb).into_iter().enumerate() {
            span.pieces(kv + [0, rb, 2 * rb][i], len, |a, within, m| {
                dev.copy_on_device(dst + within as u64, a, m)
            })?;
        }
        Ok(())
    }
}
