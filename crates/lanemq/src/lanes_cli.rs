//! `lanemq lanes ...`: lite parents, lanes, groups and metrics through the REST admin API
//! (`/api/v5/lite/...`, docs/admin-api.md#lanes). Same connection options as
//! `lanemq streams`.

use crate::admin_client::{print_pretty, segment, Api, ConnArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

/// `lanemq lanes ...`: the connection options and the subcommand.
#[derive(Args)]
pub struct LanesArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: LanesCommand,
}

#[derive(Subcommand)]
enum LanesCommand {
    /// List the lite parents (name, pattern, mode, TTL, lanes).
    Parents {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one lite parent.
    Parent { name: String },
    /// Create a lite parent from a JSON or TOML file (`-`: stdin).
    Create {
        /// The parent definition: JSON, or TOML (`name = "agents"`, `pattern = "agents/{lane}/#"`, ...).
        #[arg(long, short)]
        file: String,
    },
    /// Replace a lite parent's definition with a JSON or TOML file (omitted fields take their
    /// defaults; `name` may be omitted).
    Update {
        name: String,
        #[arg(long, short)]
        file: String,
    },
    /// Delete a lite parent with its lanes and groups.
    Delete { name: String },
    /// List lanes of a parent, sorted by key.
    List {
        parent: String,
        /// Start strictly after this lane key (the cursor printed by a previous listing).
        #[arg(long)]
        after: Option<String>,
        /// Most lanes printed (pages are fetched following the cursor).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one lane with the figures of every group.
    Show { parent: String, lane: String },
    /// List the consumer groups of a parent.
    Groups {
        parent: String,
        #[arg(long)]
        json: bool,
    },
    /// The lag of one group on each lane of a parent.
    Lag {
        parent: String,
        group: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Print the lite metrics (Prometheus text).
    Metrics,
}

/// Largest page asked for at once.
const PAGE_MAX: usize = 1000;

/// A parent definition file: JSON, else TOML (either way sent as JSON).
fn body_file(arg: &str) -> Result<Value> {
    let text = if arg == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("cannot read the definition from stdin")?;
        s
    } else {
        std::fs::read_to_string(arg).with_context(|| format!("cannot read {arg}"))?
    };
    parse_body(&text).with_context(|| format!("--file {arg}"))
}

fn parse_body(text: &str) -> Result<Value> {
    let json_err = match serde_json::from_str::<Value>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match toml::from_str::<Value>(text) {
        Ok(v) => Ok(v),
        Err(toml_err) => {
            let looks_json = text.trim_start().starts_with('{');
            if looks_json {
                bail!("not valid JSON: {json_err}")
            } else {
                bail!("neither JSON nor TOML: {}", toml_err.message())
            }
        }
    }
}

/// Fetches up to `limit` items of a cursor-paginated listing at `base` (which ends with `?`);
/// the cursor when more follow.
fn pages(
    api: &Api,
    base: &str,
    after: Option<String>,
    limit: usize,
) -> Result<(Vec<Value>, Option<String>)> {
    if limit == 0 {
        bail!("--limit must be at least 1");
    }
    let mut all = Vec::new();
    let mut cursor = after;
    loop {
        let want = (limit - all.len()).min(PAGE_MAX);
        let mut path = format!("{base}limit={want}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&after={}", segment(c)));
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
            return Ok((all, None));
        }
        if all.len() >= limit {
            return Ok((all, cursor));
        }
    }
}

use lanemq_store::now_us;

/// `12s`, `3m20s`, `2h5m`, `4d1h`.
fn human(us: u64) -> String {
    let s = us / 1_000_000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Prints rows as aligned columns (numbers right-aligned).
fn table(head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..head.len())
        .map(|i| {
            !rows.is_empty()
                && rows
                    .iter()
                    .all(|r| r[i].chars().all(|c| c.is_ascii_digit()) && !r[i].is_empty())
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = w[i].saturating_sub(c.chars().count());
            if numeric[i] {
                out.push_str(&" ".repeat(pad));
                out.push_str(c);
            } else {
                out.push_str(c);
                if i + 1 < cells.len() {
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        println!("{out}");
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

fn txt(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(x) => x.to_string(),
    }
}

fn more_hint(cursor: Option<String>, what: &str) {
    if let Some(c) = cursor {
        eprintln!("more {what} follow: --after {c:?}");
    }
}

/// `GET /lite/metrics` as Prometheus text.
fn metrics_text(api: &Api) -> Result<String> {
    let auth = format!("Bearer {}", api.token);
    let path = "/api/v5/lite/metrics";
    let r = lanemq_admin::client::request_with_headers(
        &api.addr,
        "GET",
        path,
        &[("Authorization", &auth), ("Accept", "text/plain")],
        None,
    )
    .with_context(|| format!("cannot reach the admin API at {}", api.addr))?;
    if r.status >= 400 {
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        bail!(
            "GET {path}: HTTP {} {}: {}",
            r.status,
            v.get("code").and_then(Value::as_str).unwrap_or(""),
            v.get("message")
                .and_then(Value::as_str)
                .unwrap_or(r.body.trim())
        );
    }
    Ok(r.body)
}

pub fn run(args: LanesArgs) -> Result<()> {
    let api = args.conn.api()?;
    let parent_path = |p: &str| format!("/api/v5/lite/parents/{}", segment(p));
    match args.command {
        LanesCommand::Parents { json } => {
            let (_, v) = api.call("GET", "/api/v5/lite/parents", None)?;
            let items = v
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if json {
                return print_pretty(&Value::Array(items));
            }
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|p| {
                    vec![
                        txt(p, "name"),
                        txt(p, "pattern"),
                        txt(p, "mode"),
                        txt(p, "ttl_s"),
                        txt(p, "lanes"),
                    ]
                })
                .collect();
            table(&["NAME", "PATTERN", "MODE", "TTL_S", "LANES"], &rows);
            Ok(())
        }
        LanesCommand::Parent { name } => {
            let (_, v) = api.call("GET", &parent_path(&name), None)?;
            print_pretty(&v)
        }
        LanesCommand::Create { file } => {
            let body = body_file(&file)?;
            let (_, v) = api.call("POST", "/api/v5/lite/parents", Some(&body))?;
            print_pretty(&v)
        }
        LanesCommand::Update { name, file } => {
            let body = body_file(&file)?;
            let (_, v) = api.call("PUT", &parent_path(&name), Some(&body))?;
            print_pretty(&v)
        }
        LanesCommand::Delete { name } => {
            api.call("DELETE", &parent_path(&name), None)?;
            println!("lite parent {name} deleted");
            Ok(())
        }
        LanesCommand::List {
            parent,
            after,
            limit,
            json,
        } => {
            let base = format!("{}/lanes?", parent_path(&parent));
            let (lanes, cursor) = pages(&api, &base, after, limit)?;
            if json {
                print_pretty(&Value::Array(lanes))?;
            } else {
                let now = now_us();
                let rows: Vec<Vec<String>> = lanes
                    .iter()
                    .map(|l| {
                        let t = |k: &str| l.get(k).and_then(Value::as_u64).unwrap_or(0);
                        vec![
                            txt(l, "lane"),
                            txt(l, "first_offset"),
                            txt(l, "next_offset"),
                            format!("{} ago", human(now.saturating_sub(t("last_publish_us")))),
                            match t("expires_at_us").checked_sub(now) {
                                Some(d) => format!("in {}", human(d)),
                                None => "due".into(),
                            },
                        ]
                    })
                    .collect();
                table(&["LANE", "FIRST", "NEXT", "LAST_PUBLISH", "EXPIRES"], &rows);
            }
            more_hint(cursor, "lanes");
            Ok(())
        }
        LanesCommand::Show { parent, lane } => {
            let (_, v) = api.call(
                "GET",
                &format!("{}/lanes/{}", parent_path(&parent), segment(&lane)),
                None,
            )?;
            print_pretty(&v)
        }
        LanesCommand::Groups { parent, json } => {
            let (_, v) = api.call("GET", &format!("{}/groups", parent_path(&parent)), None)?;
            let items = v
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if json {
                return print_pretty(&Value::Array(items));
            }
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|g| {
                    vec![
                        txt(g, "group"),
                        g.get("members")
                            .and_then(Value::as_array)
                            .map_or(0, Vec::len)
                            .to_string(),
                        txt(g, "online_members"),
                        txt(g, "active_lanes"),
                        txt(g, "inflight"),
                    ]
                })
                .collect();
            table(
                &["GROUP", "MEMBERS", "ONLINE", "ACTIVE_LANES", "INFLIGHT"],
                &rows,
            );
            Ok(())
        }
        LanesCommand::Lag {
            parent,
            group,
            after,
            limit,
            json,
        } => {
            let base = format!("{}/groups/{}/lag?", parent_path(&parent), segment(&group));
            let (rows, cursor) = pages(&api, &base, after, limit)?;
            if json {
                print_pretty(&Value::Array(rows))?;
            } else {
                let total: u64 = rows
                    .iter()
                    .filter_map(|r| r.get("lag").and_then(Value::as_u64))
                    .sum();
                let cells: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            txt(r, "lane"),
                            txt(r, "committed"),
                            txt(r, "next_offset"),
                            txt(r, "lag"),
                            txt(r, "inflight"),
                            txt(r, "holder"),
                        ]
                    })
                    .collect();
                table(
                    &["LANE", "COMMITTED", "NEXT", "LAG", "INFLIGHT", "HOLDER"],
                    &cells,
                );
                println!("total lag {total} over {} lanes", rows.len());
            }
            more_hint(cursor, "lanes");
            Ok(())
        }
        LanesCommand::Metrics => {
            print!("{}", metrics_text(&api)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bodies_are_json_or_toml() {
        let j = parse_body(r#"{"name":"a","pattern":"a/{lane}/#","ttl_s":5}"#).unwrap();
        assert_eq!(j["ttl_s"], 5);
        let t =
            parse_body("name = \"a\"\npattern = \"a/{lane}/#\"\nmode = \"exclusive\"\n").unwrap();
        assert_eq!(t["mode"], "exclusive");
        assert_eq!(t["pattern"], "a/{lane}/#");
        assert!(parse_body("{\"name\": ").is_err());
        assert!(parse_body("name = ").is_err());
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(human(5_000_000), "5s");
        assert_eq!(human(200_000_000), "3m20s");
        assert_eq!(human(7_500_000_000), "2h5m");
        assert_eq!(human(90_000_000_000), "1d1h");
    }
}
