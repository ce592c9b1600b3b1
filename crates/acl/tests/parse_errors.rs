//! ACL parser errors carry the file, the line and the column (in characters).

use lanemq_acl::Acl;

fn err(text: &str) -> (usize, usize, String) {
    match Acl::parse(text, "t.acl") {
        Ok(_) => panic!("{text:?} parsed"),
        Err(e) => {
            assert_eq!(e.file, "t.acl");
            assert!(e
                .to_string()
                .starts_with(&format!("t.acl:{}:{}: ", e.line, e.column)));
            (e.line, e.column, e.message)
        }
    }
}

#[test]
fn errors_with_line_and_column() {
    let cases: &[(&str, usize, usize, &str)] = &[
        (
            "permit all publish topic:a",
            1,
            1,
            "expected `allow`, `deny` or `default`",
        ),
        ("\n\n  allow", 3, 8, "expected who"),
        ("allow all", 1, 10, "expected actions"),
        ("allow all publish", 1, 18, "expected a pattern"),
        ("allow everyone publish topic:a", 1, 7, "unknown who"),
        ("allow user: publish topic:a", 1, 12, "empty username"),
        ("allow client: publish topic:a", 1, 14, "empty client id"),
        (
            "allow ip:10.0.0.0/33 publish topic:a",
            1,
            10,
            "prefix length",
        ),
        (
            "allow ip:300.1.1.1 publish topic:a",
            1,
            10,
            "not an IPv4 or IPv6",
        ),
        ("allow ip:::1/129 publish topic:a", 1, 10, "prefix length"),
        (
            "allow user:a&&ip:::1 publish topic:a",
            1,
            14,
            "empty condition",
        ),
        ("allow all publish,read topic:a", 1, 19, "unknown action"),
        ("allow all publish,, topic:a", 1, 19, "unknown action"),
        (
            "allow all publish filter:a/#/b",
            1,
            26,
            "not a valid MQTT topic filter",
        ),
        (
            "allow all publish filter:a+",
            1,
            26,
            "not a valid MQTT topic filter",
        ),
        (
            "allow all publish filter:",
            1,
            26,
            "not a valid MQTT topic filter",
        ),
        ("allow all subscribe filter:$share/g/#", 1, 28, "$share/"),
        ("allow all publish topic:", 1, 25, "empty topic"),
        (
            "allow all publish re:(",
            1,
            22,
            "invalid regular expression",
        ),
        ("allow all publish re:", 1, 22, "empty regular expression"),
        ("allow all publish regex:a", 1, 19, "expected a pattern"),
        (
            "allow all publish topic:a extra",
            1,
            27,
            "unexpected \"extra\"",
        ),
        (
            "allow all publish filter:a/# group:g",
            1,
            30,
            "must be `subscribe`",
        ),
        (
            "allow all subscribe filter:a/# group:",
            1,
            38,
            "share group name",
        ),
        (
            "allow all subscribe filter:a/# group:a/b",
            1,
            38,
            "share group name",
        ),
        (
            "allow all subscribe filter:a/# group:g group:h",
            1,
            40,
            "second group",
        ),
        (
            "allow user:\"abc publish topic:a",
            1,
            12,
            "unterminated quote",
        ),
        (
            "allow user:\"a\\qb\" publish topic:a",
            1,
            15,
            "unknown escape",
        ),
        ("allow all publish topic:a\0", 1, 26, "NUL"),
        (
            "default",
            1,
            8,
            "expected `allow` or `deny` after `default`",
        ),
        ("default maybe", 1, 9, "expected `allow` or `deny`"),
        ("default deny now", 1, 14, "unexpected text"),
        (
            "default deny\n# x\ndefault allow",
            3,
            1,
            "first is on line 1",
        ),
        // Columns count characters, not bytes.
        (
            "allow user:ü€ publish topic:ü/温度 oops",
            1,
            34,
            "unexpected",
        ),
    ];
    for (text, line, column, msg) in cases {
        let (l, c, m) = err(text);
        assert!(
            (l, c) == (*line, *column) && m.contains(msg),
            "{text:?}: got {l}:{c} {m:?}, want {line}:{column} {msg:?}"
        );
    }
}

#[test]
fn accepted_syntax() {
    let text = r#"
# comment
   # indented comment
default allow   # trailing comment
deny  user:"name with # and spaces"&client:"a&b"  publish,subscribe  topic:"a b/c"  # c
allow ip:192.168.0.0/16&user:x  all  re:^(a|b)/[0-9]+$
allow anonymous subscribe filter:a/#
allow all subscribe filter:jobs/# group:*
allow all subscribe filter:%u/%c/# group:g1
allow all publish topic:50%off/%%u
"#;
    let acl = Acl::parse(text, "ok.acl").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(acl.len(), 6);
    assert!(acl.default_allows());
    assert_eq!(acl.default_line(), Some(4));
    // `%%u` is a literal `%u`, `%o` is literal.
    let d = acl.check(&lanemq_acl::Request {
        username: None,
        client_id: "c",
        ip: "127.0.0.1".parse().expect("ip"),
        action: lanemq_acl::Action::Publish,
        topic: "50%off/%u",
    });
    assert_eq!(d.rule.map(|r| r.line), Some(10));
    // An empty file is valid: no rules, default deny.
    let empty = Acl::parse("", "e").expect("empty");
    assert!(empty.is_empty() && !empty.default_allows());
    // CRLF line endings.
    let crlf = Acl::parse("default allow\r\nallow all publish topic:a\r\n", "crlf").expect("crlf");
    assert_eq!(crlf.len(), 1);
}
