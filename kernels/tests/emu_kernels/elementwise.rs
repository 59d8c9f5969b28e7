//! The activations against the CPU reference.

use super::*;

#[test]
fn activations_match_the_cpu() {
    let mut dev = device();
    let (rows, hidden) = (3, 1000);
    let ff: Vec<f32> = det(rows * 2 * hidden, 1.5)
        .iter()
        .map(|v| v * 6.0)
        .collect();
    let dff = up(&mut dev, &ff);
    let act = zeros::<u16>(&mut dev, rows * hidden);
    // A small grid: the grid-stride loop covers the rest.
    dev.launch(
        k(&dev, "silu_gate_bf16"),
        (3, 1, 1),
        EW_THREADS,
        &[
            Arg::Ptr(dff),
            Arg::I32(hidden as i32),
            Arg::I32(rows as i32),
            Arg::Ptr(act),
        ],
    )
    .unwrap();
    let got = down::<u16>(&mut dev, act, rows * hidden);
    for r in 0..rows {
        for j in 0..hidden {
            let (g, v) = (ff[r * 2 * hidden + j], ff[r * 2 * hidden + hidden + j]);
            let want = bf16(ops::silu(g) * v);
            let e = got[r * hidden + j];
            assert!(
                (e as i32 - want as i32).abs() <= 1,
                "silu gate [{r}][{j}]: {e:#x} vs {want:#x}"
            );
        }
    }
    let n = 5000;
    let x: Vec<f32> = det(n, 0.5).iter().map(|v| v * 5.0).collect();
    let dx = up(&mut dev, &x);
    dev.launch(
        k(&dev, "gelu_f32"),
        (n.div_ceil(256) as u32, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(dx), Arg::U64(n as u64)],
    )
    .unwrap();
    let want: Vec<f32> = x.iter().map(|&v| ops::gelu(v)).collect();
    assert_close(&down::<f32>(&mut dev, dx, n), &want, 1e-6, "gelu");
    // elu in place (y == x is allowed).
    write(&mut dev, dx, &x);
    dev.launch(
        k(&dev, "elu_f32"),
        (7, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(dx), Arg::Ptr(dx), Arg::U64(n as u64)],
    )
    .unwrap();
    let want: Vec<f32> = x.iter().map(|&v| ops::elu(v)).collect();
    assert_close(&down::<f32>(&mut dev, dx, n), &want, 1e-6, "elu");
}
