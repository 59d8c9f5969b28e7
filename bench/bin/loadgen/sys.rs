//! What the load generator reads from Linux's /proc: CPU time of a process
//! (the daemon, itself) and of the calling thread, and the machine.
//!
//! Invariants: process CPU is utime + stime of `/proc/PID/stat`, which counts
//! every thread of the process, live or exited, in clock ticks of
//! `USER_HZ` = 100 Hz (fixed by the kernel ABI), so a figure over a step of
//! `s` seconds is exact to ±10 ms / s. Thread CPU comes from
//! `/proc/thread-self/schedstat` in nanoseconds. Everything returns `None`
//! or 0 off Linux rather than failing the run.

use std::fs;

/// Clock ticks per second of /proc/PID/stat times (`USER_HZ`).
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) of process `pid` so far, in milliseconds.
pub fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ms(&stat)
}

/// CPU time of each thread of process `pid` so far, in milliseconds, summed
/// by thread name (`comm`); threads that have exited are not included.
pub fn threads_cpu_ms(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(stat) = fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let name = match (stat.find('('), stat.rfind(')')) {
            (Some(a), Some(b)) if a < b => stat[a + 1..b].to_string(),
            _ => continue,
        };
        if let Some(ms) = parse_stat_cpu_ms(&stat) {
            *by_name.entry(name).or_insert(0.0) += ms;
        }
    }
    by_name
}

/// utime + stime of a /proc/PID/stat line, in milliseconds.
fn parse_stat_cpu_ms(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the line are 12th and 13th after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 * 1000.0 / USER_HZ)
}

/// CPU time of the calling thread so far, in nanoseconds (0 if unknown).
pub fn thread_cpu() -> u64 {
    fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// What the run ran on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// CPUs this process may run on.
    pub nproc: usize,
    /// Logical CPUs in /proc/cpuinfo.
    pub cpuinfo_processors: usize,
    /// `model name` of the first CPU.
    pub cpu_model: String,
    pub kernel: String,
    pub mem_total_gib: f64,
    /// 1-minute load average when the run started.
    pub loadavg_1m_at_start: f64,
}

/// Describes this machine.
pub fn machine() -> Machine {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpuinfo_processors = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem_total_gib = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0 / 1024.0)
        })
        .unwrap_or(0.0);
    Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpuinfo_processors,
        cpu_model,
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        mem_total_gib: (mem_total_gib * 10.0).round() / 10.0,
        loadavg_1m_at_start: loadavg_1m(),
    }
}

/// Busy and total CPU time of the whole machine so far, in ms (the first
/// line of /proc/stat: busy = everything but idle and iowait).
pub fn machine_cpu_ms() -> Option<(f64, f64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    parse_machine_cpu_ms(stat.lines().next()?)
}

fn parse_machine_cpu_ms(line: &str) -> Option<(f64, f64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    let ms = |t: u64| t as f64 * 1000.0 / USER_HZ;
    Some((ms(total - idle), ms(total)))
}

/// Gives the calling thread (and the threads it starts later) and the
/// current autogroup the scheduling priority `nice` (negative = favoured).
/// With `kernel.sched_autogroup_enabled`, CPU is first shared between
/// sessions (autogroups) and only then by nice within one, so the
/// autogroup's nice is what counts against other users' builds; the
/// autogroup is this session's only (a spawned daemon inherits it).
/// Returns the autogroup's previous nice, to give back with
/// [`restore_autogroup`] (the autogroup outlives this process).
pub fn favour_self(nice: i32) -> std::io::Result<Option<i32>> {
    let previous = fs::read_to_string("/proc/self/autogroup")
        .ok()
        .and_then(|s| s.split_whitespace().last()?.parse().ok());
    if previous.is_some() {
        fs::write("/proc/self/autogroup", nice.to_string())?;
    }
    set_nice(0, nice)?;
    Ok(previous)
}

/// Gives the autogroup back the nice [`favour_self`] found.
pub fn restore_autogroup(previous: Option<i32>) {
    if let Some(nice) = previous {
        let _ = fs::write("/proc/self/autogroup", nice.to_string());
    }
}

/// Gives every thread of process `pid` the scheduling priority `nice`.
pub fn favour_process(pid: u32, nice: i32) -> std::io::Result<usize> {
    let mut count = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(tid) = task?.file_name().to_str().and_then(|t| t.parse().ok()) {
            set_nice(tid, nice)?;
            count += 1;
        }
    }
    Ok(count)
}

/// `setpriority(PRIO_PROCESS, tid, nice)`: on Linux, one thread (0: the caller).
fn set_nice(tid: u32, nice: i32) -> std::io::Result<()> {
    // SAFETY: plain system call on integers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The 1-minute load average.
pub fn loadavg_1m() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_spaces_in_the_name() {
        let line = "1234 (moshid io (0)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 5 0";
        assert_eq!(parse_stat_cpu_ms(line), Some(3250.0));
        assert_eq!(parse_stat_cpu_ms("garbage"), None);
        let cpu = "cpu  100 5 50 800 20 3 2 0 0 0";
        assert_eq!(parse_machine_cpu_ms(cpu), Some((1600.0, 9800.0)));
    }
}
