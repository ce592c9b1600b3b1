#!/usr/bin/env python3
"""Summarise lanemq-bench results: print a table and draw one chart per benchmark family.

Two inputs, one pipeline (results -> data JSON -> charts):

* RESULTS_DIR, written by interop/bench-vs-mosquitto.sh: files SCENARIO.BROKER.rROUND.json
  (lanemq-bench --json reports), machine.txt and meta.json (commit, date, load average at start
  and end, rounds). The table of medians (worst round, ratio lanemq/mosquitto) goes to stdout;
  the results are turned into family data files (throughput, latency, memory, slow-consumer)
  written with --data-out DIR, and charts DIR/FAMILY.svg with --out-dir DIR. When the brokers
  were driven with different MQTT versions (opts.mqtt_version, e.g. nats and rumqttd with 3.1.1),
  the table and each family's note say which.
* --data FILE.json (repeatable): a family data file, e.g. docs/bench-data/*.json, which holds
  figures transcribed from docs/benchmarks.md or written by --data-out. Its table goes to
  stdout, its chart to --out-dir DIR/FAMILY.svg.

A family data file: {"family", "title", "source", "commit", "date", "rounds", "loadavg", "note",
"panels": [{"title", "unit", "lower_is_better", "scale": "auto"|"linear"|"log", "groups": [...],
"series": [...], "values": {SERIES: [VALUE or null per group]}, "targets": [{"value", "label"}],
"note", "decimals" (of the value labels)}]}, where VALUE is {"median": x, "worst": y, "rounds": [...], "label": "bar label as
written"} (every key optional but one of median / rounds) or a plain number (a median). A bar is the median; a whisker spans the
rounds (min-max) when they are known, a marker shows the worst round when only it is known;
nothing else is drawn.

Charts use matplotlib (the SVG keeps text as text; a fixed svg.hashsalt and no date make a
re-render of the same data byte-identical). interop/bench-plot.sh runs this script in the venv
interop/.venv-plot with the pinned matplotlib. The table needs no matplotlib.

usage: bench_plot.py RESULTS_DIR [--svg FILE] [--out-dir DIR] [--data-out DIR]
       bench_plot.py --data FAMILY.json [--data ...] [--out-dir DIR] [--svg FILE]
"""

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import textwrap

# Fixed colours for the brokers we know; any other series takes the palette in order.
BROKER_COLORS = {
    "mosquitto": "#7f8c8d",
    "lanemq": "#2e86de",
    "nats": "#27ae60",
    "nats-server": "#27ae60",
    "rumqttd": "#e67e22",
}
BROKER_ORDER = list(BROKER_COLORS)
PALETTE = ["#8e44ad", "#16a085", "#c0392b", "#d4ac0d", "#34495e", "#e84393"]

# ------------------------------------------------------------------ results directory

# (scenario, label, metric key, unit, higher_is_better): the rows of the table.
METRICS = [
    ("fanin_q0", "QoS0 64B fan-in 10→1", "out", "msg/s", True),
    ("fanout_q0", "QoS0 64B fan-out 1→10", "out", "msg/s", True),
    ("fanin_q1", "QoS1 64B 10 pubs→1 sub", "out", "msg/s", True),
    ("fanin_q1_1k", "QoS1 1KiB 10 pubs→1 sub", "out", "msg/s", True),
    ("latency_q0", "latency p50 @50% load", "p50", "µs", False),
    ("latency_q0", "latency p99 @50% load", "p99", "µs", False),
    ("latency_q0", "latency p99.9 @50% load", "p999", "µs", False),
    ("idle", "RSS per idle connection, 1 s after connecting", "rss_conn", "bytes", False),
    ("idle", "RSS per idle connection, end of the hold", "rss_conn_end", "bytes", False),
    ("idle", "connect rate (CONNECT→CONNACK)", "conn_rate", "conn/s", True),
    ("fanin_q1", "QoS1 fan-in p99", "p99", "µs", False),
    ("rate_q0", "QoS0 10→1 at rate, delivered", "out", "msg/s", True),
    ("rate_q0", "QoS0 10→1 at rate, p99", "p99", "µs", False),
    ("slow_consumer_q0", "+ stuck QoS0 sub: delivered", "out", "msg/s", True),
    ("slow_consumer_q0", "+ stuck QoS0 sub: p99", "p99", "µs", False),
    ("slow_consumer_q1", "QoS1 + stuck persistent: published", "in", "msg/s", True),
    ("slow_consumer_q1", "QoS1 + stuck persistent: delivered", "out", "msg/s", True),
    ("slow_consumer_q1", "QoS1 + stuck persistent: p99", "p99", "µs", False),
    ("slow_consumer_q1", "QoS1 + stuck persistent: RSS", "rss", "KiB", False),
]


def metric(report, key):
    if key == "out":
        return report.get("msgs_per_sec_out")
    if key == "in":
        return report.get("msgs_per_sec_in")
    if key == "rss":
        return report.get("broker_rss_max_kb")
    if key in ("p50", "p99", "p999"):
        lat = report.get("latency") or {}
        return lat.get(key + "_us")
    if key == "rss_conn":
        idle = report.get("idle") or {}
        return idle.get("rss_per_connection_bytes")
    if key == "rss_conn_end":
        idle = report.get("idle") or {}
        return idle.get("rss_per_connection_end_bytes")
    if key == "conn_rate":
        idle = report.get("idle") or {}
        secs, n = idle.get("connect_secs"), idle.get("connected")
        return n / secs if secs and n else None
    return None


def load(results):
    data = {}  # (scenario, broker) -> [reports]
    pat = re.compile(r"^(?P<s>[a-z0-9_]+)\.(?P<b>[a-z0-9_-]+)\.r(?P<r>\d+)\.json$")
    paths = []
    for path in glob.glob(os.path.join(results, "*.json")):
        m = pat.match(os.path.basename(path))
        if m:
            paths.append((m["s"], m["b"], int(m["r"]), path))
    for s, b, _r, path in sorted(paths):
        try:
            with open(path) as fh:
                data.setdefault((s, b), []).append(json.load(fh))
        except (OSError, ValueError) as e:
            print(f"skip {path}: {e}", file=sys.stderr)
    return data


def brokers_of(data):
    seen = {b for _s, b in data}
    return [b for b in BROKER_ORDER if b in seen] + sorted(seen - set(BROKER_ORDER))


def cell_value(data, scen, broker, key, hib):
    """VALUE dict (median, worst, rounds, errors) of one metric, or None."""
    reps = data.get((scen, broker), [])
    xs = [metric(r, key) for r in reps]
    xs = [x for x in xs if isinstance(x, (int, float))]
    if not xs:
        return None
    bad = sum(1 for r in reps if r.get("errors") or r.get("timed_out"))
    v = {"median": statistics.median(xs), "worst": min(xs) if hib else max(xs), "rounds": xs}
    if bad:
        v["errors"] = bad
    return v


def fmt(v, unit):
    if v is None:
        return "—"
    if unit in ("msg/s", "deliveries/s", "lanes/s", "conn/s") or unit.startswith("msg/s"):
        if v >= 1e6:
            return f"{v / 1e6:.2f}M"
        if v >= 1e3:
            return f"{v / 1000:.1f}k"
        return f"{v:.0f}"
    if unit in ("ms", "s", "B/B", "MiB") or abs(v) < 10:
        return f"{v:,.2f}".rstrip("0").rstrip(".") if v != int(v) else f"{v:,.0f}"
    return f"{v:,.0f}"


def fmt_tick(v, unit):
    """fmt without trailing zeros after the decimal point (axis ticks: 160k, 1.4M)."""
    m = re.fullmatch(r"([\d,]+)\.(\d+)([kM]?)", fmt(v, unit))
    if not m:
        return fmt(v, unit)
    frac = m[2].rstrip("0")
    return m[1] + ("." + frac if frac else "") + m[3]


def mqtt_versions(data):
    """'' when every broker was driven with the same MQTT version (or it is not recorded), else
    e.g. 'MQTT version driven: mosquitto 5, nats 3.1.1, ...'."""
    vers = {}
    for (_s, b), reps in data.items():
        for r in reps:
            v = (r.get("opts") or {}).get("mqtt_version")
            if v is not None:
                vers.setdefault(b, set()).add("3.1.1" if v in (3, 4) else str(v))
    if len({v for vs in vers.values() for v in vs}) < 2:
        return ""
    driven = [f"{b} {'/'.join(sorted(vers[b]))}" for b in brokers_of(data) if b in vers]
    return "MQTT version driven: " + ", ".join(driven)


def table(data):
    brokers = brokers_of(data)
    cols = [f"{b} median (worst)" for b in brokers]
    ratio = "lanemq" in brokers and "mosquitto" in brokers
    head = f"{'scenario':<36} {'unit':<6} " + " ".join(f"{c:>28}" for c in cols)
    if ratio:
        head += f" {'lanemq/mosq':>12}"
    out = [head, "-" * len(head)]
    for scen, label, key, unit, hib in METRICS:
        vals = {b: cell_value(data, scen, b, key, hib) for b in brokers}
        if not any(vals.values()):
            continue

        def cell(x):
            if not x:
                return "—"
            flag = "!" if x.get("errors") else ""
            return f"{fmt(x['median'], unit)} ({fmt(x['worst'], unit)}) n={len(x['rounds'])}{flag}"

        line = f"{label:<36} {unit:<6} " + " ".join(f"{cell(vals[b]):>28}" for b in brokers)
        if ratio:
            m, l = vals.get("mosquitto"), vals.get("lanemq")
            r = f"{l['median'] / m['median']:.2f}x" if m and l and m["median"] else "—"
            line += f" {r:>12}"
        if not hib:
            line += "  (lower is better)"
        out.append(line)
    losses = []
    for (scen, b), reps in sorted(data.items()):
        lost = sum(max(0, r.get("loss") or 0) for r in reps if (r.get("opts") or {}).get("qos", 0) > 0)
        errs = sum(len(r.get("errors") or []) for r in reps)
        if lost or errs:
            losses.append(f"  {scen} {b}: QoS>=1 loss {lost}, errors {errs}")
    if losses:
        out.append("")
        out.append("problems (! above = some runs reported errors):")
        out.extend(losses)
    if mqtt_versions(data):
        out.append("")
        out.append(mqtt_versions(data))
    return "\n".join(out)


def read_meta(results):
    """commit, date, rounds, loadavg from meta.json, else machine.txt."""
    meta = {}
    try:
        with open(os.path.join(results, "machine.txt")) as fh:
            info = dict(line.split(": ", 1) for line in fh.read().splitlines() if ": " in line)
        meta["commit"] = info.get("git")
        meta["date"] = info.get("date", "")[:10] or None
        m = re.match(r"(\d+)", info.get("rounds", ""))
        meta["rounds"] = int(m[1]) if m else None
        meta["machine"] = f"{info.get('nproc', '?')} cores, {info.get('cpu', '?')}"
        meta["latency_rate"] = info.get("latency_rate")
        m = re.search(r"idle: (\d+)", info.get("rounds", ""))
        meta["idle"] = int(m[1]) if m else None
    except OSError:
        pass
    try:
        with open(os.path.join(results, "meta.json")) as fh:
            j = json.load(fh)
        for k in ("commit", "rounds", "date"):
            if j.get(k):
                meta[k] = j[k] if k != "date" else str(j[k])[:10]
        la = [j.get("loadavg_start"), j.get("loadavg_end")]
        la = [x.split()[0] for x in la if x]
        if la:
            meta["loadavg"] = " → ".join(la) + " (1-min, start → end)"
    except (OSError, ValueError):
        pass
    return meta


def families_from_results(results, data):
    meta = read_meta(results)
    brokers = brokers_of(data)
    base = {
        "source": f"interop/bench-vs-mosquitto.sh results {os.path.basename(os.path.normpath(results))}"
        f", measured on {meta.get('commit') or '?'}",
        "commit": meta.get("commit"),
        "date": meta.get("date"),
        "rounds": meta.get("rounds"),
        "loadavg": meta.get("loadavg"),
        "machine": meta.get("machine"),
        "note": (mqtt_versions(data) + ".") if mqtt_versions(data) else None,
    }
    base = {k: v for k, v in base.items() if v is not None}

    def panel(title, unit, rows, hib, **kw):
        # rows: [(group label, scenario, key)]
        values = {b: [cell_value(data, s, b, k, hib) for _g, s, k in rows] for b in brokers}
        series = [b for b in brokers if any(values[b])]
        if not series:
            return None
        p = {"title": title, "unit": unit, "lower_is_better": not hib, "groups": [g for g, _s, _k in rows],
             "series": series, "values": {b: values[b] for b in series}}
        p.update(kw)
        return p

    def family(name, title, panels):
        panels = [p for p in panels if p]
        if panels:
            return dict(base, family=name, title=title, panels=panels)
        return None

    rate = meta.get("latency_rate")
    fams = [
        family("throughput", "Throughput, lanemq-bench 10 publishers ↔ 1 subscriber", [
            panel("QoS 0, 64 B", "msg/s out", [
                ("fan-in 10 → 1", "fanin_q0", "out"), ("fan-out 1 → 10 (deliveries/s)", "fanout_q0", "out")], True),
            panel("QoS 1, 10 publishers → 1 subscriber", "msg/s out", [
                ("64 B", "fanin_q1", "out"), ("1 KiB", "fanin_q1_1k", "out")], True),
        ]),
        family("latency", "Latency, fan-in QoS 0 at 50 % of mosquitto's maximum"
               + (f" ({int(rate):,} msg/s)" if rate and rate.isdigit() else ""), [
            panel("publish → delivery", "µs", [
                ("p50", "latency_q0", "p50"), ("p99", "latency_q0", "p99"), ("p99.9", "latency_q0", "p999")], False),
        ]),
        family("memory", "Memory: broker RSS per idle connection; connect rate", [
            panel(f"{meta['idle']:,} idle connections" if meta.get("idle") else "idle connections",
                  "bytes per connection", [
                ("1 s after connecting", "idle", "rss_conn"),
                ("at the end of the hold", "idle", "rss_conn_end")], False),
            panel("CONNECT → CONNACK while opening them", "connections/s", [
                ("connect rate", "idle", "conn_rate")], True),
        ]),
        family("slow-consumer", "Slow consumers: one subscriber that stops reading", [
            panel("QoS 0 at a fixed rate: delivered to the healthy subscriber", "msg/s", [
                ("no stuck client", "rate_q0", "out"), ("+ stuck QoS 0 subscriber", "slow_consumer_q0", "out")], True),
            panel("QoS 0 at a fixed rate: p99 of the healthy subscriber", "µs", [
                ("no stuck client", "rate_q0", "p99"), ("+ stuck QoS 0 subscriber", "slow_consumer_q0", "p99")], False),
            panel("QoS 1 fan-in as fast as possible", "msg/s", [
                ("no stuck client: delivered", "fanin_q1", "out"),
                ("+ stuck persistent QoS 1 sub: published", "slow_consumer_q1", "in"),
                ("+ stuck persistent QoS 1 sub: delivered", "slow_consumer_q1", "out")], True),
            panel("QoS 1 fan-in: p99 of the healthy subscriber", "µs", [
                ("no stuck client", "fanin_q1", "p99"),
                ("+ stuck persistent QoS 1 sub", "slow_consumer_q1", "p99")], False),
            panel("QoS 1 + stuck persistent subscriber: broker RSS", "KiB", [
                ("broker max RSS", "slow_consumer_q1", "rss")], False),
        ]) if any(s in ("rate_q0", "slow_consumer_q0", "slow_consumer_q1") for s, _b in data) else None,
    ]
    return [f for f in fams if f]


# ------------------------------------------------------------------ family data files


def norm_value(v):
    """A VALUE as a dict with a median, or None."""
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return {"median": v}
    v = dict(v)
    if v.get("median") is None:
        if not v.get("rounds"):
            raise ValueError(f"value without median or rounds: {v}")
        v["median"] = statistics.median(v["rounds"])
    return v


def check_family(fam):
    """Raise ValueError if the data file is malformed."""
    for k in ("family", "title", "source", "panels"):
        if k not in fam:
            raise ValueError(f"missing {k!r}")
    for p in fam["panels"]:
        for k in ("title", "unit", "groups", "series", "values"):
            if k not in p:
                raise ValueError(f"panel {p.get('title')!r}: missing {k!r}")
        for s in p["series"]:
            vals = p["values"].get(s)
            if vals is None or len(vals) != len(p["groups"]):
                raise ValueError(f"panel {p['title']!r}: series {s!r} needs one value per group")
            for v in vals:
                norm_value(v)


def family_table(fam):
    out = [f"== {fam['family']}: {fam['title']}", f"   source: {fam['source']}"]
    for p in fam["panels"]:
        out.append(f"-- {p['title']} ({p['unit']}{', lower is better' if p.get('lower_is_better') else ''})")
        w = max(len(g) for g in p["groups"]) + 2
        out.append(" " * w + "".join(f"{s:>26}" for s in p["series"]))
        for i, g in enumerate(p["groups"]):
            cells = []
            for s in p["series"]:
                v = norm_value(p["values"][s][i])
                if v is None:
                    cells.append("—")
                else:
                    c = fmt(v["median"], p["unit"])
                    if v.get("worst") is not None:
                        c += f" ({fmt(v['worst'], p['unit'])})"
                    if v.get("rounds"):
                        c += f" n={len(v['rounds'])}"
                    cells.append(c)
            out.append(f"{g:<{w}}" + "".join(f"{c:>26}" for c in cells))
    return "\n".join(out)


# ------------------------------------------------------------------ charts


def series_colors(names):
    colors, i = {}, 0
    for n in names:
        if n in BROKER_COLORS:
            colors[n] = BROKER_COLORS[n]
        else:
            colors[n] = PALETTE[i % len(PALETTE)]
            i += 1
    return colors


def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def footer_text(fam):
    bits = []
    if fam.get("commit"):
        bits.append(f"measured on commit {fam['commit']}" + (f" ({fam['date']})" if fam.get("date") else ""))
    if fam.get("machine"):
        bits.append(fam["machine"])
    r = fam.get("rounds")
    if r:
        bits.append(f"{r} round{'s' if r != 1 else ''}" if isinstance(r, int) else f"rounds: {r}")
    bits.append("load average " + (fam.get("loadavg") or "not recorded"))
    text = "; ".join(bits) + "."
    text += " Bar = median; whisker = min–max of the rounds, marker = worst round, where recorded."
    if fam.get("note"):
        text += " " + fam["note"]
    text += f" Source: {fam['source']}."
    return text


def group_label(g, wrap_title, ngroups):
    wrap = max(10, int(wrap_title * 1.15 / max(ngroups, 1)))
    return "\n".join(textwrap.wrap(g, wrap, break_long_words=False))


def draw_panel(ax, p, colors, mpl_ticker, wrap_title):
    groups, series = p["groups"], p["series"]
    unit = p["unit"]
    vals = {s: [norm_value(v) for v in p["values"][s]] for s in series}
    used = {"rounds": False, "worst": False}
    nmax = max(sum(1 for s in series if vals[s][i]) for i in range(len(groups)))
    width = 0.8 / max(nmax, 1)
    allv = []
    tops = []
    for gi in range(len(groups)):
        present = [s for s in series if vals[s][gi]]
        for k, s in enumerate(present):
            v = vals[s][gi]
            x = gi + (k - (len(present) - 1) / 2) * width
            med = v["median"]
            bars = ax.bar([x], [med], width * 0.92, color=colors[s], zorder=2)
            bars.patches[0].set_gid(f"bar-{slug(s)}-{gi}")
            allv.append(med)
            top = med
            if v.get("rounds"):
                lo, hi = min(v["rounds"]), max(v["rounds"])
                if hi > lo:
                    ax.errorbar([x], [med], yerr=[[med - lo], [hi - med]], fmt="none", ecolor="#222",
                                elinewidth=1, capsize=3, zorder=3)
                    used["rounds"] = True
                allv += [lo, hi]
                top = max(top, hi)
            elif v.get("worst") is not None and v["worst"] != med:
                ax.plot([x], [v["worst"]], marker="_", markersize=12, markeredgewidth=2, color="#222",
                        linestyle="none", zorder=3)
                used["worst"] = True
                allv.append(v["worst"])
                top = max(top, v["worst"])
            d = p.get("decimals")
            label = v.get("label") or (fmt(med, unit) if d is None else f"{med:,.{d}f}")
            label += "  (errors)" if v.get("errors") else ""
            tops.append((x, top, label))
    for t in p.get("targets") or []:
        ax.axhline(t["value"], color="#c0392b", linestyle="--", linewidth=1, zorder=1)
        ax.annotate(t["label"], xy=(1, t["value"]), xycoords=("axes fraction", "data"), xytext=(-2, 2),
                    textcoords="offset points", ha="right", va="bottom", fontsize=7, color="#c0392b", zorder=5,
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
        allv.append(t["value"])
    pos = [v for v in allv if v > 0]
    scale = p.get("scale", "auto")
    # auto: log only when every value is positive and they span more than 30x
    log = scale == "log" or (scale == "auto" and pos and len(pos) == len(allv) and max(pos) / min(pos) > 30)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(pos) / 2, max(pos) * (12 if p.get("note") else 4))
    else:
        hi = max(allv) if allv else 1
        ax.set_ylim(0, hi * (1.32 if p.get("note") else 1.18) if hi > 0 else 1)
        ax.yaxis.set_major_formatter(mpl_ticker.FuncFormatter(lambda y, _pos: fmt_tick(y, unit)))
    for x, top, label in tops:
        ax.annotate(label, xy=(x, top), xytext=(0, 4), textcoords="offset points", ha="center",
                    va="bottom", fontsize=7, zorder=4)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([group_label(g, wrap_title, len(groups)) for g in groups], fontsize=7.5)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel(unit + (" (log scale)" if log else ""), fontsize=8)
    ax.tick_params(axis="y", labelsize=7.5)
    title = p["title"] + (" — lower is better" if p.get("lower_is_better") else "")
    ax.set_title("\n".join(textwrap.wrap(title, wrap_title)), fontsize=9)
    ax.grid(axis="y", color="#ddd", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if p.get("note"):
        ax.text(0.02, 0.98, "\n".join(textwrap.wrap(p["note"], wrap_title + 8)), transform=ax.transAxes, fontsize=6.5,
                va="top", ha="left", color="#444", zorder=5)
    return used


def render(fams, path, fmt_ext=None):
    """Draw the panels of the given families into one figure at path (SVG unless fmt_ext)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    from matplotlib.lines import Line2D

    matplotlib.rcParams.update({
        "svg.fonttype": "none",
        "svg.hashsalt": "lanemq-bench",
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans"],
        "path.simplify": False,
    })
    panels = [p for f in fams for p in f["panels"]]
    series = []
    for p in panels:
        for s in p["series"]:
            if s not in series:
                series.append(s)
    ordered = [s for s in BROKER_ORDER if s in series] + [s for s in series if s not in BROKER_ORDER]
    colors = series_colors(ordered)
    ncols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    widths = [max(len(p["groups"]), 1) * (0.5 + 0.35 * len(p["series"])) for p in panels]
    colw = max(3.6, min(5.2, max(widths) + 1.0))
    fig_w = max(6.4, ncols * colw)
    colw = fig_w / ncols
    wrap_title = max(24, int((colw - 0.9) * 12.5))
    footer = footer_text(fams[0]) if len(fams) == 1 else "; ".join(
        f"{f['family']}: commit {f.get('commit') or '?'}" for f in fams) + "."
    foot_lines = textwrap.wrap(footer, int(fig_w * 17))
    head_in = 1.25  # title, legend, two lines of panel title
    xl = max(group_label(g, wrap_title, len(p["groups"])).count("\n") + 1 for p in panels for g in p["groups"])
    xl_in = 0.13 * max(xl - 2, 0)  # x labels beyond two lines
    row_in = 3.0  # one row of panels: axes plus two lines of x labels
    gap_in = 0.95 + xl_in  # between rows: x labels of the row above, panel titles of the row below
    foot_in = 0.12 + 0.13 * len(foot_lines)
    fig_h = head_in + nrows * row_in + (nrows - 1) * gap_in + 0.55 + xl_in + foot_in
    fig, axes = plt.subplots(nrows, ncols, figsize=(fig_w, fig_h), squeeze=False)
    used = {"rounds": False, "worst": False}
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        u = draw_panel(ax, panels[i], colors, ticker, wrap_title)
        used = {k: used[k] or u[k] for k in used}
    title = fams[0]["title"] if len(fams) == 1 else "lanemq benchmarks"
    title = "\n".join(textwrap.wrap(title, int(fig_w * 8.5)))
    fig.suptitle(title, fontsize=12, fontweight="bold", y=1 - 0.08 / fig_h, va="top")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[s]) for s in ordered]
    labels = list(ordered)
    if used["rounds"]:
        handles.append(Line2D([0], [0], color="#222", marker="_", markersize=8, linewidth=1))
        labels.append("min–max of rounds")
    if used["worst"]:
        handles.append(Line2D([0], [0], color="#222", marker="_", markersize=12, markeredgewidth=2,
                              linestyle="none"))
        labels.append("worst round")
    ntitle = title.count("\n")
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 5), frameon=False, fontsize=8.5,
               bbox_to_anchor=(0.5, 1 - (0.38 + 0.2 * ntitle) / fig_h))
    fig.text(0.01, 0.06 / fig_h, "\n".join(foot_lines), fontsize=6.8, color="#333", ha="left", va="bottom")
    top_in = head_in + 0.2 * ntitle + (0.2 if len(labels) > 5 else 0)
    fig.subplots_adjust(left=0.85 / fig_w, right=1 - 0.2 / fig_w, top=1 - top_in / fig_h,
                        bottom=(0.55 + xl_in + foot_in) / fig_h, hspace=gap_in / row_in, wspace=0.85 * ncols / fig_w * 1.0)
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    kind = fmt_ext or os.path.splitext(path)[1].lstrip(".") or "svg"
    meta = {"Date": None} if kind == "svg" else {}
    fig.savefig(path, format=kind, metadata=meta, dpi=110 if kind == "png" else None)
    plt.close(fig)


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", help="results directory of interop/bench-vs-mosquitto.sh")
    ap.add_argument("--data", action="append", default=[], help="a family data file (repeatable)")
    ap.add_argument("--out-dir", help="write one chart per family here (FAMILY.svg)")
    ap.add_argument("--data-out", help="write the families of RESULTS as data files here (FAMILY.json)")
    ap.add_argument("--svg", help="write every family's panels into this one chart")
    ap.add_argument("--format", default="svg", choices=["svg", "png"], help="chart format for --out-dir")
    args = ap.parse_args()
    if not args.results and not args.data:
        ap.error("give RESULTS_DIR or --data FILE")
    fams = []
    if args.results:
        data = load(args.results)
        if not data:
            sys.exit(f"no results in {args.results}")
        print(table(data))
        fams += families_from_results(args.results, data)
        if args.data_out:
            for f in fams:
                out = os.path.join(args.data_out, f["family"] + ".json")
                write_json(out, f)
                print(f"data: {out}", file=sys.stderr)
    for path in args.data:
        with open(path) as fh:
            fam = json.load(fh)
        try:
            check_family(fam)
        except ValueError as e:
            sys.exit(f"{path}: {e}")
        print(family_table(fam))
        fams.append(fam)
    if not (args.out_dir or args.svg):
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("matplotlib is missing: run interop/bench-plot.sh (it sets up interop/.venv-plot)")
    if args.out_dir:
        for f in fams:
            out = os.path.join(args.out_dir, f"{f['family']}.{args.format}")
            render([f], out)
            print(f"chart: {out}", file=sys.stderr)
    if args.svg and fams:
        render(fams, args.svg, "svg")
        print(f"chart: {args.svg}", file=sys.stderr)


if __name__ == "__main__":
    main()
