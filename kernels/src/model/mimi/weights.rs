//! Where Mimi's tensors come from and how they reach the device.
//!
//! [`Source`] hands out tensors by official name and shape: either a
//! checkpoint ([`Weights`], exactly as the CPU `Mimi::load` takes them) or a
//! deterministic pseudo-random generator ([`RandomSource`]) for timing the
//! real shape without a checkpoint. [`Mem`] allocates on the device, counts
//! the bytes of each kind (weights, per-slot state, scratch) and sends every
//! upload through one pinned [`Staging`] buffer.
//!
//! Invariants: a tensor's random values depend only on the seed and its name
//! (not on the order of the calls); every allocation of a [`GpuMimi`]
//! (super::GpuMimi) goes through one [`Mem`], so its byte counts are the
//! model's whole device footprint.

use super::super::staging::Staging;
use super::super::GpuError;
use crate::device::{as_bytes, DevPtr, Device, DeviceResult};
use moshid_model::weights::Weights;

/// Tensors by name, each as f32 in row-major order of `shape`.
pub(crate) trait Source {
    /// The tensor `name`, which must have `shape`.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, GpuError>;
}

impl Source for Weights {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, GpuError> {
        Ok(Weights::take(self, name, shape)?)
    }
}

/// Deterministic random tensors, scaled so that activations stay bounded
/// through the whole codec: matrices uniform in ±√(3/fan_in) (unit-variance
/// outputs), norm weights 1 ± 0.1, layer scales 0.1, biases and codebook
/// sums ±0.05, codebook usages 1.
#[derive(Debug, Clone)]
pub(crate) struct RandomSource {
    seed: u64,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl RandomSource {
    pub(crate) fn new(seed: u64) -> Self {
        RandomSource { seed }
    }
}

impl Source for RandomSource {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, GpuError> {
        // FNV-1a of the name, mixed with the seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let mut state = splitmix(self.seed ^ h);
        let mut uniform = move || {
            state = splitmix(state);
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let n: usize = shape.iter().product();
        let fan = if shape.len() > 1 { n / shape[0] } else { 0 };
        let kind = |v: f32| -> f32 {
            if name.ends_with("cluster_usage") || name.ends_with("_initialized") {
                1.0
            } else if name.ends_with(".scale") {
                0.1
            } else if name.contains("norm") && name.ends_with("weight") {
                1.0 + 0.1 * v
            } else if fan > 0 && !name.ends_with("embedding_sum") {
                v * (3.0 / fan as f32).sqrt()
            } else {
                0.05 * v
            }
        };
        Ok((0..n).map(|_| kind(uniform())).collect())
    }
}

/// Device allocations of one model, counted by kind, and the pinned staging
/// its uploads go through (made at the first upload).
#[derive(Debug, Default)]
pub(crate) struct Mem {
    /// Weight bytes.
    pub(crate) weights: usize,
    /// State bytes for all slots.
    pub(crate) state: usize,
    /// Scratch bytes.
    pub(crate) scratch: usize,
    staging: Option<Staging>,
}

/// Which count an allocation goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Weights,
    State,
    Scratch,
}

impl Mem {
    /// `bytes` of zeroed device memory (at least 4).
    pub(crate) fn alloc<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        kind: Kind,
        bytes: usize,
    ) -> DeviceResult<DevPtr> {
        let bytes = bytes.max(4);
        let p = dev.alloc(bytes)?;
        *match kind {
            Kind::Weights => &mut self.weights,
            Kind::State => &mut self.state,
            Kind::Scratch => &mut self.scratch,
        } += bytes;
        Ok(p)
    }

    /// `bytes` floats of zeroed device memory.
    pub(crate) fn floats<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        kind: Kind,
        n: usize,
    ) -> DeviceResult<DevPtr> {
        self.alloc(dev, kind, n * 4)
    }

    /// A device copy of `data` (counted as `kind`).
    pub(crate) fn upload_f32<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        kind: Kind,
        data: &[f32],
    ) -> DeviceResult<DevPtr> {
        let p = self.floats(dev, kind, data.len())?;
        Staging::in_slot(&mut self.staging, dev)?.upload_bytes(dev, p, as_bytes(data))?;
        Ok(p)
    }

    /// A device copy of `data` (counted as `kind`).
    pub(crate) fn upload_i32<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        kind: Kind,
        data: &[i32],
    ) -> DeviceResult<DevPtr> {
        let p = self.alloc(dev, kind, data.len() * 4)?;
        Staging::in_slot(&mut self.staging, dev)?.upload_bytes(dev, p, as_bytes(data))?;
        Ok(p)
    }
}

/// `p` advanced by `floats` f32 elements.
pub(crate) fn at(p: DevPtr, floats: usize) -> DevPtr {
    p + (floats * 4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tensors_depend_on_seed_and_name_only() {
        let mut a = RandomSource::new(7);
        let mut b = RandomSource::new(7);
        let x1 = a.take("x.weight", &[4, 3]).unwrap();
        let _ = a.take("y.weight", &[4, 3]).unwrap();
        let _ = b.take("y.weight", &[4, 3]).unwrap();
        assert_eq!(b.take("x.weight", &[4, 3]).unwrap(), x1);
        assert_ne!(RandomSource::new(8).take("x.weight", &[4, 3]).unwrap(), x1);
        let bound = (3.0f32 / 3.0).sqrt();
        assert!(x1.iter().all(|v| v.abs() <= bound));
        assert_eq!(a.take("q.cluster_usage", &[5]).unwrap(), vec![1.0; 5]);
    }
}
