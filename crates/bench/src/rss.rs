//! Broker memory sampling from /proc/PID/status, and its CPU time from /proc/PID/stat.

use std::time::Duration;

use tokio::sync::watch;

/// Current VmRSS of `pid` in KiB, `None` when unreadable.
pub fn vm_rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time `pid` has used so far (user + system, every thread), in seconds; `None` when
/// unreadable. `/proc/PID/stat` counts it in clock ticks of `USER_HZ`, which Linux fixes at
/// 100 for every architecture's user-space ABI.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after it.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    // After the name: state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// Sample every 100 ms until `stop` flips (or its sender is dropped) and
/// return the maximum seen.
pub fn spawn_sampler(
    pid: u32,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Option<u64>> {
    tokio::spawn(async move {
        let mut max = vm_rss_kb(pid);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Some(kb) = vm_rss_kb(pid) {
                        max = Some(max.map_or(kb, |m| m.max(kb)));
                    }
                }
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        max
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_cpu_time() {
        let before = super::cpu_seconds(std::process::id()).expect("own /proc stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = super::cpu_seconds(std::process::id()).expect("own /proc stat");
        // 300 ms of spinning: at least some ticks counted, never more than wall time allows
        // for this thread plus the test harness.
        assert!(after - before >= 0.1, "{before} -> {after}");
    }

    #[test]
    fn reads_own_rss() {
        let kb = super::vm_rss_kb(std::process::id()).expect("own /proc status");
        assert!(kb > 0);
    }
}
