//! Fuzz the ACL parser and the matcher: any input must parse or fail with an error whose line
//! and column lie inside the input, never panic; a parsed ACL is then asked about topics and
//! filters taken from the input itself (as publish, subscribe, create and auto-create), and
//! must answer without panicking, never allow an invalid request, and name a rule line that
//! exists.
#![no_main]

use lanemq_acl::{Acl, Action, DecidedBy, Request};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count().max(1);
    let acl = match Acl::parse(&text, "fuzz.acl") {
        Ok(acl) => acl,
        Err(e) => {
            assert!(e.line >= 1 && e.line <= lines, "line {} of {lines}", e.line);
            let width = text
                .lines()
                .nth(e.line - 1)
                .map_or(0, |l| l.chars().count());
            assert!(
                e.column >= 1 && e.column <= width + 1,
                "column {} of {width}",
                e.column
            );
            return;
        }
    };
    let ips = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    // Topics: every whitespace-separated word of the input, with a pattern prefix removed.
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| {
            w.trim_start_matches("topic:")
                .trim_start_matches("filter:")
                .trim_start_matches("user:")
        })
        .take(16)
        .collect();
    for (i, topic) in words.iter().enumerate() {
        let user = words.get(i + 1).copied();
        for action in [Action::Publish, Action::Subscribe, Action::Create] {
            let req = Request {
                username: user,
                client_id: words.get(i + 2).copied().unwrap_or("c"),
                ip: ips[i % ips.len()],
                action,
                topic,
            };
            let d = acl.check(&req);
            match d.by {
                DecidedBy::InvalidRequest => assert!(!d.allowed && d.rule.is_none()),
                DecidedBy::Default => {
                    assert!(d.rule.is_none());
                    assert_eq!(d.allowed, acl.default_allows());
                }
                DecidedBy::Rule => {
                    let r = d.rule.as_ref().map(|r| r.line).unwrap_or(0);
                    assert!(r >= 1 && r <= lines);
                }
            }
            if action == Action::Subscribe {
                let full = acl.check_subscribe(&req, true);
                // Auto-create only ever adds conditions.
                assert!(!full.allowed || d.allowed);
            }
        }
    }
});
