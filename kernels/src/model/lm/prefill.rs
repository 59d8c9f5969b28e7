//! Prompt prefills on the device (PersonaPlex), as the CPU reference's
//! `moshid_model::lm::prefill`: the transformer positions of a prefill run
//! as causal passes of up to [`PREFILL_CHUNK_POSITIONS`] rows of one slot
//! (the temporal ring has that many spare entries, so writing a pass's keys
//! before its attention overwrites nothing a query still sees); then the
//! slot gets the ring, forced flags and offset the bookkeeping computed.
//! Snapshots copy the KV entries a later query can see, the ring and its
//! flags to the host, and back into any slot.
//!
//! Invariants: only the given slot's cache rows, ring and offset change;
//! these run between steps (not captured), with synchronous copies.

use super::GpuLm;
use super::LmKernels;
use crate::device::{as_bytes, DType, DevPtr, Device, DeviceResult};
use crate::model::tensor::scratch;
use crate::ops::types::RowInfo;
use moshid_model::lm::prefill::{PositionInput, Replay, Simulated};
use moshid_model::lm::PREFILL_CHUNK_POSITIONS;

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

/// A prefilled slot's LM state on the host.
#[derive(Debug, Clone)]
pub struct GpuLmSnapshot {
    /// Steps run.
    pub offset: usize,
    cache: Vec<u32>,
    forced: Vec<i32>,
    first_pos: usize,
    kv: Vec<u8>,
}

impl GpuLmSnapshot {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.kv.len() + 8 * self.cache.len()
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

    /// A copy of `slot`'s state after `offset` steps.
    pub fn snapshot_slot<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        offset: usize,
    ) -> DeviceResult<GpuLmSnapshot> {
        let sh = self.temporal.shape();
        let first_pos = offset.saturating_sub(sh.context.saturating_sub(1));
        let bytes = 2 * sh.layers * (offset - first_pos) * self.temporal.kv_position_bytes();
        let mut kv = vec![0u8; bytes];
        self.temporal
            .copy_positions(dev, slot * self.rps, first_pos, offset, &mut kv, true)?;
        let per_slot = self.tc_shape.codebooks * self.tc_shape.ring;
        let mut cache = vec![0u32; per_slot];
        let mut forced = vec![0i32; per_slot];
        dev.download(
            self.tc.cache + (slot * per_slot * 4) as u64,
            crate::device::as_bytes_mut(&mut cache),
        )?;
        dev.download(
            self.tc.forced + (slot * per_slot * 4) as u64,
            crate::device::as_bytes_mut(&mut forced),
        )?;
        Ok(GpuLmSnapshot {
            offset,
            cache,
            forced,
            first_pos,
            kv,
        })
    }

    /// Writes `snap` into `slot` (reset with its session's parameters).
    pub fn restore_slot<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        snap: &GpuLmSnapshot,
    ) -> DeviceResult<()> {
        let mut kv = snap.kv.clone();
        self.temporal.copy_positions(
            dev,
            slot * self.rps,
            snap.first_pos,
            snap.offset,
            &mut kv,
            false,
        )?;
        self.set_ring(dev, slot, snap.offset, &snap.cache, &snap.forced)
    }
}
