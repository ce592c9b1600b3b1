//! Fuzz the password file parser: any input must parse or fail with an error whose line and
//! column lie inside the input, never panic. A parsed file must write itself back so that it
//! parses again to the same users, and survive an upsert and a removal. (Hashes are not
//! verified here: an entry may ask for up to 10 million PBKDF2 iterations.)
#![no_main]

use lanemq_acl::PasswordFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count().max(1);
    let mut file = match PasswordFile::parse(&text) {
        Ok(f) => f,
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
    let written = file.to_string();
    let again = match PasswordFile::parse(&written) {
        Ok(f) => f,
        Err(e) => panic!("written file does not parse: {e}\n{written}"),
    };
    assert_eq!(
        file.users().collect::<Vec<_>>(),
        again.users().collect::<Vec<_>>()
    );
    let first = file.users().next().map(str::to_string);
    if let Some(user) = first {
        assert!(file.remove(&user));
        assert!(!file.contains(&user));
    }
    if file.upsert("fuzz-user", b"pw").is_ok() {
        assert!(file.verify("fuzz-user", b"pw"));
        assert!(PasswordFile::parse(&file.to_string()).is_ok());
    }
});
