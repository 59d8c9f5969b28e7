use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::device::{Arg, Device, NULL};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn smoke_rms_norm() {
    let mut dev = EmuDevice::new();
    let (n, dim) = (3usize, 4096usize);
    let x: Vec<f32> = (0..n * dim).map(|i| ((i as f32 + 1.0) * 0.7137).sin()).collect();
    let alpha: Vec<f32> = (0..dim).map(|i| ((i as f32 + 2.0) * 0.7137).sin()).collect();
    let dx = dev.alloc(n * dim * 4).unwrap();
    let da = dev.alloc(dim * 4).unwrap();
    let dy = dev.alloc(n * dim * 4).unwrap();
    dev.upload(dx, &f32_bytes(&x)).unwrap();
    dev.upload(da, &f32_bytes(&alpha)).unwrap();
    let k = dev.kernel("rms_norm_f32").unwrap();
    dev.launch(k, (n as u32, 1, 1), 256, &[Arg::Ptr(dx), Arg::Ptr(da), Arg::F32(1e-8), Arg::I32(dim as i32), Arg::Ptr(NULL), Arg::Ptr(dy)]).unwrap();
    let mut out = vec![0u8; n * dim * 4];
    dev.download(dy, &mut out).unwrap();
    let got: Vec<f32> = out.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let mut want = vec![0.0; n * dim];
    moshid_model::ops::rms_norm(&x, &alpha, 1e-8, dim, &mut want);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    eprintln!("switches {}", dev.fiber_switches());
}
