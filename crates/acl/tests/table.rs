//! Table-driven authorization tests: the shipped ACL files and a test ACL, including the
//! attacks listed in issue 5.

use lanemq_acl::{Acl, Action, DecidedBy, Request};
use std::net::IpAddr;

const TEST_ACL: &str = r#"
# test ACL
default deny
allow  all          subscribe         filter:%c/inbox/#
allow  user:alice   subscribe         topic:$stream/events
allow  user:c1      subscribe         filter:$stream/x/#
allow  user:c2      subscribe         filter:$stream/x/#
allow  user:c2      create            topic:$stream/x
deny   all          subscribe,create  filter:$stream/#
deny   all          subscribe         filter:$s/#
deny   all          publish           filter:$SYS/#
deny   all          subscribe         filter:secret/#
allow  user:u2      subscribe         filter:a/+
allow  user:u3      subscribe         filter:a/#
allow  all          publish           filter:users/%u/#
allow  all          subscribe         filter:devices/%c/#
allow  all          publish           topic:exact/%c
allow  user:re      publish           re:sensor-[0-9]+/temp
allow  ip:10.0.0.0/8   publish        filter:lan/#
allow  ip:fd00::/8     publish        filter:lan6/#
allow  user:w       subscribe         filter:jobs/#  group:workers
deny   all          subscribe         filter:jobs/#  group:*
allow  all          subscribe         filter:jobs/#
allow  user:"x y"&client:c  publish   topic:"quoted topic"
allow  all          publish,subscribe filter:pub/#
"#;

fn acl(name: &str) -> (Acl, String) {
    let text = match name {
        "default" => include_str!("../../../acl/default.acl").to_string(),
        "reader" => include_str!("../../../acl/examples/stream-reader.acl").to_string(),
        "per-user" => include_str!("../../../acl/examples/per-user.acl").to_string(),
        "fleet" => include_str!("../../../acl/examples/fleet.acl").to_string(),
        "test" => TEST_ACL.to_string(),
        other => panic!("no acl {other}"),
    };
    let acl = Acl::parse(&text, name).unwrap_or_else(|e| panic!("{e}"));
    (acl, text)
}

/// Line number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle) && !l.trim_start().starts_with('#'))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no rule line containing {needle:?}"))
}

/// (acl, username, client id, ip, action, topic, allowed, decided by).
/// Action "sub+create" is `check_subscribe(.., auto_create = true)`.
/// Decided by: "default", "invalid", or a substring of the deciding rule's line.
type Case = (
    &'static str,
    Option<&'static str>,
    &'static str,
    &'static str,
    &'static str,
    String,
    bool,
    &'static str,
);

fn s(x: &str) -> String {
    x.to_string()
}

fn cases() -> Vec<Case> {
    let long_pub = format!("pub/{}", "a/".repeat(30_000));
    let long_sub = format!("pub/{}#", "+/".repeat(20_000));
    let long_other = "z/".repeat(30_000) + "z";
    let l = "127.0.0.1";
    vec![
        // ---- default.acl
        ("default", None, "c", l, "sub", s("#"), true, "filter:#"),
        ("default", None, "c", l, "sub", s("+/#"), true, "filter:#"),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream/events/#"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream/events/t/#"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream/+"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream/#"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$stream"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$s/earliest/#"),
            false,
            "$s/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$s/latest/t/+"),
            false,
            "$s/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$share/g/$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$share/g/$s/earliest/#"),
            false,
            "$s/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$share/g/#"),
            true,
            "filter:#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "create",
            s("$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub+create",
            s("$stream/new/#"),
            false,
            "$stream/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "pub",
            s("$SYS/broker/uptime"),
            false,
            "publish           filter:$SYS/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$SYS/#"),
            true,
            "subscribe         filter:$SYS/#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "pub",
            s("$stream/events"),
            false,
            "default",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$other/x"),
            false,
            "default",
        ),
        ("default", None, "c", l, "pub", s("a/b"), true, "filter:#"),
        (
            "default",
            None,
            "c",
            l,
            "pub",
            s("ü/温度/🙂"),
            true,
            "filter:#",
        ),
        (
            "default",
            None,
            "c",
            l,
            "pub",
            s("a/\0/b"),
            false,
            "invalid",
        ),
        ("default", None, "c", l, "sub", s("a/\0"), false, "invalid"),
        ("default", None, "c", l, "sub", s("a/#/b"), false, "invalid"),
        ("default", None, "c", l, "pub", s("a/+"), false, "invalid"),
        ("default", None, "c", l, "pub", s(""), false, "invalid"),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$share/g"),
            false,
            "invalid",
        ),
        (
            "default",
            None,
            "c",
            l,
            "sub",
            s("$share//a"),
            false,
            "invalid",
        ),
        (
            "default",
            None,
            "c",
            "::1",
            "pub",
            long_other.clone(),
            true,
            "filter:#",
        ),
        // ---- stream-reader.acl
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$stream/events"),
            true,
            "user:reader",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$share/g/$stream/events"),
            true,
            "user:reader",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$stream/events/#"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub+create",
            s("$stream/events/#"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$stream/+"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$stream/#"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$stream/other"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("$s/earliest/#"),
            false,
            "$s/#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "sub",
            s("#"),
            true,
            "filter:#",
        ),
        (
            "reader",
            Some("reader"),
            "r",
            l,
            "pub",
            s("t/0"),
            true,
            "filter:#",
        ),
        (
            "reader",
            Some("other"),
            "o",
            l,
            "sub",
            s("$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            None,
            "reader",
            l,
            "sub",
            s("$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "reader",
            Some("Reader"),
            "r",
            l,
            "sub",
            s("$stream/events"),
            false,
            "$stream/#",
        ),
        // ---- per-user.acl
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "pub",
            s("users/bob/x"),
            true,
            "users/%u/#",
        ),
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "sub",
            s("users/bob/#"),
            true,
            "users/%u/#",
        ),
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "pub",
            s("users/alice/x"),
            false,
            "default",
        ),
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "sub",
            s("users/+/public/#"),
            true,
            "users/+/public/#",
        ),
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "sub",
            s("users/#"),
            false,
            "default",
        ),
        (
            "per-user",
            Some("bob"),
            "b",
            l,
            "sub",
            s("#"),
            false,
            "default",
        ),
        (
            "per-user",
            Some("a/b"),
            "b",
            l,
            "pub",
            s("users/a/b/x"),
            false,
            "default",
        ),
        (
            "per-user",
            Some("+"),
            "b",
            l,
            "sub",
            s("users/+/#"),
            false,
            "default",
        ),
        (
            "per-user",
            Some("#"),
            "b",
            l,
            "sub",
            s("users/#"),
            false,
            "default",
        ),
        (
            "per-user",
            Some(""),
            "b",
            l,
            "pub",
            s("users//x"),
            false,
            "default",
        ),
        (
            "per-user",
            None,
            "b",
            l,
            "pub",
            s("users/b/x"),
            false,
            "deny   anonymous",
        ),
        (
            "per-user",
            Some("ops"),
            "o",
            l,
            "sub",
            s("users/#"),
            true,
            "user:ops   subscribe         filter:users/#",
        ),
        (
            "per-user",
            Some("ops"),
            "o",
            l,
            "sub",
            s("$stream/audit"),
            false,
            "$stream/#",
        ),
        // ---- fleet.acl
        (
            "fleet",
            Some("dev"),
            "d1",
            l,
            "pub",
            s("fleet/d1/telemetry"),
            true,
            "fleet/%c/telemetry",
        ),
        (
            "fleet",
            Some("dev"),
            "d1",
            l,
            "pub",
            s("fleet/d2/telemetry"),
            false,
            "default",
        ),
        (
            "fleet",
            Some("dev"),
            "+",
            l,
            "pub",
            s("fleet/x/telemetry"),
            false,
            "default",
        ),
        (
            "fleet",
            Some("dev"),
            "d1",
            l,
            "sub",
            s("fleet/d1/commands/#"),
            true,
            "fleet/%c/commands/#",
        ),
        (
            "fleet",
            Some("dev"),
            "d1",
            l,
            "sub",
            s("fleet/+/commands/#"),
            false,
            "default",
        ),
        (
            "fleet",
            Some("dev"),
            "d1",
            l,
            "sub",
            s("$share/g/fleet/d1/commands/#"),
            false,
            "group:*",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            l,
            "sub",
            s("fleet/+/telemetry"),
            true,
            "user:backend&ip:127",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            "::1",
            "sub",
            s("$share/backend/fleet/+/telemetry"),
            true,
            "user:backend&ip:::1",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            "192.0.2.1",
            "sub",
            s("fleet/+/telemetry"),
            false,
            "default",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            "192.0.2.1",
            "sub",
            s("$share/backend/fleet/+/telemetry"),
            false,
            "group:*",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            l,
            "pub",
            s("fleet/d1/commands/reboot"),
            true,
            "commands/#",
        ),
        (
            "fleet",
            Some("backend"),
            "be",
            l,
            "sub",
            s("$stream/telemetry"),
            false,
            "$stream/#",
        ),
        // ---- test ACL: subscriptions covered by allow rules, intersected by deny rules
        ("test", Some("u2"), "c", l, "sub", s("a/b"), true, "user:u2"),
        ("test", Some("u2"), "c", l, "sub", s("a/+"), true, "user:u2"),
        (
            "test",
            Some("u2"),
            "c",
            l,
            "sub",
            s("a/#"),
            false,
            "default",
        ),
        (
            "test",
            Some("u3"),
            "c",
            l,
            "sub",
            s("a/+/b"),
            true,
            "user:u3",
        ),
        ("test", Some("u3"), "c", l, "sub", s("a/#"), true, "user:u3"),
        ("test", None, "c", l, "sub", s("#"), false, "secret/#"),
        ("test", None, "c", l, "sub", s("+/x"), false, "secret/#"),
        (
            "test",
            None,
            "c",
            l,
            "sub",
            s("secret/x"),
            false,
            "secret/#",
        ),
        (
            "test",
            None,
            "c",
            l,
            "sub",
            s("pub/#"),
            true,
            "filter:pub/#",
        ),
        ("test", None, "c", l, "sub", s("$SYS/#"), false, "default"),
        (
            "test",
            None,
            "c",
            l,
            "pub",
            s("$SYS/x"),
            false,
            "filter:$SYS/#",
        ),
        // auto-create
        (
            "test",
            Some("alice"),
            "c",
            l,
            "sub",
            s("$stream/events"),
            true,
            "user:alice",
        ),
        (
            "test",
            Some("alice"),
            "c",
            l,
            "sub+create",
            s("$stream/events/#"),
            false,
            "$stream/#",
        ),
        (
            "test",
            Some("alice"),
            "c",
            l,
            "sub",
            s("$share/g/$stream/events"),
            true,
            "user:alice",
        ),
        (
            "test",
            Some("bob"),
            "c",
            l,
            "sub",
            s("$share/g/$stream/events"),
            false,
            "$stream/#",
        ),
        (
            "test",
            Some("c1"),
            "c",
            l,
            "sub",
            s("$stream/x/pub/#"),
            true,
            "user:c1",
        ),
        (
            "test",
            Some("c1"),
            "c",
            l,
            "sub+create",
            s("$stream/x/pub/#"),
            false,
            "subscribe,create  filter:$stream/#",
        ),
        (
            "test",
            Some("c2"),
            "c",
            l,
            "sub+create",
            s("$stream/x/pub/#"),
            true,
            "user:c2      subscribe",
        ),
        (
            "test",
            Some("c2"),
            "c",
            l,
            "sub+create",
            s("$stream/x/#"),
            false,
            "secret/#",
        ),
        (
            "test",
            Some("c2"),
            "c",
            l,
            "sub+create",
            s("$stream/x/$SYS/#"),
            false,
            "default",
        ),
        (
            "test",
            Some("c2"),
            "c",
            l,
            "sub+create",
            s("$s/earliest/pub/#"),
            false,
            "$s/#",
        ),
        (
            "test",
            Some("c2"),
            "c",
            l,
            "create",
            s("$stream/x"),
            true,
            "user:c2      create",
        ),
        (
            "test",
            Some("c1"),
            "c",
            l,
            "create",
            s("$stream/x"),
            false,
            "subscribe,create  filter:$stream/#",
        ),
        // placeholders
        (
            "test",
            Some("bob"),
            "c",
            l,
            "pub",
            s("users/bob/x"),
            true,
            "users/%u/#",
        ),
        (
            "test",
            Some("bob"),
            "c",
            l,
            "pub",
            s("users/alice/x"),
            false,
            "default",
        ),
        (
            "test",
            Some("a/b"),
            "c",
            l,
            "pub",
            s("users/a/b/x"),
            false,
            "default",
        ),
        ("test", None, "c", l, "pub", s("users//x"), false, "default"),
        (
            "test",
            None,
            "+",
            l,
            "sub",
            s("devices/+/#"),
            false,
            "default",
        ),
        (
            "test",
            None,
            "#",
            l,
            "sub",
            s("devices/#"),
            false,
            "default",
        ),
        (
            "test",
            None,
            "a/b",
            l,
            "sub",
            s("devices/a/b/#"),
            false,
            "default",
        ),
        (
            "test",
            None,
            "dev1",
            l,
            "sub",
            s("devices/dev1/#"),
            true,
            "devices/%c/#",
        ),
        (
            "test",
            None,
            "dev1",
            l,
            "sub",
            s("devices/dev2/#"),
            false,
            "default",
        ),
        ("test", None, "x", l, "pub", s("exact/x"), true, "exact/%c"),
        (
            "test",
            None,
            "x\0",
            l,
            "pub",
            s("exact/x"),
            false,
            "default",
        ),
        (
            "test",
            None,
            "bob",
            l,
            "sub",
            s("bob/inbox/#"),
            true,
            "%c/inbox/#",
        ),
        (
            "test",
            None,
            "$stream",
            l,
            "sub",
            s("$stream/inbox/#"),
            false,
            "subscribe,create  filter:$stream/#",
        ),
        (
            "test",
            None,
            "$SYS",
            l,
            "sub",
            s("$SYS/inbox/#"),
            false,
            "default",
        ),
        // regex, anchored
        (
            "test",
            Some("re"),
            "c",
            l,
            "pub",
            s("sensor-12/temp"),
            true,
            "re:sensor",
        ),
        (
            "test",
            Some("re"),
            "c",
            l,
            "pub",
            s("sensor-x/temp"),
            false,
            "default",
        ),
        (
            "test",
            Some("re"),
            "c",
            l,
            "pub",
            s("sensor-12/temp/extra"),
            false,
            "default",
        ),
        (
            "test",
            Some("re"),
            "c",
            l,
            "pub",
            s("xsensor-12/temp"),
            false,
            "default",
        ),
        // ip / cidr
        (
            "test",
            None,
            "c",
            "10.1.2.3",
            "pub",
            s("lan/x"),
            true,
            "ip:10.0.0.0/8",
        ),
        (
            "test",
            None,
            "c",
            "11.0.0.1",
            "pub",
            s("lan/x"),
            false,
            "default",
        ),
        (
            "test",
            None,
            "c",
            "::ffff:10.1.2.3",
            "pub",
            s("lan/x"),
            true,
            "ip:10.0.0.0/8",
        ),
        (
            "test",
            None,
            "c",
            "fd00::1",
            "pub",
            s("lan6/x"),
            true,
            "ip:fd00::/8",
        ),
        (
            "test",
            None,
            "c",
            "fe80::1",
            "pub",
            s("lan6/x"),
            false,
            "default",
        ),
        // share groups
        (
            "test",
            Some("w"),
            "c",
            l,
            "sub",
            s("$share/workers/jobs/#"),
            true,
            "group:workers",
        ),
        (
            "test",
            Some("w"),
            "c",
            l,
            "sub",
            s("$share/other/jobs/a"),
            false,
            "group:*",
        ),
        (
            "test",
            Some("x"),
            "c",
            l,
            "sub",
            s("$share/workers/jobs/#"),
            false,
            "group:*",
        ),
        (
            "test",
            Some("x"),
            "c",
            l,
            "sub",
            s("jobs/#"),
            true,
            "filter:jobs/#\n",
        ),
        (
            "test",
            Some("x"),
            "c",
            l,
            "sub",
            s("$share/g/secret/#"),
            false,
            "secret/#",
        ),
        // quoting and conjunctions
        (
            "test",
            Some("x y"),
            "c",
            l,
            "pub",
            s("quoted topic"),
            true,
            "quoted topic",
        ),
        (
            "test",
            Some("x y"),
            "d",
            l,
            "pub",
            s("quoted topic"),
            false,
            "default",
        ),
        // unicode, long topics
        (
            "test",
            None,
            "c",
            l,
            "pub",
            s("pub/温度/ü"),
            true,
            "filter:pub/#",
        ),
        (
            "test",
            None,
            "c",
            l,
            "sub",
            s("pub/🙂/+"),
            true,
            "filter:pub/#",
        ),
        ("test", None, "c", l, "pub", long_pub, true, "filter:pub/#"),
        ("test", None, "c", l, "sub", long_sub, true, "filter:pub/#"),
        ("test", None, "c", l, "pub", long_other, false, "default"),
    ]
}

#[test]
fn table() {
    let names = ["default", "reader", "per-user", "fleet", "test"];
    let acls: Vec<(&str, (Acl, String))> = names.iter().map(|n| (*n, acl(n))).collect();
    let mut failures = Vec::new();
    let all = cases();
    assert!(all.len() >= 50);
    for (name, user, client, ip, action, topic, allowed, by) in &all {
        let (acl, text) = &acls.iter().find(|(n, _)| n == name).expect("acl").1;
        let ip: IpAddr = ip.parse().expect("ip");
        let act = match *action {
            "pub" => Action::Publish,
            "sub" | "sub+create" => Action::Subscribe,
            "create" => Action::Create,
            other => panic!("action {other}"),
        };
        let req = Request {
            username: *user,
            client_id: client,
            ip,
            action: act,
            topic,
        };
        let d = if *action == "sub+create" {
            acl.check_subscribe(&req, true)
        } else {
            acl.check(&req)
        };
        let want_by = match *by {
            "default" => (DecidedBy::Default, None),
            "invalid" => (DecidedBy::InvalidRequest, None),
            needle => {
                let needle = needle.trim_end_matches('\n');
                let line = if by.ends_with('\n') {
                    // The line must end with the needle.
                    text.lines()
                        .position(|l| l.trim_end().ends_with(needle) && !l.starts_with('#'))
                        .map(|i| i + 1)
                        .expect("needle")
                } else {
                    line_of(text, needle)
                };
                (DecidedBy::Rule, Some(line))
            }
        };
        let got = (d.by, d.rule.as_ref().map(|r| r.line));
        if d.allowed != *allowed || got != want_by {
            let shown: String = topic.chars().take(60).collect();
            failures.push(format!(
                "{name}: user={user:?} client={client:?} {action} {shown:?}: got {d} {got:?}, want allowed={allowed} {want_by:?}"
            ));
        }
        if let Some(r) = &d.rule {
            assert_eq!(&*r.file, *name);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    println!("{} cases passed", all.len());
}

#[test]
fn embedded_default_is_the_shipped_file() {
    let embedded = Acl::embedded_default();
    assert_eq!(embedded.len(), acl("default").0.len());
    assert!(!embedded.default_allows());
    assert_eq!(
        lanemq_acl::acl::DEFAULT_ACL,
        include_str!("../../../acl/default.acl")
    );
}

#[test]
fn load_reports_path() {
    let dir = std::env::temp_dir().join(format!("lanemq-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = dir.join("bad.acl");
    std::fs::write(&p, "default deny\nallow all publish filter:a/#/b\n").expect("write");
    let e = Acl::load(&p).expect_err("must fail");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}:2:", p.display())), "{msg}");
    let p2 = dir.join("good.acl");
    std::fs::write(&p2, "allow all publish filter:a/#\n").expect("write");
    let acl = Acl::load(&p2).expect("load");
    let d = acl.check(&Request {
        username: None,
        client_id: "c",
        ip: "127.0.0.1".parse().expect("ip"),
        action: Action::Publish,
        topic: "a/b",
    });
    assert!(d.allowed);
    assert_eq!(
        d.rule.expect("rule").to_string(),
        format!("{}:1", p2.display())
    );
    assert!(Acl::load(dir.join("missing.acl")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn allow_all_and_deny_all() {
    let req = Request {
        username: None,
        client_id: "c",
        ip: "127.0.0.1".parse().expect("ip"),
        action: Action::Subscribe,
        topic: "$stream/events",
    };
    assert!(Acl::allow_all().check(&req).allowed);
    assert!(!Acl::deny_all().check(&req).allowed);
    assert_eq!(Acl::allow_all().check(&req).by, DecidedBy::Default);
}

#[test]
fn publish_path_is_cheap() {
    // 10,000 per-user rules plus the shipped ones: a publish check must stay well under
    // the cost of a linear scan with pattern matching.
    let mut text = String::from("default deny\n");
    for i in 0..10_000 {
        text.push_str(&format!("allow user:u{i} publish topic:t/{i}\n"));
        text.push_str(&format!("allow user:u{i} publish filter:f/{i}/#\n"));
    }
    text.push_str("allow all publish filter:pub/#\n");
    let acl = Acl::parse(&text, "big").expect("parse");
    let start = std::time::Instant::now();
    let n = 100_000;
    let mut allowed = 0;
    for i in 0..n {
        let topic = format!("f/{}/x", i % 10_000);
        let user = format!("u{}", i % 10_000);
        let d = acl.check(&Request {
            username: Some(&user),
            client_id: "c",
            ip: "127.0.0.1".parse().expect("ip"),
            action: Action::Publish,
            topic: &topic,
        });
        allowed += usize::from(d.allowed);
    }
    assert_eq!(allowed, n);
    let per = start.elapsed() / n as u32;
    println!("publish check with 20,001 rules: {per:?} each");
    assert!(per < std::time::Duration::from_micros(200), "{per:?}");
}
