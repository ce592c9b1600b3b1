//! The process allocator (mimalloc) and the upkeep that gives freed memory back to the OS.
//!
//! mimalloc 3 keeps pages that became free for `purge_delay` (default 1 s) before it returns
//! them, and it only returns them when some thread calls into the allocator again: a broker
//! that goes quiet after a burst (a publish to thousands of offline sessions, a replay) kept
//! much of the burst's peak as its RSS (58 B per queued message after a 1 M-message burst,
//! against 21 B with the delay at 10 ms; docs/benchmarks.md, "Offline persistent sessions").
//! So, unless `MIMALLOC_PURGE_DELAY` is set in the environment:
//! - the purge delay is [`PURGE_DELAY_MS`]: long enough that a sustained load reuses the
//!   pages it frees instead of returning and faulting them in again (10 ms, mimalloc 2's
//!   default, cost the 10 -> 1 QoS 0 fan-in a quarter of its throughput: page faults and
//!   `madvise` were ~8 % of the broker's CPU), short enough that RSS after a burst is the
//!   same as with 10 ms (20 B per queued message, measured 2 s after the burst);
//! - every runtime worker, when it parks with nothing to do, collects its own thread heap at
//!   most once per [`COLLECT_EVERY`];
//! - a small thread collects every [`COLLECT_EVERY`], which also purges the arenas (program
//!   wide) of pages whose delay has expired;
//! - no transparent huge pages (unless `MIMALLOC_ALLOW_THP` is set): see [`configure`].
//!
//! Invariant: nothing here frees or moves live memory; `mi_collect(false)` only returns pages
//! that hold no live block.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// mimalloc instead of the system allocator: the replay and publish paths allocate many
/// short-lived buffers, and glibc malloc spent ~40% of the broker's CPU on them (see
/// docs/benchmarks.md).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Least time between two collections of one thread's heap.
pub const COLLECT_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    static LAST_COLLECT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Return this thread's free pages (and expired arena purges) to the OS, unless it was done
/// less than [`COLLECT_EVERY`] ago on this thread. Cheap when it has nothing to do: one
/// clock read.
pub fn collect_if_due() {
    let now = Instant::now();
    let due = LAST_COLLECT.with(|last| match last.get() {
        Some(t) if now.duration_since(t) < COLLECT_EVERY => false,
        _ => {
            last.set(Some(now));
            true
        }
    });
    if due {
        collect();
    }
}

/// Purge delay the broker runs with, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 250;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (include/mimalloc.h); the Rust
/// bindings do not name it. `tests::purge_delay_option_is_the_one_we_think` pins it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Apply [`PURGE_DELAY_MS`] unless the operator set `MIMALLOC_PURGE_DELAY`, and keep
/// transparent huge pages out of the process unless `MIMALLOC_ALLOW_THP` is set.
///
/// mimalloc 3 asks the kernel for huge pages on its arenas (`allow_thp`, on by default; the
/// first 1 GiB arena is reserved before `main`, so the option cannot be changed in time).
/// With THP in `madvise` mode (Debian's default) a burst then faults in 2 MiB pages that a
/// purge of some 4 KiB pages does not give back: measured on 5,000 offline sessions with
/// 1 M queued messages, broker RSS at start 77 MiB against 48 MiB without THP, 39 B against
/// 20 B per queued message, and 495 MiB against 269 MiB after the queues drained
/// (docs/benchmarks.md). `PR_SET_THP_DISABLE` turns huge pages off for every later page
/// fault of the process, the arena's included. Call it first thing in `main`.
#[allow(unsafe_code)]
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` takes plain integers; setting an option at any time is
        // allowed by mimalloc (it takes effect on the next purge decision).
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        if let Err(e) = disable_thp() {
            eprintln!("lanemq: cannot turn transparent huge pages off ({e}); RSS may be higher");
        }
    }
}

/// Turn transparent huge pages off for this process (`PR_SET_THP_DISABLE`).
#[allow(unsafe_code)]
fn disable_thp() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; PR_SET_THP_DISABLE changes a flag of this
    // process's memory map and nothing else.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[allow(unsafe_code)]
fn collect() {
    // SAFETY: `mi_collect` takes no pointer and only releases pages without live blocks; it
    // is safe to call from any thread at any time (mimalloc's documented contract).
    unsafe { libmimalloc_sys::mi_collect(false) }
}

/// Start the thread that collects every [`COLLECT_EVERY`] for the life of the process.
pub fn start_upkeep() {
    let spawned = std::thread::Builder::new()
        .name("lanemq-alloc".into())
        .spawn(|| loop {
            std::thread::sleep(COLLECT_EVERY);
            collect();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the allocator upkeep thread; freed memory is returned more slowly");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn purge_delay_option_is_the_one_we_think() {
        // mimalloc 3's default purge delay is 1000 ms and no other option of the enum has
        // that default, so reading 1000 (or the value this process was started with) proves
        // the index. The test binary does not call `configure`.
        let expected = std::env::var("MIMALLOC_PURGE_DELAY")
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(1000);
        // SAFETY: reads an option; no pointers.
        let got = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        #[allow(clippy::useless_conversion)] // c_long is i32 on some targets
        let got = i64::from(got);
        assert_eq!(got, expected);
    }

    #[test]
    #[allow(unsafe_code)]
    fn huge_pages_are_off_after_disable_thp() {
        disable_thp().unwrap();
        // SAFETY: prctl with integer arguments only.
        let got = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(got, 1);
    }
}
