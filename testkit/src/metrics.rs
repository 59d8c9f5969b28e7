//! `/metrics`: the Prometheus text exposition parsed into series, sums
//! over labels, and waits on counters.
//!
//! Invariant: a series is keyed by its name and its sorted labels, so two
//! reads compare series by series whatever order the daemon wrote them in.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::wait::poll;
use crate::{Daemon, IDLE_TIMEOUT};

/// A parsed exposition: `(name, sorted labels) → value`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prom(pub BTreeMap<(String, Vec<(String, String)>), f64>);

impl Prom {
    /// Parses the text exposition (comments and blank lines skipped).
    pub fn parse(text: &str) -> Prom {
        let mut map = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
                None => (series, ""),
            };
            let mut labels: Vec<(String, String)> = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            labels.sort();
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}"));
            map.insert((name.to_string(), labels), value);
        }
        Prom(map)
    }

    /// The series `name` with exactly `labels`, if there is one.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        self.0.get(&(name.to_string(), l)).copied()
    }

    /// The series `name` with exactly `labels`; panics when absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in /metrics"))
    }

    /// The series `name` without labels, as a count.
    pub fn counter(&self, name: &str) -> u64 {
        self.get(name, &[]) as u64
    }

    /// The sum of the series `name` whose labels include every one of
    /// `labels` (`("reason", "busy")`), 0 when there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| *v)
            .sum()
    }

    /// `moshid_stage_duration_seconds_count{stage, core}`.
    pub fn stage_count(&self, stage: &str, core: &str) -> u64 {
        self.get(
            "moshid_stage_duration_seconds_count",
            &[("stage", stage), ("core", core)],
        ) as u64
    }

    /// Stage `stage`'s `count` or `sum` (seconds) over every thread (not
    /// the `core="all"` total).
    pub fn stage_total(&self, stage: &str, what: &str) -> f64 {
        let name = format!("moshid_stage_duration_seconds_{what}");
        self.0
            .iter()
            .filter(|((n, l), _)| {
                *n == name
                    && l.iter().any(|(k, v)| k == "stage" && v == stage)
                    && l.iter().any(|(k, v)| k == "core" && v != "all")
            })
            .map(|(_, v)| *v)
            .sum()
    }

    /// Every stage series but the histogram buckets, for "did anything
    /// move" comparisons.
    pub fn stage_series(&self) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter(|((name, _), _)| name.starts_with("moshid_stage_"))
            .filter(|((name, _), _)| !name.ends_with("_bucket"))
            .map(|((name, labels), v)| (format!("{name}{labels:?}"), *v))
            .collect()
    }
}

impl Daemon {
    /// `GET /metrics`, parsed.
    pub fn metrics(&self) -> Prom {
        let (status, text) = self.http_get("/metrics");
        assert_eq!(status, 200, "{text}");
        Prom::parse(&text)
    }

    /// Polls `/metrics` until `cond` holds (bounded by [`IDLE_TIMEOUT`]);
    /// returns the read that satisfied it.
    pub fn wait_metrics(&self, what: &str, cond: impl Fn(&Prom) -> bool) -> Prom {
        let mut last = Prom::default();
        let found = poll(IDLE_TIMEOUT, || {
            last = self.metrics();
            cond(&last).then(|| last.clone())
        });
        found.unwrap_or_else(|| {
            panic!(
                "timed out after {IDLE_TIMEOUT:?} waiting for {what} in /metrics: {:?}\nstderr:\n{}",
                last.0,
                self.stderr_tail()
            )
        })
    }

    /// The sum of the `/metrics` series `name` whose labels include every
    /// one of `labels` (`reason="busy"`), once it is at least `min` or
    /// `timeout` has passed (counters copied on a timer lag a little).
    pub fn metric_at_least(&self, name: &str, labels: &[&str], min: u64, timeout: Duration) -> u64 {
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|l| {
                let (k, v) = l.split_once('=').expect("a label is key=\"value\"");
                (k, v.trim_matches('"'))
            })
            .collect();
        let mut sum = 0;
        poll(timeout, || {
            sum = self.metrics().sum(name, &labels) as u64;
            (sum >= min).then_some(())
        });
        sum
    }

    /// Stage `stage`'s `count` or `sum` (seconds) in `/metrics`, over every
    /// thread (not the `core="all"` total).
    pub fn stage_total(&self, stage: &str, what: &str) -> f64 {
        self.metrics().stage_total(stage, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_sums_and_stages() {
        let p = Prom::parse(
            "# HELP x\nmoshid_up 1\nmoshid_refused_total{reason=\"busy\",core=\"0\"} 2\n\
             moshid_refused_total{core=\"1\",reason=\"busy\"} 3\nmoshid_refused_total{core=\"1\",reason=\"auth\"} 5\n\
             moshid_stage_duration_seconds_count{stage=\"decode\",core=\"0\"} 4\n\
             moshid_stage_duration_seconds_count{stage=\"decode\",core=\"all\"} 4\n",
        );
        assert_eq!(p.counter("moshid_up"), 1);
        assert_eq!(
            p.get("moshid_refused_total", &[("core", "0"), ("reason", "busy")]),
            2.0
        );
        assert_eq!(p.sum("moshid_refused_total", &[("reason", "busy")]), 5.0);
        assert_eq!(p.sum("moshid_refused_total", &[]), 10.0);
        assert_eq!(p.sum("moshid_nothing", &[]), 0.0);
        assert_eq!(p.stage_count("decode", "all"), 4);
        assert_eq!(p.stage_total("decode", "count"), 4.0);
        assert_eq!(p.stage_series().len(), 2);
    }
}
