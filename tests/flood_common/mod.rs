//! Tools of the connection-flood test: many idle half-open connections from
//! many loopback source addresses, a watch on how long threads waited for a
//! CPU, the open-file limit, and `/metrics` samples.
//!
//! Why a run-queue watch: the test checks wall-clock bounds (`/health`
//! within 100 ms, answers within 160 ms) on a 2-core machine that other
//! work shares. A thread that is runnable but not running is the machine's
//! load, not the daemon's design; Linux counts that time per thread in
//! `/proc/…/task/TID/schedstat` (second field, nanoseconds). A bound is
//! missed only if the measured time minus what the involved threads waited
//! for a CPU over the same interval still exceeds it. A daemon that makes a
//! client wait — a refused connection, a request stuck behind a full table
//! until a timeout frees it — is late whatever the machine does.
//!
//! Every wait is bounded (socket timeouts, deadlines).

#![allow(dead_code)] // each test binary uses a subset

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Raises this process's soft `RLIMIT_NOFILE` to at least `needed` (the
/// hard limit too when allowed, e.g. as root); returns the soft limit now.
#[allow(clippy::unnecessary_cast)] // `rlim_t` is 32 bits on some targets
pub fn raise_nofile(needed: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_max < needed as libc::rlim_t {
        let raised = libc::rlimit {
            rlim_cur: needed as libc::rlim_t,
            rlim_max: needed as libc::rlim_t,
        };
        // SAFETY: setrlimit reads one rlimit struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return needed;
        }
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        lim.rlim_max as u64
    } else {
        lim.rlim_cur as u64
    }
}

/// The kernel's id of the calling thread.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// `/proc/self/task/TID/schedstat` of the calling thread.
pub fn own_schedstat() -> PathBuf {
    PathBuf::from(format!("/proc/self/task/{}/schedstat", gettid()))
}

/// The schedstat file of the first thread (lowest id) whose name starts
/// with `prefix` in process `pid`. (glommio names an executor's thread
/// `NAME-ID`, and threads it starts inherit the name: the first is the
/// executor.)
pub fn thread_schedstat(pid: u32, prefix: &str) -> Option<PathBuf> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut found: Vec<(u32, PathBuf)> = tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim().starts_with(prefix))
        })
        .filter_map(|t| Some((t.file_name().to_str()?.parse().ok()?, t.path())))
        .collect();
    found.sort();
    found.first().map(|(_, p)| p.join("schedstat"))
}

/// Nanoseconds the thread of `path` has waited on a run queue so far.
pub fn run_queue_wait_ns(path: &PathBuf) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// When, and each watched thread's run-queue wait so far (ns).
type Sample = (Instant, Vec<u64>);

/// Samples the run-queue wait of a fixed set of threads every few
/// milliseconds, so that the wait of any of them over any interval of the
/// run can be looked up afterwards.
pub struct SchedWatch {
    names: Vec<String>,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SchedWatch {
    /// Watches `threads` (name, schedstat path) every `period`.
    pub fn start(threads: Vec<(String, PathBuf)>, period: Duration) -> SchedWatch {
        let names = threads.iter().map(|(n, _)| n.clone()).collect();
        let paths: Vec<PathBuf> = threads.into_iter().map(|(_, p)| p).collect();
        let samples = Arc::new(Mutex::new(Vec::with_capacity(8192)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let waits = paths.iter().map(run_queue_wait_ns).collect();
                    samples.lock().unwrap().push((Instant::now(), waits));
                    std::thread::sleep(period);
                }
            })
        };
        SchedWatch {
            names,
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// Nanoseconds thread `name` waited for a CPU between `from` and `to`,
    /// from the last sample at or before `from` to the first at or after
    /// `to` (so never less than the truth, at most a sampling period more).
    pub fn wait_ns(&self, name: &str, from: Instant, to: Instant) -> u64 {
        let Some(i) = self.names.iter().position(|n| n == name) else {
            panic!("thread {name} is not watched");
        };
        let s = self.samples.lock().unwrap();
        let before = s.iter().rev().find(|(t, _)| *t <= from).or(s.first());
        let after = s.iter().find(|(t, _)| *t >= to).or(s.last());
        match (before, after) {
            (Some(b), Some(a)) => a.1[i].saturating_sub(b.1[i]),
            _ => 0,
        }
    }

    /// Stops sampling.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SchedWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One flood connection, as its client sees it.
pub struct FloodConn {
    pub stream: TcpStream,
    pub src: Ipv4Addr,
    pub opened: Instant,
    /// When the client saw the server close it.
    pub closed: Option<Instant>,
    /// The first bytes the server sent before closing (a 408 on timeout).
    pub received: Vec<u8>,
}

/// Idle half-open connections: each sent the start of a request head and
/// then nothing.
pub struct Flood {
    target: SocketAddr,
    pub conns: Vec<FloodConn>,
}

/// The start of a request head: the request line and one header, no end.
pub const HALF_HEAD: &[u8] = b"GET /health HTTP/1.1\r\nHost: flood\r\n";

impl Flood {
    /// No connection yet, all to `target`.
    pub fn new(target: SocketAddr) -> Flood {
        Flood {
            target,
            conns: Vec::new(),
        }
    }

    /// Opens one connection from each of `sources` (bound before connect)
    /// and sends [`HALF_HEAD`] on each; returns how long it took.
    pub fn open(&mut self, sources: impl IntoIterator<Item = Ipv4Addr>) -> Duration {
        let t0 = Instant::now();
        for src in sources {
            let stream = connect_from(src, self.target);
            let mut s = &stream;
            s.write_all(HALF_HEAD).expect("sending half a head");
            stream.set_nonblocking(true).unwrap();
            self.conns.push(FloodConn {
                stream,
                src,
                opened: Instant::now(),
                closed: None,
                received: Vec::new(),
            });
        }
        t0.elapsed()
    }

    /// Notes every connection the server has closed since the last call;
    /// returns how many are still open.
    pub fn poll(&mut self) -> usize {
        let open: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].closed.is_none())
            .collect();
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.conns[i].stream.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            })
            .collect();
        if !fds.is_empty() {
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs
            // that outlives the call; timeout 0 returns at once.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
            assert!(r >= 0, "poll: {}", std::io::Error::last_os_error());
        }
        let now = Instant::now();
        let mut still = 0;
        for (pfd, &i) in fds.iter().zip(&open) {
            if pfd.revents == 0 {
                still += 1;
                continue;
            }
            let c = &mut self.conns[i];
            let mut buf = [0u8; 256];
            loop {
                match (&c.stream).read(&mut buf) {
                    Ok(0) => {
                        c.closed = Some(now);
                        break;
                    }
                    Ok(n) => {
                        let keep = n.min(64usize.saturating_sub(c.received.len()));
                        c.received.extend_from_slice(&buf[..keep]);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.closed = Some(now);
                        break;
                    }
                }
            }
            if c.closed.is_none() {
                still += 1;
            }
        }
        still
    }

    /// Polls until no connection has closed for `quiet`, at most `max`;
    /// returns the open count.
    pub fn settle(&mut self, quiet: Duration, max: Duration) -> usize {
        let deadline = Instant::now() + max;
        let mut open = self.poll();
        let mut since = Instant::now();
        while Instant::now() < deadline && since.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(10));
            let now_open = self.poll();
            if now_open != open {
                open = now_open;
                since = Instant::now();
            }
        }
        open
    }

    /// Polls until every connection is closed or `max` has passed; returns
    /// the open count.
    pub fn wait_all_closed(&mut self, max: Duration) -> usize {
        let deadline = Instant::now() + max;
        loop {
            let open = self.poll();
            if open == 0 || Instant::now() >= deadline {
                return open;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Indices of the connections still open.
    pub fn open_indices(&self) -> Vec<usize> {
        (0..self.conns.len())
            .filter(|&i| self.conns[i].closed.is_none())
            .collect()
    }
}

/// A blocking connection from `src` (any port) to `target`.
pub fn connect_from(src: Ipv4Addr, target: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::V4(SocketAddrV4::new(src, 0)).into())
        .unwrap_or_else(|e| panic!("binding {src}: {e}"));
    s.connect_timeout(&target.into(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connecting from {src}: {e}"));
    s.into()
}

/// `n` distinct loopback addresses 127.1.x.y (y in 1..=250), from `first`.
pub fn sources(first: usize, n: usize) -> impl Iterator<Item = Ipv4Addr> {
    (first..first + n).map(|i| {
        Ipv4Addr::new(
            127,
            1 + (i / 62_500) as u8,
            (i / 250 % 250) as u8,
            (i % 250 + 1) as u8,
        )
    })
}

/// The value of the `/metrics` sample `name{labels}` (labels as rendered,
/// without braces; `""` for none), if present.
pub fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let labels: Vec<(&str, &str)> = labels
        .split(',')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').expect("label=\"value\"");
            (k, v.trim_matches('"'))
        })
        .collect();
    moshid_testkit::metrics::Prom::parse(text).find(name, &labels)
}

/// Percentile `q` (0–100, nearest rank) of `v` (sorted here).
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
