//! Doorbell behaviour under a counting waker. Executor tests live in `tests/`.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{Wake, Waker};

use super::*;

#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_context() -> (Arc<CountingWaker>, Waker) {
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    (counter, waker)
}

fn wakes(counter: &CountingWaker) -> usize {
    counter.0.load(Ordering::SeqCst)
}

#[test]
fn idle_bell_is_pending() {
    let bell = Doorbell::new();
    let (counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
    assert_eq!(wakes(&counter), 0);
}

#[test]
fn ring_before_wait_is_not_lost() {
    let bell = Doorbell::new();
    bell.ring();
    let (_counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Ok(())));
    assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
}

#[test]
fn many_rings_coalesce_into_one_wake_and_one_completion() {
    let bell = Doorbell::new();
    let (counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    for _ in 0..3 {
        assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
        for _ in 0..1_000 {
            bell.ring();
        }
        assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
    }
    assert_eq!(wakes(&counter), 3, "one wake per batch of rings");
}

#[test]
fn close_wakes_the_waiter_and_is_sticky() {
    let bell = Doorbell::new();
    let (counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
    assert!(!bell.is_closed());
    bell.close();
    assert_eq!(wakes(&counter), 1);
    assert!(bell.is_closed());
    for _ in 0..3 {
        assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Err(Closed)));
    }
}

#[test]
fn ring_before_close_is_reported_first() {
    let bell = Doorbell::new();
    bell.ring();
    bell.close();
    bell.ring(); // after close: ignored
    let (_counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Ok(())));
    assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Err(Closed)));
}

#[test]
fn ring_after_close_is_ignored() {
    let bell = Doorbell::new();
    let (counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
    bell.close();
    bell.ring();
    assert_eq!(wakes(&counter), 1, "only close wakes");
    assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Err(Closed)));
}

#[test]
fn dropping_a_wait_loses_nothing() {
    let bell = Doorbell::new();
    let (_counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    let mut wait = bell.wait();
    assert_eq!(Pin::new(&mut wait).poll(&mut cx), Poll::Pending);
    drop(wait);
    bell.ring();
    let mut wait = bell.wait();
    assert_eq!(Pin::new(&mut wait).poll(&mut cx), Poll::Ready(Ok(())));
}

#[test]
fn ring_from_another_thread_wakes() {
    let bell = Arc::new(Doorbell::new());
    let (counter, waker) = counting_context();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Pending);
    let ringer = Arc::clone(&bell);
    std::thread::spawn(move || ringer.ring()).join().unwrap();
    assert_eq!(wakes(&counter), 1);
    assert_eq!(bell.poll_rung(&mut cx), Poll::Ready(Ok(())));
}

#[test]
fn doorbell_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Doorbell>();
    assert_send_sync::<Arc<Doorbell>>();
}
