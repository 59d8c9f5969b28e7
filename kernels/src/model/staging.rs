//! Set-up uploads through page-locked staging: how weights travel from the
//! mapped checkpoint to the device.
//!
//! A [`Staging`] is one pinned host buffer cut in two halves of
//! `chunk_bytes`. [`Staging::upload`] asks its caller to write the next chunk
//! of a tensor (straight from the checkpoint's mapped bytes, converting as it
//! goes) into one half, queues that half's copy on the device's stream, and
//! fills the other half while the copy runs: the host's conversion overlaps
//! the transfer, and the transfer is a DMA from page-locked memory instead of
//! the driver's own bounce through a pageable buffer.
//!
//! Invariants: a half is refilled only after a synchronisation that followed
//! its last copy; when `upload` returns, every copy it queued has completed,
//! so the buffer can be reused for the next tensor or dropped at once, and no
//! caller has to remember a final synchronisation. Chunk boundaries are
//! multiples of 64 bytes, hence of every element size, so a chunk always
//! holds whole values.

use crate::device::{DevPtr, Device, DeviceResult, HostBuf};

/// The default half size: large enough that per-copy overhead vanishes
/// beside the transfer (≈ 0.2 ms per chunk at PCIe 4 speed), small enough
/// that the pinned buffer (twice this) costs nothing beside the weights.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;

/// A double-buffered pinned staging area (see the module doc).
pub struct Staging {
    buf: HostBuf,
    chunk_bytes: usize,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("chunk_bytes", &self.chunk_bytes)
            .finish()
    }
}

impl Staging {
    /// Allocates two halves of `chunk_bytes` (rounded down to a multiple of
    /// 64, at least 64) of page-locked memory.
    pub fn new<D: Device + ?Sized>(dev: &mut D, chunk_bytes: usize) -> DeviceResult<Self> {
        let chunk_bytes = (chunk_bytes / 64).max(1) * 64;
        Ok(Staging {
            buf: dev.alloc_host(2 * chunk_bytes)?,
            chunk_bytes,
        })
    }

    /// The staging kept in `slot`, made there (with [`STAGING_CHUNK_BYTES`]
    /// halves) at the first upload: loaders hold one for their whole load.
    pub fn in_slot<'s, D: Device + ?Sized>(
        slot: &'s mut Option<Staging>,
        dev: &mut D,
    ) -> DeviceResult<&'s mut Staging> {
        match slot {
            Some(s) => Ok(s),
            None => Ok(slot.insert(Staging::new(dev, STAGING_CHUNK_BYTES)?)),
        }
    }

    /// Bytes per half.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Writes `total_bytes` at `dst`: `fill(offset, out)` must write bytes
    /// `offset .. offset + out.len()` of what is uploaded into `out`
    /// (`offset` is a multiple of 64). Returns once the whole range is on
    /// the device.
    pub fn upload<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        dst: DevPtr,
        total_bytes: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> DeviceResult<()> {
        let mut offset = 0;
        let mut half = 0;
        let mut in_flight = [false; 2];
        while offset < total_bytes {
            if in_flight[half] {
                // One stream: synchronising retires both halves' copies.
                dev.synchronize()?;
                in_flight = [false; 2];
            }
            let n = (total_bytes - offset).min(self.chunk_bytes);
            let at = half * self.chunk_bytes;
            fill(offset, self.buf.view_mut::<u8>(at, n));
            dev.copy_to_device(dst + offset as u64, &self.buf, at, n)?;
            in_flight[half] = true;
            offset += n;
            half ^= 1;
        }
        if in_flight.contains(&true) {
            dev.synchronize()?;
        }
        Ok(())
    }

    /// Uploads `src` as it is.
    pub fn upload_bytes<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        dst: DevPtr,
        src: &[u8],
    ) -> DeviceResult<()> {
        self.upload(dev, dst, src.len(), |off, out| {
            out.copy_from_slice(&src[off..off + out.len()])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu::EmuDevice;

    #[test]
    fn uploads_of_every_length_arrive_whole() {
        let mut dev = EmuDevice::new();
        let mut st = Staging::new(&mut dev, 100).unwrap();
        assert_eq!(st.chunk_bytes(), 64);
        for len in [0usize, 1, 63, 64, 65, 128, 129, 1000] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let dst = dev.alloc(len.max(1)).unwrap();
            let mut offsets = Vec::new();
            st.upload(&mut dev, dst, len, |off, out| {
                offsets.push((off, out.len()));
                out.copy_from_slice(&src[off..off + out.len()]);
            })
            .unwrap();
            let mut back = vec![0u8; len];
            dev.download(dst, &mut back).unwrap();
            assert_eq!(back, src, "length {len}");
            // Whole 64-byte chunks in order, the last one short.
            let expect: Vec<(usize, usize)> = (0..len.div_ceil(64))
                .map(|c| (64 * c, (len - 64 * c).min(64)))
                .collect();
            assert_eq!(offsets, expect, "length {len}");
        }
    }

    #[test]
    fn a_range_outside_the_allocation_is_an_error() {
        let mut dev = EmuDevice::new();
        let mut st = Staging::new(&mut dev, 64).unwrap();
        let dst = dev.alloc(100).unwrap();
        assert!(st.upload_bytes(&mut dev, dst, &[1u8; 101]).is_err());
    }
}
