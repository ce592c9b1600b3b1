//! Will the log's retention fit on its disk? Checked once at start, before anything is opened.
//!
//! By default the log keeps 7 days (`storage.retention_max_age_s`) and has no size limit
//! (`storage.retention_max_bytes = 0`): at 40,000 QoS 1 messages of 256 B a second that is
//! about 1 TB a day, far more than most data directories hold, and a full disk makes the log
//! refuse writes (fail-stop, `docs/durability.md`). A default size limit would not be safe
//! either (lanes do not pin the log, so it could drop lane messages nobody consumed yet, and
//! no fixed value suits every disk), so the broker says so instead: a WARN at start with the
//! free space of the data directory's file system and the key to set, and another when a size
//! limit is set that the file system cannot hold.
//!
//! The free space comes from `statvfs(3)` (libc, already a dependency of this crate for the
//! open-files limit): blocks available to an unprivileged user, as `df` shows them.

use std::path::{Path, PathBuf};

use lanemq_broker::config::StorageConfig;

/// Space of the file system holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged process may still write (`f_bavail * f_frsize`).
    pub free_bytes: u64,
    /// Size of the file system (`f_blocks * f_frsize`).
    pub total_bytes: u64,
}

/// `statvfs` of `path`, or of its nearest existing ancestor (the data directory may not
/// exist before the first start).
#[allow(unsafe_code)]
pub fn space(path: &Path) -> std::io::Result<(PathBuf, Space)> {
    use std::os::unix::ffi::OsStrExt;
    let abs = std::path::absolute(path)?;
    let existing = abs
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or_else(|| Path::new("/"))
        .to_path_buf();
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path contains a NUL byte"))?;
    // SAFETY: statvfs reads the NUL-terminated path and writes the struct passed by pointer;
    // an all-zero statvfs is a valid value of that plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `c` and `st` outlive the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    let (bavail, blocks, frsize) = (
        u64::from(st.f_bavail),
        u64::from(st.f_blocks),
        u64::from(st.f_frsize),
    );
    Ok((
        existing,
        Space {
            free_bytes: bavail.saturating_mul(frsize),
            total_bytes: blocks.saturating_mul(frsize),
        },
    ))
}

/// Bytes of the log's segment files under `data_dir` now (0 when there is no log yet).
pub fn log_bytes(data_dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(data_dir.join("log")) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// What the start should say about the log's retention and the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A size limit that fits.
    Fits,
    /// No size limit (`retention_max_bytes = 0`): the log grows with the traffic for
    /// `retention_max_age_s` (or forever); `suggested_bytes` is a limit that would fit.
    Unbounded {
        room_bytes: u64,
        suggested_bytes: u64,
    },
    /// The size limit plus one segment (what the log may reach between two retention
    /// passes) is more than the log has room for.
    TooBig {
        room_bytes: u64,
        suggested_bytes: u64,
    },
}

/// Judges the storage settings against the file system. The log's room is the free space
/// plus what the log already takes; a suggested limit is half of it (the index, the session
/// queue journal, the stream and lane entry files and carried messages live on the same file
/// system), in whole segments, at least one.
pub fn judge(st: &StorageConfig, space: Space, log_bytes: u64) -> Verdict {
    let room = space.free_bytes.saturating_add(log_bytes);
    let seg = st.segment_bytes_max.max(1);
    let suggested = (room / 2 / seg).max(1) * seg;
    if st.retention_max_bytes == 0 {
        return Verdict::Unbounded {
            room_bytes: room,
            suggested_bytes: suggested,
        };
    }
    if st.retention_max_bytes.saturating_add(seg) > room {
        return Verdict::TooBig {
            room_bytes: room,
            suggested_bytes: suggested,
        };
    }
    Verdict::Fits
}

/// The start's check: one WARN when the retention cannot fit (module doc).
pub fn check(data_dir: &Path, st: &StorageConfig) {
    let (fs_path, space) = match space(data_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(data_dir = %data_dir.display(), error = %e, "cannot read the free space of the data directory's file system");
            return;
        }
    };
    let log = log_bytes(data_dir);
    match judge(st, space, log) {
        Verdict::Fits => {}
        Verdict::Unbounded {
            room_bytes,
            suggested_bytes,
        } => {
            let kept = if st.retention_max_age_s == 0 {
                "the log has no size limit and no age limit (storage.retention_max_bytes = 0, storage.retention_max_age_s = 0): it keeps every message until the disk is full, and then refuses publishes; set storage.retention_max_bytes"
            } else {
                "the log has no size limit (storage.retention_max_bytes = 0): it keeps every message for storage.retention_max_age_s whatever the disk holds, and refuses publishes once the disk is full; set storage.retention_max_bytes"
            };
            tracing::warn!(
                data_dir = %data_dir.display(),
                file_system = %fs_path.display(),
                free_bytes = space.free_bytes,
                total_bytes = space.total_bytes,
                log_bytes = log,
                room_bytes,
                retention_max_age_s = st.retention_max_age_s,
                suggested_retention_max_bytes = suggested_bytes,
                "{kept}"
            );
        }
        Verdict::TooBig {
            room_bytes,
            suggested_bytes,
        } => {
            tracing::warn!(
                data_dir = %data_dir.display(),
                file_system = %fs_path.display(),
                free_bytes = space.free_bytes,
                log_bytes = log,
                room_bytes,
                retention_max_bytes = st.retention_max_bytes,
                segment_bytes_max = st.segment_bytes_max,
                suggested_retention_max_bytes = suggested_bytes,
                "storage.retention_max_bytes (plus one segment) is more than the data directory's file system has room for: the disk fills before retention deletes anything, and the log then refuses publishes; lower storage.retention_max_bytes"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const GIB: u64 = 1 << 30;
    const SEG: u64 = 64 << 20;

    fn st(max_bytes: u64) -> StorageConfig {
        StorageConfig {
            retention_max_bytes: max_bytes,
            ..StorageConfig::default()
        }
    }

    fn space(free: u64) -> Space {
        Space {
            free_bytes: free,
            total_bytes: 4 * free,
        }
    }

    #[test]
    fn the_default_has_no_size_limit_and_is_told_what_would_fit() {
        assert_eq!(StorageConfig::default().retention_max_bytes, 0);
        assert_eq!(
            judge(&StorageConfig::default(), space(64 * GIB), 0),
            Verdict::Unbounded {
                room_bytes: 64 * GIB,
                suggested_bytes: 32 * GIB
            }
        );
        // What the log already takes is room too; the suggestion is whole segments.
        assert_eq!(
            judge(&st(0), space(10 * GIB + 5), 3 * GIB),
            Verdict::Unbounded {
                room_bytes: 13 * GIB + 5,
                suggested_bytes: (13 * GIB / 2 / SEG) * SEG
            }
        );
        // A nearly full disk still gets a usable suggestion: one segment.
        assert_eq!(
            judge(&st(0), space(1 << 20), 0),
            Verdict::Unbounded {
                room_bytes: 1 << 20,
                suggested_bytes: SEG
            }
        );
    }

    #[test]
    fn a_size_limit_must_fit_with_one_segment_on_top() {
        assert_eq!(judge(&st(10 * GIB), space(64 * GIB), 0), Verdict::Fits);
        assert_eq!(
            judge(&st(64 * GIB - SEG), space(64 * GIB), 0),
            Verdict::Fits
        );
        assert_eq!(
            judge(&st(64 * GIB), space(64 * GIB), 0),
            Verdict::TooBig {
                room_bytes: 64 * GIB,
                suggested_bytes: 32 * GIB
            }
        );
        // The log's own bytes count as room: a full log at its limit fits.
        assert_eq!(judge(&st(50 * GIB), space(GIB), 50 * GIB), Verdict::Fits);
    }

    #[test]
    fn statvfs_of_a_missing_data_dir_is_its_nearest_ancestor() {
        let tmp = std::env::temp_dir();
        let (at, s) = super::space(&tmp.join("lanemq-no-such-dir/data")).unwrap();
        assert_eq!(at, std::path::absolute(&tmp).unwrap());
        assert!(s.total_bytes > 0 && s.free_bytes <= s.total_bytes, "{s:?}");
        assert_eq!(log_bytes(&tmp.join("lanemq-no-such-dir/data")), 0);
    }
}
