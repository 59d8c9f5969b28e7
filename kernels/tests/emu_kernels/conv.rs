//! Streaming convolutions and transposed convolutions with per-slot state,
//! against naive streaming implementations: the implicit GEMM (with and
//! without split reductions, odd shapes, many slot-steps over several row
//! tiles) and the direct kernel, with ELU fused on the inputs and a residual
//! on the outputs, masked steps, replicate padding, and outputs that do not
//! depend on the batch.

use super::*;
use moshid_kernels::ops::conv::{ConvIo, ConvKernels, ConvShape, ConvTrShape, GEMM_MIN_COUT};

/// Device-layout conv weights `[kernel][c_in][c_out]`.
pub(crate) fn conv_w(kernel: usize, c_in: usize, c_out: usize, seed: f32) -> Vec<f32> {
    det(kernel * c_in * c_out, seed)
        .iter()
        .map(|v| v * 0.3)
        .collect()
}

fn elu(v: f32) -> f32 {
    if v > 0.0 {
        v
    } else {
        v.exp_m1()
    }
}

/// Where a case's residual comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Res {
    None,
    /// A buffer of its own.
    Apart,
    /// The output buffer itself (y = y + conv).
    InPlace,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    t_in: usize,
    n: usize,
    elu: bool,
    res: Res,
}

fn shape(c: &Case) -> ConvShape {
    ConvShape {
        c_in: c.c_in,
        c_out: c.c_out,
        kernel: c.kernel,
        stride: c.stride,
        dilation: c.dilation,
    }
}

/// The slot of step j among `n` (distinct, in reverse order; slot 0 unused).
fn slot_of(j: usize, n: usize) -> usize {
    n - j
}

/// Four calls of `n` slot-steps; step 1 is masked in call 2 (its slot's
/// state must not move); the slot of step 0 is replicate-padded. Checked
/// against the naive streaming conv.
fn conv1d_case(c: Case) {
    let s = shape(&c);
    let (history, t_out) = (s.history(), s.t_out(c.t_in));
    let mut dev = device();
    let w = conv_w(c.kernel, c.c_in, c.c_out, 1.0);
    let bias = det(c.c_out, 2.0);
    let (dw, db) = (up(&mut *dev, &w), up(&mut *dev, &bias));
    let max_slots = c.n + 1;
    let prev = zeros::<f32>(&mut *dev, max_slots * history * c.c_in);
    let mut first = vec![0i32; max_slots];
    first[slot_of(0, c.n)] = 1;
    let first = up(&mut *dev, &first);
    let part = zeros::<f32>(&mut *dev, s.plan(c.t_in).part_floats(c.n).max(1));
    let conv = ConvKernels::resolve(&*dev).unwrap();
    let mut streams: Vec<Vec<f32>> = vec![Vec::new(); c.n];
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); c.n];
    let mut resids: Vec<Vec<f32>> = vec![Vec::new(); c.n];
    for call in 0..4 {
        let steps: Vec<SlotStep> = (0..c.n)
            .map(|j| SlotStep {
                slot: slot_of(j, c.n) as i32,
                active: (j != 1 || call != 2) as i32,
                row_cond: j as i32,
                row_null: -1,
            })
            .collect();
        let x = det(c.n * c.t_in * c.c_in, call as f32 * 13.0 + 0.5);
        let r = det(c.n * t_out * c.c_out, call as f32 * 7.0 + 0.25);
        let (dx, ds) = (up(&mut *dev, &x), up(&mut *dev, &steps));
        let y = match c.res {
            Res::InPlace => up(&mut *dev, &r),
            _ => up(&mut *dev, &vec![9.0f32; c.n * t_out * c.c_out]),
        };
        let res = match c.res {
            Res::None => NULL,
            Res::Apart => up(&mut *dev, &r),
            Res::InPlace => y,
        };
        let io = ConvIo {
            x: dx,
            state: prev,
            w: dw,
            bias: db,
            res,
            steps: ds,
            y,
            tail: NULL,
            part,
            elu: c.elu,
        };
        conv.conv1d_replicate_pad(&mut *dev, &s, c.t_in, c.n, dx, prev, first, ds)
            .unwrap();
        conv.conv1d_stream(&mut *dev, &s, c.t_in, c.n, &io).unwrap();
        conv.conv1d_state_update(&mut *dev, &s, c.t_in, c.n, dx, prev, first, ds)
            .unwrap();
        let got = down::<f32>(&mut *dev, y, c.n * t_out * c.c_out);
        for j in 0..c.n {
            let yj = &got[j * t_out * c.c_out..(j + 1) * t_out * c.c_out];
            if steps[j].active == 0 {
                assert!(
                    yj.iter().all(|&v| v == 0.0),
                    "{c:?}: a masked step's outputs are zero"
                );
                continue;
            }
            let xj = &x[j * c.t_in * c.c_in..(j + 1) * c.t_in * c.c_in];
            if streams[j].is_empty() {
                // History: replicate padding for step 0's slot, zeros elsewhere.
                let pad = if j == 0 {
                    xj[..c.c_in].to_vec()
                } else {
                    vec![0.0; c.c_in]
                };
                for _ in 0..history {
                    streams[j].extend_from_slice(&pad);
                }
            }
            streams[j].extend_from_slice(xj);
            outs[j].extend_from_slice(yj);
            resids[j].extend_from_slice(&r[j * t_out * c.c_out..(j + 1) * t_out * c.c_out]);
        }
    }
    assert_eq!(
        down::<i32>(&mut *dev, first, max_slots),
        vec![0; max_slots],
        "first flags cleared"
    );
    let p = down::<f32>(&mut *dev, prev, max_slots * history * c.c_in);
    for j in 0..c.n {
        let st = &streams[j];
        let steps_in = st.len() / c.c_in - history;
        for t in 0..steps_in / c.stride {
            for o in 0..c.c_out {
                let mut acc = 0.0f64;
                for kk in 0..c.kernel {
                    let v = t * c.stride + kk * c.dilation;
                    for i in 0..c.c_in {
                        let a = st[v * c.c_in + i];
                        let a = if c.elu { elu(a) } else { a };
                        acc += a as f64 * w[(kk * c.c_in + i) * c.c_out + o] as f64;
                    }
                }
                let mut want = (acc + bias[o] as f64) as f32;
                if c.res != Res::None {
                    want += resids[j][t * c.c_out + o];
                }
                let g = outs[j][t * c.c_out + o];
                let err = (g - want).abs() / want.abs().max(1.0);
                assert!(
                    err < 2e-5,
                    "{c:?}: step {j} output {t} channel {o}: {g} vs {want}"
                );
            }
        }
        // The state is the last `history` raw input steps.
        let slot = slot_of(j, c.n);
        assert_eq!(
            &p[slot * history * c.c_in..(slot + 1) * history * c.c_in],
            &st[st.len() - history * c.c_in..],
            "{c:?}: state of slot {slot}"
        );
    }
}

#[test]
fn conv1d_stream_and_state_match_a_naive_streaming_conv() {
    let base = Case {
        c_in: 5,
        c_out: 6,
        kernel: 4,
        stride: 2,
        dilation: 2,
        t_in: 4,
        n: 2,
        elu: false,
        res: Res::None,
    };
    let cases = [
        // The direct kernel (6 < GEMM_MIN_COUT channels), with ELU and skip.
        base,
        Case {
            elu: true,
            res: Res::InPlace,
            n: 3,
            ..base
        },
        // The GEMM without a split: 5 steps × 40 rows over 7 row tiles,
        // 200 channels over 4 column tiles (the last short), odd c_in.
        Case {
            c_in: 33,
            c_out: 200,
            kernel: 3,
            stride: 1,
            dilation: 2,
            t_in: 40,
            n: 5,
            ..base
        },
        // 150 rows per step (never split), c_in below one slice, ELU.
        Case {
            c_in: 3,
            c_out: 37,
            kernel: 3,
            stride: 2,
            dilation: 1,
            t_in: 300,
            n: 2,
            elu: true,
            ..base
        },
        // Split in two (320 terms, 2 rows per step), with ELU and a skip.
        Case {
            c_in: 40,
            c_out: 70,
            kernel: 8,
            stride: 4,
            dilation: 1,
            t_in: 8,
            n: 3,
            elu: true,
            res: Res::Apart,
        },
        // Split in many (a deep layer's shape: 1 row, 1024 terms), in place.
        Case {
            c_in: 128,
            c_out: 64,
            kernel: 8,
            stride: 8,
            dilation: 1,
            t_in: 8,
            n: 37,
            res: Res::InPlace,
            ..base
        },
        // A 1×1 conv (no history) with its skip, as a residual block's last.
        Case {
            c_in: 16,
            c_out: 32,
            kernel: 1,
            stride: 1,
            dilation: 1,
            t_in: 6,
            n: 4,
            elu: true,
            res: Res::Apart,
        },
    ];
    for c in cases {
        conv1d_case(c);
    }
    // The cases cover both paths and split reductions.
    assert!(cases
        .iter()
        .any(|c| shape(c).plan(c.t_in).splits > 2 && c.c_out >= GEMM_MIN_COUT));
    assert!(cases.iter().any(|c| c.c_out < GEMM_MIN_COUT));
}

#[test]
fn conv_gemm_outputs_do_not_depend_on_the_batch() {
    // One slot-step's input alone and as step 20 of 37 (other row tiles,
    // other blocks of a split reduction): the same bits, with 32-row tiles
    // and a split reduction, and with 64-row tiles.
    let split = ConvShape {
        c_in: 96,
        c_out: 80,
        kernel: 6,
        stride: 3,
        dilation: 1,
    };
    assert!(split.plan(6).splits > 1 && split.plan(6).tile_rows == 32);
    let tall = ConvShape { c_in: 20, ..split };
    assert!(tall.plan(390).splits == 1 && tall.plan(390).tile_rows == 64);
    for (s, t_in) in [(split, 6), (tall, 390)] {
        same_alone_and_among_others(s, t_in);
    }
}

fn same_alone_and_among_others(s: ConvShape, t_in: usize) {
    let t_out = s.t_out(t_in);
    let mut dev = device();
    let w = up(&mut *dev, &conv_w(s.kernel, s.c_in, s.c_out, 4.0));
    let b = up(&mut *dev, &det(s.c_out, 5.0));
    let conv = ConvKernels::resolve(&*dev).unwrap();
    let mut run = |n: usize, at: usize| -> Vec<f32> {
        let mut x = det(n * t_in * s.c_in, 6.0);
        let mine = det(t_in * s.c_in, 7.0);
        x[at * t_in * s.c_in..(at + 1) * t_in * s.c_in].copy_from_slice(&mine);
        let prev = up(&mut *dev, &det((n + 1) * s.history() * s.c_in, 8.0));
        // Step `at` reads slot n's history: the same values in both runs.
        let mut hist = down::<f32>(&mut *dev, prev, (n + 1) * s.history() * s.c_in);
        let h0 = det(s.history() * s.c_in, 9.0);
        hist[n * s.history() * s.c_in..].copy_from_slice(&h0);
        write(&mut *dev, prev, &hist);
        let steps: Vec<SlotStep> = (0..n)
            .map(|j| SlotStep {
                slot: if j == at { n as i32 } else { j as i32 },
                active: 1,
                row_cond: j as i32,
                row_null: -1,
            })
            .collect();
        let y = zeros::<f32>(&mut *dev, n * t_out * s.c_out);
        let io = ConvIo {
            x: up(&mut *dev, &x),
            state: prev,
            w,
            bias: b,
            res: NULL,
            steps: up(&mut *dev, &steps),
            y,
            tail: NULL,
            part: zeros::<f32>(&mut *dev, s.plan(t_in).part_floats(n)),
            elu: true,
        };
        conv.conv1d_stream(&mut *dev, &s, t_in, n, &io).unwrap();
        let all = down::<f32>(&mut *dev, y, n * t_out * s.c_out);
        all[at * t_out * s.c_out..(at + 1) * t_out * s.c_out].to_vec()
    };
    let alone = run(1, 0);
    let among = run(37, 20);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&alone), bits(&among));
}

#[test]
fn convtr1d_dense_and_depthwise_match_a_naive_transposed_conv() {
    // (depthwise, channels in/out, kernel, stride, t_in, steps, ELU):
    // the dense product as a GEMM per phase — one split (130 channels over
    // three column tiles), split in two (300 terms), and a kernel that is
    // not a multiple of the stride (phases with 3 and 2 taps) — and the
    // depthwise kernel; many rows per phase (64-row tiles). Step 1 is
    // masked in call 2.
    for (depthwise, (c_in, c_out), kernel, stride, t_in, n, elu) in [
        (false, (7, 130), 6, 2, 3, 2, false),
        (true, (130, 130), 6, 2, 3, 2, false),
        (false, (150, 70), 6, 3, 2, 3, true),
        (false, (100, 33), 7, 3, 2, 3, true),
        (false, (9, 33), 8, 4, 5, 1, false),
        // 131 rows per phase and step: the 64-row tiles.
        (false, (9, 33), 8, 4, 130, 2, true),
    ] {
        let shape = ConvTrShape {
            c_in,
            c_out,
            kernel,
            stride,
            depthwise,
        };
        let overlap = kernel - stride;
        let t_out = t_in * stride;
        let mut dev = device();
        let w = if depthwise {
            det(c_out * kernel, 3.0)
        } else {
            conv_w(kernel, c_in, c_out, 3.0)
        };
        let bias = det(c_out, 4.0);
        let (dw, db) = (up(&mut *dev, &w), up(&mut *dev, &bias));
        let max_slots = n + 1;
        let partial = zeros::<f32>(&mut *dev, max_slots * overlap * c_out);
        let parts = if depthwise {
            1
        } else {
            shape.plan(t_in).part_floats(n).max(1)
        };
        let part = zeros::<f32>(&mut *dev, parts);
        let conv = ConvKernels::resolve(&*dev).unwrap();
        let mut xs: Vec<Vec<f32>> = vec![Vec::new(); n];
        let mut ys: Vec<Vec<f32>> = vec![Vec::new(); n];
        for call in 0..4 {
            let steps: Vec<SlotStep> = (0..n)
                .map(|j| SlotStep {
                    slot: slot_of(j, n) as i32,
                    active: (j != 1 || call != 2) as i32,
                    row_cond: j as i32,
                    row_null: -1,
                })
                .collect();
            let ds = up(&mut *dev, &steps);
            let x = det(n * t_in * c_in, call as f32 * 2.0 + 0.1);
            let dx = up(&mut *dev, &x);
            let y = up(&mut *dev, &vec![9.0f32; n * t_out * c_out]);
            let tail = zeros::<f32>(&mut *dev, n * overlap * c_out);
            let io = ConvIo {
                x: dx,
                state: partial,
                w: dw,
                bias: db,
                res: NULL,
                steps: ds,
                y,
                tail,
                part,
                elu,
            };
            conv.convtr1d_stream(&mut *dev, &shape, t_in, n, &io)
                .unwrap();
            conv.convtr1d_state_update(&mut *dev, &shape, n, tail, partial, ds)
                .unwrap();
            let got = down::<f32>(&mut *dev, y, n * t_out * c_out);
            for j in 0..n {
                let yj = &got[j * t_out * c_out..(j + 1) * t_out * c_out];
                if steps[j].active == 0 {
                    assert!(yj.iter().all(|&v| v == 0.0));
                    continue;
                }
                xs[j].extend_from_slice(&x[j * t_in * c_in..(j + 1) * t_in * c_in]);
                ys[j].extend_from_slice(yj);
            }
        }
        let unused = (0..max_slots)
            .find(|&s| (0..n).all(|j| slot_of(j, n) != s))
            .unwrap();
        let p = down::<f32>(&mut *dev, partial, max_slots * overlap * c_out);
        assert!(
            p[unused * overlap * c_out..(unused + 1) * overlap * c_out]
                .iter()
                .all(|&v| v == 0.0),
            "an unused slot's state was touched"
        );
        for j in 0..n {
            let total_in = xs[j].len() / c_in;
            for r in 0..total_in * stride {
                for o in 0..c_out {
                    let mut acc = 0.0f64;
                    for t in 0..total_in {
                        let kk = r as i64 - (t * stride) as i64;
                        if kk < 0 || kk >= kernel as i64 {
                            continue;
                        }
                        let kk = kk as usize;
                        if depthwise {
                            acc += xs[j][t * c_in + o] as f64 * w[o * kernel + kk] as f64;
                        } else {
                            for i in 0..c_in {
                                let a = xs[j][t * c_in + i];
                                let a = if elu { self::elu(a) } else { a };
                                acc += a as f64 * w[(kk * c_in + i) * c_out + o] as f64;
                            }
                        }
                    }
                    let want = (acc + bias[o] as f64) as f32;
                    let g = ys[j][r * c_out + o];
                    assert!(
                        (g - want).abs() < 2e-5 * want.abs().max(1.0),
                        "depthwise {depthwise} c_in {c_in} step {j} output {r} channel {o}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
