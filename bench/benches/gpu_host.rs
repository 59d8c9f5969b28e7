//! The host's share of one GPU step: what moshid's CPU does per frame when
//! the GPU model serves `b` streams of the real Moshi 7B shape — compact the
//! active slots, write every step descriptor, transformer row and PCM frame
//! into the pinned staging, issue the frame (one graph launch, or every
//! launch and GEMM when graphs are off), synchronise, and scatter tokens and
//! PCM back into the batch. The device here does no device work
//! ([`HostOnlyDevice`]: launches, GEMMs and copies return at once), so what
//! is timed is moshid's own bookkeeping; the GPU's time adds to it.
//!
//! Baseline, measured in the same run: copying the batch's input and output
//! PCM once each (`b` × 1920 samples in, the same out), the least any
//! implementation must do per frame. Also printed: launches and GEMMs per
//! frame with graphs off (what a graph replaces by one launch).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moshid_kernels::device::{
    Arg, DevPtr, Device, DeviceError, DeviceResult, Gemm, GraphId, HostAlloc, HostBuf, KernelId,
};
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::plan::KvDtype;
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::streaming::{SessionParams, StreamingModel};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Host memory for the staging buffers (the only memory the host touches),
/// 64-byte aligned inside an over-allocated vector.
struct HostMem {
    buf: Vec<u8>,
    at: usize,
    bytes: usize,
}

impl HostMem {
    fn new(bytes: usize) -> Self {
        // 0x01 bytes: ready flags set, finite PCM (1.4e-38), so every step
        // scatters a full output frame per stream, as a real device's
        // results would make it (the device writes them by DMA, no host
        // cost; here they are simply already there).
        let buf = vec![1u8; bytes + 64];
        let at = buf.as_ptr().align_offset(64);
        HostMem { buf, at, bytes }
    }
}

impl HostAlloc for HostMem {
    fn ptr(&self) -> *mut u8 {
        self.buf[self.at..].as_ptr() as *mut u8
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A device that does no device work: addresses are handed out but never
/// dereferenced, launches and GEMMs are counted and return at once.
struct HostOnlyDevice {
    next: u64,
    kernels: Vec<String>,
    launches: Arc<AtomicU64>,
    gemms: Arc<AtomicU64>,
    graphs: u32,
}

impl HostOnlyDevice {
    fn new() -> Self {
        let mut kernels = Vec::new();
        for m in moshid_kernels::compile::MODULES {
            kernels.extend(m.kernels.iter().map(|k| k.to_string()));
        }
        HostOnlyDevice {
            next: 1 << 20,
            kernels,
            launches: Arc::default(),
            gemms: Arc::default(),
            graphs: 0,
        }
    }
}

impl Device for HostOnlyDevice {
    fn name(&self) -> String {
        "host-only".into()
    }
    fn memory(&self) -> DeviceResult<(usize, usize)> {
        Ok((usize::MAX / 2, usize::MAX / 2))
    }
    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
        let p = self.next;
        self.next += (bytes.div_ceil(256) * 256) as u64 + 256;
        Ok(p)
    }
    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        Ok(HostBuf::new(Box::new(HostMem::new(bytes))))
    }
    fn upload(&mut self, _: DevPtr, _: &[u8]) -> DeviceResult<()> {
        Ok(())
    }
    fn download(&mut self, _: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        dst.fill(0);
        Ok(())
    }
    fn copy_to_device(&mut self, _: DevPtr, _: &HostBuf, _: usize, _: usize) -> DeviceResult<()> {
        Ok(())
    }
    fn copy_to_host(&mut self, _: &HostBuf, _: usize, _: DevPtr, _: usize) -> DeviceResult<()> {
        Ok(())
    }
    fn copy_on_device(&mut self, _: DevPtr, _: DevPtr, _: usize) -> DeviceResult<()> {
        Ok(())
    }
    fn memset_zero(&mut self, _: DevPtr, _: usize) -> DeviceResult<()> {
        Ok(())
    }
    fn kernel(&self, name: &str) -> DeviceResult<KernelId> {
        self.kernels
            .iter()
            .position(|k| k == name)
            .map(|i| KernelId(i as u32))
            .ok_or_else(|| DeviceError::UnknownKernel(name.into()))
    }
    fn launch(
        &mut self,
        _: KernelId,
        _: (u32, u32, u32),
        _: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        std::hint::black_box(args);
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        moshid_kernels::device::check_gemm(g)?;
        self.gemms.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn synchronize(&mut self) -> DeviceResult<()> {
        Ok(())
    }
    fn begin_capture(&mut self) -> DeviceResult<()> {
        Ok(())
    }
    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        self.graphs += 1;
        Ok(GraphId(self.graphs - 1))
    }
    fn launch_graph(&mut self, _: GraphId) -> DeviceResult<()> {
        Ok(())
    }
}

fn bench_host(c: &mut Criterion) {
    let lm = LmConfig::moshi_7b();
    let mimi = MimiConfig::mimi_default();
    let mut group = c.benchmark_group("gpu_step_host_per_stream_frame");
    for b in [1usize, 8, 64] {
        group.throughput(Throughput::Elements(b as u64));
        for graphs in [true, false] {
            let dev = HostOnlyDevice::new();
            let (launches, gemms) = (dev.launches.clone(), dev.gemms.clone());
            let opts = GpuOptions {
                max_slots: b,
                precision: Precision::Bf16,
                kv: KvDtype::Bf16,
                graphs,
                ..GpuOptions::default()
            };
            let mut model = GpuModel::random(dev, &lm, &mimi, 1, &opts).expect("host-only model");
            for s in 0..b {
                model.reset_slot(s, &SessionParams::default()).unwrap();
                // Past the model's delay, so every step has an output frame
                // (what the pre-filled staging reports: see `HostMem`).
                model.fast_forward_for_timing(s, lm.max_delay()).unwrap();
            }
            let mut batch = model.new_batch();
            batch.exec[..b].fill(true);
            model.step(&mut batch).unwrap();
            if !graphs {
                let (l0, g0) = (
                    launches.load(Ordering::Relaxed),
                    gemms.load(Ordering::Relaxed),
                );
                model.step(&mut batch).unwrap();
                println!(
                    "batch {b}: {} kernel launches and {} GEMMs per frame without graphs (one graph launch with)",
                    launches.load(Ordering::Relaxed) - l0,
                    gemms.load(Ordering::Relaxed) - g0
                );
            }
            let name = if graphs { "graphs_on" } else { "graphs_off" };
            group.bench_with_input(BenchmarkId::new(name, b), &b, |bn, _| {
                bn.iter(|| model.step(&mut batch).unwrap())
            });
        }
        let input = vec![0.25f32; b * 1920];
        let mut staging = vec![0.0f32; b * 1920];
        let mut output = vec![0.0f32; b * 1920];
        group.bench_with_input(BenchmarkId::new("baseline_pcm_copies", b), &b, |bn, _| {
            bn.iter(|| {
                staging.copy_from_slice(std::hint::black_box(&input));
                output.copy_from_slice(std::hint::black_box(&staging));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_host);
criterion_main!(benches);
