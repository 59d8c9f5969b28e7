//! Two threads, one lane: every record arrives once, in order, intact.
//!
//! The producer retries on `Full` (yielding); the consumer yields when the
//! lane is empty and fails if the producer finished while records are
//! missing, so a lost record cannot hang the test.

use std::thread;

use moshid_ringbuf::{lane, LaneReceiver, LaneSender, PushError};

/// Samples in one 80 ms frame at 24 kHz.
const FRAME_SAMPLES: usize = 1920;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Small {
    seq: u64,
    check: u64,
}

impl Small {
    fn new(seq: u64) -> Self {
        Self {
            seq,
            check: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }
}

/// Shaped like the daemon's `FrameIn` (~7.7 KB).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Frame {
    slot: u32,
    generation: u32,
    pcm: [f32; FRAME_SAMPLES],
}

impl Default for Frame {
    fn default() -> Self {
        Self {
            slot: 0,
            generation: 0,
            pcm: [0.0; FRAME_SAMPLES],
        }
    }
}

fn fill_frame(frame: &mut Frame, seq: u32) {
    frame.slot = seq;
    frame.generation = !seq;
    for (i, sample) in frame.pcm.iter_mut().enumerate() {
        *sample = (seq as usize * 31 + i) as f32;
    }
}

fn check_frame(frame: &Frame, seq: u32) {
    assert_eq!((frame.slot, frame.generation), (seq, !seq));
    for (i, sample) in frame.pcm.iter().enumerate() {
        assert_eq!(
            *sample,
            (seq as usize * 31 + i) as f32,
            "frame {seq} sample {i}"
        );
    }
}

/// Runs `push(tx, n)` for n in 0..count on one thread (retrying on `Full`)
/// while `pop(rx)` consumes on this one; returns how many records arrived.
fn run<T: Copy + Send + 'static>(
    capacity_records: usize,
    count: u64,
    push: fn(&mut LaneSender<T>, u64) -> Result<(), PushError>,
    mut pop: impl FnMut(&mut LaneReceiver<T>) -> u64,
) -> u64 {
    let (mut tx, mut rx) = lane::<T>(capacity_records).unwrap();
    let producer = thread::spawn(move || {
        for n in 0..count {
            loop {
                match push(&mut tx, n) {
                    Ok(()) => break,
                    Err(PushError::Full) => thread::yield_now(),
                    Err(PushError::Abandoned) => panic!("consumer gone at {n}"),
                }
            }
        }
    });
    let mut received = 0;
    while received < count {
        let got = pop(&mut rx);
        if got == 0 {
            assert!(!rx.is_finished(), "lost records: {received} of {count}");
            thread::yield_now();
        }
        received += got;
    }
    producer.join().unwrap();
    assert!(rx.is_empty(), "more records than pushed");
    received
}

#[test]
fn million_small_records_copy_in_copy_out() {
    let mut next = 0;
    let mut out = Small::default();
    let received = run(
        64,
        1_000_000,
        |tx, n| tx.try_push(&Small::new(n)),
        |rx| {
            if !rx.pop_into(&mut out) {
                return 0;
            }
            assert_eq!(out, Small::new(next));
            next += 1;
            1
        },
    );
    assert_eq!(received, 1_000_000);
}

#[test]
fn million_small_records_in_place() {
    let mut next = 0;
    let received = run(
        7,
        1_000_000,
        |tx, n| tx.try_push_with(|slot| *slot = Small::new(n)),
        |rx| {
            rx.drain(|r| {
                assert_eq!(*r, Small::new(next));
                next += 1;
            }) as u64
        },
    );
    assert_eq!(received, 1_000_000);
}

#[test]
fn frames_copy_in_copy_out() {
    let mut next = 0;
    let mut out = Box::<Frame>::default();
    let received = run(
        8,
        20_000,
        |tx, n| {
            let mut frame = Frame::default();
            fill_frame(&mut frame, n as u32);
            tx.try_push(&frame)
        },
        |rx| {
            if !rx.pop_into(&mut out) {
                return 0;
            }
            check_frame(&out, next);
            next += 1;
            1
        },
    );
    assert_eq!(received, 20_000);
}

#[test]
fn frames_in_place() {
    let mut next = 0;
    let received = run(
        8,
        20_000,
        |tx, n| tx.try_push_with(|slot| fill_frame(slot, n as u32)),
        |rx| {
            rx.pop_with(|frame| {
                check_frame(frame, next);
                next += 1;
            })
            .map_or(0, |()| 1)
        },
    );
    assert_eq!(received, 20_000);
}
