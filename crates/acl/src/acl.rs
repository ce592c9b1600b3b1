//! ACL files: ordered `allow`/`deny` rules, first match wins.
//!
//! # Format
//!
//! One rule or directive per line; blank lines are ignored and a token beginning with `#`
//! starts a comment that runs to the end of the line (`filter:a/#` is not a comment: the `#`
//! does not begin the token).
//!
//! ```text
//! default deny                                   # when no rule matches (absent: deny)
//! <allow|deny>  <who>  <actions>  <pattern>  [group:<name>|group:*]
//! ```
//!
//! * `who`: `all`, `anonymous` (no username), `user:NAME`, `client:ID`, `ip:ADDR` or
//!   `ip:ADDR/PREFIX` (IPv4 or IPv6; an IPv4-mapped IPv6 client address counts as IPv4).
//!   Conditions joined with `&` must all hold: `user:backend&ip:10.0.0.0/8`.
//! * `actions`: a comma list of `publish`, `subscribe`, `create` (auto-create a stream), or
//!   `all` (all three).
//! * `pattern`: `topic:EXACT` (the exact string: a topic name for publish, the subscription
//!   string itself for subscribe), `filter:FILTER` (an MQTT filter), `re:REGEX` (a regular
//!   expression of the `regex` crate, anchored at both ends, matched against the string as
//!   text). `topic:` and `filter:` patterns may use `%u` (username) and `%c` (client id);
//!   `%%` is a literal `%`.
//! * `group:NAME` / `group:*` (subscribe rules only): the rule matches only `$share/NAME/...`
//!   (`*`: any group) subscriptions. A rule without it matches plain and shared subscriptions
//!   alike.
//!
//! A token may be double-quoted in whole or in part to include blanks, `#`, `&` or `,`:
//! `user:"name with spaces"`; inside quotes `\"` and `\\` are escapes.
//!
//! # Semantics
//!
//! * **Publish** `T`: `topic:` equals `T`, `filter:` matches `T`, `re:` matches `T`.
//! * **Subscribe** `F`: an `allow` rule matches when its filter *covers* `F` (every topic `F`
//!   matches, the rule matches: `filter:a/#` covers `a/+/b`; `filter:a/+` does not cover `a/#`);
//!   a `deny` rule matches when its filter *intersects* `F` (some topic matches both: `deny
//!   filter:secret/#` denies a subscription to `#`). So an allowed subscription never receives
//!   a message that the rules would deny it. `topic:` compares the subscription string
//!   (`deny topic:T` also denies any filter matching `T`); `re:` matches the subscription
//!   string as text (a wildcard in it is just a character).
//! * `$share/<group>/<filter>` is authorized on `<filter>` (with its group for `group:`
//!   rules); `$stream/...` and `$s/...` are authorized on the whole string, like any other
//!   topic beginning with `$`.
//! * `$` rule: a rule filter beginning with `+` or `#` matches no topic or filter beginning
//!   with `$` (`$SYS/...`, `$stream/...`, `$s/...`); those need rules that name them.
//! * **Create** (auto-creating a stream) is checked on `$stream/<name>`; see
//!   [`Acl::check_subscribe`].
//! * Placeholders: a rule with `%u` does not match a client without a username; a rule with
//!   `%u`/`%c` does not match when the value is empty or contains `/`, `+`, `#` or NUL, nor
//!   when the value would make a pattern begin with `$` that does not begin with `$` itself.

use crate::error::{read_file, LoadError, ParseError};
use crate::topic::{covers, intersects};
use lanemq_protocol::topic::{
    matches, parse_shared, split_stream_topic, valid_filter, valid_topic_name, StreamTopicParts,
};
use regex::{Regex, RegexBuilder};
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

/// The rules `acl/default.acl` ships, embedded so the binary works without the file.
pub const DEFAULT_ACL: &str = include_str!("../../../acl/default.acl");

/// What a client asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// PUBLISH to a topic name.
    Publish,
    /// SUBSCRIBE to a filter (including `$share/`, `$stream/` and `$s/` forms).
    Subscribe,
    /// Auto-create a stream; the topic is `$stream/<name>`.
    Create,
}

impl Action {
    fn bit(self) -> u8 {
        match self {
            Action::Publish => 1,
            Action::Subscribe => 2,
            Action::Create => 4,
        }
    }

    fn index(self) -> usize {
        match self {
            Action::Publish => 0,
            Action::Subscribe => 1,
            Action::Create => 2,
        }
    }

    /// `publish`, `subscribe` or `create`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Publish => "publish",
            Action::Subscribe => "subscribe",
            Action::Create => "create",
        }
    }
}

impl std::str::FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "publish" => Ok(Action::Publish),
            "subscribe" => Ok(Action::Subscribe),
            "create" => Ok(Action::Create),
            _ => Err(format!(
                "unknown action {s:?} (publish, subscribe or create)"
            )),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One authorization question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The username of the CONNECT (`None`: anonymous).
    pub username: Option<&'a str>,
    /// The client id (the assigned one if the server assigned it).
    pub client_id: &'a str,
    /// The client's address.
    pub ip: IpAddr,
    pub action: Action,
    /// Publish: the topic name. Subscribe: the filter as sent (`$share/g/...` included).
    /// Create: `$stream/<name>`.
    pub topic: &'a str,
}

/// Which rule decided: its file and 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    pub file: Arc<str>,
    pub line: usize,
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// What decided a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The rule in [`Decision::rule`].
    Rule,
    /// No rule matched: the file's `default`.
    Default,
    /// The topic is not a valid topic name (publish), filter (subscribe) or stream name
    /// (create): always denied.
    InvalidRequest,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The rule that decided; `None` when the default decided or the request was invalid.
    pub rule: Option<RuleRef>,
    pub by: DecidedBy,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.allowed { "allow" } else { "deny" };
        match (&self.rule, self.by) {
            (Some(r), _) => write!(f, "{verdict} ({r})"),
            (None, DecidedBy::InvalidRequest) => write!(f, "{verdict} (invalid topic or filter)"),
            (None, _) => write!(f, "{verdict} (default)"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rules

#[derive(Debug, Clone)]
enum Cond {
    All,
    Anonymous,
    User(String),
    Client(String),
    Ip(Cidr),
}

#[derive(Debug, Clone, Copy)]
struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    User,
    Client,
}

/// A `topic:`/`filter:` pattern, possibly with placeholders.
#[derive(Debug, Clone)]
struct Template {
    /// The pattern with `%%` resolved (placeholders kept as `%u`/`%c`), for display.
    pieces: Vec<Piece>,
    /// `Some` when there are no placeholders.
    fixed: Option<String>,
}

impl Template {
    /// The pattern for this client, or `None` when a placeholder cannot be filled safely.
    fn expand(&self, username: Option<&str>, client_id: &str) -> Option<String> {
        if let Some(f) = &self.fixed {
            return Some(f.clone());
        }
        let ok = |v: &str| !v.is_empty() && !v.contains(['/', '+', '#', '\0']);
        let mut out = String::new();
        let starts_dollar =
            matches!(self.pieces.first(), Some(Piece::Lit(s)) if s.starts_with('$'));
        for p in &self.pieces {
            match p {
                Piece::Lit(s) => out.push_str(s),
                Piece::User => {
                    let u = username.filter(|u| ok(u))?;
                    out.push_str(u);
                }
                Piece::Client => {
                    if !ok(client_id) {
                        return None;
                    }
                    out.push_str(client_id);
                }
            }
        }
        if out.starts_with('$') && !starts_dollar {
            return None;
        }
        Some(out)
    }
}

#[derive(Debug, Clone)]
enum Pattern {
    Exact(Template),
    Filter(Template),
    Regex(Regex),
}

#[derive(Debug, Clone)]
enum Group {
    Any,
    Named(String),
}

#[derive(Debug, Clone)]
struct Rule {
    allow: bool,
    who: Vec<Cond>,
    actions: u8,
    pattern: Pattern,
    group: Option<Group>,
    line: usize,
}

impl Rule {
    fn who_matches(&self, username: Option<&str>, client_id: &str, ip: IpAddr) -> bool {
        self.who.iter().all(|c| match c {
            Cond::All => true,
            Cond::Anonymous => username.is_none(),
            Cond::User(u) => username == Some(u.as_str()),
            Cond::Client(c) => client_id == c,
            Cond::Ip(net) => net.contains(ip),
        })
    }

    fn group_matches(&self, group: Option<&str>) -> bool {
        match (&self.group, group) {
            (None, _) => true,
            (Some(Group::Any), Some(_)) => true,
            (Some(Group::Named(n)), Some(g)) => n == g,
            (Some(_), None) => false,
        }
    }

    /// Does this rule's pattern match the publish topic / create object `topic`?
    fn topic_matches(&self, topic: &str, username: Option<&str>, client_id: &str) -> bool {
        match &self.pattern {
            Pattern::Exact(t) => t.expand(username, client_id).is_some_and(|s| s == topic),
            Pattern::Filter(t) => t
                .expand(username, client_id)
                .is_some_and(|f| matches(&f, topic)),
            Pattern::Regex(re) => re.is_match(topic),
        }
    }

    /// Does this rule match the subscription filter `filter` (the inner filter of `$share/`)?
    fn filter_matches(&self, filter: &str, username: Option<&str>, client_id: &str) -> bool {
        match &self.pattern {
            Pattern::Exact(t) => t.expand(username, client_id).is_some_and(|s| {
                s == filter || (!self.allow && valid_topic_name(&s) && matches(filter, &s))
            }),
            Pattern::Filter(t) => t.expand(username, client_id).is_some_and(|f| {
                if self.allow {
                    covers(&f, filter)
                } else {
                    intersects(&f, filter)
                }
            }),
            Pattern::Regex(re) => re.is_match(filter),
        }
    }
}

/// A filter trie over the static `filter:` rules of one action.
#[derive(Debug, Default, Clone)]
struct Trie {
    children: HashMap<String, Trie>,
    plus: Option<Box<Trie>>,
    /// Rules whose filter ends with `#` at this node (`prefix/#`).
    hash: Vec<u32>,
    /// Rules whose filter ends exactly at this node.
    end: Vec<u32>,
}

impl Trie {
    fn insert(&mut self, filter: &str, rule: u32) {
        let mut node = self;
        for level in filter.split('/') {
            match level {
                "#" => {
                    node.hash.push(rule);
                    return;
                }
                "+" => node = node.plus.get_or_insert_with(Box::default),
                l => node = node.children.entry(l.to_string()).or_default(),
            }
        }
        node.end.push(rule);
    }

    /// Push every rule whose filter matches `topic` (a topic name) onto `out`.
    fn collect(&self, topic: &str, out: &mut Vec<u32>) {
        let levels: Vec<&str> = topic.split('/').collect();
        let dollar = topic.starts_with('$');
        let mut stack: Vec<(&Trie, usize)> = vec![(self, 0)];
        while let Some((node, i)) = stack.pop() {
            let root = i == 0;
            if !(root && dollar) {
                out.extend_from_slice(&node.hash);
            }
            let Some(level) = levels.get(i) else {
                out.extend_from_slice(&node.end);
                continue;
            };
            if let Some(child) = node.children.get(*level) {
                stack.push((child, i + 1));
            }
            if let Some(plus) = &node.plus {
                if !(root && dollar) {
                    stack.push((plus, i + 1));
                }
            }
        }
    }
}

/// The precompiled index of one action's rules.
#[derive(Debug, Default, Clone)]
struct Index {
    /// All rules of the action, in file order (subscribe and create walk this).
    all: Vec<u32>,
    /// Static `topic:` patterns.
    exact: HashMap<String, Vec<u32>>,
    /// Static `filter:` patterns.
    trie: Trie,
    /// Regexes and patterns with placeholders, in file order: checked one by one.
    dynamic: Vec<u32>,
}

/// A parsed, precompiled ACL. Cheap to share (`Arc<Acl>`), immutable; reload by parsing a new
/// one and swapping it in.
#[derive(Debug, Clone)]
pub struct Acl {
    file: Arc<str>,
    rules: Vec<Rule>,
    default_allow: bool,
    /// Line of the `default` directive, if any.
    default_line: Option<usize>,
    index: [Index; 3],
}

impl Acl {
    /// Parse ACL text; `source_name` (usually the path) names the file in errors and in
    /// [`RuleRef`]s.
    pub fn parse(text: &str, source_name: &str) -> Result<Acl, ParseError> {
        parse(text, source_name)
    }

    /// Read and parse the ACL file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Acl, LoadError> {
        let path = path.as_ref();
        let text = read_file(path)?;
        Ok(parse(&text, &path.display().to_string())?)
    }

    /// The embedded copy of `acl/default.acl` (source name `<embedded default.acl>`).
    pub fn embedded_default() -> Acl {
        match parse(DEFAULT_ACL, "<embedded default.acl>") {
            Ok(acl) => acl,
            // The embedded file is checked by the tests; fall back to deny-everything.
            Err(_) => Acl::deny_all(),
        }
    }

    /// No rules, default allow (what a broker without an ACL does).
    pub fn allow_all() -> Acl {
        Acl::empty(true)
    }

    /// No rules, default deny.
    pub fn deny_all() -> Acl {
        Acl::empty(false)
    }

    fn empty(default_allow: bool) -> Acl {
        Acl {
            file: Arc::from("<none>"),
            rules: Vec::new(),
            default_allow,
            default_line: None,
            index: Default::default(),
        }
    }

    /// The source name given to [`parse`](Self::parse) or the path given to
    /// [`load`](Self::load).
    pub fn source_name(&self) -> &str {
        &self.file
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// No rules?
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The result when no rule matches.
    pub fn default_allows(&self) -> bool {
        self.default_allow
    }

    fn decided(&self, rule: &Rule) -> Decision {
        Decision {
            allowed: rule.allow,
            rule: Some(RuleRef {
                file: self.file.clone(),
                line: rule.line,
            }),
            by: DecidedBy::Rule,
        }
    }

    fn by_default(&self) -> Decision {
        Decision {
            allowed: self.default_allow,
            rule: None,
            by: DecidedBy::Default,
        }
    }

    fn invalid() -> Decision {
        Decision {
            allowed: false,
            rule: None,
            by: DecidedBy::InvalidRequest,
        }
    }

    /// Authorize one request: the first rule that matches decides, else the default.
    ///
    /// A subscription `$share/<group>/<filter>` is checked on `<filter>` (and the group, for
    /// `group:` rules); everything else on the full string. An invalid topic name, filter or
    /// stream object is denied ([`DecidedBy::InvalidRequest`]).
    pub fn check(&self, req: &Request<'_>) -> Decision {
        let ip = req.ip.to_canonical();
        let index = &self.index[req.action.index()];
        match req.action {
            Action::Publish => {
                if !valid_topic_name(req.topic) {
                    return Self::invalid();
                }
                self.check_publish(index, req, ip)
            }
            Action::Subscribe => {
                let (group, filter) = match parse_shared(req.topic) {
                    Ok(Some(s)) => (Some(s.group), s.filter),
                    Ok(None) if valid_filter(req.topic) => (None, req.topic),
                    _ => return Self::invalid(),
                };
                for &i in &index.all {
                    let Some(rule) = self.rules.get(i as usize) else {
                        continue;
                    };
                    if rule.who_matches(req.username, req.client_id, ip)
                        && rule.group_matches(group)
                        && rule.filter_matches(filter, req.username, req.client_id)
                    {
                        return self.decided(rule);
                    }
                }
                self.by_default()
            }
            Action::Create => {
                if req.topic.is_empty() || req.topic.contains('\0') {
                    return Self::invalid();
                }
                for &i in &index.all {
                    let Some(rule) = self.rules.get(i as usize) else {
                        continue;
                    };
                    if rule.who_matches(req.username, req.client_id, ip)
                        && rule.topic_matches(req.topic, req.username, req.client_id)
                    {
                        return self.decided(rule);
                    }
                }
                self.by_default()
            }
        }
    }

    fn check_publish(&self, index: &Index, req: &Request<'_>, ip: IpAddr) -> Decision {
        // Candidates whose pattern is known to match: exact hits and trie hits.
        let mut cands: Vec<u32> = Vec::new();
        if let Some(v) = index.exact.get(req.topic) {
            cands.extend_from_slice(v);
        }
        index.trie.collect(req.topic, &mut cands);
        cands.sort_unstable();
        // Merge with the dynamic rules (which still need their pattern checked), in file order.
        let mut c = cands.iter().peekable();
        let mut d = index.dynamic.iter().peekable();
        loop {
            let (i, known) = match (c.peek(), d.peek()) {
                (Some(&&ci), Some(&&di)) if ci <= di => {
                    c.next();
                    (ci, true)
                }
                (_, Some(&&di)) => {
                    d.next();
                    (di, false)
                }
                (Some(&&ci), None) => {
                    c.next();
                    (ci, true)
                }
                (None, None) => return self.by_default(),
            };
            let Some(rule) = self.rules.get(i as usize) else {
                continue;
            };
            if rule.who_matches(req.username, req.client_id, ip)
                && (known || rule.topic_matches(req.topic, req.username, req.client_id))
            {
                return self.decided(rule);
            }
        }
    }

    /// Authorize a SUBSCRIBE completely: the subscription itself and, when `auto_create` is
    /// true (the broker found no stream of that name and would create one), `create` on the
    /// stream and `subscribe` on the filter the new stream would capture:
    ///
    /// * `$stream/<name>/<filter>`: `create` on `$stream/<name>`, `subscribe` on `<filter>`;
    /// * `$s/<offset>/<filter>` (default name `/<filter>`): `create` on `$stream//<filter>`,
    ///   `subscribe` on `<filter>`.
    ///
    /// `req.action` is ignored. The first denial is returned; if everything is allowed, the
    /// decision on the subscription itself. A `$stream/<name>` without a filter cannot create
    /// a stream, so `auto_create` changes nothing for it.
    pub fn check_subscribe(&self, req: &Request<'_>, auto_create: bool) -> Decision {
        let sub = Request {
            action: Action::Subscribe,
            ..*req
        };
        let d = self.check(&sub);
        if !d.allowed || !auto_create {
            return d;
        }
        let inner = match parse_shared(req.topic) {
            Ok(Some(s)) => s.filter,
            _ => req.topic,
        };
        let Some((object, filter)) = stream_creation(inner) else {
            return d;
        };
        let create = self.check(&Request {
            action: Action::Create,
            topic: &object,
            ..*req
        });
        if !create.allowed {
            return create;
        }
        let embedded = self.check(&Request {
            action: Action::Subscribe,
            topic: filter,
            ..*req
        });
        if !embedded.allowed {
            return embedded;
        }
        d
    }
}

/// For a subscription that can auto-create a stream: the `create` object and the filter.
fn stream_creation(filter: &str) -> Option<(String, &str)> {
    match split_stream_topic(filter)? {
        StreamTopicParts::Named {
            name,
            filter: Some(f),
        } if !name.is_empty() && !f.is_empty() => Some((format!("$stream/{name}"), f)),
        StreamTopicParts::Legacy {
            filter: Some(f), ..
        } if !f.is_empty() => Some((format!("$stream//{f}"), f)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer

/// One character of a token: the character, whether it was inside quotes, its column.
#[derive(Debug, Clone, Copy)]
struct Ch {
    c: char,
    quoted: bool,
    col: usize,
}

#[derive(Debug, Clone)]
struct Token {
    chars: Vec<Ch>,
    col: usize,
}

impl Token {
    fn text(&self) -> String {
        self.chars.iter().map(|c| c.c).collect()
    }

    /// Split on an unquoted separator; empty parts are kept (the caller reports them).
    fn split(&self, sep: char) -> Vec<Token> {
        let mut parts = Vec::new();
        let mut cur = Token {
            chars: Vec::new(),
            col: self.col,
        };
        for ch in &self.chars {
            if ch.c == sep && !ch.quoted {
                let next_col = ch.col + 1;
                parts.push(std::mem::replace(
                    &mut cur,
                    Token {
                        chars: Vec::new(),
                        col: next_col,
                    },
                ));
            } else {
                cur.chars.push(*ch);
            }
        }
        parts.push(cur);
        parts
    }

    /// If the token starts with the unquoted `prefix`, the rest of it.
    fn strip_prefix(&self, prefix: &str) -> Option<Token> {
        let n = prefix.chars().count();
        if self.chars.len() < n {
            return None;
        }
        let head = self.chars.get(..n)?;
        if head.iter().map(|c| c.c).eq(prefix.chars()) && head.iter().all(|c| !c.quoted) {
            let rest = self.chars.get(n..).unwrap_or_default().to_vec();
            let col = rest.first().map_or(self.col + n, |c| c.col);
            Some(Token { chars: rest, col })
        } else {
            None
        }
    }

    fn is(&self, word: &str) -> bool {
        self.chars.iter().all(|c| !c.quoted) && self.chars.iter().map(|c| c.c).eq(word.chars())
    }
}

/// Tokens of one line (comment stripped); `Err((column, message))`.
fn tokenize(line: &str) -> Result<Vec<Token>, (usize, String)> {
    let mut tokens = Vec::new();
    let mut it = line.chars().enumerate().map(|(i, c)| (i + 1, c)).peekable();
    loop {
        while it.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, first)) = it.peek() else {
            break;
        };
        if first == '#' {
            break;
        }
        let mut tok = Token {
            chars: Vec::new(),
            col: start,
        };
        let mut quote_at: Option<usize> = None;
        while let Some(&(col, c)) = it.peek() {
            if quote_at.is_none() && c.is_whitespace() {
                break;
            }
            it.next();
            if c == '\0' {
                return Err((col, "NUL character".into()));
            }
            match (quote_at, c) {
                (None, '"') => quote_at = Some(col),
                (Some(_), '"') => quote_at = None,
                (Some(_), '\\') => match it.next() {
                    Some((_, e @ ('"' | '\\'))) => tok.chars.push(Ch {
                        c: e,
                        quoted: true,
                        col,
                    }),
                    Some((ecol, _)) => {
                        return Err((ecol, "unknown escape (only \\\" and \\\\)".into()))
                    }
                    None => return Err((col, "unterminated quote".into())),
                },
                (q, c) => tok.chars.push(Ch {
                    c,
                    quoted: q.is_some(),
                    col,
                }),
            }
        }
        if let Some(q) = quote_at {
            return Err((q, "unterminated quote".into()));
        }
        tokens.push(tok);
    }
    Ok(tokens)
}

// ---------------------------------------------------------------------------------------------
// Parser

struct Ctx<'a> {
    file: &'a str,
    line: usize,
}

impl Ctx<'_> {
    fn err(&self, column: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            file: self.file.to_string(),
            line: self.line,
            column,
            message: message.into(),
        }
    }
}

fn parse(text: &str, source_name: &str) -> Result<Acl, ParseError> {
    let mut rules: Vec<Rule> = Vec::new();
    let mut default: Option<(bool, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let ctx = Ctx {
            file: source_name,
            line: i + 1,
        };
        let tokens = tokenize(line).map_err(|(c, m)| ctx.err(c, m))?;
        let end_col = line.chars().count() + 1;
        let Some(first) = tokens.first() else {
            continue;
        };
        if first.is("default") {
            let Some(v) = tokens.get(1) else {
                return Err(ctx.err(end_col, "expected `allow` or `deny` after `default`"));
            };
            let allow = if v.is("allow") {
                true
            } else if v.is("deny") {
                false
            } else {
                return Err(ctx.err(v.col, "expected `allow` or `deny` after `default`"));
            };
            if let Some(extra) = tokens.get(2) {
                return Err(ctx.err(extra.col, "unexpected text after `default allow|deny`"));
            }
            if let Some((_, prev)) = default {
                return Err(ctx.err(
                    first.col,
                    format!("second `default` directive (the first is on line {prev})"),
                ));
            }
            default = Some((allow, ctx.line));
            continue;
        }
        let allow = if first.is("allow") {
            true
        } else if first.is("deny") {
            false
        } else {
            return Err(ctx.err(
                first.col,
                format!(
                    "expected `allow`, `deny` or `default`, found {:?}",
                    first.text()
                ),
            ));
        };
        let who_tok = tokens.get(1).ok_or_else(|| {
            ctx.err(
                end_col,
                "expected who: all, anonymous, user:NAME, client:ID or ip:CIDR",
            )
        })?;
        let who = parse_who(&ctx, who_tok)?;
        let act_tok = tokens.get(2).ok_or_else(|| {
            ctx.err(
                end_col,
                "expected actions: publish, subscribe, create or all (comma-separated)",
            )
        })?;
        let actions = parse_actions(&ctx, act_tok)?;
        let pat_tok = tokens.get(3).ok_or_else(|| {
            ctx.err(
                end_col,
                "expected a pattern: topic:EXACT, filter:FILTER or re:REGEX",
            )
        })?;
        let pattern = parse_pattern(&ctx, pat_tok)?;
        let mut group = None;
        for q in tokens.iter().skip(4) {
            let Some(g) = q.strip_prefix("group:") else {
                return Err(ctx.err(
                    q.col,
                    format!(
                        "unexpected {:?} (the only qualifier is group:NAME or group:*)",
                        q.text()
                    ),
                ));
            };
            if group.is_some() {
                return Err(ctx.err(q.col, "second group: qualifier"));
            }
            if actions != Action::Subscribe.bit() {
                return Err(ctx.err(
                    q.col,
                    "group: applies to shared subscriptions: the actions must be `subscribe`",
                ));
            }
            let name = g.text();
            if name.is_empty() || name.contains(['/', '+', '#', '\0']) {
                return Err(ctx.err(
                    g.col,
                    "a share group name is non-empty, without '/', '+' or '#'",
                ));
            }
            group = Some(if g.is("*") {
                Group::Any
            } else {
                Group::Named(name)
            });
        }
        rules.push(Rule {
            allow,
            who,
            actions,
            pattern,
            group,
            line: ctx.line,
        });
    }
    let (default_allow, default_line) = match default {
        Some((a, l)) => (a, Some(l)),
        None => (false, None),
    };
    let mut index: [Index; 3] = Default::default();
    for (i, rule) in rules.iter().enumerate() {
        let Ok(i) = u32::try_from(i) else {
            return Err(ParseError {
                file: source_name.to_string(),
                line: rule.line,
                column: 1,
                message: "too many rules".into(),
            });
        };
        for action in [Action::Publish, Action::Subscribe, Action::Create] {
            if rule.actions & action.bit() == 0 {
                continue;
            }
            let ix = &mut index[action.index()];
            ix.all.push(i);
            if action != Action::Publish {
                continue;
            }
            match &rule.pattern {
                Pattern::Exact(Template { fixed: Some(t), .. }) => {
                    ix.exact.entry(t.clone()).or_default().push(i)
                }
                Pattern::Filter(Template { fixed: Some(f), .. }) => ix.trie.insert(f, i),
                _ => ix.dynamic.push(i),
            }
        }
    }
    Ok(Acl {
        file: Arc::from(source_name),
        rules,
        default_allow,
        default_line,
        index,
    })
}

fn parse_who(ctx: &Ctx<'_>, tok: &Token) -> Result<Vec<Cond>, ParseError> {
    let mut conds = Vec::new();
    for part in tok.split('&') {
        if part.chars.is_empty() {
            return Err(ctx.err(
                part.col,
                "empty condition in who (conditions are joined with `&`)",
            ));
        }
        let cond = if part.is("all") {
            Cond::All
        } else if part.is("anonymous") {
            Cond::Anonymous
        } else if let Some(u) = part.strip_prefix("user:") {
            if u.chars.is_empty() {
                return Err(ctx.err(u.col, "empty username"));
            }
            Cond::User(u.text())
        } else if let Some(c) = part.strip_prefix("client:") {
            if c.chars.is_empty() {
                return Err(ctx.err(c.col, "empty client id"));
            }
            Cond::Client(c.text())
        } else if let Some(a) = part.strip_prefix("ip:") {
            Cond::Ip(parse_cidr(&a.text()).map_err(|m| ctx.err(a.col, m))?)
        } else {
            return Err(ctx.err(
                part.col,
                format!(
                    "unknown who {:?}: all, anonymous, user:NAME, client:ID or ip:CIDR",
                    part.text()
                ),
            ));
        };
        conds.push(cond);
    }
    Ok(conds)
}

fn parse_cidr(s: &str) -> Result<Cidr, String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
    let addr = addr.to_canonical();
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| format!("prefix length {p:?} is not 0..={max}"))?,
    };
    Ok(Cidr { addr, prefix })
}

fn parse_actions(ctx: &Ctx<'_>, tok: &Token) -> Result<u8, ParseError> {
    let mut bits = 0;
    for part in tok.split(',') {
        bits |= if part.is("publish") {
            Action::Publish.bit()
        } else if part.is("subscribe") {
            Action::Subscribe.bit()
        } else if part.is("create") {
            Action::Create.bit()
        } else if part.is("all") {
            7
        } else {
            return Err(ctx.err(
                part.col,
                format!(
                    "unknown action {:?}: publish, subscribe, create or all",
                    part.text()
                ),
            ));
        };
    }
    Ok(bits)
}

fn parse_template(text: &str) -> Template {
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut it = text.chars().peekable();
    while let Some(c) = it.next() {
        if c == '%' {
            match it.peek() {
                Some('u') | Some('c') => {
                    if !lit.is_empty() {
                        pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                    }
                    pieces.push(if it.next() == Some('u') {
                        Piece::User
                    } else {
                        Piece::Client
                    });
                    continue;
                }
                Some('%') => {
                    it.next();
                }
                _ => {}
            }
        }
        lit.push(c);
    }
    if !lit.is_empty() {
        pieces.push(Piece::Lit(lit));
    }
    let fixed = match pieces.as_slice() {
        [] => Some(String::new()),
        [Piece::Lit(s)] => Some(s.clone()),
        _ => None,
    };
    Template { pieces, fixed }
}

/// The template with placeholders replaced by `x`, for validation.
fn sample(t: &Template) -> String {
    t.pieces
        .iter()
        .map(|p| match p {
            Piece::Lit(s) => s.as_str(),
            Piece::User | Piece::Client => "x",
        })
        .collect()
}

fn parse_pattern(ctx: &Ctx<'_>, tok: &Token) -> Result<Pattern, ParseError> {
    if let Some(t) = tok.strip_prefix("topic:") {
        let tpl = parse_template(&t.text());
        let s = sample(&tpl);
        if s.is_empty() {
            return Err(ctx.err(t.col, "empty topic"));
        }
        if s.starts_with("$share/") {
            return Err(ctx.err(
                t.col,
                "$share/ subscriptions are matched on their inner filter: write the filter and add group:NAME",
            ));
        }
        return Ok(Pattern::Exact(tpl));
    }
    if let Some(f) = tok.strip_prefix("filter:") {
        let tpl = parse_template(&f.text());
        let s = sample(&tpl);
        if !valid_filter(&s) {
            return Err(ctx.err(
                f.col,
                format!("{:?} is not a valid MQTT topic filter", f.text()),
            ));
        }
        if s.starts_with("$share/") || s == "$share" {
            return Err(ctx.err(
                f.col,
                "$share/ subscriptions are matched on their inner filter: write the filter and add group:NAME",
            ));
        }
        return Ok(Pattern::Filter(tpl));
    }
    if let Some(r) = tok.strip_prefix("re:") {
        let src = r.text();
        if src.is_empty() {
            return Err(ctx.err(r.col, "empty regular expression"));
        }
        let re = RegexBuilder::new(&format!("^(?:{src})$"))
            .size_limit(1 << 20)
            .dfa_size_limit(1 << 20)
            .build()
            .map_err(|e| {
                let msg = e.to_string().replace('\n', " ");
                ctx.err(r.col, format!("invalid regular expression: {msg}"))
            })?;
        return Ok(Pattern::Regex(re));
    }
    Err(ctx.err(
        tok.col,
        format!(
            "expected a pattern topic:EXACT, filter:FILTER or re:REGEX, found {:?}",
            tok.text()
        ),
    ))
}

impl Acl {
    /// Line of the `default` directive (`None`: absent, so the default is deny).
    pub fn default_line(&self) -> Option<usize> {
        self.default_line
    }
}
