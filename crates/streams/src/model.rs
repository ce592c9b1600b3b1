//! The stream resource and the global stream settings, as they appear in the config file
//! (`[[streams]]`, `[streams_config]`) and in REST bodies. Field names and defaults follow
//! EMQX 6.1 (`docs/streams.md`); unknown fields are rejected.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

pub use lanemq_protocol::ValidationError;

/// Longest stream name accepted.
pub const NAME_LEN_MAX: usize = 255;
/// Largest `read_max_unacked` accepted.
pub const READ_MAX_UNACKED_MAX: u32 = 65_535;

/// The most digits a duration or limit written as text may have: with any unit the value
/// still fits 64 bits (9,999,999,999 weeks in milliseconds, or GB in bytes).
pub const NUMBER_DIGITS_MAX: usize = 10;

/// A duration written as EMQX writes it: `"7d"`, `"1h"`, `"30m"`, `"10s"`, `"500ms"`
/// (an integer is milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpecDuration(pub Duration);

impl SpecDuration {
    pub const fn from_secs(s: u64) -> SpecDuration {
        SpecDuration(Duration::from_secs(s))
    }

    /// `<digits><unit>` with 1 to [`NUMBER_DIGITS_MAX`] digits and a unit of `ms`, `s`, `m`,
    /// `h`, `d` or `w` (none: seconds), nothing around them: the grammar the REST API's
    /// OpenAPI document states as a pattern.
    pub fn parse(s: &str) -> Result<SpecDuration, String> {
        let t = s;
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: expected a number and a unit (7d, 1h, 30m, 10s, 500ms)"
            ));
        }
        if num.len() > NUMBER_DIGITS_MAX {
            return Err(format!(
                "invalid duration {s:?}: at most {NUMBER_DIGITS_MAX} digits"
            ));
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: number too large"))?;
        let ms_per: u64 = match unit {
            "ms" => 1,
            "" | "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            other => {
                return Err(format!(
                    "invalid duration {s:?}: unknown unit {other:?} (use ms, s, m, h, d or w)"
                ))
            }
        };
        let ms = n
            .checked_mul(ms_per)
            .ok_or_else(|| format!("invalid duration {s:?}: too large"))?;
        Ok(SpecDuration(Duration::from_millis(ms)))
    }

    pub fn as_millis(&self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for SpecDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.as_millis();
        for (unit, per) in [
            ("d", 86_400_000u64),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms >= per && ms % per == 0 {
                return write!(f, "{}{unit}", ms / per);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for SpecDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SpecDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Ms(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Ms(ms) => Ok(SpecDuration(Duration::from_millis(ms))),
            Raw::Text(t) => SpecDuration::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// A count or byte limit: a number, or `"infinity"` (no limit). Byte limits also accept
/// `"64KB"`, `"100MB"`, `"2GB"` (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Limit {
    #[default]
    Infinity,
    Max(u64),
}

impl Limit {
    pub fn get(&self) -> Option<u64> {
        match self {
            Limit::Infinity => None,
            Limit::Max(n) => Some(*n),
        }
    }

    /// `infinity` (any case), or 1 to [`NUMBER_DIGITS_MAX`] digits with an optional unit `B`,
    /// `KB`, `MB`, `GB` (any case), nothing around them.
    pub fn parse(s: &str) -> Result<Limit, String> {
        let t = s;
        if t.eq_ignore_ascii_case("infinity") {
            return Ok(Limit::Infinity);
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.len() > NUMBER_DIGITS_MAX {
            return Err(format!(
                "invalid limit {s:?}: at most {NUMBER_DIGITS_MAX} digits"
            ));
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid limit {s:?}: expected a number or \"infinity\""))?;
        let mul: u64 = match unit.to_ascii_uppercase().as_str() {
            "" | "B" => 1,
            "KB" => 1 << 10,
            "MB" => 1 << 20,
            "GB" => 1 << 30,
            other => return Err(format!("invalid limit {s:?}: unknown unit {other:?}")),
        };
        n.checked_mul(mul)
            .map(Limit::Max)
            .ok_or_else(|| format!("invalid limit {s:?}: too large"))
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Infinity => s.serialize_str("infinity"),
            Limit::Max(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Limit::Max(n)),
            Raw::Text(t) => Limit::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// `limits` of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default)]
    pub max_message_count: Limit,
    #[serde(default)]
    pub max_message_bytes: Limit,
}

pub fn default_key_expression() -> String {
    "message.from".to_string()
}
fn default_retention() -> SpecDuration {
    SpecDuration::from_secs(7 * 86_400)
}
fn default_read_max_unacked() -> u32 {
    1000
}
fn default_true() -> bool {
    true
}

/// The stream resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamDef {
    /// Unique; `^[0-9a-zA-Z][-.0-9a-zA-Z_]*$`.
    pub name: String,
    /// The MQTT filter whose messages the stream captures (fixed after creation).
    pub topic_filter: String,
    /// Newest message per key replaces the older one (fixed after creation).
    #[serde(default)]
    pub is_lastvalue: bool,
    /// Orders delivery per key; selects what last-value overwrites.
    #[serde(default = "default_key_expression")]
    pub key_expression: String,
    /// Messages older than this are removed and never delivered.
    #[serde(default = "default_retention")]
    pub data_retention_period: SpecDuration,
    #[serde(default)]
    pub limits: Limits,
    /// Messages a subscriber may have unacknowledged (delivered, not yet PUBACK'd).
    #[serde(default = "default_read_max_unacked")]
    pub read_max_unacked: u32,
}

impl StreamDef {
    /// A definition with the defaults for everything but the name and filter.
    pub fn new(name: &str, topic_filter: &str) -> StreamDef {
        StreamDef {
            name: name.to_string(),
            topic_filter: topic_filter.to_string(),
            is_lastvalue: false,
            key_expression: default_key_expression(),
            data_retention_period: default_retention(),
            limits: Limits::default(),
            read_max_unacked: default_read_max_unacked(),
        }
    }

    /// Every problem with this definition (empty: valid).
    pub fn validate(&self) -> Vec<ValidationError> {
        let mut errs = Vec::new();
        if let Err(m) = validate_name(&self.name) {
            errs.push(ValidationError::new("name", m));
        }
        if let Err(m) = validate_filter(&self.topic_filter) {
            errs.push(ValidationError::new("topic_filter", m));
        }
        if let Err(m) = crate::keyexpr::KeyExpr::parse(&self.key_expression) {
            errs.push(ValidationError::new("key_expression", m));
        }
        if self.data_retention_period.0.is_zero() {
            errs.push(ValidationError::new(
                "data_retention_period",
                "must be greater than 0",
            ));
        }
        if self.limits.max_message_count == Limit::Max(0) {
            errs.push(ValidationError::new(
                "limits.max_message_count",
                "must be greater than 0 (or \"infinity\")",
            ));
        }
        if self.limits.max_message_bytes == Limit::Max(0) {
            errs.push(ValidationError::new(
                "limits.max_message_bytes",
                "must be greater than 0 (or \"infinity\")",
            ));
        }
        if self.read_max_unacked == 0 || self.read_max_unacked > READ_MAX_UNACKED_MAX {
            errs.push(ValidationError::new(
                "read_max_unacked",
                format!("must be between 1 and {READ_MAX_UNACKED_MAX}"),
            ));
        }
        errs
    }
}

/// Checks a stream name.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > NAME_LEN_MAX {
        return Err(format!("longer than {NAME_LEN_MAX} bytes"));
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok {
        return Err(format!("{name:?} must start with a letter or a digit"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "{name:?} may contain only letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

/// Checks a stream's topic filter: a valid MQTT filter, not a shared or `$stream` one.
pub fn validate_filter(filter: &str) -> Result<(), String> {
    if !lanemq_protocol::topic::valid_filter(filter) {
        return Err(format!("{filter:?} is not a valid MQTT topic filter"));
    }
    if filter.starts_with("$share/") || filter.starts_with("$queue/") {
        return Err(format!(
            "{filter:?}: a stream cannot capture a shared subscription filter"
        ));
    }
    if filter.starts_with("$stream/") || filter.starts_with("$s/") || filter == "$stream" {
        return Err(format!(
            "{filter:?}: a stream cannot capture stream subscriptions"
        ));
    }
    Ok(())
}

/// `auto_create.lastvalue`: `false`, or `{ key_expression = "..." }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoLastValue {
    pub key_expression: String,
}

fn ser_auto_lv<S: Serializer>(v: &Option<AutoLastValue>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    match v {
        None => s.serialize_bool(false),
        Some(a) => {
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry("key_expression", &a.key_expression)?;
            m.end()
        }
    }
}

fn de_auto_lv<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AutoLastValue>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Obj {
        #[serde(default = "default_key_expression")]
        key_expression: String,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        B(bool),
        O(Obj),
    }
    match Raw::deserialize(d)? {
        Raw::B(false) => Ok(None),
        Raw::B(true) => Ok(Some(AutoLastValue {
            key_expression: default_key_expression(),
        })),
        Raw::O(o) => Ok(Some(AutoLastValue {
            key_expression: o.key_expression,
        })),
    }
}

fn default_auto_lv() -> Option<AutoLastValue> {
    Some(AutoLastValue {
        key_expression: default_key_expression(),
    })
}

/// `auto_create`: what `SUBSCRIBE $stream/<name>/<filter>` creates when `<name>` is unknown.
/// `regular` wins over `lastvalue` when both are enabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoCreate {
    #[serde(default)]
    pub regular: bool,
    #[serde(
        default = "default_auto_lv",
        serialize_with = "ser_auto_lv",
        deserialize_with = "de_auto_lv"
    )]
    pub lastvalue: Option<AutoLastValue>,
}

impl Default for AutoCreate {
    fn default() -> Self {
        AutoCreate {
            regular: false,
            lastvalue: default_auto_lv(),
        }
    }
}

fn default_max_stream_count() -> u32 {
    1000
}
fn default_gc_interval() -> SpecDuration {
    SpecDuration::from_secs(3600)
}
fn default_check_interval() -> SpecDuration {
    SpecDuration::from_secs(10)
}

/// Global settings (`[streams]`, `GET/PUT /api/v5/streams/config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalSettings {
    /// Streams on or off (off: `$stream/` subscriptions are refused, nothing is indexed).
    #[serde(default = "default_true")]
    pub enable: bool,
    #[serde(default = "default_max_stream_count")]
    pub max_stream_count: u32,
    /// Interval of the retention task.
    #[serde(default = "default_gc_interval")]
    pub gc_interval: SpecDuration,
    /// `data_retention_period` of auto-created streams.
    #[serde(default = "default_retention")]
    pub regular_stream_retention_period: SpecDuration,
    /// Accepted for EMQX compatibility: lanemq starts pending subscriptions the moment the
    /// stream is created instead of polling.
    #[serde(default = "default_check_interval")]
    pub check_stream_status_interval: SpecDuration,
    #[serde(default)]
    pub auto_create: AutoCreate,
}

impl Default for GlobalSettings {
    fn default() -> Self {
        GlobalSettings {
            enable: true,
            max_stream_count: default_max_stream_count(),
            gc_interval: default_gc_interval(),
            regular_stream_retention_period: default_retention(),
            check_stream_status_interval: default_check_interval(),
            auto_create: AutoCreate::default(),
        }
    }
}

impl GlobalSettings {
    pub fn validate(&self) -> Vec<ValidationError> {
        let mut errs = Vec::new();
        if self.max_stream_count == 0 {
            errs.push(ValidationError::new(
                "max_stream_count",
                "must be greater than 0",
            ));
        }
        if self.gc_interval.0 < Duration::from_secs(1) {
            errs.push(ValidationError::new("gc_interval", "must be at least 1s"));
        }
        if self.regular_stream_retention_period.0.is_zero() {
            errs.push(ValidationError::new(
                "regular_stream_retention_period",
                "must be greater than 0",
            ));
        }
        if let Some(lv) = &self.auto_create.lastvalue {
            if let Err(m) = crate::keyexpr::KeyExpr::parse(&lv.key_expression) {
                errs.push(ValidationError::new(
                    "auto_create.lastvalue.key_expression",
                    m,
                ));
            }
        }
        errs
    }
}

/// Figures of one stream (`GET /api/v5/stream/{name}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamStats {
    /// Messages the stream holds (for last-value streams: keys plus keyless messages).
    pub message_count: u64,
    /// Payload + topic bytes of those messages.
    pub message_bytes: u64,
    /// Arrival time (Unix µs) of the oldest / newest message held; `None` when empty.
    pub oldest_timestamp_us: Option<u64>,
    pub newest_timestamp_us: Option<u64>,
    /// Stream subscriptions currently reading the stream (of connected clients; an offline
    /// persistent session's subscription is counted again when it reconnects).
    pub subscribers: u64,
    /// Messages whose key could not be extracted (stored as regular messages).
    pub keyless_messages: u64,
}

/// A stream with its figures, as the REST API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    #[serde(flatten)]
    pub def: StreamDef,
    /// Unix µs of creation.
    pub created_at_us: u64,
    pub stats: StreamStats,
}

/// Errors of registry operations; one mapping to HTTP in the admin crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("stream {0:?} not found")]
    NotFound(String),
    #[error("stream {0:?} already exists")]
    AlreadyExists(String),
    #[error("the limit of {0} streams is reached (streams_config.max_stream_count)")]
    MaxStreamCount(u32),
    #[error("invalid stream: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<ValidationError>),
    #[error("{0} cannot be changed after creation")]
    Immutable(&'static str),
    #[error("streams are disabled (streams_config.enable = false)")]
    Disabled,
    #[error("storage: {0}")]
    Storage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip() {
        for (s, ms) in [
            ("7d", 604_800_000u64),
            ("1h", 3_600_000),
            ("90s", 90_000),
            ("250ms", 250),
        ] {
            let d = SpecDuration::parse(s).expect("parses");
            assert_eq!(d.as_millis(), ms);
            assert_eq!(SpecDuration::parse(&d.to_string()).expect("reparses"), d);
        }
        assert!(SpecDuration::parse("7 days").is_err());
        assert!(SpecDuration::parse(" 7d").is_err());
        assert!(SpecDuration::parse("7 d").is_err());
        assert_eq!(
            SpecDuration::parse("9999999999w").map(|d| d.as_millis()),
            Ok(9_999_999_999 * 604_800_000)
        );
        assert!(SpecDuration::parse("00000000001s").is_err());
        assert!(SpecDuration::parse("h").is_err());
    }

    #[test]
    fn stream_defaults_and_unknown_fields() {
        let d: StreamDef =
            serde_json::from_str(r#"{"name":"events","topic_filter":"t/#"}"#).expect("valid");
        assert_eq!(d, StreamDef::new("events", "t/#"));
        assert!(d.validate().is_empty());
        let e = serde_json::from_str::<StreamDef>(r#"{"name":"a","topic_filter":"t","x":1}"#);
        assert!(e.is_err());
    }

    #[test]
    fn names() {
        for ok in ["a", "events", "0x", "a.b-c_d"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "_a", "a/b", "a b", "é", "a+"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_parse() {
        assert_eq!(Limit::parse("infinity"), Ok(Limit::Infinity));
        assert_eq!(Limit::parse("10MB"), Ok(Limit::Max(10 << 20)));
        assert!(Limit::parse("ten").is_err());
        assert!(Limit::parse(" 10MB").is_err());
        assert_eq!(Limit::parse("10mb"), Ok(Limit::Max(10 << 20)));
        assert!(Limit::parse("99999999999").is_err());
        let l: Limits =
            serde_json::from_str(r#"{"max_message_count":5,"max_message_bytes":"1KB"}"#)
                .expect("valid");
        assert_eq!(l.max_message_count, Limit::Max(5));
        assert_eq!(l.max_message_bytes, Limit::Max(1024));
    }

    #[test]
    fn auto_create_forms() {
        let g: GlobalSettings =
            serde_json::from_str(r#"{"auto_create":{"lastvalue":false}}"#).expect("valid");
        assert_eq!(g.auto_create.lastvalue, None);
        let g: GlobalSettings = serde_json::from_str(
            r#"{"auto_create":{"regular":true,"lastvalue":{"key_expression":"message.topic"}}}"#,
        )
        .expect("valid");
        assert!(g.auto_create.regular);
        assert_eq!(
            g.auto_create
                .lastvalue
                .as_ref()
                .map(|l| l.key_expression.as_str()),
            Some("message.topic")
        );
        let back = serde_json::to_value(&g).expect("serializes");
        assert_eq!(
            back["auto_create"]["lastvalue"]["key_expression"],
            "message.topic"
        );
    }
}
