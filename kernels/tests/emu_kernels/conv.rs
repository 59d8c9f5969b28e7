//! Streaming convolutions and transposed convolutions with per-slot state,
//! against naive streaming implementations.

use super::*;
use moshid_kernels::ops::conv::{ConvKernels, ConvShape, ConvTrShape};

/// Device-layout conv weights `[kernel][c_in][c_out]`.
pub(crate) fn conv_w(kernel: usize, c_in: usize, c_out: usize, seed: f32) -> Vec<f32> {
    det(kernel * c_in * c_out, seed)
        .iter()
        .map(|v| v * 0.3)
        .collect()
}

#[test]
fn conv1d_stream_and_state_match_a_naive_streaming_conv() {
    // c_out = 200 spans two blocks of 128 threads with one group of output
    // steps (2 of CONV_TT); c_out = 37 with 11 output steps: three groups,
    // the last one short, and warps that straddle two groups.
    for shape in [(5, 200, 4, 2, 2, 4), (3, 37, 3, 2, 1, 22)] {
        conv1d_case(shape);
    }
}

/// Two slots over five calls; slot 1 skips call 2 (masked step, state
/// untouched); slot 0 uses replicate padding (first input step fills the
/// history).
fn conv1d_case(
    (c_in, c_out, kernel, stride, dilation, t_in): (usize, usize, usize, usize, usize, usize),
) {
    let history = (kernel - 1) * dilation + 1 - stride;
    let t_out = t_in / stride;
    let mut dev = device();
    let w = conv_w(kernel, c_in, c_out, 1.0);
    let bias = det(c_out, 2.0);
    let (dw, db) = (up(&mut dev, &w), up(&mut dev, &bias));
    let max_slots = 3;
    // Slot indices 2 and 0 (state rows are per slot, not per step).
    let slot_of = [2usize, 0];
    let prev = zeros::<f32>(&mut dev, max_slots * history * c_in);
    let first = up(&mut dev, &[0i32, 0, 1]);
    let mut streams: Vec<Vec<f32>> = vec![Vec::new(); 2];
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); 2];
    for call in 0..5 {
        let steps: Vec<SlotStep> = (0..2)
            .map(|j| SlotStep {
                slot: slot_of[j] as i32,
                active: (j == 0 || call != 2) as i32,
                row_cond: j as i32,
                row_null: -1,
            })
            .collect();
        let x = det(2 * t_in * c_in, call as f32 * 13.0 + 0.5);
        let (dx, ds) = (up(&mut dev, &x), up(&mut dev, &steps));
        let y = up(&mut dev, &vec![9.0f32; 2 * t_out * c_out]);
        let shape = ConvShape {
            c_in,
            c_out,
            kernel,
            stride,
            dilation,
        };
        let conv = ConvKernels::resolve(&dev).unwrap();
        conv.conv1d_replicate_pad(&mut dev, &shape, t_in, 2, dx, prev, first, ds)
            .unwrap();
        conv.conv1d_stream(&mut dev, &shape, t_in, 2, dx, prev, dw, db, ds, y)
            .unwrap();
        conv.conv1d_state_update(&mut dev, &shape, t_in, 2, dx, prev, first, ds)
            .unwrap();
        let got = down::<f32>(&mut dev, y, 2 * t_out * c_out);
        for j in 0..2 {
            let yj = &got[j * t_out * c_out..(j + 1) * t_out * c_out];
            if steps[j].active == 0 {
                assert!(
                    yj.iter().all(|&v| v == 0.0),
                    "a masked step's outputs are zero"
                );
                continue;
            }
            let xj = &x[j * t_in * c_in..(j + 1) * t_in * c_in];
            if streams[j].is_empty() {
                // History: replicate padding for slot 2 (step 0), zeros for slot 0.
                let pad: Vec<f32> = if slot_of[j] == 2 {
                    xj[..c_in].to_vec()
                } else {
                    vec![0.0; c_in]
                };
                for _ in 0..history {
                    streams[j].extend_from_slice(&pad);
                }
            }
            streams[j].extend_from_slice(xj);
            outs[j].extend_from_slice(yj);
        }
    }
    assert_eq!(
        down::<i32>(&mut dev, first, 3),
        vec![0, 0, 0],
        "first flags cleared"
    );
    // The naive conv over each slot's whole stream.
    for j in 0..2 {
        let s = &streams[j];
        let steps_in = s.len() / c_in - history;
        for t in 0..steps_in / stride {
            for o in 0..c_out {
                let mut acc = 0.0f32;
                for kk in 0..kernel {
                    let v = t * stride + kk * dilation;
                    for i in 0..c_in {
                        acc += s[v * c_in + i] * w[(kk * c_in + i) * c_out + o];
                    }
                }
                let want = acc + bias[o];
                let g = outs[j][t * c_out + o];
                assert!(
                    (g - want).abs() < 1e-5,
                    "slot step {j} output {t} channel {o}: {g} vs {want}"
                );
            }
        }
        // The state is the last `history` input steps.
        let p = down::<f32>(&mut dev, prev, max_slots * history * c_in);
        let slot = slot_of[j];
        assert_eq!(
            &p[slot * history * c_in..(slot + 1) * history * c_in],
            &s[s.len() - history * c_in..],
            "state of slot {slot}"
        );
    }
}

#[test]
fn convtr1d_dense_and_depthwise_match_a_naive_transposed_conv() {
    // (channels, kernel, stride, t_in): 10 outputs per call in 2 phases of
    // 5 (groups of CONV_TT: one full, one short); Mimi's kernel = 2·stride
    // at stride 4 over 33 channels.
    for (depthwise, (c, kernel, stride, t_in)) in [
        (false, (130, 6, 2, 3)),
        (true, (130, 6, 2, 3)),
        (false, (33, 8, 4, 5)),
    ] {
        let (c_in, c_out) = if depthwise { (c, c) } else { (7, c) };
        let overlap = kernel - stride;
        let t_out = t_in * stride;
        let mut dev = device();
        let w = if depthwise {
            det(c * kernel, 3.0)
        } else {
            conv_w(kernel, c_in, c_out, 3.0)
        };
        let bias = det(c_out, 4.0);
        let (dw, db) = (up(&mut dev, &w), up(&mut dev, &bias));
        let partial = zeros::<f32>(&mut dev, 2 * overlap * c_out);
        let steps = [SlotStep {
            slot: 1,
            active: 1,
            row_cond: 0,
            row_null: -1,
        }];
        let ds = up(&mut dev, &steps);
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for call in 0..4 {
            let x = det(t_in * c_in, call as f32 * 2.0 + 0.1);
            let dx = up(&mut dev, &x);
            let y = zeros::<f32>(&mut dev, t_out * c_out);
            let tail = zeros::<f32>(&mut dev, overlap * c_out);
            let shape = ConvTrShape {
                c_in,
                c_out,
                kernel,
                stride,
                depthwise,
            };
            let conv = ConvKernels::resolve(&dev).unwrap();
            conv.convtr1d_stream(&mut dev, &shape, t_in, 1, dx, partial, dw, db, ds, y, tail)
                .unwrap();
            conv.convtr1d_state_update(&mut dev, &shape, 1, tail, partial, ds)
                .unwrap();
            xs.extend_from_slice(&x);
            ys.extend(down::<f32>(&mut dev, y, t_out * c_out));
        }
        // Slot 0's state was never touched.
        assert!(down::<f32>(&mut dev, partial, overlap * c_out)
            .iter()
            .all(|&v| v == 0.0));
        let total_in = xs.len() / c_in;
        for r in 0..total_in * stride {
            for o in 0..c_out {
                let mut acc = 0.0f32;
                for t in 0..total_in {
                    let kk = r as i64 - (t * stride) as i64;
                    if kk < 0 || kk >= kernel as i64 {
                        continue;
                    }
                    let kk = kk as usize;
                    if depthwise {
                        acc += xs[t * c + o] * w[o * kernel + kk];
                    } else {
                        for i in 0..c_in {
                            acc += xs[t * c_in + i] * w[(kk * c_in + i) * c_out + o];
                        }
                    }
                }
                let want = acc + bias[o];
                let g = ys[r * c_out + o];
                assert!(
                    (g - want).abs() < 1e-5,
                    "depthwise {depthwise} step {r} channel {o}: {g} vs {want}"
                );
            }
        }
    }
}
