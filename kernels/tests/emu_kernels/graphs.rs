//! Graph capture and replay against direct execution, and capture misuse.

use super::*;

/// One step of work: host input → gelu → GEMM → copy, fill → host output.
struct StepBufs {
    hin: HostBuf,
    hout: HostBuf,
    x: DevPtr,
    w: DevPtr,
    y: DevPtr,
    z: DevPtr,
}

const GM: usize = 4;
const GK: usize = 64;
const GN: usize = 48;

fn issue_step(dev: &mut dyn Device, s: &StepBufs) {
    dev.copy_to_device(s.x, &s.hin, 0, GM * GK * 4).unwrap();
    dev.launch(
        k(dev, "gelu_f32"),
        (1, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(s.x), Arg::U64((GM * GK) as u64)],
    )
    .unwrap();
    dev.gemm(&Gemm {
        m: GM,
        n: GN,
        k: GK,
        a: s.x,
        a_type: DType::F32,
        lda: GK,
        b: s.w,
        b_type: DType::F32,
        ldb: GK,
        c: s.y,
        c_type: DType::F32,
        ldc: GN,
        alpha: 1.0,
        beta: 0.0,
    })
    .unwrap();
    dev.memset_zero(s.z, GN * 4).unwrap();
    dev.copy_on_device(s.z + (GN * 4) as u64, s.y, GM * GN * 4)
        .unwrap();
    dev.copy_to_host(&s.hout, 4, s.z, (GM + 1) * GN * 4)
        .unwrap();
}

fn step_bufs(dev: &mut dyn Device) -> StepBufs {
    let w = det(GN * GK, 8.0);
    StepBufs {
        hin: dev.alloc_host(GM * GK * 4).unwrap(),
        hout: dev.alloc_host(4 + (GM + 1) * GN * 4).unwrap(),
        x: dev.alloc(GM * GK * 4).unwrap(),
        w: up(dev, &w),
        y: dev.alloc(GM * GN * 4).unwrap(),
        z: up(dev, &vec![5.0f32; (GM + 1) * GN]),
    }
}

#[test]
fn a_captured_graph_replays_as_direct_execution() {
    let mut dev = device();
    let mut s = step_bufs(&mut dev);
    dev.begin_capture().unwrap();
    issue_step(&mut dev, &s);
    let graph = dev.end_capture().unwrap();
    // Nothing ran while capturing.
    assert!(down::<f32>(&mut dev, s.z, (GM + 1) * GN)
        .iter()
        .all(|&v| v == 5.0));
    assert!(s
        .hout
        .slice::<f32>(0, 1 + (GM + 1) * GN)
        .iter()
        .all(|&v| v == 0.0));

    let mut direct = device();
    let mut d = step_bufs(&mut direct);
    for round in 0..2 {
        let input = det(GM * GK, round as f32 * 10.0 + 1.0);
        s.hin.slice_mut::<f32>(0, GM * GK).copy_from_slice(&input);
        d.hin.slice_mut::<f32>(0, GM * GK).copy_from_slice(&input);
        dev.launch_graph(graph).unwrap();
        dev.synchronize().unwrap();
        issue_step(&mut direct, &d);
        direct.synchronize().unwrap();
        let got = s.hout.slice::<f32>(0, 1 + (GM + 1) * GN);
        let want = d.hout.slice::<f32>(0, 1 + (GM + 1) * GN);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "round {round}"
        );
        assert!(got[1..=GN].iter().all(|&v| v == 0.0), "memset");
        assert!(got[GN + 1..].iter().any(|&v| v != 0.0), "GEMM output");
    }
    // A graph launched inside a capture is refused (as CUDA does) and the
    // capture is discarded.
    dev.begin_capture().unwrap();
    assert!(matches!(
        dev.launch_graph(graph),
        Err(DeviceError::Capture(_))
    ));
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
}

#[test]
fn a_replay_runs_each_captured_launch_once_on_the_emulator() {
    let mut dev = EmuDevice::new();
    let s = step_bufs(&mut dev);
    dev.begin_capture().unwrap();
    issue_step(&mut dev, &s);
    let graph = dev.end_capture().unwrap();
    for _ in 0..2 {
        dev.launch_graph(graph).unwrap();
    }
    dev.synchronize().unwrap();
    assert_eq!(dev.launches(), 2, "one launch per replay");
}

#[test]
fn capture_misuse_is_an_error() {
    let mut dev = device();
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    assert!(matches!(
        dev.launch_graph(moshid_kernels::device::GraphId(3)),
        Err(DeviceError::Capture(_))
    ));
    dev.begin_capture().unwrap();
    assert!(matches!(dev.begin_capture(), Err(DeviceError::Capture(_))));
    // The failed nested begin discarded the capture.
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    let p = dev.alloc(16).unwrap();
    for refused in 0..5 {
        dev.begin_capture().unwrap();
        let r = match refused {
            0 => dev.alloc(16).map(|_| ()),
            1 => dev.alloc_host(16).map(|_| ()),
            2 => dev.upload(p, &[0; 4]),
            3 => dev.download(p, &mut [0; 4]),
            _ => dev.synchronize(),
        };
        assert!(
            matches!(r, Err(DeviceError::Capture(_))),
            "call {refused}: {r:?}"
        );
        assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    }
    // A failed check while capturing discards the capture too.
    dev.begin_capture().unwrap();
    assert!(matches!(
        dev.memset_zero(p, 17),
        Err(DeviceError::Shape { .. })
    ));
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    // An empty capture is a graph that does nothing.
    dev.begin_capture().unwrap();
    let g = dev.end_capture().unwrap();
    dev.launch_graph(g).unwrap();
    dev.synchronize().unwrap();
}
