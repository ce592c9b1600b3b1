//! Topic names, topic filters and matching (MQTT 5 section 4.7 and 4.8.2).
//!
//! Invariants: a topic name never contains `+` or `#`; in a filter `#` is the last level and
//! alone in it, `+` is alone in its level; a filter whose first level is a wildcard never
//! matches a topic beginning with `$` [MQTT-4.7.2-1].

/// Is `topic` a valid topic name for PUBLISH (non-empty, no wildcards, no NUL)?
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && !topic.bytes().any(|b| b == b'+' || b == b'#' || b == 0)
}

/// Is `filter` a syntactically valid topic filter?
pub fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.as_bytes().contains(&0) {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return false;
        }
        if level.contains('+') && level != "+" {
            return false;
        }
    }
    true
}

/// Does the filter contain a wildcard?
pub fn has_wildcards(filter: &str) -> bool {
    filter.bytes().any(|b| b == b'+' || b == b'#')
}

/// Does `filter` (already valid) match the topic name `topic`?
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A `$share/<group>/<filter>` subscription, split into its group and inner filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedFilter<'a> {
    pub group: &'a str,
    pub filter: &'a str,
}

/// Why a `$share/` filter is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedError {
    /// `$share/` without a group, or a group containing `+`/`#`.
    BadGroup,
    /// `$share/<group>` with no filter, or an invalid inner filter.
    BadFilter,
}

/// Parse a `$share/` filter. `Ok(None)` for an ordinary filter.
pub fn parse_shared(filter: &str) -> Result<Option<SharedFilter<'_>>, SharedError> {
    let Some(rest) = filter.strip_prefix("$share/") else {
        if filter == "$share" {
            return Err(SharedError::BadGroup);
        }
        return Ok(None);
    };
    let Some((group, inner)) = rest.split_once('/') else {
        return Err(SharedError::BadFilter);
    };
    if group.is_empty() || group.contains(['+', '#']) {
        return Err(SharedError::BadGroup);
    }
    if !valid_filter(inner) {
        return Err(SharedError::BadFilter);
    }
    Ok(Some(SharedFilter {
        group,
        filter: inner,
    }))
}

/// The shape of a stream subscription topic, split at its slashes and not validated: the one
/// place the `$stream/` grammar is written. Validation and error messages are the streams
/// crate's (`lanemq_streams::subscribe::parse_topic`); the ACL and the broker use the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTopicParts<'a> {
    /// `$stream/<name>` or `$stream/<name>/<filter>`.
    Named {
        name: &'a str,
        filter: Option<&'a str>,
    },
    /// Legacy `$s/<offset>/<filter>`; `filter` is `None` when nothing follows the offset.
    Legacy {
        offset: &'a str,
        filter: Option<&'a str>,
    },
}

/// Prefix of a named stream subscription.
pub const STREAM_PREFIX: &str = "$stream/";
/// Prefix of a legacy stream subscription.
pub const LEGACY_STREAM_PREFIX: &str = "$s/";

/// `Some` for a stream subscription topic (`$stream/...` or `$s/...`), split into its parts.
pub fn split_stream_topic(topic: &str) -> Option<StreamTopicParts<'_>> {
    if let Some(rest) = topic.strip_prefix(STREAM_PREFIX) {
        let (name, filter) = match rest.split_once('/') {
            Some((n, f)) => (n, Some(f)),
            None => (rest, None),
        };
        return Some(StreamTopicParts::Named { name, filter });
    }
    let rest = topic.strip_prefix(LEGACY_STREAM_PREFIX)?;
    let (offset, filter) = match rest.split_once('/') {
        Some((o, f)) => (o, Some(f)),
        None => (rest, None),
    };
    Some(StreamTopicParts::Legacy { offset, filter })
}

/// Is `topic` a stream subscription (`$stream/...` or `$s/...`)?
pub fn is_stream_topic(topic: &str) -> bool {
    split_stream_topic(topic).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_topics_split_at_their_slashes() {
        use StreamTopicParts::*;
        for (t, want) in [
            (
                "$stream/a",
                Some(Named {
                    name: "a",
                    filter: None,
                }),
            ),
            (
                "$stream/a/t/#",
                Some(Named {
                    name: "a",
                    filter: Some("t/#"),
                }),
            ),
            (
                "$stream//x",
                Some(Named {
                    name: "",
                    filter: Some("x"),
                }),
            ),
            (
                "$s/earliest/t/+",
                Some(Legacy {
                    offset: "earliest",
                    filter: Some("t/+"),
                }),
            ),
            (
                "$s/latest",
                Some(Legacy {
                    offset: "latest",
                    filter: None,
                }),
            ),
            ("$streams/a", None),
            ("t/a", None),
        ] {
            assert_eq!(split_stream_topic(t), want, "{t}");
        }
    }

    #[test]
    fn filters() {
        for ok in [
            "a", "a/b", "#", "+", "a/+/b", "a/#", "+/+", "/", "//", "$SYS/#", "a/+",
        ] {
            assert!(valid_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "+a/b", "a/b#", "##", "a/\0"] {
            assert!(!valid_filter(bad), "{bad:?}");
        }
    }

    #[test]
    fn topic_names() {
        assert!(valid_topic_name("a/b"));
        assert!(valid_topic_name("/"));
        assert!(!valid_topic_name(""));
        assert!(!valid_topic_name("a/+"));
        assert!(!valid_topic_name("a/#"));
    }

    #[test]
    fn matching() {
        let cases = [
            ("#", "a/b/c", true),
            ("a/#", "a", true),
            ("a/#", "a/b", true),
            ("a/+", "a/b", true),
            ("a/+", "a/b/c", false),
            ("a/+/c", "a/b/c", true),
            ("+", "a", true),
            ("+", "/a", false),
            ("+/+", "/a", true),
            ("/+", "/a", true),
            ("a/b", "a/b", true),
            ("a/b", "a/b/", false),
            ("a/b/", "a/b/", true),
            ("a/+/", "a/b/", true),
            ("#", "$SYS/x", false),
            ("+/x", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("$SYS/+", "$SYS/x", true),
            ("#", "$stream/events", false),
            ("sport/tennis/#", "sport/tennis", true),
        ];
        for (f, t, want) in cases {
            assert_eq!(matches(f, t), want, "{f} vs {t}");
        }
    }

    #[test]
    fn shared() {
        assert_eq!(
            parse_shared("$share/g/a/#"),
            Ok(Some(SharedFilter {
                group: "g",
                filter: "a/#"
            }))
        );
        assert_eq!(parse_shared("a/b"), Ok(None));
        assert_eq!(parse_shared("$share/g"), Err(SharedError::BadFilter));
        assert_eq!(parse_shared("$share//a"), Err(SharedError::BadGroup));
        assert_eq!(parse_shared("$share/g+/a"), Err(SharedError::BadGroup));
        assert_eq!(parse_shared("$share/g/a#"), Err(SharedError::BadFilter));
    }
}
