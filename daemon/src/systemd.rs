//! systemd integration for `Type=notify` units, through the `sd-notify`
//! crate:
//!
//! * `READY=1` once warm-up is done and every core listens
//!   ([`Notifier::ready`], from `Hooks::on_ready`);
//! * `WATCHDOG=1` from the engine thread's tick hook ([`Notifier::tick_hook`])
//!   at half the watchdog interval, so a stuck engine (not just a dead
//!   process) makes systemd restart the daemon;
//! * `STATUS=` lines with sessions and capacity, at most every
//!   [`STATUS_PERIOD`], from the same hook;
//! * `STOPPING=1` when SIGTERM starts the drain ([`Notifier::stopping`]).
//!
//! Invariants: without `NOTIFY_SOCKET` nothing is sent and no hook is
//! installed. The tick hook makes no system call on most ticks: it compares
//! the tick's `Instant` with the last notification's, and only when one is
//! due does it send one datagram (the crate opens a socket and builds the
//! message for it: a few syscalls and one small allocation per
//! notification, never per tick). A failed notification is logged once and
//! never stops the engine.

use crate::agent::EngineCell;
use crate::engine::admission::Capacity;
use crate::engine::thread::TickHook;
use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shortest time between two `STATUS=` lines sent from the tick hook.
pub const STATUS_PERIOD: Duration = Duration::from_secs(5);

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const STOPPING: u8 = 2;

/// The watchdog interval libsystemd's `sd_watchdog_enabled` would report for
/// these `WATCHDOG_USEC` / `WATCHDOG_PID` values in process `me`: a positive
/// `WATCHDOG_USEC`, and `WATCHDOG_PID` either absent or equal to `me`.
pub fn watchdog_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    match pid {
        Some(p) if p.trim().parse::<u32>().ok() != Some(me) => None,
        _ => Some(Duration::from_micros(usec)),
    }
}

/// The watchdog interval systemd asked for, if any.
fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut usec) {
        return (usec > 0).then(|| Duration::from_micros(usec));
    }
    // sd-notify 0.4 insists on WATCHDOG_PID; libsystemd (and systemd's own
    // tools) also accept WATCHDOG_USEC alone, meaning "this process".
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_from(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// The `STATUS=` text for a daemon serving with this capacity.
pub fn status_text(draining: bool, cap: &Capacity) -> String {
    if draining {
        format!("draining: {} session(s) left", cap.active_sessions)
    } else {
        format!(
            "serving: {} session(s), {} more admissible, {} of {} slots free",
            cap.active_sessions, cap.admissible_sessions, cap.free_slots, cap.max_slots
        )
    }
}

struct Inner {
    notify_socket: bool,
    watchdog: Option<Duration>,
    engine: EngineCell,
    phase: AtomicU8,
    warned: AtomicBool,
}

impl Inner {
    fn send(&self, states: &[NotifyState]) {
        if !self.notify_socket {
            return;
        }
        if let Err(e) = sd_notify::notify(false, states) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                eprintln!("<4>systemd: notification failed (logged once): {e}");
            }
        }
    }

    fn status(&self) -> Option<String> {
        let engine = self.engine.get()?;
        let draining = self.phase.load(Ordering::Acquire) == STOPPING;
        Some(status_text(draining, &engine.capacity()))
    }
}

/// Sends the daemon's state to systemd (a no-op outside systemd).
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC`; status lines read the
    /// engine from `engine` once it is set.
    pub fn from_env(engine: EngineCell) -> Notifier {
        let notify_socket = std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty());
        let watchdog = if notify_socket {
            watchdog_interval()
        } else {
            None
        };
        if notify_socket {
            match watchdog {
                Some(w) => eprintln!(
                    "<6>systemd: notify socket set, watchdog {} ms (pinged from the engine tick)",
                    w.as_millis()
                ),
                None => eprintln!("<6>systemd: notify socket set, no watchdog"),
            }
        }
        Notifier {
            inner: Arc::new(Inner {
                notify_socket,
                watchdog,
                engine,
                phase: AtomicU8::new(STARTING),
                warned: AtomicBool::new(false),
            }),
        }
    }

    /// Whether systemd listens (`NOTIFY_SOCKET` is set).
    pub fn active(&self) -> bool {
        self.inner.notify_socket
    }

    /// The watchdog interval, when systemd set one.
    pub fn watchdog(&self) -> Option<Duration> {
        self.inner.watchdog
    }

    /// `READY=1` plus a first status line.
    pub fn ready(&self) {
        self.inner.phase.store(SERVING, Ordering::Release);
        let status = self.inner.status().unwrap_or_else(|| "serving".into());
        self.inner
            .send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// `STOPPING=1` plus a status line; the drain follows.
    pub fn stopping(&self) {
        self.inner.phase.store(STOPPING, Ordering::Release);
        let status = self.inner.status().unwrap_or_else(|| "draining".into());
        self.inner
            .send(&[NotifyState::Stopping, NotifyState::Status(&status)]);
    }

    /// The engine tick hook: `WATCHDOG=1` every half watchdog interval and
    /// a status line every [`STATUS_PERIOD`], both only once `READY=1` was
    /// sent. `None` outside systemd.
    pub fn tick_hook(&self) -> Option<TickHook> {
        if !self.inner.notify_socket {
            return None;
        }
        let inner = self.inner.clone();
        let ping_every = inner.watchdog.map(|w| w / 2);
        let mut last_ping: Option<Instant> = None;
        let mut last_status: Option<Instant> = None;
        Some(Box::new(move |now: Instant| {
            if inner.phase.load(Ordering::Relaxed) == STARTING {
                return;
            }
            let due = |last: Option<Instant>, every: Duration| {
                last.is_none_or(|t| now.saturating_duration_since(t) >= every)
            };
            if let Some(every) = ping_every {
                if due(last_ping, every) {
                    last_ping = Some(now);
                    inner.send(&[NotifyState::Watchdog]);
                }
            }
            if due(last_status, STATUS_PERIOD) {
                // The first status after READY=1 was sent with it.
                if last_status.is_some() {
                    if let Some(status) = inner.status() {
                        inner.send(&[NotifyState::Status(&status)]);
                    }
                }
                last_status = Some(now);
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_env_follows_libsystemd() {
        let w = |u, p| watchdog_from(u, p, 42);
        assert_eq!(w(Some("2000000"), None), Some(Duration::from_secs(2)));
        assert_eq!(w(Some("2000000"), Some("42")), Some(Duration::from_secs(2)));
        assert_eq!(
            w(Some("2000000"), Some("41")),
            None,
            "another process's watchdog"
        );
        assert_eq!(w(Some("2000000"), Some("x")), None);
        assert_eq!(w(Some("0"), None), None);
        assert_eq!(w(Some("soon"), None), None);
        assert_eq!(w(None, Some("42")), None);
    }

    #[test]
    fn status_names_sessions_and_capacity() {
        let engine = crate::engine::EngineShared::new(8, 1, 10.0, 1);
        for b in 1..=8 {
            engine.step_times.set(b, 1000);
        }
        engine.admission().set_accepting(true);
        let cap = engine.capacity();
        assert_eq!(
            status_text(false, &cap),
            "serving: 0 session(s), 8 more admissible, 8 of 8 slots free"
        );
        assert_eq!(status_text(true, &cap), "draining: 0 session(s) left");
    }
}
