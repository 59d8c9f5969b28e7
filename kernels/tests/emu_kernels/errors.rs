//! What the emulator must refuse or report: bad pointers and arguments, a
//! warp shuffle over missing lanes.

use super::*;

fn norm_args(x: DevPtr, a: DevPtr, y: DevPtr) -> [Arg; 6] {
    [
        Arg::Ptr(x),
        Arg::Ptr(a),
        Arg::F32(1e-5),
        Arg::I32(64),
        Arg::Ptr(NULL),
        Arg::Ptr(y),
    ]
}

#[test]
fn bad_pointers_and_arguments_are_refused_before_running() {
    let mut dev = EmuDevice::with_memory(1 << 20);
    let f = k(&dev, "rms_norm_f32");
    let x = up(&mut dev, &det(64, 1.0));
    let a = up(&mut dev, &det(64, 2.0));
    let y = up(&mut dev, &vec![3.0f32; 64]);
    let shape = |r: Result<(), DeviceError>, what: &str| match r {
        Err(DeviceError::Shape { why, .. }) => eprintln!("{what}: {why}"),
        other => panic!("{what}: expected a shape error, got {other:?}"),
    };
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, 0xdead_0000)),
        "bogus pointer",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y + 256)),
        "one past the end",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y + 2)),
        "misaligned",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)[..5]),
        "too few",
    );
    let mut wrong = norm_args(x, a, y);
    wrong[2] = Arg::I32(1);
    shape(dev.launch(f, (1, 1, 1), 256, &wrong), "int for float");
    shape(
        dev.launch(f, (1, 1, 1), 512, &norm_args(x, a, y)),
        "over the launch bounds",
    );
    shape(
        dev.launch(f, (0, 1, 1), 256, &norm_args(x, a, y)),
        "empty grid",
    );
    shape(
        dev.launch(f, (1, 1, 1), 0, &norm_args(x, a, y)),
        "empty block",
    );
    shape(dev.upload(y + 200, &[0; 100]), "upload past the end");
    shape(dev.copy_on_device(x, 0x1000, 4), "copy from nowhere");
    let mut other = EmuDevice::new();
    let foreign = other.alloc_host(64).unwrap();
    shape(
        dev.copy_to_device(x, &foreign, 0, 4),
        "another device's host buffer",
    );
    let mine = dev.alloc_host(64).unwrap();
    shape(dev.copy_to_device(x, &mine, 32, 64), "past the host buffer");
    assert!(matches!(
        dev.kernel("no_such_kernel"),
        Err(DeviceError::UnknownKernel(_))
    ));
    assert!(matches!(
        dev.alloc(2 << 20),
        Err(DeviceError::OutOfMemory { .. })
    ));
    let (free, total) = dev.memory().unwrap();
    assert_eq!(total, 1 << 20);
    assert_eq!(free, total - 3 * 256);
    // Nothing ran: y is as uploaded, and the device still works.
    assert_eq!(down::<f32>(&mut dev, y, 64), vec![3.0; 64]);
    dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)).unwrap();
    dev.synchronize().unwrap();
}

#[test]
fn a_warp_shuffle_over_missing_lanes_faults_the_device() {
    // rms_norm's block_sum shuffles whole warps: with 100 threads the last
    // warp has 4 lanes, so lane 4 of its full-mask shuffle does not exist.
    let mut dev = EmuDevice::new();
    let f = k(&dev, "rms_norm_f32");
    let x = up(&mut dev, &det(64, 1.0));
    let a = up(&mut dev, &det(64, 2.0));
    let y = zeros::<f32>(&mut dev, 64);
    match dev.launch(f, (1, 1, 1), 100, &norm_args(x, a, y)) {
        Err(DeviceError::Call { why, .. }) => {
            assert!(why.contains("does not exist"), "{why}");
            eprintln!("{why}");
        }
        other => panic!("expected a launch error, got {other:?}"),
    }
    // Faulted: everything fails from now on, synchronize included.
    assert!(dev.synchronize().is_err());
    assert!(dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)).is_err());
    assert!(dev.download(y, &mut [0; 4]).is_err());
}
