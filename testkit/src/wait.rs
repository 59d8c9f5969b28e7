//! Bounded waiting: polling a condition until a deadline, and clients
//! that all start before any of them runs.
//!
//! Invariant: nothing here waits without a bound; a failed wait panics
//! with what was waited for and the caller's context.

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `probe` until it gives a value (every 20 ms), at most `timeout`;
/// `None` when it never did.
pub fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL);
    }
}

/// [`poll`], which must succeed: a timeout panics saying `what` was
/// waited for, with `context()`.
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    poll(timeout, probe).unwrap_or_else(|| {
        panic!(
            "timed out after {timeout:?} waiting for {what}; {}",
            context()
        )
    })
}

/// Runs `n` clients on threads that all start (connect and are admitted)
/// before any of them runs, so that their frames overlap. A client that
/// cannot start (a refusal, a dead daemon) fails the test with its own
/// panic instead of leaving the others waiting for it forever.
pub fn start_together<C, R>(
    n: usize,
    start: impl Fn(usize) -> C + Send + Sync + 'static,
    run: impl Fn(usize, C) -> R + Send + Sync + 'static,
) -> Vec<R>
where
    R: Send + 'static,
{
    let start = Arc::new(start);
    let run = Arc::new(run);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let mut go = Vec::with_capacity(n);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (go_tx, go_rx) = mpsc::channel::<()>();
            go.push(go_tx);
            let (start, run, started_tx) = (start.clone(), run.clone(), started_tx.clone());
            thread::spawn(move || {
                let client = start(i);
                let _ = started_tx.send(());
                // A closed channel: another client failed to start.
                go_rx.recv().ok().map(|()| run(i, client))
            })
        })
        .collect();
    drop(started_tx);
    let mut started = 0;
    while started < n {
        match started_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => started += 1,
            // A thread that ended before it started has panicked: its
            // join below reports why.
            Err(_) if threads.iter().any(|t| t.is_finished()) => break,
            Err(_) => {}
        }
    }
    if started == n {
        for g in &go {
            let _ = g.send(());
        }
    }
    drop(go);
    let results: Vec<Option<R>> = threads
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.join().unwrap_or_else(|_| panic!("client {i} failed")))
        .collect();
    results
        .into_iter()
        .map(|r| r.expect("every client started"))
        .collect()
}
