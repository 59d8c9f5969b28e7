//! `events.*`: the bounds of live session events and webhooks, and their
//! checks at start (errors name the key). `session.webhook_url` (the
//! default webhook of every session) lives in `session.*` and is checked
//! here too.

use crate::http::url::WebhookUrl;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `events.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Events each session keeps for its subscribers (a power of two): a
    /// subscriber that falls this far behind loses the oldest ones, counted
    /// and told (`event: lost`); the session never waits for it.
    pub ring_events: usize,
    /// Subscribers one session may have at once (beyond: 429).
    pub max_subscribers_per_session: usize,
    /// Subscribers of the whole daemon at once (beyond: 503).
    pub max_subscribers: usize,
    /// How often an I/O core looks for new events for the subscribers it
    /// serves, in milliseconds (the most an event waits before it is sent).
    pub poll_ms: u64,
    /// An idle subscriber gets an SSE comment this often, in milliseconds
    /// (keeps proxies from closing the stream; finds gone clients).
    pub keepalive_ms: u64,
    /// Text kept per session for its final record, in bytes (allocated at
    /// the session's start; text beyond it is streamed but not kept, and
    /// the record says `text_truncated`).
    pub max_text_bytes: usize,
    /// Prefixes a per-session `webhook_url` must start with (e.g.
    /// `"https://hooks.example.com/"`); empty: sessions may not name their
    /// own webhook (only `session.webhook_url` is used).
    pub session_webhook_prefixes: Vec<String>,
    /// Final records waiting for a webhook worker, beyond which new ones are
    /// dropped (counted).
    pub webhook_queue: usize,
    /// Threads that deliver webhooks (off the I/O cores).
    pub webhook_workers: usize,
    /// Time allowed for one delivery attempt (connect, TLS, request,
    /// response head), in milliseconds.
    pub webhook_timeout_ms: u64,
    /// Further attempts after a failed one (connection error, timeout, 5xx,
    /// 408, 429), one second apart, doubling.
    pub webhook_retries: u32,
    /// PEM file of the CA certificates `https://` webhooks are checked
    /// against; `null`: the system's bundle (`/etc/ssl/certs/ca-certificates.crt`
    /// or the first of its usual places that exists).
    pub webhook_ca_file: Option<PathBuf>,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            ring_events: 256,
            max_subscribers_per_session: 4,
            max_subscribers: 256,
            poll_ms: 20,
            keepalive_ms: 15_000,
            max_text_bytes: 32 * 1024,
            session_webhook_prefixes: Vec::new(),
            webhook_queue: 64,
            webhook_workers: 2,
            webhook_timeout_ms: 5_000,
            webhook_retries: 2,
            webhook_ca_file: None,
        }
    }
}

/// Checks `events.*` and `session.webhook_url`: `Err((key, why))`.
pub fn validate(e: &EventsConfig, webhook_url: Option<&str>) -> Result<(), (&'static str, String)> {
    let bad = |key, why: &str| Err((key, why.to_string()));
    if !(16..=65_536).contains(&e.ring_events) || !e.ring_events.is_power_of_two() {
        return bad(
            "events.ring_events",
            "must be a power of two between 16 and 65536",
        );
    }
    if e.max_subscribers == 0 || e.max_subscribers > 65_536 {
        return bad("events.max_subscribers", "must be between 1 and 65536");
    }
    if e.max_subscribers_per_session == 0 || e.max_subscribers_per_session > e.max_subscribers {
        return bad(
            "events.max_subscribers_per_session",
            "must be between 1 and events.max_subscribers",
        );
    }
    if !(1..=1000).contains(&e.poll_ms) {
        return bad("events.poll_ms", "must be between 1 and 1000");
    }
    if e.keepalive_ms < 1000 {
        return bad("events.keepalive_ms", "must be at least 1000");
    }
    if e.max_text_bytes > 16 << 20 {
        return bad("events.max_text_bytes", "must be at most 16 MiB");
    }
    for p in &e.session_webhook_prefixes {
        if !(p.starts_with("http://") || p.starts_with("https://")) || p.len() < "http://x".len() {
            return Err((
                "events.session_webhook_prefixes",
                format!("`{p}` is not the start of an http:// or https:// URL with a host"),
            ));
        }
    }
    if e.webhook_queue == 0 || e.webhook_queue > 65_536 {
        return bad("events.webhook_queue", "must be between 1 and 65536");
    }
    if !(1..=64).contains(&e.webhook_workers) {
        return bad("events.webhook_workers", "must be between 1 and 64");
    }
    if !(100..=600_000).contains(&e.webhook_timeout_ms) {
        return bad(
            "events.webhook_timeout_ms",
            "must be between 100 and 600000",
        );
    }
    if e.webhook_retries > 10 {
        return bad("events.webhook_retries", "must be at most 10");
    }
    if let Some(f) = &e.webhook_ca_file {
        if !f.is_file() {
            return Err((
                "events.webhook_ca_file",
                format!("{} is not a readable file", f.display()),
            ));
        }
    }
    if let Some(url) = webhook_url {
        WebhookUrl::parse(url).map_err(|why| ("session.webhook_url", why))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_their_key() {
        let ok = EventsConfig::default();
        assert_eq!(validate(&ok, None), Ok(()));
        let cases: Vec<(EventsConfig, Option<&str>, &str)> = vec![
            (
                EventsConfig {
                    ring_events: 100,
                    ..ok.clone()
                },
                None,
                "events.ring_events",
            ),
            (
                EventsConfig {
                    max_subscribers_per_session: 300,
                    ..ok.clone()
                },
                None,
                "events.max_subscribers_per_session",
            ),
            (
                EventsConfig {
                    poll_ms: 0,
                    ..ok.clone()
                },
                None,
                "events.poll_ms",
            ),
            (
                EventsConfig {
                    session_webhook_prefixes: vec!["ftp://x/".into()],
                    ..ok.clone()
                },
                None,
                "events.session_webhook_prefixes",
            ),
            (
                EventsConfig {
                    webhook_ca_file: Some("/nonexistent/ca.pem".into()),
                    ..ok.clone()
                },
                None,
                "events.webhook_ca_file",
            ),
            (ok.clone(), Some("gopher://x/"), "session.webhook_url"),
        ];
        for (cfg, url, key) in cases {
            assert_eq!(validate(&cfg, url).unwrap_err().0, key);
        }
        assert_eq!(
            validate(&ok, Some("https://hooks.example.com/moshid")),
            Ok(())
        );
    }
}
