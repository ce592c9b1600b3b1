//! `lanemq check-config` and `lanemq serve` with a broken configuration file: every problem
//! of the file is reported at once, each with its line and key path, and nothing starts
//! (issue 18, "every configuration error at once").
#![allow(clippy::unwrap_used)]

use crate::child;
use std::process::{Command, Stdio};

/// The file tried when the problem was found: one unknown key hid four other mistakes.
const BROKEN: &str = r#"[server]
sys_interval_s = 0
colour = "blue"

[mqtt]
max_connections = -5

[storage]
fsync = "sometimes"

[[lite.parents]]
name = "bots"
pattern = "bots/#"
ttl_s = 0
"#;

const EXPECTED: [&str; 5] = [
    "line 3: server.colour: unknown field",
    "line 6: mqtt.max_connections: invalid value",
    "line 9: storage.fsync: unknown variant `sometimes`",
    "line 13: lite.parents[0] (\"bots\").pattern: must contain one {lane} level",
    "line 14: lite.parents[0] (\"bots\").ttl_s: must be",
];

fn run(args: &[&str]) -> std::process::Output {
    Command::new(child::lanemq_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn check_config_and_serve_report_every_problem_with_line_and_key() {
    let dir = child::TempDir::new("config-cli");
    let file = dir.0.join("broken.toml");
    std::fs::write(&file, BROKEN).unwrap();
    let file = file.to_str().unwrap();
    for args in [
        vec!["check-config", file],
        vec![
            "serve",
            "--config",
            file,
            "--data-dir",
            dir.0.join("data").to_str().unwrap(),
            "--mqtt",
            "127.0.0.1:0",
        ],
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} accepted a broken file");
        let err = String::from_utf8_lossy(&out.stderr);
        let problems: Vec<&str> = err
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .collect();
        assert_eq!(problems.len(), 5, "{args:?}:\n{err}");
        for (got, want) in problems.iter().zip(EXPECTED) {
            assert!(
                got.starts_with(want),
                "{args:?}: {got:?} should start with {want:?}"
            );
        }
    }
    // `serve` stopped before it made anything.
    assert!(!dir.0.join("data").join("log").exists());
    // The default file passes.
    let good = dir.0.join("good.toml");
    let out = run(&["generate-config"]);
    std::fs::write(&good, &out.stdout).unwrap();
    let out = run(&["check-config", good.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn auth_methods_are_checked() {
    let dir = child::TempDir::new("config-auth-methods");
    let file = dir.0.join("scram.toml");
    std::fs::write(
        &file,
        "[server]\nauth_methods = [\"SCRAM-SHA-1\", \"SCRAM-SHA-512\"]\n",
    )
    .unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.auth_methods: unknown method \"SCRAM-SHA-1\""),
        "{err}"
    );
    assert!(err.contains("SCRAM needs server.password_file"), "{err}");
}

#[test]
fn serve_validates_the_file_merged_with_the_command_line() {
    let dir = child::TempDir::new("config-merged");
    // A file that offers SCRAM but names no password file: refused alone...
    let file = dir.0.join("scram.toml");
    std::fs::write(&file, "[server]\nauth_methods = [\"SCRAM-SHA-512\"]\n").unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    // ...and accepted by `serve` when `--passwd` gives the password file.
    let passwd = dir.0.join("passwd");
    let mut p = Command::new(child::lanemq_bin())
        .args(["passwd", passwd.to_str().unwrap(), "alice"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        p.stdin.take().unwrap().write_all(b"secret\n").unwrap();
    }
    assert!(p.wait().unwrap().success(), "lanemq passwd failed");
    let ready = serve_until_ready(
        &dir,
        &[
            "-c",
            file.to_str().unwrap(),
            "--passwd",
            passwd.to_str().unwrap(),
        ],
        &[],
    );
    if let Err(why) = ready {
        panic!("serve -c FILE --passwd PASSWD refused a configuration it completes: {why}");
    }
}

/// `lanemq serve ARGS` on a free port with its own data directory, stderr to a file (not a
/// terminal), until it logs "lanemq ready"; then stopped. Its log, or why it never got ready.
fn serve_until_ready(
    dir: &child::TempDir,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<String, String> {
    let log = dir.0.join("serve.log");
    let port = child::free_port();
    let mut cmd = Command::new(child::lanemq_bin());
    cmd.arg("serve")
        .args(args)
        .args([
            "--data-dir",
            dir.0.join("data").to_str().unwrap(),
            "--mqtt",
            &format!("127.0.0.1:{port}"),
            "--http",
            "off",
        ])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut serve = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let ready = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("lanemq ready") {
            break Ok(text);
        }
        if let Some(status) = serve.try_wait().unwrap() {
            break Err(format!("exited with {status}:\n{text}"));
        }
        if std::time::Instant::now() > deadline {
            break Err(format!("not ready within 20 s:\n{text}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = serve.kill();
    let _ = serve.wait();
    ready
}

#[test]
fn logs_to_a_file_carry_no_colour_codes_and_json_lines_parse() {
    // Text: no terminal, so no ANSI escape codes (the same with NO_COLOR set).
    for env in [&[][..], &[("NO_COLOR", "1")][..]] {
        let dir = child::TempDir::new("log-text");
        let log = serve_until_ready(&dir, &[], env).unwrap();
        assert!(
            !log.contains('\x1b'),
            "colour codes in a log file ({env:?}):\n{log}"
        );
        assert!(log.contains(" INFO "), "{log}");
    }
    // JSON: one object a line, with the time, the level, the target and the message.
    let dir = child::TempDir::new("log-json");
    let log = serve_until_ready(&dir, &["--log-format", "json"], &[]).unwrap();
    let mut ready = false;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        assert!(v["target"].is_string(), "{line}");
        if v["fields"]["message"] == "lanemq ready" {
            ready = true;
            assert_eq!(v["level"], "INFO");
        }
    }
    assert!(ready, "no \"lanemq ready\" event:\n{log}");
}
