//! The events machinery's series in `GET /metrics` (always on, read at
//! scrape time from the hub's counters):
//!
//! * `moshid_events_subscribers` — subscribers connected now;
//! * `moshid_events_live_sessions` — sessions registered as event sources;
//! * `moshid_events_subscriptions_total{result}` — `accepted`, `unknown`,
//!   `ended`, `full`;
//! * `moshid_events_lost_total` — events subscribers lost by falling
//!   behind (the sessions never wait);
//! * `moshid_events_slow_subscribers_closed_total`;
//! * `moshid_events_emitted_total` — events written by ended sessions;
//! * `moshid_webhook_deliveries_total{result}` — `delivered`, `failed`,
//!   `dropped` (queue full); `moshid_webhook_failed_attempts_total`;
//!   `moshid_webhook_pending`.

use crate::events::EventHub;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// Appends the series to a Prometheus text page.
pub fn append(out: &mut String, hub: &EventHub) {
    let c = hub.counters();
    let w = &hub.webhooks.counters;
    let sizes = hub.sizes();
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    };
    family(
        "moshid_events_subscribers",
        "gauge",
        "Event-stream subscribers connected",
        &[("", sizes.subscribers as u64)],
    );
    family(
        "moshid_events_live_sessions",
        "gauge",
        "Sessions registered as event sources",
        &[("", sizes.live_sessions as u64)],
    );
    family(
        "moshid_events_subscriptions_total",
        "counter",
        "Event-stream subscriptions, by outcome",
        &[
            ("result=\"accepted\"", r(&c.subscriptions)),
            ("result=\"unknown\"", r(&c.refused_unknown)),
            ("result=\"ended\"", r(&c.refused_ended)),
            ("result=\"full\"", r(&c.refused_full)),
        ],
    );
    family(
        "moshid_events_lost_total",
        "counter",
        "Events subscribers lost because they fell behind (sessions never wait)",
        &[("", r(&c.events_lost))],
    );
    family(
        "moshid_events_slow_subscribers_closed_total",
        "counter",
        "Subscribers closed because they took no data within session.send_timeout_ms",
        &[("", r(&c.slow_subscribers_closed))],
    );
    family(
        "moshid_events_emitted_total",
        "counter",
        "Events written by sessions that have ended",
        &[("", r(&c.events_emitted))],
    );
    family(
        "moshid_webhook_deliveries_total",
        "counter",
        "Final records to webhooks, by outcome",
        &[
            ("result=\"delivered\"", r(&w.delivered)),
            ("result=\"failed\"", r(&w.failed)),
            ("result=\"dropped\"", r(&w.dropped)),
        ],
    );
    family(
        "moshid_webhook_failed_attempts_total",
        "counter",
        "Webhook attempts that failed (retried or not)",
        &[("", r(&w.failed_attempts))],
    );
    family(
        "moshid_webhook_pending",
        "gauge",
        "Final records waiting for or in webhook delivery",
        &[("", sizes.webhook_pending)],
    );
}
