//! The lite parent resource (`[[lite.parents]]` and `/api/v5/lite/parents`) and its pattern.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest parent name accepted.
pub const NAME_LEN_MAX: usize = 64;
/// Longest TTL accepted (30 days, RocketMQ's upper bound).
pub const TTL_S_MAX: u64 = 30 * 24 * 3600;
/// Largest batch accepted.
pub const BATCH_MAX: u32 = 1024;
/// Default `ack_timeout_ms` (RocketMQ's stuck-client detection: 10 s).
pub const ACK_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Shortest `ack_timeout_ms` accepted (other than 0, off).
pub const ACK_TIMEOUT_MS_MIN: u64 = 50;
/// Longest `ack_timeout_ms` accepted (1 day).
pub const ACK_TIMEOUT_MS_MAX: u64 = 86_400_000;

/// How the lanes of a parent are shared among the members of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Any member may take the next batch of a lane (one batch in flight per group and lane).
    #[default]
    Shared,
    /// A lane stays with one member until it leaves, or until a member subscribes to that
    /// exact lane (the newest explicit subscriber wins).
    Exclusive,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Shared => "shared",
            Mode::Exclusive => "exclusive",
        })
    }
}

/// A lite parent: the namespace and control boundary of its lanes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParentDef {
    /// `[A-Za-z0-9_.-]{1,64}`.
    pub name: String,
    /// Topic pattern with one `{lane}` level, e.g. `agents/{lane}/#`.
    pub pattern: String,
    /// Topic levels the key spans, starting at `{lane}` (joined with `/`).
    pub key_levels: u32,
    /// A lane expires after this many seconds without a publish.
    pub ttl_s: u64,
    /// `shared` or `exclusive`.
    pub mode: Mode,
    /// Deliveries answered `lane-retry-ms` before the message goes to the dead-letter topic.
    pub max_attempts: u32,
    /// Most lanes the parent may hold; a publish that would create one more is refused (0x97).
    pub max_lanes: u64,
    /// Longest lane key in bytes; a longer one is refused (0x90).
    pub max_key_bytes: u32,
    /// Most messages of one lane in flight to one member at once.
    pub batch: u32,
    /// A batch not fully acknowledged this long after it was handed to a member is taken
    /// back and handed to another online member (DUP=1, one attempt counted); the holder is
    /// marked stuck until it shows life. 0: never (only a lost connection frees a batch).
    pub ack_timeout_ms: u64,
}

impl Default for ParentDef {
    fn default() -> Self {
        ParentDef {
            name: String::new(),
            pattern: String::new(),
            key_levels: 1,
            ttl_s: 3600,
            mode: Mode::Shared,
            max_attempts: 16,
            max_lanes: 10_000_000,
            max_key_bytes: 64,
            batch: 32,
            ack_timeout_ms: ACK_TIMEOUT_MS_DEFAULT,
        }
    }
}

pub use lanemq_protocol::ValidationError;

impl ParentDef {
    /// Every problem of this definition (empty: valid).
    pub fn validate(&self) -> Vec<ValidationError> {
        let mut e = Vec::new();
        if self.name.is_empty() || self.name.len() > NAME_LEN_MAX {
            e.push(ValidationError::new(
                "name",
                format!("must be 1 to {NAME_LEN_MAX} bytes"),
            ));
        } else if !self
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            e.push(ValidationError::new(
                "name",
                "may contain only A-Z a-z 0-9 _ . -",
            ));
        }
        if self.key_levels == 0 || self.key_levels > 16 {
            e.push(ValidationError::new("key_levels", "must be 1 to 16"));
        }
        if let Err(why) = Pattern::compile(&self.pattern, self.key_levels.max(1)) {
            e.push(ValidationError::new("pattern", why));
        }
        if self.ttl_s == 0 || self.ttl_s > TTL_S_MAX {
            e.push(ValidationError::new(
                "ttl_s",
                format!("must be 1 to {TTL_S_MAX} seconds"),
            ));
        }
        if self.max_attempts == 0 {
            e.push(ValidationError::new("max_attempts", "must be at least 1"));
        }
        if self.max_lanes == 0 {
            e.push(ValidationError::new("max_lanes", "must be at least 1"));
        }
        if self.max_key_bytes == 0 || self.max_key_bytes > 65_535 {
            e.push(ValidationError::new("max_key_bytes", "must be 1 to 65535"));
        }
        if self.batch == 0 || self.batch > BATCH_MAX {
            e.push(ValidationError::new(
                "batch",
                format!("must be 1 to {BATCH_MAX}"),
            ));
        }
        if self.ack_timeout_ms != 0
            && !(ACK_TIMEOUT_MS_MIN..=ACK_TIMEOUT_MS_MAX).contains(&self.ack_timeout_ms)
        {
            e.push(ValidationError::new(
                "ack_timeout_ms",
                format!(
                    "must be 0 (off) or {ACK_TIMEOUT_MS_MIN} to {ACK_TIMEOUT_MS_MAX} milliseconds"
                ),
            ));
        }
        e
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    Lit(String),
    Plus,
}

/// A compiled parent pattern: levels before the lane, the lane's levels, levels after it,
/// and whether it ends with `#`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    before: Vec<Level>,
    key_levels: usize,
    after: Vec<Level>,
    hash: bool,
}

/// Which lanes of a parent a subscription filter selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LaneSel {
    /// Every lane (`agents/+/#`, `agents/#`).
    All,
    /// One lane, by key (`agents/s-42/#`).
    One(String),
}

impl Pattern {
    /// Compile `pattern` with a key of `key_levels` levels.
    pub fn compile(pattern: &str, key_levels: u32) -> Result<Pattern, String> {
        if pattern.is_empty() {
            return Err("must not be empty".into());
        }
        if pattern.starts_with('$') {
            return Err("must not start with '$' (those topics belong to the broker)".into());
        }
        if pattern.len() > 65_535 || pattern.contains('\0') {
            return Err("is not a valid topic filter".into());
        }
        let levels: Vec<&str> = pattern.split('/').collect();
        let mut before = Vec::new();
        let mut after = Vec::new();
        let mut seen_lane = false;
        let mut hash = false;
        for (i, l) in levels.iter().enumerate() {
            let last = i + 1 == levels.len();
            match *l {
                "{lane}" => {
                    if seen_lane {
                        return Err("must contain exactly one {lane} level".into());
                    }
                    seen_lane = true;
                }
                "#" if last => hash = true,
                "#" => return Err("'#' must be the last level".into()),
                "+" => {
                    if seen_lane {
                        after.push(Level::Plus)
                    } else {
                        before.push(Level::Plus)
                    }
                }
                l if l.contains(['+', '#', '{', '}']) => {
                    return Err(format!(
                        "level {l:?}: '+', '#' must fill a whole level; braces only in {{lane}}"
                    ))
                }
                l => {
                    let lit = Level::Lit(l.to_string());
                    if seen_lane {
                        after.push(lit)
                    } else {
                        before.push(lit)
                    }
                }
            }
        }
        if !seen_lane {
            return Err("must contain one {lane} level (for example agents/{lane}/#)".into());
        }
        Ok(Pattern {
            before,
            key_levels: key_levels.max(1) as usize,
            after,
            hash,
        })
    }

    /// The byte range of the lane key inside `topic`, if the topic matches.
    pub fn key_span(&self, topic: &str) -> Option<(usize, usize)> {
        if topic.starts_with('$') && !matches!(self.before.first(), Some(Level::Lit(_))) {
            return None;
        }
        let mut pos = 0usize;
        let mut levels = topic.split('/');
        let mut next = |pos: &mut usize| -> Option<(usize, usize)> {
            let l = levels.next()?;
            let start = *pos;
            *pos += l.len() + 1;
            Some((start, start + l.len()))
        };
        for lvl in &self.before {
            let (s, e) = next(&mut pos)?;
            if let Level::Lit(lit) = lvl {
                if &topic[s..e] != lit {
                    return None;
                }
            }
        }
        let mut key = None::<(usize, usize)>;
        for _ in 0..self.key_levels {
            let (s, e) = next(&mut pos)?;
            if s == e {
                return None;
            }
            key = Some(match key {
                None => (s, e),
                Some((ks, _)) => (ks, e),
            });
        }
        for lvl in &self.after {
            let (s, e) = next(&mut pos)?;
            if let Level::Lit(lit) = lvl {
                if &topic[s..e] != lit {
                    return None;
                }
            }
        }
        if !self.hash && next(&mut pos).is_some() {
            return None;
        }
        key
    }

    /// The lane key of `topic`, if it matches.
    pub fn key_of<'a>(&self, topic: &'a str) -> Option<&'a str> {
        self.key_span(topic).map(|(s, e)| &topic[s..e])
    }

    /// Does the (inner, non-shared) subscription filter lie inside this parent? `All` when
    /// the lane levels are `+` (or `#` at the lane position), `One(key)` when they are
    /// literal; `None` otherwise (an ordinary subscription).
    pub fn lane_sel(&self, filter: &str) -> Option<LaneSel> {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut i = 0;
        for lvl in &self.before {
            let f = *levels.get(i)?;
            match (lvl, f) {
                (Level::Lit(l), f) if f == l => {}
                (Level::Plus, "+") => {}
                (Level::Plus, f) if !f.contains(['+', '#']) => {}
                _ => return None,
            }
            i += 1;
        }
        if levels.get(i) == Some(&"#") {
            return Some(LaneSel::All);
        }
        // `+` levels up to a `#` (`mk/+/#` with a two-level key) select every lane too.
        let avail = &levels[i.min(levels.len())..];
        if let Some(h) = avail.iter().take(self.key_levels).position(|l| *l == "#") {
            if avail[..h].iter().all(|l| *l == "+") {
                return Some(LaneSel::All);
            }
            return None;
        }
        let key_levels = levels.get(i..i + self.key_levels)?;
        if key_levels.iter().all(|l| *l == "+") {
            return Some(LaneSel::All);
        }
        if key_levels
            .iter()
            .all(|l| !l.is_empty() && !l.contains(['+', '#']))
        {
            return Some(LaneSel::One(key_levels.join("/")));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pattern_finds_the_key() {
        let p = Pattern::compile("agents/{lane}/#", 1).unwrap();
        assert_eq!(p.key_of("agents/s-42/req"), Some("s-42"));
        assert_eq!(p.key_of("agents/s-42"), Some("s-42"));
        assert_eq!(p.key_of("agents/s-42/a/b"), Some("s-42"));
        assert_eq!(p.key_of("agents"), None);
        assert_eq!(p.key_of("agents//x"), None);
        assert_eq!(p.key_of("other/s-42/x"), None);
        let p = Pattern::compile("t/+/{lane}/out", 2).unwrap();
        assert_eq!(p.key_of("t/x/a/b/out"), Some("a/b"));
        assert_eq!(p.key_of("t/x/a/b/out/more"), None);
        assert_eq!(p.key_of("t/x/a/b/in"), None);
        let p = Pattern::compile("{lane}/#", 1).unwrap();
        assert_eq!(p.key_of("$SYS/x"), None);
        assert_eq!(p.key_of("k/x"), Some("k"));
    }

    #[test]
    fn pattern_is_validated() {
        for bad in [
            "",
            "agents/#",
            "agents/{lane}/{lane}",
            "$sys/{lane}",
            "a/#/{lane}",
            "a/x+/{lane}",
            "a/{lane}x",
        ] {
            assert!(Pattern::compile(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn lane_selection_of_filters() {
        let p = Pattern::compile("agents/{lane}/#", 1).unwrap();
        assert_eq!(p.lane_sel("agents/+/#"), Some(LaneSel::All));
        assert_eq!(p.lane_sel("agents/#"), Some(LaneSel::All));
        assert_eq!(p.lane_sel("agents/+/req"), Some(LaneSel::All));
        assert_eq!(p.lane_sel("agents/s-1/#"), Some(LaneSel::One("s-1".into())));
        assert_eq!(p.lane_sel("#"), None);
        assert_eq!(p.lane_sel("other/+/#"), None);
        assert_eq!(p.lane_sel("agents"), None);
        let p2 = Pattern::compile("mk/{lane}/#", 2).unwrap();
        assert_eq!(p2.lane_sel("mk/+/#"), Some(LaneSel::All));
        assert_eq!(p2.lane_sel("mk/+/+/#"), Some(LaneSel::All));
        assert_eq!(p2.lane_sel("mk/a/b/#"), Some(LaneSel::One("a/b".into())));
        assert_eq!(p2.lane_sel("mk/a/#"), None);
    }

    #[test]
    fn definitions_are_validated() {
        let d = ParentDef {
            name: "agents".into(),
            pattern: "agents/{lane}/#".into(),
            ..Default::default()
        };
        assert!(d.validate().is_empty());
        let bad = ParentDef {
            name: "a b".into(),
            pattern: "x".into(),
            ttl_s: 0,
            batch: 0,
            ack_timeout_ms: 10,
            ..Default::default()
        };
        let fields: Vec<String> = bad.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            ["name", "pattern", "ttl_s", "batch", "ack_timeout_ms"]
        );
        for ok in [0, ACK_TIMEOUT_MS_MIN, 300, ACK_TIMEOUT_MS_MAX] {
            let d = ParentDef {
                ack_timeout_ms: ok,
                ..d.clone()
            };
            assert!(d.validate().is_empty(), "{ok}");
        }
        let d = ParentDef {
            ack_timeout_ms: ACK_TIMEOUT_MS_MAX + 1,
            ..d
        };
        assert_eq!(d.validate()[0].field, "ack_timeout_ms");
    }
}
