//! What the soak runner reads of the daemon every second: its memory, open
//! descriptors and threads from /proc, its CPU time, and from `/metrics`
//! every per-session table, the connection tables and the engine counters.
//!
//! Invariants: one short-lived HTTP/1.1 connection per scrape (the daemon
//! answers and closes); a failed read gives `None`, never a panic, so a
//! stalled daemon shows as gaps in the timeline rather than ending the run.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, Result};
use moshid_testkit::http::try_request;

use crate::sys;

/// Timeout of one scrape.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET path` on `addr`: the body.
pub fn http_body(addr: SocketAddr, path: &str) -> Result<String> {
    let r = try_request(addr, "GET", path, None, HTTP_TIMEOUT)?;
    if r.status != 200 {
        return Err(anyhow!(
            "GET {path}: {}",
            r.head.lines().next().unwrap_or("")
        ));
    }
    Ok(r.body)
}

/// `POST /admin/metrics {"enabled": on}`.
pub fn switch_metrics(addr: SocketAddr, on: bool) -> Result<()> {
    let body = format!(r#"{{"enabled": {on}}}"#);
    let r = try_request(addr, "POST", "/admin/metrics", Some(&body), HTTP_TIMEOUT)?;
    if r.status != 200 {
        return Err(anyhow!(
            "POST /admin/metrics: {}",
            r.head.lines().next().unwrap_or("")
        ));
    }
    Ok(())
}

/// The samples of one Prometheus text body: (name, labels, value).
pub fn parse_prometheus(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            Some((name.to_string(), labels.to_string(), value))
        })
        .collect()
}

/// The sum of every sample of `name` whose labels contain `filter`.
pub fn sum(samples: &[(String, String, f64)], name: &str, filter: &str) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && l.contains(filter))
        .map(|s| s.2)
        .sum()
}

/// The per-session tables `/metrics` exports
/// (`moshid_session_table_entries{table}`), in this order.
pub const TABLES: [&str; 5] = [
    "held_slots",
    "pending_params",
    "engine_open_slots",
    "routed",
    "pending_closes",
];

/// One reading of the daemon.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Reading {
    /// Seconds since the run's epoch.
    pub t_s: f64,
    pub rss_kib: u64,
    /// Anonymous part of the RSS (the heap, stacks; not the mapped weights).
    pub rss_anon_kib: u64,
    /// File-backed part of the RSS (the binary, mapped weights).
    pub rss_file_kib: u64,
    /// The daemon's heap (`moshid_heap_bytes`; 0 where absent), in KiB:
    /// allocated and not freed.
    pub heap_in_use_kib: u64,
    /// Free chunks glibc keeps in its arenas (KiB).
    pub heap_free_kib: u64,
    /// glibc's arenas plus its separately mapped chunks (KiB).
    pub heap_total_kib: u64,
    pub fds: usize,
    pub threads: usize,
    /// utime + stime so far (ms).
    pub cpu_ms: f64,
    pub active_sessions: f64,
    /// [`TABLES`], in order.
    pub tables: [f64; 5],
    /// Open connections, all listeners and cores.
    pub connections_open: f64,
    /// Entries of the per-address tables (listeners and pending budget).
    pub connection_addresses: f64,
    pub connections_pending: f64,
    pub metrics_enabled: bool,
    pub late_ticks: f64,
    pub dropped_frames: f64,
    pub lost_outputs: f64,
    pub steps: f64,
    pub refused_total: f64,
    /// Whether `/metrics` answered (else its fields are 0).
    pub scraped: bool,
}

/// Reads /proc of `pid` and `/metrics` at `addr`.
pub fn read(addr: SocketAddr, pid: Option<u32>, t_s: f64) -> Reading {
    let mut r = Reading {
        t_s,
        ..Reading::default()
    };
    if let Some(pid) = pid {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0)
        };
        r.rss_kib = field("VmRSS:");
        r.rss_anon_kib = field("RssAnon:");
        r.rss_file_kib = field("RssFile:");
        r.threads = field("Threads:") as usize;
        r.fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
        r.cpu_ms = sys::process_cpu_ms(pid).unwrap_or(0.0);
    }
    if let Ok(text) = http_body(addr, "/metrics") {
        let m = parse_prometheus(&text);
        r.scraped = true;
        r.active_sessions = sum(&m, "moshid_active_sessions", "");
        for (i, t) in TABLES.iter().enumerate() {
            r.tables[i] = sum(
                &m,
                "moshid_session_table_entries",
                &format!("table=\"{t}\""),
            );
        }
        r.connections_open = sum(&m, "moshid_connections_open", "");
        r.connection_addresses = sum(&m, "moshid_connections_addresses", "")
            + sum(&m, "moshid_connections_pending_addresses", "");
        r.connections_pending = sum(&m, "moshid_connections_pending", "");
        r.metrics_enabled = sum(&m, "moshid_metrics_enabled", "") > 0.0;
        r.late_ticks = sum(&m, "moshid_engine_late_ticks_total", "");
        r.dropped_frames = sum(&m, "moshid_engine_dropped_frames_total", "");
        r.lost_outputs = sum(&m, "moshid_engine_lost_outputs_total", "");
        r.steps = sum(&m, "moshid_engine_steps_total", "");
        r.refused_total = sum(&m, "moshid_sessions_refused_total", "");
        let heap = |kind: &str| {
            (sum(&m, "moshid_heap_bytes", &format!("kind=\"{kind}\"")) / 1024.0) as u64
        };
        r.heap_in_use_kib = heap("in_use");
        r.heap_free_kib = heap("free");
        r.heap_total_kib = heap("arena") + heap("mapped");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_samples() {
        let text = "# HELP x y\nmoshid_active_sessions 3\n\
            moshid_session_table_entries{table=\"held_slots\"} 2\n\
            moshid_connections_open{core=\"0\",listener=\"http\"} 4\n\
            moshid_connections_open{core=\"1\",listener=\"http\"} 1\n";
        let m = parse_prometheus(text);
        assert_eq!(sum(&m, "moshid_active_sessions", ""), 3.0);
        assert_eq!(
            sum(&m, "moshid_session_table_entries", "table=\"held_slots\""),
            2.0
        );
        assert_eq!(sum(&m, "moshid_connections_open", ""), 5.0);
        assert_eq!(sum(&m, "moshid_connections_open", "core=\"1\""), 1.0);
    }
}
