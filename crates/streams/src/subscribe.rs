//! Parsing stream subscriptions (placeholder: the helper implementing this module replaces it).

/// Where a stream subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Latest,
    /// Unix time in microseconds (inclusive).
    TimestampUs(u64),
    /// Resume after this position (`@<n>`: the `stream-offset` of the last message processed).
    After(u64),
}

/// A `$stream/...` or `$s/...` subscription topic, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTopic {
    /// Stream name (for `$s/<offset>/<filter>`: `/<filter>`... see `docs/streams.md`).
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

/// True if `filter` is a stream subscription (starts with `$stream/` or `$s/`).
pub fn is_stream_filter(filter: &str) -> bool {
    filter.starts_with("$stream/") || filter.starts_with("$s/")
}

/// Parse a stream subscription topic.
pub fn parse_topic(filter: &str) -> Result<StreamTopic, SubscribeError> {
    let rest = filter
        .strip_prefix("$stream/")
        .ok_or_else(|| SubscribeError(format!("{filter:?} is not a stream subscription")))?;
    let (name, f) = match rest.split_once('/') {
        Some((n, f)) => (n, Some(f.to_string())),
        None => (rest, None),
    };
    Ok(StreamTopic {
        name: name.to_string(),
        filter: f,
        start: None,
        legacy: false,
    })
}

/// Parse a `stream-offset` (or `$stream.start-from`) user property value.
pub fn parse_offset(value: &str) -> Result<StartFrom, SubscribeError> {
    match value {
        "earliest" => Ok(StartFrom::Earliest),
        "latest" => Ok(StartFrom::Latest),
        v => v
            .parse()
            .map(StartFrom::TimestampUs)
            .map_err(|_| SubscribeError(format!("invalid stream-offset {v:?}"))),
    }
}
