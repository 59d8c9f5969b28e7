//! RMSNorm (f32 and bf16 output) and LayerNorm against the CPU reference.

use super::*;

#[test]
fn rms_norm_matches_the_cpu_in_f32_and_bf16() {
    let mut dev = device();
    let (n, dim) = (3, 4096);
    let x = det(n * dim, 1.0);
    let alpha = det(dim, 2.0);
    let mut want = vec![0.0; n * dim];
    ops::rms_norm(&x, &alpha, 1e-8, dim, &mut want);
    let (dx, da) = (up(&mut dev, &x), up(&mut dev, &alpha));
    let dy = zeros::<f32>(&mut dev, n * dim);
    let args = |rows: DevPtr, y: DevPtr| {
        [
            Arg::Ptr(dx),
            Arg::Ptr(da),
            Arg::F32(1e-8),
            Arg::I32(dim as i32),
            Arg::Ptr(rows),
            Arg::Ptr(y),
        ]
    };
    let f = k(&dev, "rms_norm_f32");
    dev.launch(f, (n as u32, 1, 1), NORM_THREADS, &args(NULL, dy))
        .unwrap();
    assert_close(
        &down::<f32>(&mut dev, dy, n * dim),
        &want,
        1e-5,
        "rms_norm_f32",
    );

    // bf16 output, the middle row masked (zeros).
    let mut rows = rows_all(n);
    rows[1].active = 0;
    let dr = up(&mut dev, &rows);
    let db = up(&mut dev, &vec![0x5555u16; n * dim]);
    let b = k(&dev, "rms_norm_bf16");
    dev.launch(b, (n as u32, 1, 1), NORM_THREADS, &args(dr, db))
        .unwrap();
    let got = down::<u16>(&mut dev, db, n * dim);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let w = if i / dim == 1 { 0 } else { bf16(w) };
        // One bf16 ulp: the f32 results may differ in their last bits.
        assert!(
            (g as i32 - w as i32).abs() <= 1,
            "rms_norm_bf16[{i}]: {g:#x} vs {w:#x}"
        );
    }
}

#[test]
fn layer_norm_matches_the_cpu() {
    let mut dev = device();
    let (n, dim) = (4, 512);
    let x: Vec<f32> = det(n * dim, 3.0).iter().map(|v| v * 3.0 + 0.5).collect();
    let (w, b) = (det(dim, 4.0), det(dim, 5.0));
    let mut want = vec![0.0; n * dim];
    ops::layer_norm(&x, &w, &b, 1e-5, dim, &mut want);
    let mut rows = rows_all(n);
    rows[3].active = 0;
    want[3 * dim..].fill(0.0);
    let (dx, dw, dbias, dr) = (
        up(&mut dev, &x),
        up(&mut dev, &w),
        up(&mut dev, &b),
        up(&mut dev, &rows),
    );
    let dy = up(&mut dev, &vec![7.0f32; n * dim]);
    let f = k(&dev, "layer_norm_f32");
    let args = [
        Arg::Ptr(dx),
        Arg::Ptr(dw),
        Arg::Ptr(dbias),
        Arg::F32(1e-5),
        Arg::I32(dim as i32),
        Arg::Ptr(dr),
        Arg::Ptr(dy),
    ];
    dev.launch(f, (n as u32, 1, 1), NORM_THREADS, &args)
        .unwrap();
    assert_close(
        &down::<f32>(&mut dev, dy, n * dim),
        &want,
        1e-5,
        "layer_norm_f32",
    );
}
