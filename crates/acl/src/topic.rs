//! Filter-against-filter relations used to authorize subscriptions.
//!
//! Both relations follow MQTT's `$` rule [MQTT-4.7.2-1]: a filter whose first level is `+` or
//! `#` matches no topic beginning with `$`, so it neither covers nor intersects a filter whose
//! first level begins with `$`.

/// Is the first level of `f` a wildcard?
fn wild_first(f: &str) -> bool {
    f.starts_with('+') || f.starts_with('#')
}

/// Does the (valid) filter `rule` match every topic the (valid) filter `req` matches?
///
/// `a/#` covers `a`, `a/+/b` and `a/#`; `a/+` covers `a/b` and `a/+` but not `a/#`;
/// `#` and `+/...` cover nothing that begins with `$`.
pub(crate) fn covers(rule: &str, req: &str) -> bool {
    if req.starts_with('$') && wild_first(rule) {
        return false;
    }
    let mut r = rule.split('/');
    let mut q = req.split('/');
    loop {
        match (r.next(), q.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(ql)) if ql != "#" => {}
            (Some(rl), Some(ql)) if rl != "+" && ql != "+" && ql != "#" && rl == ql => {}
            (None, None) => return true,
            // `a/#` also matches `a` itself: the request ended where the rule has a final `#`.
            (Some(rl), None) => return rl == "#",
            _ => return false,
        }
    }
}

/// Is there a topic that both (valid) filters match?
pub(crate) fn intersects(a: &str, b: &str) -> bool {
    if (wild_first(a) && b.starts_with('$')) || (wild_first(b) && a.starts_with('$')) {
        return false;
    }
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            (Some(xl), Some(yl)) if xl == "+" || yl == "+" || xl == yl => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage() {
        let cases = [
            ("#", "a/b", true),
            ("#", "#", true),
            ("#", "+/x", true),
            ("#", "$SYS/x", false),
            ("+/#", "$stream/events", false),
            ("$SYS/#", "$SYS/x/#", true),
            ("a/#", "a", true),
            ("a/#", "a/+/b", true),
            ("a/#", "a/#", true),
            ("a/+", "a/#", false),
            ("a/+", "a/+", true),
            ("a/+", "a/b", true),
            ("a/+", "a", false),
            ("a/b", "a/+", false),
            ("a/b", "a/b", true),
            ("a/b", "a/b/c", false),
            ("a/b/c", "a/b", false),
            ("+", "", true),
            ("a/+/c", "a/+/c", true),
            ("a/+/c", "a/#", false),
        ];
        for (rule, req, want) in cases {
            assert_eq!(covers(rule, req), want, "{rule} covers {req}");
        }
    }

    #[test]
    fn intersection() {
        let cases = [
            ("secret/#", "#", true),
            ("secret/#", "+/x", true),
            ("secret/x", "+/+", true),
            ("secret/x", "+", false),
            ("a/#", "a", true),
            ("a", "a/#", true),
            ("a/b", "a/c", false),
            ("#", "$SYS/#", false),
            ("$SYS/#", "#", false),
            ("$SYS/#", "$SYS/x", true),
            ("+/+", "$SYS/x", false),
            ("+", "+", true),
            ("a/+/c", "a/b/+", true),
            ("a/+/c", "a/b", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(intersects(a, b), want, "{a} ∩ {b}");
            assert_eq!(intersects(b, a), want, "{b} ∩ {a}");
        }
    }
}
