//! The emulator's scheduler: barriers, shuffles and their misuse, results
//! independent of the thread order, devices on several threads, and its speed.

use super::*;
use crate::conv::conv_w;
use crate::rvq::book_norms;
use crate::sampling::{sample, Sampling};
use moshid_kernels::ops::norm::NormKernels;
use moshid_kernels::ops::rvq::{RvqKernels, RvqShape};

#[test]
fn scheduler_shuffles_barriers_and_misuses() {
    let mut dev = EmuDevice::new();
    let n = 96;
    let out = zeros::<i32>(&mut dev, 4 * 1024);
    dev.launch(
        k(&dev, "emu_selftest_shuffles"),
        (1, 1, 1),
        n,
        &[Arg::Ptr(out)],
    )
    .unwrap();
    let got = down::<i32>(&mut dev, out, 4 * n as usize);
    for t in 0..n as i32 {
        let (lane, base) = (t % 32, t - t % 32);
        let v = |l: i32| (base + l) * 10;
        let g = &got[4 * t as usize..4 * t as usize + 4];
        assert_eq!(g[0], v(lane ^ 1), "xor, thread {t}");
        assert_eq!(
            g[1],
            if lane >= 3 { v(lane - 3) } else { v(lane) },
            "up, thread {t}"
        );
        assert_eq!(
            g[2],
            if lane + 5 < 32 { v(lane + 5) } else { v(lane) },
            "down, thread {t}"
        );
        assert_eq!(g[3], v(7), "idx, thread {t}");
    }
    // A missing barrier shows in every order; with it, every order agrees.
    for order in [
        Order::Reverse,
        Order::Forward,
        Order::Shuffled(5),
        Order::WarpsAhead(2),
    ] {
        dev.set_order(order);
        let want: Vec<i32> = (0..256).map(|t| (t + 1) % 256).collect();
        for barrier in [1, 0] {
            let out = zeros::<i32>(&mut dev, 256);
            dev.launch(
                k(&dev, "emu_selftest_neighbour"),
                (1, 1, 1),
                256,
                &[Arg::Ptr(out), Arg::I32(barrier)],
            )
            .unwrap();
            let got = down::<i32>(&mut dev, out, 256);
            if barrier == 1 {
                assert_eq!(got, want, "{order:?}");
            } else {
                assert_ne!(got, want, "{order:?}: the race went unnoticed");
            }
        }
        // Exited threads drop out of the barrier.
        let out = up(&mut dev, &vec![-1i32; 128]);
        dev.launch(
            k(&dev, "emu_selftest_exit_then_sync"),
            (1, 1, 1),
            128,
            &[Arg::Ptr(out), Arg::I32(40)],
        )
        .unwrap();
        let got = down::<i32>(&mut dev, out, 128);
        let want: Vec<i32> = (0..128).map(|t| if t < 40 { 39 - t } else { -1 }).collect();
        assert_eq!(got, want, "{order:?}");
    }
    // The misuses are errors (each faults its device).
    for (mode, words) in [(0, "exited"), (1, "deadlock"), (2, "divergent")] {
        let mut dev = EmuDevice::new();
        let out = zeros::<i32>(&mut dev, 64);
        match dev.launch(
            k(&dev, "emu_selftest_misuse"),
            (2, 1, 1),
            64,
            &[Arg::Ptr(out), Arg::I32(mode)],
        ) {
            Err(DeviceError::Call { why, .. }) => {
                assert!(why.contains(words), "mode {mode}: {why}");
                eprintln!("mode {mode}: {why}");
            }
            other => panic!("mode {mode}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_order() {
    // The kernels with barriers and shuffles, in three orders, bit for bit.
    let run = |order: Order| -> (Vec<u32>, Vec<f32>, Vec<u32>) {
        let mut dev = EmuDevice::new();
        dev.set_order(order);
        let vocab = 3000;
        let logits: Vec<f32> = det(2 * vocab, 1.0).iter().map(|v| v * 3.0).collect();
        let p = SlotParams {
            temp_text: 0.9,
            temp_audio: 0.9,
            top_k_text: 40,
            top_k_audio: 40,
            use_sampling: 1,
            cfg_coef: 1.0,
        };
        let s = Sampling {
            logits: up(&mut dev, &logits),
            steps: up(&mut dev, &steps_all(2)),
            params: up(&mut dev, &[p, p]),
            rng: up(&mut dev, &[rng::seed_state(3), rng::seed_state(4)].concat()),
            out: zeros::<u32>(&mut dev, 2),
        };
        let mut toks = Vec::new();
        for _ in 0..4 {
            toks.extend(sample(&mut dev, &s, vocab, 2, false));
        }
        let (n, dim) = (2, 1000);
        let x = up(&mut dev, &det(n * dim, 2.0));
        let (w, b) = (up(&mut dev, &det(dim, 3.0)), up(&mut dev, &det(dim, 4.0)));
        let y = zeros::<f32>(&mut dev, n * dim);
        NormKernels::resolve(&dev)
            .unwrap()
            .layer_norm(&mut dev, x, w, b, 1e-5, dim, NULL, n, y)
            .unwrap();
        let (dq, bins, books) = (64, 300, 2);
        let book = det(books * bins * dq, 5.0);
        let norms = book_norms(&book, books, bins, dq);
        let xq = up(&mut dev, &det(3 * dq, 6.0));
        let (dbt, dn, ds) = (
            up(&mut dev, &book),
            up(&mut dev, &norms),
            up(&mut dev, &steps_all(3)),
        );
        let codes = zeros::<u32>(&mut dev, 3 * books);
        let shape = RvqShape {
            n_books: books,
            dq,
            bins,
            codes_stride: books,
            col0: 0,
        };
        let part = zeros::<u8>(&mut dev, shape.part_bytes(3));
        RvqKernels::resolve(&dev)
            .unwrap()
            .encode(&mut dev, &shape, 3, xq, dbt, dn, ds, part, codes)
            .unwrap();
        (
            toks,
            down::<f32>(&mut dev, y, n * dim),
            down::<u32>(&mut dev, codes, 3 * books),
        )
    };
    let base = run(Order::Reverse);
    for order in [
        Order::Forward,
        Order::Shuffled(1),
        Order::Shuffled(99),
        Order::WarpsAhead(1),
        Order::WarpsAhead(8),
    ] {
        let r = run(order);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let first_diff = |a: &[u32], b: &[u32]| a.iter().zip(b).position(|(x, y)| x != y);
        assert_eq!(r.0, base.0, "{order:?}: tokens");
        let (got, want) = (bits(&r.1), bits(&base.1));
        assert!(
            got == want,
            "{order:?}: layer norm differs first at {:?}",
            first_diff(&got, &want)
        );
        assert_eq!(r.2, base.2, "{order:?}: codes");
    }
}

#[test]
fn devices_on_several_threads_do_not_share_scheduler_state() {
    // Shared memory and fibers are per OS thread: concurrent launches of the
    // same kernel (same `__shared__` variables) on four threads stay exact.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut dev = EmuDevice::new();
                let (n, dim) = (8, 2048);
                let x = det(n * dim, t as f32 * 3.0);
                let alpha = det(dim, 1.0);
                let mut want = vec![0.0; n * dim];
                ops::rms_norm(&x, &alpha, 1e-6, dim, &mut want);
                let (dx, da) = (up(&mut dev, &x), up(&mut dev, &alpha));
                let dy = zeros::<f32>(&mut dev, n * dim);
                for _ in 0..20 {
                    NormKernels::resolve(&dev)
                        .unwrap()
                        .rms_norm(&mut dev, dx, da, 1e-6, dim, NULL, n, dy, DType::F32)
                        .unwrap();
                    assert_close(&down::<f32>(&mut dev, dy, n * dim), &want, 1e-5, "rms_norm");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn emulator_speed() {
    // Not a pass/fail check: prints the figures of the emulator's cost
    // (run with --nocapture to see them).
    let mut dev = EmuDevice::new();
    // A conv launch of 128 threads × 5,000 blocks (128 channels × 50 groups
    // of CONV_TT = 4 output steps, × 100 steps), small input channels so
    // that the scheduler's cost dominates.
    let (c_in, c_out, kernel, t_in, n_steps) = (4, 128, 3, 200, 100);
    let blocks = (c_out * t_in / 4 / CONV_THREADS as usize) as u32;
    assert_eq!(blocks * n_steps as u32, 5000);
    let history = kernel - 1;
    let x = up(&mut dev, &det(n_steps * t_in * c_in, 1.0));
    let prev = zeros::<f32>(&mut dev, n_steps * history * c_in);
    let w = up(&mut dev, &conv_w(kernel, c_in, c_out, 2.0));
    let steps = up(&mut dev, &steps_all(n_steps));
    let y = zeros::<f32>(&mut dev, n_steps * t_in * c_out);
    let args = [
        Arg::Ptr(x),
        Arg::Ptr(prev),
        Arg::Ptr(w),
        Arg::Ptr(NULL),
        Arg::Ptr(NULL),
        Arg::Ptr(steps),
        Arg::I32(c_in as i32),
        Arg::I32(c_out as i32),
        Arg::I32(kernel as i32),
        Arg::I32(1),
        Arg::I32(1),
        Arg::I32(t_in as i32),
        Arg::I32(history as i32),
        Arg::I32(0),
        Arg::Ptr(y),
    ];
    let f = k(&dev, "conv1d_stream");
    let t0 = std::time::Instant::now();
    dev.launch(f, (blocks, n_steps as u32, 1), CONV_THREADS, &args)
        .unwrap();
    let conv = t0.elapsed();
    let s0 = dev.fiber_switches();
    // Barrier-heavy: sampling (512 threads, ~15 barriers and many shuffles).
    let vocab = 2048;
    let p = SlotParams {
        temp_text: 0.9,
        temp_audio: 0.9,
        top_k_text: 40,
        top_k_audio: 40,
        use_sampling: 1,
        cfg_coef: 1.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &det(16 * vocab, 1.0)),
        steps: up(&mut dev, &steps_all(16)),
        params: up(&mut dev, &vec![p; 16]),
        rng: up(&mut dev, &vec![1u64; 64]),
        out: zeros::<u32>(&mut dev, 16),
    };
    let t1 = std::time::Instant::now();
    sample(&mut dev, &s, vocab, 16, false);
    let samp = t1.elapsed();
    let switches = dev.fiber_switches() - s0;
    // The scheduler alone: 256 threads, 200 rounds of a barrier and a warp sum.
    let out = zeros::<i32>(&mut dev, 256);
    let s1 = dev.fiber_switches();
    let t2 = std::time::Instant::now();
    dev.launch(
        k(&dev, "emu_selftest_spin"),
        (1, 1, 1),
        256,
        &[Arg::Ptr(out), Arg::I32(200)],
    )
    .unwrap();
    let spin = t2.elapsed();
    let spin_switches = dev.fiber_switches() - s1;
    eprintln!(
        "emulator: conv1d_stream 128 threads × 5000 blocks in {:.1} ms ({:.0} ns per thread); \
         sample_tokens 16 blocks × 512 threads in {:.1} ms ({} fiber switches); \
         barriers and warp sums: {} switches in {:.1} ms ({:.1} M switches/s)",
        conv.as_secs_f64() * 1e3,
        conv.as_secs_f64() * 1e9 / 640_000.0,
        samp.as_secs_f64() * 1e3,
        switches,
        spin_switches,
        spin.as_secs_f64() * 1e3,
        spin_switches as f64 / spin.as_secs_f64() / 1e6
    );
}

#[test]
fn shared_memory_is_poisoned_at_every_block_start() {
    // What no thread of a block wrote reads as the poison, in every block
    // (never the value the previous block left), in every order.
    use moshid_kernels::device::emu::POISON;
    for order in [
        Order::Reverse,
        Order::Forward,
        Order::Shuffled(3),
        Order::WarpsAhead(4),
    ] {
        let mut dev = EmuDevice::new();
        dev.set_order(order);
        let (blocks, threads) = (3usize, 64usize);
        let out = zeros::<i32>(&mut dev, blocks * threads + blocks);
        dev.launch(
            k(&dev, "emu_selftest_unwritten_shared"),
            (blocks as u32, 1, 1),
            threads as u32,
            &[Arg::Ptr(out)],
        )
        .unwrap();
        let got = down::<i32>(&mut dev, out, blocks * threads + blocks);
        for b in 0..blocks {
            for t in 0..threads {
                let want = if (t + b) % 2 == 0 {
                    (t + 1000 * b) as i32
                } else {
                    POISON as i32
                };
                assert_eq!(got[b * threads + t], want, "{order:?} block {b} thread {t}");
            }
            // Float shared memory reads as NaN (and NaN stays NaN).
            assert!(
                f32::from_bits(got[blocks * threads + b] as u32).is_nan(),
                "{order:?}"
            );
        }
    }
}
