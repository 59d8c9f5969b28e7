//! Which numbers of streams to try, and when a step counts as held.
//!
//! Ramp syntax (`--ramp`):
//! - `START:END:STEP`: START, START+STEP, … up to END (END always tried);
//! - `START:END:xF` (or `*F`): START, ×F each time (rounded up, at least +1),
//!   up to END;
//! - `A,B,C`: exactly these.
//!
//! A ramp stops at the first step that breaks a criterion; `--refine K` then
//! bisects between the last N that held and the first that broke, K more
//! steps at most. Invariants: plans are strictly increasing and non-empty,
//! every N ≥ 1.

use anyhow::{bail, Context, Result};

/// Parses a ramp specification (see the module docs).
pub fn parse_ramp(spec: &str) -> Result<Vec<usize>> {
    let spec = spec.trim();
    let plan: Vec<usize> = if spec.contains(',') || !spec.contains(':') {
        spec.split(',')
            .map(|n| {
                n.trim()
                    .parse::<usize>()
                    .with_context(|| format!("ramp item {n:?}"))
            })
            .collect::<Result<_>>()?
    } else {
        let parts: Vec<&str> = spec.split(':').collect();
        let [start, end, step] = parts[..] else {
            bail!("expected START:END:STEP, got {spec:?}");
        };
        let start: usize = start.trim().parse().context("ramp START")?;
        let end: usize = end.trim().parse().context("ramp END")?;
        let step = step.trim();
        let next: Box<dyn Fn(usize) -> usize> =
            if let Some(f) = step.strip_prefix('x').or_else(|| step.strip_prefix('*')) {
                let f: f64 = f.parse().context("ramp factor")?;
                if f.is_nan() || f <= 1.0 {
                    bail!("ramp factor must be above 1, got {f}");
                }
                Box::new(move |n| ((n as f64 * f).ceil() as usize).max(n + 1))
            } else {
                let k: usize = step.parse().context("ramp STEP")?;
                if k == 0 {
                    bail!("ramp STEP must be positive");
                }
                Box::new(move |n| n + k)
            };
        if start == 0 || end < start {
            bail!("ramp needs 1 <= START <= END, got {start}..{end}");
        }
        let mut plan = vec![start];
        let mut n = start;
        while n < end {
            n = next(n).min(end);
            plan.push(n);
        }
        plan
    };
    if plan.is_empty() || plan.contains(&0) || plan.windows(2).any(|w| w[0] >= w[1]) {
        bail!("ramp must be increasing numbers of streams >= 1, got {plan:?}");
    }
    Ok(plan)
}

/// The stop criteria (`--stop-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Criteria {
    /// p99 added latency above the budget.
    pub p99: bool,
    /// Any deadline miss (late answer or unanswered frame).
    pub miss: bool,
    /// Any refused session.
    pub refused: bool,
    /// Any caller error (connection, protocol, early close).
    pub error: bool,
}

impl Criteria {
    /// Parses a comma list of `p99`, `miss`, `refused`, `error` (or `none`).
    pub fn parse(text: &str) -> Result<Self> {
        let mut c = Criteria {
            p99: false,
            miss: false,
            refused: false,
            error: false,
        };
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "p99" => c.p99 = true,
                "miss" => c.miss = true,
                "refused" => c.refused = true,
                "error" => c.error = true,
                "none" => {}
                other => {
                    bail!("unknown stop criterion {other:?} (p99, miss, refused, error, none)")
                }
            }
        }
        Ok(c)
    }

    /// The names of the enabled criteria.
    pub fn names(&self) -> Vec<String> {
        [
            (self.p99, "p99"),
            (self.miss, "miss"),
            (self.refused, "refused"),
            (self.error, "error"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| n.to_string())
        .collect()
    }

    /// The criteria a step broke, given its figures.
    pub fn broken(
        &self,
        p99_ms: Option<f64>,
        budget_ms: f64,
        misses: usize,
        refused: usize,
        errors: usize,
    ) -> Vec<String> {
        let mut broke = Vec::new();
        match p99_ms {
            Some(p) if self.p99 && p > budget_ms => {
                broke.push(format!("p99 {p:.1} ms > budget {budget_ms} ms"))
            }
            None if self.p99 => broke.push("no latency measured".into()),
            _ => {}
        }
        if self.miss && misses > 0 {
            broke.push(format!("{misses} deadline misses"));
        }
        if self.refused && refused > 0 {
            broke.push(format!("{refused} sessions refused"));
        }
        if self.error && errors > 0 {
            broke.push(format!("{errors} callers failed"));
        }
        broke
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramps() {
        assert_eq!(parse_ramp("1:10:4").unwrap(), vec![1, 5, 9, 10]);
        assert_eq!(parse_ramp("1:64:x2").unwrap(), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(parse_ramp("1:10:*1.5").unwrap(), vec![1, 2, 3, 5, 8, 10]);
        assert_eq!(parse_ramp("2,4, 8").unwrap(), vec![2, 4, 8]);
        assert_eq!(parse_ramp("7").unwrap(), vec![7]);
        assert!(parse_ramp("4,2").is_err());
        assert!(parse_ramp("0:4:1").is_err());
        assert!(parse_ramp("1:4:0").is_err());
        assert!(parse_ramp("1:4:x1").is_err());
    }

    #[test]
    fn criteria() {
        let c = Criteria::parse("p99,miss,refused,error").unwrap();
        assert!(c.broken(Some(80.0), 160.0, 0, 0, 0).is_empty());
        assert_eq!(c.broken(Some(170.0), 160.0, 2, 1, 0).len(), 3);
        let only_refusals = Criteria::parse("refused").unwrap();
        assert!(only_refusals
            .broken(Some(900.0), 160.0, 50, 0, 3)
            .is_empty());
        assert!(Criteria::parse("p95").is_err());
    }
}
