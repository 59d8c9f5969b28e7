//! Stream operations: each copy, fill, launch, GEMM and graph launch that
//! passed its checks becomes an [`Op`], run at once, queued until the next
//! synchronisation (deferred mode) or, while capturing, recorded into the
//! graph being captured; a graph replays its ops in order.
//!
//! Invariants: an op is recorded with its arguments by value and host
//! buffers by address (the device keeps every host buffer alive, so a replay
//! never reads freed memory); a call CUDA cannot capture is refused while
//! capturing and discards the capture, as does a failed check; a faulted
//! device runs nothing.

use super::gemm::gemm;
use super::EmuDevice;
use crate::device::{Arg, DevPtr, DeviceError, DeviceResult, Gemm};

/// One stream operation, as run or as recorded in a graph.
#[derive(Debug, Clone)]
pub(super) enum Op {
    ToDevice {
        dst: DevPtr,
        src: usize,
        bytes: usize,
    },
    ToHost {
        dst: usize,
        src: DevPtr,
        bytes: usize,
    },
    OnDevice {
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    },
    Zero {
        dst: DevPtr,
        bytes: usize,
    },
    Launch {
        kernel: u32,
        grid: [u32; 3],
        block: u32,
        args: Vec<Arg>,
    },
    Gemm(Gemm),
    Graph(u32),
    /// A timing event: the host clock when the stream reaches it.
    Event(u32),
}

/// Fills `bytes` bytes at `dst` with the garbage pattern of the emulator's
/// shared memory (NaN as f32).
///
/// # Safety
/// The range must lie in memory nobody else accesses meanwhile.
unsafe fn poison_host(dst: usize, bytes: usize) {
    let p = dst as *mut u8;
    for i in 0..bytes {
        p.add(i).write((super::POISON >> (8 * (i % 4))) as u8);
    }
}

pub(super) fn capture_error(why: impl Into<String>) -> DeviceError {
    DeviceError::Capture(why.into())
}

impl EmuDevice {
    pub(super) fn not_capturing(&mut self, call: &str) -> DeviceResult<()> {
        if self.capture.take().is_some() {
            return Err(capture_error(format!(
                "{call} is not allowed while capturing (the capture is discarded)"
            )));
        }
        Ok(())
    }

    fn issue(&mut self, op: Op) -> DeviceResult<()> {
        match &mut self.capture {
            Some(ops) => {
                ops.push(op);
                Ok(())
            }
            None if self.deferred => {
                if let Op::ToHost { dst, bytes, .. } = op {
                    // SAFETY: dst..dst + bytes lies in a live host buffer of
                    // this device (checked when issued), whose contents the
                    // host may not read before synchronising (the `Device`
                    // contract): garbage until the copy runs.
                    unsafe { poison_host(dst, bytes) };
                }
                self.pending.push(op);
                Ok(())
            }
            None => self.execute(&op),
        }
    }

    /// Runs the deferred ops, in order; the first failure faults the device
    /// and drops the rest (as work queued behind a failed kernel on a GPU).
    pub(super) fn flush(&mut self) -> DeviceResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut ops = std::mem::take(&mut self.pending);
        let r = ops.iter().try_for_each(|op| self.execute(op));
        ops.clear();
        // Keep the queue's capacity for the next step.
        self.pending = ops;
        r
    }

    /// Records or runs an op that passed its checks; while capturing, a
    /// failed check discards the capture.
    pub(super) fn checked(&mut self, op: DeviceResult<Op>) -> DeviceResult<()> {
        self.faulted()?;
        match op {
            Ok(op) => self.issue(op),
            Err(e) => {
                self.capture = None;
                Err(e)
            }
        }
    }

    fn execute(&mut self, op: &Op) -> DeviceResult<()> {
        self.faulted()?;
        match *op {
            Op::ToDevice { dst, src, bytes } => {
                // SAFETY: src lies in a live host buffer of this device and dst
                // in one of its allocations (checked when issued; neither is
                // ever freed while the device lives); distinct memory.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::ToHost { dst, src, bytes } => {
                // SAFETY: as above, the other way; the host reads the buffer
                // only after `synchronize` (the `Device` contract).
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::OnDevice { dst, src, bytes } => {
                // SAFETY: both ranges lie inside allocations of this device
                // (checked when issued); `copy` allows them to overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::Zero { dst, bytes } => {
                // SAFETY: the range lies inside an allocation (checked when issued).
                unsafe { std::ptr::write_bytes(dst as *mut u8, 0, bytes) }
            }
            Op::Gemm(g) => gemm(&g, &mut self.gemm_scratch),
            Op::Event(id) => self.events[id as usize] = Some(std::time::Instant::now()),
            Op::Graph(id) => {
                let ops = self.graphs[id as usize].clone();
                for op in ops.iter() {
                    self.execute(op)?;
                }
            }
            Op::Launch {
                kernel,
                grid,
                block,
                ref args,
            } => self.run(kernel, grid, block, args)?,
        }
        Ok(())
    }
}
