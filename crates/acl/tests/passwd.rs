//! Password files: files made by the real `mosquitto_passwd` (skipped with a note when the
//! binary is absent), fixed vectors, parser errors, round trips.

use lanemq_acl::{PasswordFile, DEFAULT_ITERATIONS};
use std::path::PathBuf;
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lanemq-passwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

fn mosquitto_passwd() -> Option<&'static str> {
    let ok = Command::new("mosquitto_passwd").arg("-h").output().is_ok();
    if ok {
        Some("mosquitto_passwd")
    } else {
        println!("note: mosquitto_passwd not found; skipping the tests against its files");
        None
    }
}

fn run(bin: &str, args: &[&str]) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("run mosquitto_passwd");
    assert!(out.status.success(), "mosquitto_passwd {args:?}: {out:?}");
}

#[test]
fn files_made_by_mosquitto_passwd() {
    let Some(bin) = mosquitto_passwd() else {
        return;
    };
    let p = tmp("real");
    let ps = p.to_str().expect("utf-8 path");
    let users: &[(&str, &str, &[&str])] = &[
        ("alice", "secret", &[]),
        ("bob", "hunter2", &["-H", "sha512"]),
        ("carol", "pässwörd €", &["-H", "sha512-pbkdf2"]),
        ("dave", "", &["-H", "sha512"]),
        ("erin", "x", &[]),
    ];
    for (i, (u, pw, extra)) in users.iter().enumerate() {
        let mut args: Vec<&str> = extra.to_vec();
        if i == 0 {
            args.push("-c");
        }
        args.extend(["-b", ps, u, pw]);
        run(bin, &args);
    }
    let text = std::fs::read_to_string(&p).expect("read");
    assert!(text.contains("alice:$7$101$"), "{text}");
    assert!(text.contains("bob:$6$"), "{text}");
    let file = PasswordFile::load(&p).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(file.len(), users.len());
    for (u, pw, _) in users {
        assert!(file.verify(u, pw.as_bytes()), "{u} with the right password");
        assert!(!file.verify(u, b"wrong"), "{u} with a wrong password");
        let mut longer = pw.as_bytes().to_vec();
        longer.push(b'!');
        assert!(!file.verify(u, &longer), "{u} with a longer password");
    }
    assert!(!file.verify("nobody", b"secret"));
    // An untouched file round-trips byte for byte.
    assert_eq!(file.to_string(), text);

    // Entries we write are read by mosquitto_passwd: -U on an already hashed file would
    // double-hash, so check via `mosquitto_passwd -b` updating *another* entry of our file and
    // leaving ours intact, then verify ours with our reader, and check the format.
    let mut file = file;
    file.upsert("frank", b"new pass").expect("upsert");
    file.upsert("alice", b"changed").expect("upsert");
    let ours = tmp("ours");
    file.save(&ours).expect("save");
    run(bin, &["-b", ours.to_str().expect("path"), "erin", "y"]);
    let back = PasswordFile::load(&ours).unwrap_or_else(|e| panic!("{e}"));
    assert!(back.verify("frank", b"new pass"));
    assert!(back.verify("alice", b"changed"));
    assert!(!back.verify("alice", b"secret"));
    assert!(back.verify("erin", b"y"));
    assert!(back.verify("bob", b"hunter2"));
    assert_eq!(
        back.users().collect::<Vec<_>>(),
        ["alice", "bob", "carol", "dave", "erin", "frank"]
    );
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(&ours);
}

#[test]
fn our_entries_have_mosquittos_shape() {
    // Our `$7$` entry has exactly mosquitto's shape: 101 iterations, 12-byte salt (16 base64
    // characters), 64-byte hash (88 base64 characters with padding).
    let mut f = PasswordFile::new();
    f.upsert("u", b"p").expect("upsert");
    let text = f.to_string();
    let hash = text.trim_end().strip_prefix("u:$7$101$").expect("prefix");
    let (salt, h) = hash.split_once('$').expect("two fields");
    assert_eq!(salt.len(), 16, "{text}");
    assert_eq!(h.len(), 88, "{text}");
    assert_eq!(DEFAULT_ITERATIONS, 101);
    // Two upserts of the same password get different salts.
    let mut g = PasswordFile::new();
    g.upsert("u", b"p").expect("upsert");
    assert_ne!(f.to_string(), g.to_string());
}

/// Entries made once by mosquitto_passwd 2.0.11 (Debian 12).
const FIXED: &str = "\
alice:$7$101$WQplM7D40HLGzP/X$Oyy8Lw4jghCl10xEg2Jio0BCqvA+7yte13ceDZD6eG1pe7hwCcQ8WkcuKiUEkpiKu5OFMN7W/e0e2QjFbq5RTQ==
bob:$6$hlYYxwzNuECH0o8o$X5GA+HOJyL8NMEiecY35fL5YQIfrh7xrjd/Er/2IXvlwj1c3iELXjmdbij3TyMJat+By042cZh/LyU7t3gwRog==
";

#[test]
fn fixed_vectors() {
    let f = PasswordFile::parse(FIXED).unwrap_or_else(|e| panic!("{e}"));
    assert!(f.verify("alice", b"secret"));
    assert!(!f.verify("alice", b"Secret"));
    assert!(f.verify("bob", b"hunter2"));
    assert!(!f.verify("bob", b"hunter"));
    assert!(!f.verify("carol", b""));
    assert_eq!(f.to_string(), FIXED);
    // Comments, blank lines, surrounding blanks, CRLF and unpadded base64 are accepted.
    let messy = format!(
        "# users\n\n  alice : {}\r\nbob:{}\n",
        FIXED
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("alice:"))
            .expect("alice"),
        FIXED
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("bob:"))
            .expect("bob")
            .trim_end_matches('=')
    );
    let m = PasswordFile::parse(&messy).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.verify("alice", b"secret"));
    assert!(m.verify("bob", b"hunter2"));
    assert_eq!(m.to_string(), messy.replace('\r', ""));
}

#[test]
fn edits() {
    let mut f = PasswordFile::parse(&format!("# head\n{FIXED}# tail\n")).expect("parse");
    assert!(f.remove("alice"));
    assert!(!f.remove("alice"));
    assert!(!f.verify("alice", b"secret"));
    f.upsert("zed", b"z").expect("upsert");
    assert!(f.verify("zed", b"z"));
    assert!(f.verify("bob", b"hunter2"));
    let text = f.to_string();
    assert!(text.starts_with("# head\nbob:$6$"), "{text}");
    assert!(text.contains("# tail\nzed:$7$101$"), "{text}");
    for bad in ["", "a:b", " a", "a ", "a\nb", "a\0"] {
        assert!(f.upsert(bad, b"x").is_err(), "{bad:?}");
    }
    let again = PasswordFile::parse(&text).expect("reparse");
    assert!(again.verify("zed", b"z"));
    f.upsert_with_iterations("slow", b"s", 1000)
        .expect("upsert");
    assert!(f.to_string().contains("slow:$7$1000$"));
    assert!(f.verify("slow", b"s"));
}

#[test]
fn parse_errors() {
    let h7 = FIXED
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("alice:"))
        .expect("h7");
    let cases: Vec<(String, usize, usize, &str)> = vec![
        ("alice".into(), 1, 1, "expected `username:hash`"),
        ("# c\n  nocolon".into(), 2, 3, "expected `username:hash`"),
        (":$6$x$y".into(), 1, 1, "empty username"),
        ("u:plain".into(), 1, 3, "plain-text"),
        ("u:$5$abc$def".into(), 1, 3, "expected a $7$"),
        ("u:$7$101$abc".into(), 1, 3, "$7$<iterations>"),
        ("u:$7$x$c2FsdA==$aGFzaA==".into(), 1, 6, "iterations"),
        ("u:$7$0$c2FsdA==$aGFzaA==".into(), 1, 6, "iterations"),
        (
            "u:$7$99999999999$c2FsdA==$aGFzaA==".into(),
            1,
            6,
            "iterations",
        ),
        (
            "u:$7$101$!!!!$aGFzaA==".into(),
            1,
            10,
            "salt is not valid base64",
        ),
        (
            "u:$7$101$c2FsdA==$aGFzaA==".into(),
            1,
            19,
            "hash is 4 bytes",
        ),
        (
            "u:$7$101$c2FsdA==$a*".into(),
            1,
            19,
            "hash is not valid base64",
        ),
        ("u:$6$c2FsdA==".into(), 1, 3, "$6$<base64 salt>"),
        ("u:$6$$aGFzaA==".into(), 1, 6, "empty salt"),
        ("u:$6$c2FsdA==$aGFzaA==".into(), 1, 15, "hash is 4 bytes"),
        (
            format!("alice:{h7}\nbob:{h7}\nalice:{h7}"),
            3,
            1,
            "duplicate username \"alice\" (first on line 1)",
        ),
        ("ü€:$9$".into(), 1, 4, "expected a $7$"),
    ];
    for (text, line, column, msg) in &cases {
        match PasswordFile::parse(text) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(e) => assert!(
                e.line == *line && e.column == *column && e.message.contains(msg),
                "{text:?}: got {e}, want {line}:{column} {msg:?}"
            ),
        }
    }
    assert!(PasswordFile::parse("").expect("empty").is_empty());
    assert!(PasswordFile::load(tmp("missing-file")).is_err());
}

#[test]
fn unknown_user_costs_a_hash() {
    let f = PasswordFile::parse(FIXED).expect("parse");
    let n = 200;
    for _ in 0..20 {
        f.verify("nobody", b"warm up");
        f.verify("alice", b"warm up");
    }
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(!f.verify("nobody", b"secret"));
    }
    let unknown = t.elapsed();
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(!f.verify("alice", b"wrong"));
    }
    let known = t.elapsed();
    println!(
        "unknown user {:?}, known user {:?} per verify",
        unknown / n,
        known / n
    );
    // Same work within a generous factor (timing noise on a shared machine).
    assert!(
        unknown * 4 > known && known * 4 > unknown,
        "{unknown:?} vs {known:?}"
    );
}

/// One SCRAM exchange against the credentials `pf` holds for `user`.
fn scram_login(
    pf: &PasswordFile,
    mech: lanemq_acl::scram::Mechanism,
    user: &str,
    password: &str,
) -> Result<(), lanemq_acl::scram::ScramError> {
    use lanemq_acl::scram::{Client, ClientFirst, ServerFirst};
    let (client, first) = Client::start(mech, user, password.as_bytes(), "c-nonce");
    let cf = ClientFirst::parse(first.as_bytes())?;
    let creds = pf.scram_credentials(&cf.username, mech);
    let (state, sf) = ServerFirst::start(cf, creds, "s-nonce");
    let (fin, cfinal) = client.finish(&sf)?;
    let v = state.finish(cfinal.as_bytes())?;
    assert_eq!(v.username, user);
    fin.verify_server(&v.server_final)
}

/// A file written by the real mosquitto_passwd serves SCRAM-SHA-512 as it is: a `$7$` entry
/// is the SaltedPassword (no migration).
#[test]
fn mosquitto_files_serve_scram_sha512() {
    use lanemq_acl::scram::{Mechanism, ScramError};
    let Some(bin) = mosquitto_passwd() else {
        return;
    };
    let p = tmp("scram512");
    let ps = p.to_str().expect("utf-8 path");
    run(bin, &["-c", "-b", ps, "alice", "s3cret"]);
    let pf = PasswordFile::load(&p).expect("load");
    scram_login(&pf, Mechanism::Sha512, "alice", "s3cret").expect("SCRAM-SHA-512");
    assert_eq!(
        scram_login(&pf, Mechanism::Sha512, "alice", "wrong"),
        Err(ScramError::InvalidProof)
    );
    assert_eq!(
        scram_login(&pf, Mechanism::Sha512, "nobody", "s3cret"),
        Err(ScramError::InvalidProof)
    );
    // A $7$ entry holds nothing SCRAM-SHA-256 can use.
    assert_eq!(
        scram_login(&pf, Mechanism::Sha256, "alice", "s3cret"),
        Err(ScramError::InvalidProof)
    );
}

#[test]
fn scram_sha256_entries() {
    use lanemq_acl::scram::{Mechanism, ScramError};
    let mut pf = PasswordFile::new();
    pf.upsert_scram_sha256("bob", b"pencil").expect("upsert");
    pf.upsert("carol", b"pw").expect("upsert");
    let text = pf.to_string();
    let line = text.lines().next().expect("a line");
    assert!(line.starts_with("bob:SCRAM-SHA-256$4096:"), "{line}");
    let back = PasswordFile::parse(&text).expect("round trip");
    assert!(back.verify("bob", b"pencil"), "CONNECT passwords work too");
    assert!(!back.verify("bob", b"pencil2"));
    scram_login(&back, Mechanism::Sha256, "bob", "pencil").expect("SCRAM-SHA-256");
    assert_eq!(
        scram_login(&back, Mechanism::Sha256, "bob", "x"),
        Err(ScramError::InvalidProof)
    );
    assert_eq!(
        scram_login(&back, Mechanism::Sha512, "bob", "pencil"),
        Err(ScramError::InvalidProof)
    );
    scram_login(&back, Mechanism::Sha512, "carol", "pw").expect("$7$ by lanemq");
    // Unknown users get a salt that does not change between asks.
    let salt = |pf: &PasswordFile| pf.scram_credentials("ghost", Mechanism::Sha256).salt;
    assert_eq!(salt(&back), salt(&back));

    // Parse errors point at the field.
    for (bad, what) in [
        ("u:SCRAM-SHA-256$4096:c2FsdA==", "a SCRAM-SHA-256 entry is"),
        ("u:SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA", "iterations"),
        (
            "u:SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
            "SHA-256 makes 32",
        ),
        (
            "u:SCRAM-SHA-256$4096:!!$AAAA:AAAA",
            "salt is not valid base64",
        ),
    ] {
        let e = PasswordFile::parse(bad).expect_err(bad);
        assert!(e.message.contains(what), "{bad}: {e}");
    }
}
