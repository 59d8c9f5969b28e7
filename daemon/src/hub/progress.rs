//! Download progress on stderr: a bar redrawn in place (size, rate, time
//! left) when stderr is a terminal, plain lines every few seconds when it
//! is not (systemd's journal, CI logs), so logs are not flooded with
//! carriage returns.

use std::io::Write;
use std::time::{Duration, Instant};

/// Progress of one file.
pub struct Progress {
    file: String,
    total: u64,
    done: u64,
    /// Bytes already there when this run started (a resumed download).
    resumed: u64,
    started: Instant,
    last_draw: Option<Instant>,
    tty: bool,
}

fn human(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

/// Whether stderr is a terminal.
pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

impl Progress {
    /// Starts a file of `total` bytes of which `already` are on disk.
    pub fn start(file: &str, total: u64, already: u64) -> Self {
        let p = Progress {
            file: file.to_string(),
            total,
            done: already,
            resumed: already,
            started: Instant::now(),
            last_draw: None,
            tty: stderr_is_tty(),
        };
        if !p.tty {
            if already > 0 {
                eprintln!(
                    "pull: {}: {} (resuming at {})",
                    p.file,
                    human(total),
                    human(already)
                );
            } else {
                eprintln!("pull: {}: {}", p.file, human(total));
            }
        }
        p
    }

    /// The download restarted from byte `at` (the server ignored a range).
    pub fn restart(&mut self, at: u64) {
        self.done = at;
        self.resumed = at;
        self.started = Instant::now();
    }

    /// `n` more bytes arrived.
    pub fn advance(&mut self, n: u64) {
        self.done += n;
        let now = Instant::now();
        let every = if self.tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(5)
        };
        if self.last_draw.is_none_or(|t| now - t >= every) {
            self.last_draw = Some(now);
            self.draw(false);
        }
    }

    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.done - self.resumed) as f64 / secs;
        let left = if rate > 0.0 {
            duration((self.total.saturating_sub(self.done)) as f64 / rate)
        } else {
            "?".into()
        };
        let pct = if self.total > 0 {
            100.0 * self.done as f64 / self.total as f64
        } else {
            100.0
        };
        format!(
            "{} of {} ({pct:.0}%), {}/s, {left} left",
            human(self.done),
            human(self.total),
            human(rate as u64)
        )
    }

    fn draw(&self, last: bool) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let width = 24;
            let filled = (width as u64 * self.done)
                .checked_div(self.total)
                .map_or(width, |f| f as usize);
            let bar: String =
                "#".repeat(filled.min(width)) + &"-".repeat(width - filled.min(width));
            let _ = write!(err, "\r\x1b[2K{} [{bar}] {}", self.file, self.line());
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "pull: {}: {}", self.file, self.line());
        }
        let _ = err.flush();
    }

    /// The file is complete and verified.
    pub fn finish(&self) {
        if self.tty {
            self.draw(true);
        } else {
            let secs = self.started.elapsed().as_secs_f64();
            eprintln!(
                "pull: {}: done, {} in {} (sha checked)",
                self.file,
                human(self.total),
                duration(secs.ceil())
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(human(15_400_000_000), "15.40 GB");
        assert_eq!(human(2_500_000), "2.5 MB");
        assert_eq!(duration(3725.0), "1 h 02 min");
        assert_eq!(duration(75.0), "1 min 15 s");
        let mut p = Progress::start("f", 1000, 500);
        p.done = 750;
        let l = p.line();
        assert!(l.starts_with("750 B of 1 kB (75%)"), "{l}");
        assert!(l.contains("left"), "{l}");
    }
}
