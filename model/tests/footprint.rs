//! The CPU footprint ([`moshid_model::footprint`]) against what a real load
//! allocates: a counting global allocator watches `CpuModel::load` of the
//! golden fixtures and the demo checkpoint at 1 and 8 slots.
//!
//! The footprint must be an upper bound of the peak (the preflight would
//! otherwise let an unservable model start), and a close one for what grows
//! with the slots (or it would refuse machines that can serve).

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::footprint::CpuFootprint;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
/// One measurement at a time (the test harness runs tests on threads).
static ONE: Mutex<()> = Mutex::new(());

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size() as u64, Relaxed) + l.size() as u64;
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size() as u64, Relaxed) + l.size() as u64;
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size() as u64, Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            LIVE.fetch_sub(l.size() as u64, Relaxed);
            let now = LIVE.fetch_add(new as u64, Relaxed) + new as u64;
            PEAK.fetch_max(now, Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// (peak during load, live after load) in bytes above what was live before.
fn measure(dir: &CheckpointDir, slots: usize) -> (u64, u64) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let model = CpuModel::load(dir, slots).expect("loading the checkpoint");
    let live = LIVE.load(Relaxed) - base;
    let peak = PEAK.load(Relaxed) - base;
    drop(model);
    (peak, live)
}

fn folders() -> Vec<(String, PathBuf, Option<tempfile::TempDir>)> {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden");
    let mut out: Vec<_> = ["moshi-tiny", "hibiki-tiny"]
        .iter()
        .map(|n| (n.to_string(), golden.join(n), None))
        .collect();
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("demo");
    moshid_model::demo::write_demo(&d, 3).unwrap();
    out.push(("demo".into(), d, Some(t)));
    out
}

#[test]
fn the_footprint_bounds_a_real_load_closely() {
    let _one = ONE.lock().unwrap();
    for (name, path, _keep) in folders() {
        let dir = CheckpointDir::open(&path).unwrap();
        let f = CpuFootprint::new(&dir.lm, &dir.mimi);
        let (peak1, live1) = measure(&dir, 1);
        let (peak8, live8) = measure(&dir, 8);
        let per_slot_measured = (live8 - live1) as f64 / 7.0;
        let per_slot = f.bytes_per_slot() as f64;
        let base_measured = live1 as f64 - per_slot_measured;
        eprintln!(
            "{name}: peak {peak1} / {peak8} B (1 / 8 slots), predicted {} / {}; \
             per slot measured {per_slot_measured:.0}, predicted {per_slot:.0}; \
             weights+fixed measured {base_measured:.0}, predicted weights {}",
            f.bytes_for(1),
            f.bytes_for(8),
            f.weight_bytes()
        );
        assert!(
            peak1 <= f.bytes_for(1) && peak8 <= f.bytes_for(8),
            "{name}: under-predicted"
        );
        assert!(
            per_slot >= per_slot_measured && per_slot <= 1.5 * per_slot_measured,
            "{name}: per-slot figure {per_slot:.0} vs {per_slot_measured:.0} measured"
        );
        let weights = f.weight_bytes() as f64;
        assert!(
            weights >= 0.9 * base_measured && weights <= 1.1 * base_measured,
            "{name}: weights {weights:.0} vs {base_measured:.0} measured"
        );
    }
}
