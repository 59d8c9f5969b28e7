//! The doorbell waking real glommio tasks from plain threads.
//!
//! No timing is asserted: glommio's first timer in an executor can take
//! tens of milliseconds, and this machine is shared.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::thread;
use std::time::Duration;

use glommio::LocalExecutorBuilder;
use moshid_ringbuf::{lane, Closed, Doorbell, LaneReceiver, LaneSender, PushError};

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Rec {
    seq: u64,
    check: u64,
}

fn rec(seq: u64) -> Rec {
    Rec { seq, check: !seq }
}

/// Runs `task` as the only task of a fresh glommio executor and returns
/// its output once it ends.
fn on_executor<T, F>(task: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + 'static,
{
    LocalExecutorBuilder::default()
        .spawn(task)
        .expect("start glommio executor")
        .join()
        .expect("glommio task")
}

/// The output task of one I/O core: waits on the bell, drains the lane,
/// ends when the bell is closed. Returns (records, wakeups).
async fn output_task(bell: Arc<Doorbell>, mut rx: LaneReceiver<Rec>) -> (u64, u64) {
    let (mut next, mut wakeups) = (0, 0);
    loop {
        let closed = bell.wait().await == Err(Closed);
        wakeups += 1;
        rx.drain(|r| {
            assert_eq!(*r, rec(next), "order or content");
            next += 1;
        });
        if closed {
            return (next, wakeups);
        }
    }
}

/// The engine's side: pushes `count` records (retrying on `Full`),
/// ringing after each, then closes the bell.
fn engine_feed(tx: &mut LaneSender<Rec>, bell: &Doorbell, count: u64) {
    for seq in 0..count {
        loop {
            match tx.try_push(&rec(seq)) {
                Ok(()) => break,
                Err(PushError::Full) => thread::yield_now(),
                Err(PushError::Abandoned) => panic!("output task gone at {seq}"),
            }
        }
        bell.ring();
    }
}

#[test]
fn engine_thread_feeds_a_glommio_task_until_close() {
    const COUNT: u64 = 100_000;
    let bell = Arc::new(Doorbell::new());
    let (mut tx, rx) = lane::<Rec>(64).unwrap();
    let engine_bell = Arc::clone(&bell);
    let engine = thread::spawn(move || {
        engine_feed(&mut tx, &engine_bell, COUNT);
        engine_bell.close();
    });
    let (received, wakeups) = on_executor(move || output_task(bell, rx));
    engine.join().unwrap();
    assert_eq!(received, COUNT);
    assert!(wakeups <= COUNT + 1, "{wakeups} wakeups");
}

#[test]
fn one_engine_thread_feeds_two_io_cores() {
    const COUNT: u64 = 20_000;
    let bells = [Arc::new(Doorbell::new()), Arc::new(Doorbell::new())];
    let (mut tx0, rx0) = lane::<Rec>(16).unwrap();
    let (mut tx1, rx1) = lane::<Rec>(16).unwrap();
    let engine_bells = bells.clone();
    let engine = thread::spawn(move || {
        for step in 0..COUNT {
            for (tx, bell) in [(&mut tx0, &engine_bells[0]), (&mut tx1, &engine_bells[1])] {
                while tx.try_push(&rec(step)) == Err(PushError::Full) {
                    thread::yield_now();
                }
                bell.ring();
            }
        }
        engine_bells.iter().for_each(|bell| bell.close());
    });
    let [bell0, bell1] = bells;
    let core0 = thread::spawn(move || on_executor(move || output_task(bell0, rx0)));
    let core1 = thread::spawn(move || on_executor(move || output_task(bell1, rx1)));
    assert_eq!(core0.join().unwrap().0, COUNT);
    assert_eq!(core1.join().unwrap().0, COUNT);
    engine.join().unwrap();
}

#[test]
fn rings_before_the_wait_coalesce_into_one_completion() {
    let bell = Arc::new(Doorbell::new());
    for _ in 0..100 {
        bell.ring();
    }
    on_executor(move || async move {
        assert_eq!(bell.wait().await, Ok(()));
        let again = poll_fn(|cx| Poll::Ready(bell.poll_rung(cx))).await;
        assert!(
            again.is_pending(),
            "100 rings gave more than one completion"
        );
        bell.close();
        assert_eq!(bell.wait().await, Err(Closed));
    });
}

#[test]
fn close_from_another_thread_ends_a_waiting_task() {
    let bell = Arc::new(Doorbell::new());
    let engine_bell = Arc::clone(&bell);
    let engine = thread::spawn(move || {
        // Give the task time to park; correctness does not depend on it.
        thread::sleep(Duration::from_millis(50));
        engine_bell.close();
    });
    let outcome = on_executor(move || async move { bell.wait().await });
    assert_eq!(outcome, Err(Closed));
    engine.join().unwrap();
}

#[test]
fn engine_exit_with_records_in_flight_loses_none() {
    // The engine pushes, rings, drops its sender and closes without waiting:
    // the task must still read every record before it sees `Closed`.
    let bell = Arc::new(Doorbell::new());
    let (mut tx, rx) = lane::<Rec>(1_000).unwrap();
    let engine_bell = Arc::clone(&bell);
    let engine = thread::spawn(move || {
        engine_feed(&mut tx, &engine_bell, 1_000);
        drop(tx);
        engine_bell.close();
    });
    let (received, _) = on_executor(move || output_task(bell, rx));
    engine.join().unwrap();
    assert_eq!(received, 1_000);
}
