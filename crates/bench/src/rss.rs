//! Broker memory sampling from /proc/PID/status.

use std::time::Duration;

use tokio::sync::watch;

/// Current VmRSS of `pid` in KiB, `None` when unreadable.
pub fn vm_rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
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
    fn reads_own_rss() {
        let kb = super::vm_rss_kb(std::process::id()).expect("own /proc status");
        assert!(kb > 0);
    }
}
