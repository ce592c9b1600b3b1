//! Parsing stream subscriptions (`docs/streams.md`, "Subscribing").
//!
//! - `$stream/<name>`: read the named stream;
//! - `$stream/<name>/<topic filter>`: read it if its filter is exactly `<topic filter>` (or
//!   auto-create it with that filter);
//! - legacy `$s/<offset>/<topic filter>` (offset `earliest`, `latest` or a µs timestamp): the
//!   stream whose default name is `/<topic filter>`.
//!
//! The start position comes from the subscription's user property `stream-offset` (EMQX also
//! reads the legacy `$stream.start-from`): `earliest`, `latest`, a Unix timestamp in
//! microseconds, or (lanemq) `@<n>` to resume after log position `n`. Every error is a sentence
//! meant for a SUBACK reason string.

use std::fmt;

use crate::model::validate_name;
use lanemq_protocol::topic::{split_stream_topic, valid_filter, StreamTopicParts};

/// The subscription user property giving the start position.
pub const OFFSET_PROPERTY: &str = "stream-offset";
/// EMQX's legacy name for [`OFFSET_PROPERTY`].
pub const LEGACY_OFFSET_PROPERTY: &str = "$stream.start-from";

/// Where a stream subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Latest,
    /// Unix time in microseconds (inclusive).
    TimestampUs(u64),
    /// Resume after this log position (`@<n>`, the `stream-offset` property of a delivered
    /// message).
    After(u64),
}

/// A `$stream/...` or `$s/...` subscription topic, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTopic {
    /// Stream name (for `$s/<offset>/<filter>`: `/<filter>`, the stream's default name).
    pub name: String,
    /// The embedded filter, when given (`$stream/<name>/<filter>`, `$s/<offset>/<filter>`).
    pub filter: Option<String>,
    /// The start given in the topic (`$s/<offset>/...` only).
    pub start: Option<StartFrom>,
    /// Legacy `$s/` form.
    pub legacy: bool,
}

/// Why a stream subscription was refused (reason string for SUBACK).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeError(pub String);

impl fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SubscribeError {}

fn err(msg: impl Into<String>) -> SubscribeError {
    SubscribeError(msg.into())
}

/// True if `filter` is a stream subscription (starts with `$stream/` or `$s/`).
pub fn is_stream_filter(filter: &str) -> bool {
    lanemq_protocol::topic::is_stream_topic(filter)
}

/// Parse a stream subscription topic.
pub fn parse_topic(filter: &str) -> Result<StreamTopic, SubscribeError> {
    match split_stream_topic(filter) {
        Some(StreamTopicParts::Named { name, filter: f }) => parse_named(filter, name, f),
        Some(StreamTopicParts::Legacy { offset, filter: f }) => parse_legacy(filter, offset, f),
        None => Err(err(format!(
            "{filter:?} is not a stream subscription: it must begin with $stream/ or $s/."
        ))),
    }
}

fn parse_named(
    filter: &str,
    name: &str,
    embedded: Option<&str>,
) -> Result<StreamTopic, SubscribeError> {
    if name.is_empty() {
        return Err(err(format!(
            "{filter:?} names no stream: use $stream/<name> or $stream/<name>/<topic filter>."
        )));
    }
    validate_name(name).map_err(|reason| {
        err(format!(
            "Invalid stream name {name:?} in {filter:?}: {reason}."
        ))
    })?;
    let filter_part = match embedded {
        None => None,
        Some("") => {
            return Err(err(format!(
                "The topic filter after the stream name {name:?} is empty in {filter:?}."
            )))
        }
        Some(f) => {
            check_filter(filter, f)?;
            Some(f.to_string())
        }
    };
    Ok(StreamTopic {
        name: name.to_string(),
        filter: filter_part,
        start: None,
        legacy: false,
    })
}

fn parse_legacy(
    filter: &str,
    offset: &str,
    inner: Option<&str>,
) -> Result<StreamTopic, SubscribeError> {
    let usage = "use $s/<earliest|latest|timestamp in µs>/<topic filter>";
    let Some(inner) = inner else {
        return Err(err(format!("{filter:?} has no topic filter: {usage}.")));
    };
    let start = match offset {
        "earliest" => StartFrom::Earliest,
        "latest" => StartFrom::Latest,
        o if !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()) => {
            let us = o.parse::<u64>().map_err(|_| {
                err(format!(
                    "The offset {o:?} in {filter:?} is too large for a timestamp in microseconds."
                ))
            })?;
            StartFrom::TimestampUs(us)
        }
        o => {
            return Err(err(format!(
                "The offset {o:?} in {filter:?} is invalid: {usage}."
            )))
        }
    };
    if inner.is_empty() {
        return Err(err(format!(
            "{filter:?} has an empty topic filter: {usage}."
        )));
    }
    check_filter(filter, inner)?;
    Ok(StreamTopic {
        name: format!("/{inner}"),
        filter: Some(inner.to_string()),
        start: Some(start),
        legacy: true,
    })
}

fn check_filter(whole: &str, f: &str) -> Result<(), SubscribeError> {
    if valid_filter(f) {
        Ok(())
    } else {
        Err(err(format!(
            "The topic filter {f:?} in {whole:?} is not a valid MQTT topic filter \
             ('#' must be last and alone in its level, '+' alone in its level)."
        )))
    }
}

/// Parse a `stream-offset` (or `$stream.start-from`) user property value: `earliest`,
/// `latest`, a Unix timestamp in microseconds, or `@<n>` (resume after log position `n`).
/// Surrounding whitespace is ignored.
pub fn parse_offset(value: &str) -> Result<StartFrom, SubscribeError> {
    let v = value.trim();
    let expected = "expected earliest, latest, a Unix timestamp in microseconds \
                    or @<position>";
    if v.eq_ignore_ascii_case("earliest") {
        return Ok(StartFrom::Earliest);
    }
    if v.eq_ignore_ascii_case("latest") {
        return Ok(StartFrom::Latest);
    }
    if v.is_empty() {
        return Err(err(format!("The stream offset is empty: {expected}.")));
    }
    let (digits, what) = match v.strip_prefix('@') {
        Some(d) => (d, "position"),
        None => (v, "timestamp"),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(format!(
            "The stream offset {value:?} is invalid: {expected}."
        )));
    }
    let n: u64 = digits.parse().map_err(|_| {
        err(format!(
            "The stream offset {value:?} is invalid: the {what} is too large."
        ))
    })?;
    Ok(if what == "position" {
        StartFrom::After(n)
    } else {
        StartFrom::TimestampUs(n)
    })
}

/// The start position given by a subscription's user properties: `stream-offset` first, then
/// the legacy `$stream.start-from` (the first occurrence of each counts). `Ok(None)` when
/// neither is present; an error when the one used is invalid.
pub fn offset_from_user_properties(
    props: &[(String, String)],
) -> Result<Option<StartFrom>, SubscribeError> {
    for name in [OFFSET_PROPERTY, LEGACY_OFFSET_PROPERTY] {
        if let Some((_, v)) = props.iter().find(|(k, _)| k == name) {
            return parse_offset(v)
                .map(Some)
                .map_err(|e| err(format!("User property {name}: {}", e.0)));
        }
    }
    Ok(None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn stream_filter_detection() {
        assert!(is_stream_filter("$stream/events"));
        assert!(is_stream_filter("$stream/"));
        assert!(is_stream_filter("$s/earliest/t/#"));
        assert!(!is_stream_filter("$stream"));
        assert!(!is_stream_filter("$streams/x"));
        assert!(!is_stream_filter("$share/g/t"));
        assert!(!is_stream_filter("stream/x"));
        assert!(!is_stream_filter("$S/x"));
    }

    #[test]
    fn named_stream() {
        assert_eq!(
            parse_topic("$stream/events").unwrap(),
            StreamTopic {
                name: "events".into(),
                filter: None,
                start: None,
                legacy: false
            }
        );
    }

    #[test]
    fn named_stream_with_filter() {
        let t = parse_topic("$stream/ev-1.x_y/sensors/+/data").unwrap();
        assert_eq!(t.name, "ev-1.x_y");
        assert_eq!(t.filter.as_deref(), Some("sensors/+/data"));
        assert_eq!(t.start, None);
        assert!(!t.legacy);
        let t = parse_topic("$stream/all/#").unwrap();
        assert_eq!(t.filter.as_deref(), Some("#"));
        // Empty levels inside the filter are real levels.
        let t = parse_topic("$stream/e//a/").unwrap();
        assert_eq!(t.filter.as_deref(), Some("/a/"));
    }

    #[test]
    fn named_stream_errors() {
        for bad in ["$stream/", "$stream//x", "$stream//"] {
            let e = parse_topic(bad).unwrap_err();
            assert!(e.0.contains("names no stream"), "{bad}: {e}");
        }
        let e = parse_topic("$stream/bad name").unwrap_err();
        assert!(e.0.contains("bad name"), "{e}");
        assert!(e.0.contains("Invalid stream name"), "{e}");
        let e = parse_topic("$stream/_x/t").unwrap_err();
        assert!(e.0.contains("_x"), "{e}");
        let e = parse_topic("$stream/a+/t").unwrap_err();
        assert!(e.0.contains("a+"), "{e}");
        let long = format!("$stream/{}", "a".repeat(300));
        assert!(parse_topic(&long).is_err());
        let e = parse_topic("$stream/events/").unwrap_err();
        assert!(e.0.contains("empty"), "{e}");
        for bad in [
            "$stream/e/a/#/b",
            "$stream/e/a+",
            "$stream/e/a#",
            "$stream/e/t\0",
        ] {
            let e = parse_topic(bad).unwrap_err();
            assert!(e.0.contains("not a valid MQTT topic filter"), "{bad}: {e}");
        }
    }

    #[test]
    fn not_a_stream_subscription() {
        let e = parse_topic("a/b").unwrap_err();
        assert!(e.0.contains("not a stream subscription"), "{e}");
        assert!(parse_topic("$stream").is_err());
    }

    #[test]
    fn legacy_form() {
        assert_eq!(
            parse_topic("$s/earliest/t/#").unwrap(),
            StreamTopic {
                name: "/t/#".into(),
                filter: Some("t/#".into()),
                start: Some(StartFrom::Earliest),
                legacy: true
            }
        );
        let t = parse_topic("$s/latest/a/+/b").unwrap();
        assert_eq!(t.start, Some(StartFrom::Latest));
        assert_eq!(t.name, "/a/+/b");
        let t = parse_topic("$s/1700000000000000/x").unwrap();
        assert_eq!(t.start, Some(StartFrom::TimestampUs(1_700_000_000_000_000)));
        assert_eq!(t.filter.as_deref(), Some("x"));
        let t = parse_topic("$s/0//").unwrap();
        assert_eq!(t.start, Some(StartFrom::TimestampUs(0)));
        assert_eq!(t.filter.as_deref(), Some("/"));
    }

    #[test]
    fn legacy_errors() {
        for (bad, needle) in [
            ("$s/", "no topic filter"),
            ("$s/earliest", "no topic filter"),
            ("$s/earliest/", "empty topic filter"),
            ("$s//t", "invalid"),
            ("$s/soon/t", "invalid"),
            ("$s/-5/t", "invalid"),
            ("$s/+5/t", "invalid"),
            ("$s/@5/t", "invalid"),
            ("$s/ 5/t", "invalid"),
            ("$s/99999999999999999999999/t", "too large"),
            ("$s/earliest/a/#/b", "not a valid MQTT topic filter"),
            ("$s/latest/a+", "not a valid MQTT topic filter"),
        ] {
            let e = parse_topic(bad).unwrap_err();
            assert!(e.0.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn offsets() {
        assert_eq!(parse_offset("earliest"), Ok(StartFrom::Earliest));
        assert_eq!(parse_offset("latest"), Ok(StartFrom::Latest));
        assert_eq!(parse_offset("LATEST"), Ok(StartFrom::Latest));
        assert_eq!(parse_offset(" earliest\t"), Ok(StartFrom::Earliest));
        assert_eq!(parse_offset("0"), Ok(StartFrom::TimestampUs(0)));
        assert_eq!(
            parse_offset("1700000000000000"),
            Ok(StartFrom::TimestampUs(1_700_000_000_000_000))
        );
        assert_eq!(parse_offset(" 42 "), Ok(StartFrom::TimestampUs(42)));
        assert_eq!(
            parse_offset(&u64::MAX.to_string()),
            Ok(StartFrom::TimestampUs(u64::MAX))
        );
        assert_eq!(parse_offset("@0"), Ok(StartFrom::After(0)));
        assert_eq!(parse_offset("@12345"), Ok(StartFrom::After(12345)));
    }

    #[test]
    fn bad_offsets() {
        for (bad, needle) in [
            ("", "empty"),
            ("   ", "empty"),
            ("-1", "invalid"),
            ("+1", "invalid"),
            ("1.5", "invalid"),
            ("1e6", "invalid"),
            ("12 34", "invalid"),
            ("soon", "invalid"),
            ("@", "invalid"),
            ("@-1", "invalid"),
            ("@+1", "invalid"),
            ("@ 1", "invalid"),
            ("18446744073709551616", "too large"),
            ("@18446744073709551616", "position is too large"),
        ] {
            let e = parse_offset(bad).unwrap_err();
            assert!(e.0.contains(needle), "{bad:?}: {e}");
            assert!(e.0.ends_with('.'), "{bad:?}: {e}");
        }
        let e = parse_offset("soon").unwrap_err();
        assert!(e.0.contains("earliest, latest"), "{e}");
    }

    #[test]
    fn offset_properties() {
        assert_eq!(offset_from_user_properties(&[]), Ok(None));
        assert_eq!(
            offset_from_user_properties(&props(&[("other", "x")])),
            Ok(None)
        );
        assert_eq!(
            offset_from_user_properties(&props(&[("stream-offset", "earliest")])),
            Ok(Some(StartFrom::Earliest))
        );
        assert_eq!(
            offset_from_user_properties(&props(&[("$stream.start-from", "@7")])),
            Ok(Some(StartFrom::After(7)))
        );
        // stream-offset wins over the legacy name, wherever it is.
        assert_eq!(
            offset_from_user_properties(&props(&[
                ("$stream.start-from", "earliest"),
                ("stream-offset", "123"),
            ])),
            Ok(Some(StartFrom::TimestampUs(123)))
        );
        // The first occurrence counts.
        assert_eq!(
            offset_from_user_properties(&props(&[
                ("stream-offset", "latest"),
                ("stream-offset", "earliest"),
            ])),
            Ok(Some(StartFrom::Latest))
        );
        // Property names are case-sensitive.
        assert_eq!(
            offset_from_user_properties(&props(&[("Stream-Offset", "earliest")])),
            Ok(None)
        );
    }

    #[test]
    fn offset_property_errors() {
        let e = offset_from_user_properties(&props(&[("stream-offset", "nope")])).unwrap_err();
        assert!(e.0.contains("stream-offset"), "{e}");
        assert!(e.0.contains("nope"), "{e}");
        let e = offset_from_user_properties(&props(&[("$stream.start-from", "")])).unwrap_err();
        assert!(e.0.contains("$stream.start-from"), "{e}");
        // An invalid stream-offset is an error even when the legacy one is valid.
        assert!(offset_from_user_properties(&props(&[
            ("$stream.start-from", "earliest"),
            ("stream-offset", "-1"),
        ]))
        .is_err());
        assert_eq!(e.to_string(), e.0);
    }
}
