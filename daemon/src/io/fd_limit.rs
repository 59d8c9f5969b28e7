//! The process's file-descriptor limit, raised at start so that the
//! configured connection bounds — not `EMFILE` — decide what a flood gets.
//!
//! Linux starts most processes with a soft `RLIMIT_NOFILE` of 1024 and a
//! hard one far above (systemd: 524288; `moshid.service` sets 1048576): the
//! soft limit is for programs that still use `select`. moshid does not, so
//! it raises the soft limit to the hard one, then compares it with what its
//! configuration can open at once ([`needed`]) and warns, naming the keys,
//! when the hard limit is lower. It does not refuse to start: the bound is
//! a worst case, and the pending budget keeps a flood far below it.
//!
//! Invariants: called once, before any listener is bound; never lowers the
//! limit.

use crate::config::Config;

/// Descriptors kept apart from connections: standard streams, listeners,
/// io_uring rings and eventfds of each executor, the engine's files, the
/// agent-check socket, short-lived control sockets.
pub const RESERVED_FDS: u64 = 256;

/// What [`raise`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// The most descriptors the configuration can use at once.
    pub needed: u64,
}

/// The most descriptors the configuration can hold open at once: every
/// core's connection bounds, every RTP session's UDP socket, plus
/// [`RESERVED_FDS`].
pub fn needed(config: &Config) -> u64 {
    let cores = config.runtime.io_cores as u64;
    let mut per_core = config.listen.max_connections_per_core as u64;
    if config.audiosocket.enabled {
        per_core += config.audiosocket.max_connections_per_core as u64;
    }
    let rtp = if config.rtp.enabled {
        config.rtp.max_sessions as u64
    } else {
        0
    };
    cores * per_core + rtp + RESERVED_FDS
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (capped at Linux's
/// default `fs.nr_open`, 2^20, when the hard limit is unlimited).
#[allow(clippy::unnecessary_cast)] // `rlim_t` is 32 bits on some targets
pub fn raise(config: &Config) -> std::io::Result<FdLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    let hard = if lim.rlim_max == libc::RLIM_INFINITY {
        1 << 20
    } else {
        lim.rlim_max
    };
    let mut soft = before;
    if before < hard {
        let raised = libc::rlimit {
            rlim_cur: hard,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            soft = hard;
        } else {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(FdLimit {
        before: before as u64,
        soft: soft as u64,
        hard: hard as u64,
        needed: needed(config),
    })
}

/// Raises the limit and logs the outcome (a warning when it is too low).
pub fn raise_and_log(config: &Config) {
    match raise(config) {
        Ok(l) if l.soft < l.needed => eprintln!(
            "<4>fds: the open-file limit is {} (hard limit {}), below the {} the configuration can \
             use (runtime.io_cores × (listen.max_connections_per_core + \
             audiosocket.max_connections_per_core) + rtp.max_sessions + {RESERVED_FDS}): raise \
             LimitNOFILE / ulimit -Hn, or lower those keys; accept fails with EMFILE beyond it",
            l.soft, l.hard, l.needed
        ),
        Ok(l) => eprintln!(
            "<6>fds: open-file limit {} (was {}; the configuration uses at most {})",
            l.soft, l.before, l.needed
        ),
        Err(e) => eprintln!("<4>fds: cannot raise the open-file limit: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_follow_the_bounds() {
        let mut c = Config::default();
        let base = needed(&c);
        assert_eq!(base, 1024 + 256 + RESERVED_FDS);
        c.runtime.io_cores = 2;
        c.audiosocket.enabled = true;
        assert_eq!(needed(&c), 2 * (1024 + 1024) + 256 + RESERVED_FDS);
        // Raising never lowers; the soft limit ends at the hard one.
        let l = raise(&c).unwrap();
        assert!(l.soft >= l.before && l.soft <= l.hard);
        assert_eq!(l.soft, l.hard);
    }
}
