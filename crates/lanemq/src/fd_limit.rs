//! The open-files limit: every connection is a file descriptor, and the usual soft limit
//! (1,024) would cap the broker far below `mqtt.max_connections` (100,000 by default). At
//! start the soft limit is raised to the hard one, as servers commonly do; the hard limit
//! itself is the operator's (`ulimit -Hn`, systemd's `LimitNOFILE=`).

/// Raise the soft `RLIMIT_NOFILE` to the hard limit. Returns the soft limit before and after.
#[allow(unsafe_code)]
pub fn raise() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed by pointer and touches nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct passed by pointer and touches nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    #[allow(clippy::useless_conversion)] // rlim_t is u64 on Linux, not everywhere
    Ok((u64::from(before), u64::from(lim.rlim_cur)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn soft_limit_ends_at_the_hard_limit() {
        let (before, after) = super::raise().unwrap();
        assert!(after >= before);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: as in `raise`.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        assert_eq!(rc, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        #[allow(clippy::useless_conversion)]
        let cur = u64::from(lim.rlim_cur);
        assert_eq!(cur, after);
    }
}
