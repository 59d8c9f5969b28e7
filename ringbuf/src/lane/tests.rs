//! Single-thread behaviour of lanes. Cross-thread tests live in `tests/`.

use super::*;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Rec {
    seq: u64,
    payload: [u32; 3],
}

fn rec(seq: u64) -> Rec {
    let s = seq as u32;
    Rec {
        seq,
        payload: [s, s.wrapping_mul(7), !s],
    }
}

#[test]
fn zero_capacity_refused() {
    assert_eq!(lane::<Rec>(0).unwrap_err(), ZeroCapacity);
}

#[test]
fn capacity_and_counts() {
    let (mut tx, mut rx) = lane::<Rec>(4).unwrap();
    assert_eq!((tx.capacity(), rx.capacity()), (4, 4));
    assert_eq!((tx.free_slots(), rx.len(), rx.is_empty()), (4, 0, true));
    tx.try_push(&rec(0)).unwrap();
    tx.try_push(&rec(1)).unwrap();
    assert_eq!((tx.free_slots(), rx.len(), rx.is_empty()), (2, 2, false));
    let mut out = Rec::default();
    assert!(rx.pop_into(&mut out));
    assert_eq!((tx.free_slots(), rx.len()), (3, 1));
}

#[test]
fn wrap_around_keeps_order_and_content() {
    let (mut tx, mut rx) = lane::<Rec>(3).unwrap();
    let (mut next_push, mut next_pop) = (0u64, 0u64);
    let mut out = Rec::default();
    // Vary the fill level so that reads and writes straddle the wrap point.
    for round in 0..1_000u64 {
        for _ in 0..(round % 3 + 1) {
            if tx.try_push(&rec(next_push)).is_ok() {
                next_push += 1;
            }
        }
        for _ in 0..(round % 2 + 1) {
            if rx.pop_into(&mut out) {
                assert_eq!(out, rec(next_pop));
                next_pop += 1;
            }
        }
    }
    while rx.pop_into(&mut out) {
        assert_eq!(out, rec(next_pop));
        next_pop += 1;
    }
    assert_eq!(next_pop, next_push);
    assert!(next_push > 300 * 3, "ring wrapped many times");
}

#[test]
fn full_lane_reported_and_nothing_overwritten() {
    let (mut tx, mut rx) = lane::<Rec>(2).unwrap();
    tx.try_push(&rec(10)).unwrap();
    tx.try_push(&rec(11)).unwrap();
    assert_eq!(tx.try_push(&rec(99)), Err(PushError::Full));
    let mut called = false;
    assert_eq!(tx.try_push_with(|_| called = true), Err(PushError::Full));
    assert!(!called, "fill must not run on a full lane");
    assert_eq!(tx.free_slots(), 0);
    let mut seen = Vec::new();
    assert_eq!(rx.drain(|r| seen.push(*r)), 2);
    assert_eq!(seen, [rec(10), rec(11)]);
}

#[test]
fn pop_from_empty_leaves_output_untouched() {
    let (_tx, mut rx) = lane::<Rec>(1).unwrap();
    let mut out = rec(7);
    assert!(!rx.pop_into(&mut out));
    assert_eq!(out, rec(7));
    assert_eq!(rx.pop_with(|r| r.seq), None);
    assert_eq!(rx.drain(|_| panic!("empty lane")), 0);
}

#[test]
fn push_with_starts_from_default_and_fills_in_place() {
    let (mut tx, mut rx) = lane::<Rec>(1).unwrap();
    for seq in 1..5 {
        tx.try_push_with(|slot| {
            assert_eq!(*slot, Rec::default(), "stale record leaked");
            *slot = rec(seq);
        })
        .unwrap();
        assert_eq!(rx.pop_with(|r| *r), Some(rec(seq)));
    }
}

#[test]
fn drain_takes_only_what_was_available_at_the_call() {
    let (mut tx, mut rx) = lane::<Rec>(8).unwrap();
    for seq in 0..3 {
        tx.try_push(&rec(seq)).unwrap();
    }
    let mut seen = Vec::new();
    let drained = rx.drain(|r| {
        seen.push(r.seq);
        tx.try_push(&rec(100 + r.seq)).unwrap();
    });
    assert_eq!((drained, seen.as_slice()), (3, &[0, 1, 2][..]));
    assert_eq!(rx.len(), 3, "records pushed during drain stay queued");
}

#[test]
fn panicking_reader_consumes_nothing() {
    let (mut tx, mut rx) = lane::<Rec>(4).unwrap();
    tx.try_push(&rec(1)).unwrap();
    tx.try_push(&rec(2)).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rx.drain(|r| assert_ne!(r.seq, 2));
    }));
    assert!(panicked.is_err());
    assert_eq!(rx.len(), 2);
    assert_eq!(rx.pop_with(|r| r.seq), Some(1));
}

#[test]
fn dropped_receiver_detected_by_sender() {
    let (mut tx, rx) = lane::<Rec>(4).unwrap();
    tx.try_push(&rec(0)).unwrap();
    assert!(!tx.is_abandoned());
    drop(rx);
    assert!(tx.is_abandoned());
    assert_eq!(tx.try_push(&rec(1)), Err(PushError::Abandoned));
    assert_eq!(tx.try_push_with(|_| {}), Err(PushError::Abandoned));
}

#[test]
fn dropped_sender_detected_and_its_records_still_readable() {
    let (mut tx, mut rx) = lane::<Rec>(4).unwrap();
    tx.try_push(&rec(0)).unwrap();
    tx.try_push(&rec(1)).unwrap();
    assert!(!rx.is_abandoned());
    drop(tx);
    assert!(rx.is_abandoned());
    assert!(!rx.is_finished());
    assert_eq!(rx.pop_with(|r| r.seq), Some(0));
    assert_eq!(rx.pop_with(|r| r.seq), Some(1));
    assert!(rx.is_finished());
}

#[test]
fn ends_are_send() {
    fn assert_send<T: Send>() {}
    assert_send::<LaneSender<Rec>>();
    assert_send::<LaneReceiver<Rec>>();
}
