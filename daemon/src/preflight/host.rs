//! How much memory this process may still take: the lowest of what the
//! kernel says is available (`MemAvailable`), what the process's cgroup
//! allows (`memory.max` less `memory.current`, cgroup v2) and what its
//! address-space limit leaves (`RLIMIT_AS`, `ulimit -v`, less the address
//! space already mapped).
//!
//! `RLIMIT_AS` counts address space, not memory: a mapped checkpoint file
//! counts in full while it is mapped, which [`HostMemory::available_for`]
//! adds to the need when that limit is the one that binds.

/// One of the limits on this process's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// What it is, as a user would look it up.
    pub name: &'static str,
    /// Bytes still available under it.
    pub available: u64,
    /// Whether it counts address space (mapped files too) rather than memory.
    pub counts_mappings: bool,
}

/// The limits that apply to this process (at least one on Linux).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostMemory {
    /// Every limit found.
    pub limits: Vec<Limit>,
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

/// The cgroup v2 folder of this process, from `/proc/self/cgroup` (`0::/path`).
fn cgroup_dir() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(std::path::Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')))
}

fn read_u64(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl HostMemory {
    /// Reads the limits of this process now.
    pub fn read() -> HostMemory {
        let mut limits = Vec::new();
        if let Some(avail) = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| kib_field(&t, "MemAvailable:"))
        {
            limits.push(Limit {
                name: "MemAvailable",
                available: avail,
                counts_mappings: false,
            });
        }
        // The innermost cgroup with a limit binds; walk up to the root.
        let mut dir = cgroup_dir();
        while let Some(d) = dir {
            if let Some(max) = read_u64(&d.join("memory.max")) {
                let current = read_u64(&d.join("memory.current")).unwrap_or(0);
                limits.push(Limit {
                    name: "the cgroup's memory.max",
                    available: max.saturating_sub(current),
                    counts_mappings: false,
                });
                break;
            }
            dir = d
                .parent()
                .filter(|p| p.starts_with("/sys/fs/cgroup") && *p != d)
                .map(|p| p.to_path_buf());
        }
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0;
        if ok && rl.rlim_cur != libc::RLIM_INFINITY {
            let used = std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|t| kib_field(&t, "VmSize:"))
                .unwrap_or(0);
            limits.push(Limit {
                name: "RLIMIT_AS (ulimit -v)",
                available: rl.rlim_cur.saturating_sub(used),
                counts_mappings: true,
            });
        }
        HostMemory { limits }
    }

    /// The bytes available for a need of `memory` bytes that also maps
    /// `mapped` bytes of files, and the limit that binds: each limit is
    /// compared with what it counts (address-space limits count the maps).
    /// `None` when no limit is known (not Linux).
    pub fn available_for(&self, memory: u64, mapped: u64) -> Option<(u64, u64, &Limit)> {
        self.limits
            .iter()
            .map(|l| {
                let need = memory + if l.counts_mappings { mapped } else { 0 };
                (need, l.available, l)
            })
            // The binding limit is the one with the least room left.
            .min_by_key(|(need, avail, _)| *avail as i128 - *need as i128)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_parse() {
        let t = "MemTotal:       24000000 kB\nMemAvailable:   12345 kB\n";
        assert_eq!(kib_field(t, "MemAvailable:"), Some(12345 * 1024));
        assert_eq!(kib_field(t, "Nope:"), None);
    }

    #[test]
    fn this_machine_has_memavailable_and_the_tightest_limit_binds() {
        let h = HostMemory::read();
        assert!(h.limits.iter().any(|l| l.name == "MemAvailable"), "{h:?}");
        let h = HostMemory {
            limits: vec![
                Limit {
                    name: "a",
                    available: 10 << 30,
                    counts_mappings: false,
                },
                Limit {
                    name: "b",
                    available: 12 << 30,
                    counts_mappings: true,
                },
            ],
        };
        // 4 GiB of memory and 8 GiB of maps: b has 0 left, a 6 GiB.
        let (need, avail, l) = h.available_for(4 << 30, 8 << 30).unwrap();
        assert_eq!((need, avail, l.name), (12 << 30, 12 << 30, "b"));
        let (need, _, l) = h.available_for(4 << 30, 1 << 30).unwrap();
        assert_eq!((need, l.name), (4 << 30, "a"));
    }
}
