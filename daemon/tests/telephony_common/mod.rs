//! Shared by the telephony end-to-end tests: the real `moshid serve` on
//! loopback (the end-to-end suites' one [`Daemon`], from `tests/common`),
//! plain HTTP requests, test audio, and summaries of packet arrival gaps.
//!
//! Every wait is bounded (socket timeouts, deadlines), so a hung daemon
//! fails a test instead of hanging it.

#![allow(dead_code)] // each test binary uses a subset

#[path = "../../../tests/common/mod.rs"]
pub mod common;

use std::sync::Mutex;
use std::time::Instant;

/// Bound on any socket read or write.
pub use common::IO_TIMEOUT;

/// One daemon at a time: the machine may have two CPUs.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// The daemon: the one helper every end-to-end suite starts it with.
pub use common::Daemon;

/// `n` samples of a 440 Hz tone at `rate`, 16-bit.
pub fn tone(rate: u32, start: usize, n: usize) -> Vec<i16> {
    (start..start + n)
        .map(|i| {
            ((2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin() * 8000.0) as i16
        })
        .collect()
}

/// Arrival gaps of paced packets, in milliseconds: printed, not asserted.
pub fn print_gaps(what: &str, arrivals: &[Instant]) {
    if arrivals.len() < 2 {
        println!("{what}: {} packets, no gaps to measure", arrivals.len());
        return;
    }
    let mut gaps: Vec<f64> = arrivals
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    gaps.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
    let span = (arrivals[arrivals.len() - 1] - arrivals[0]).as_secs_f64() * 1000.0;
    println!(
        "{what}: {} packets over {span:.0} ms; gap ms: mean {mean:.2}, min {:.2}, p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
        arrivals.len(),
        gaps[0],
        pct(0.5),
        pct(0.9),
        pct(0.99),
        gaps[gaps.len() - 1]
    );
}

/// Plain HTTP requests to the daemon: the end-to-end suites' own.
#[allow(unused_imports)] // each test binary uses a subset
pub use common::{http_request, http_request_with};
