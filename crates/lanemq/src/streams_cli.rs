//! `lanemq streams ...`: a command-line client of the REST admin API (`/api/v5`).

use crate::admin_client::{print_pretty, segment, ConnArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{Map, Value};

/// `lanemq streams ...`: the connection options and the subcommand.
#[derive(Args)]
pub struct StreamsArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: StreamsCommand,
}

#[derive(Subcommand)]
enum StreamsCommand {
    /// List every stream (name, filter, last-value, messages).
    List {
        /// Streams fetched per request.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print the streams as a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one stream with its figures.
    Show { name: String },
    /// Create a stream from flags or from a JSON body.
    Create {
        #[command(flatten)]
        fields: StreamFields,
    },
    /// Change a stream: the JSON body replaces the definition; flags are merged over the
    /// current definition (topic_filter and is_lastvalue cannot change).
    Update {
        #[arg(id = "stream", value_name = "NAME")]
        name: String,
        #[command(flatten)]
        fields: StreamFields,
    },
    /// Delete a stream and its messages.
    Delete { name: String },
    /// Print the global stream settings, or replace them with --json.
    Config {
        /// The new settings (JSON; `@FILE` reads a file, `-` stdin).
        #[arg(long)]
        json: Option<String>,
    },
}

#[derive(Args)]
struct StreamFields {
    /// The whole request body (JSON; `@FILE` reads a file, `-` stdin); excludes the flags.
    #[arg(
        long,
        conflicts_with_all = ["name", "filter", "lastvalue", "key_expression", "retention",
            "max_messages", "max_bytes", "read_max_unacked"]
    )]
    json: Option<String>,
    /// Stream name (create only).
    #[arg(long)]
    name: Option<String>,
    /// MQTT topic filter the stream captures (create only).
    #[arg(long)]
    filter: Option<String>,
    /// Last-value stream: the newest message per key replaces older ones (create only).
    #[arg(long)]
    lastvalue: bool,
    /// Key expression, e.g. `message.from`, `message.topic`.
    #[arg(long)]
    key_expression: Option<String>,
    /// Data retention period: 7d, 12h, 30m, 10s, 500ms.
    #[arg(long)]
    retention: Option<String>,
    /// Most messages held: a number or `infinity`.
    #[arg(long)]
    max_messages: Option<String>,
    /// Most bytes held: 1048576, 64KB, 10MB, 2GB or `infinity`.
    #[arg(long)]
    max_bytes: Option<String>,
    /// Messages a subscriber may have unacknowledged.
    #[arg(long)]
    read_max_unacked: Option<u32>,
}

impl StreamFields {
    fn has_flags(&self) -> bool {
        self.name.is_some()
            || self.filter.is_some()
            || self.lastvalue
            || self.key_expression.is_some()
            || self.retention.is_some()
            || self.max_messages.is_some()
            || self.max_bytes.is_some()
            || self.read_max_unacked.is_some()
    }

    /// Writes the given flags into `obj` (a stream definition).
    fn merge_into(&self, obj: &mut Map<String, Value>) {
        let limit = |s: &str| match s.trim().parse::<u64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::String(s.trim().to_string()),
        };
        if let Some(n) = &self.name {
            obj.insert("name".into(), Value::String(n.clone()));
        }
        if let Some(f) = &self.filter {
            obj.insert("topic_filter".into(), Value::String(f.clone()));
        }
        if self.lastvalue {
            obj.insert("is_lastvalue".into(), Value::Bool(true));
        }
        if let Some(k) = &self.key_expression {
            obj.insert("key_expression".into(), Value::String(k.clone()));
        }
        if let Some(r) = &self.retention {
            obj.insert("data_retention_period".into(), Value::String(r.clone()));
        }
        if self.max_messages.is_some() || self.max_bytes.is_some() {
            let limits = obj
                .entry("limits")
                .or_insert_with(|| Value::Object(Map::new()));
            if !limits.is_object() {
                *limits = Value::Object(Map::new());
            }
            if let Value::Object(l) = limits {
                if let Some(m) = &self.max_messages {
                    l.insert("max_message_count".into(), limit(m));
                }
                if let Some(b) = &self.max_bytes {
                    l.insert("max_message_bytes".into(), limit(b));
                }
            }
        }
        if let Some(n) = self.read_max_unacked {
            obj.insert("read_max_unacked".into(), Value::from(n));
        }
    }
}

/// A `--json` argument: inline JSON, `@FILE` or `-` (stdin); checked to be JSON.
fn json_arg(arg: &str) -> Result<Value> {
    let text = if arg == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("cannot read the JSON body from stdin")?;
        s
    } else if let Some(path) = arg.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?
    } else {
        arg.to_string()
    };
    serde_json::from_str(&text).context("--json: not valid JSON")
}

/// The stream definition part of a `StreamInfo` (drops the figures).
fn definition(info: &Value) -> Map<String, Value> {
    let mut obj = info.as_object().cloned().unwrap_or_default();
    obj.remove("created_at_us");
    obj.remove("stats");
    obj
}

fn table(streams: &[Value]) {
    let rows: Vec<[String; 4]> = streams
        .iter()
        .map(|s| {
            let txt = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            [
                txt("name"),
                txt("topic_filter"),
                s.get("is_lastvalue")
                    .and_then(Value::as_bool)
                    .map_or_else(String::new, |b| if b { "yes" } else { "no" }.to_string()),
                s.pointer("/stats/message_count")
                    .and_then(Value::as_u64)
                    .map_or_else(String::new, |n| n.to_string()),
            ]
        })
        .collect();
    let head = ["NAME", "FILTER", "LASTVALUE", "MESSAGES"];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |c: [&str; 4]| {
        println!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
            c[0],
            c[1],
            c[2],
            c[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        )
    };
    line(head);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3]]);
    }
}

pub fn run(args: StreamsArgs) -> Result<()> {
    let api = args.conn.api()?;
    match args.command {
        StreamsCommand::List { limit, json } => {
            if limit == 0 {
                bail!("--limit must be at least 1");
            }
            let mut all = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let mut path = format!("/api/v5/streams?limit={limit}");
                if let Some(c) = &cursor {
                    path.push_str(&format!("&cursor={}", segment(c)));
                }
                let (_, page) = api.call("GET", &path, None)?;
                if let Some(items) = page.get("data").and_then(Value::as_array) {
                    all.extend(items.iter().cloned());
                }
                let next = page
                    .pointer("/meta/hasnext")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                cursor = page
                    .pointer("/meta/cursor")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if !next || cursor.is_none() {
                    break;
                }
            }
            if json {
                print_pretty(&Value::Array(all))
            } else {
                table(&all);
                Ok(())
            }
        }
        StreamsCommand::Show { name } => {
            let (_, v) = api.call("GET", &format!("/api/v5/stream/{}", segment(&name)), None)?;
            print_pretty(&v)
        }
        StreamsCommand::Create { fields } => {
            let body = match &fields.json {
                Some(j) => json_arg(j)?,
                None => {
                    if fields.name.is_none() || fields.filter.is_none() {
                        bail!("create needs --name and --filter (or --json BODY)");
                    }
                    let mut obj = Map::new();
                    fields.merge_into(&mut obj);
                    Value::Object(obj)
                }
            };
            let (_, v) = api.call("POST", "/api/v5/streams", Some(&body))?;
            print_pretty(&v)
        }
        StreamsCommand::Update { name, fields } => {
            let path = format!("/api/v5/stream/{}", segment(&name));
            let body = match &fields.json {
                Some(j) => json_arg(j)?,
                None => {
                    if !fields.has_flags() {
                        bail!("update needs --json BODY or at least one field flag");
                    }
                    let (_, cur) = api.call("GET", &path, None)?;
                    let mut obj = definition(&cur);
                    fields.merge_into(&mut obj);
                    Value::Object(obj)
                }
            };
            let (_, v) = api.call("PUT", &path, Some(&body))?;
            print_pretty(&v)
        }
        StreamsCommand::Delete { name } => {
            api.call(
                "DELETE",
                &format!("/api/v5/stream/{}", segment(&name)),
                None,
            )?;
            println!("stream {name} deleted");
            Ok(())
        }
        StreamsCommand::Config { json } => {
            let (_, v) = match json {
                Some(j) => api.call("PUT", "/api/v5/streams/config", Some(&json_arg(&j)?))?,
                None => api.call("GET", "/api/v5/streams/config", None)?,
            };
            print_pretty(&v)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flags_merge_over_a_definition() {
        let f = StreamFields {
            json: None,
            name: None,
            filter: None,
            lastvalue: false,
            key_expression: None,
            retention: Some("1d".into()),
            max_messages: Some("10".into()),
            max_bytes: Some("10MB".into()),
            read_max_unacked: Some(5),
        };
        let mut obj: Map<String, Value> = serde_json::from_str(
            r#"{"name":"a","topic_filter":"t/#","limits":{"max_message_count":"infinity"}}"#,
        )
        .unwrap();
        f.merge_into(&mut obj);
        let v = Value::Object(obj);
        assert_eq!(v["data_retention_period"], "1d");
        assert_eq!(v["limits"]["max_message_count"], 10);
        assert_eq!(v["limits"]["max_message_bytes"], "10MB");
        assert_eq!(v["read_max_unacked"], 5);
        assert_eq!(v["topic_filter"], "t/#");
    }
}
