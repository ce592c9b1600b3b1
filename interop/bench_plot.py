#!/usr/bin/env python3
"""Summarise lanemq-bench JSON results: print a table and write an SVG chart.

Input: a results directory written by interop/bench-vs-mosquitto.sh, holding
files named SCENARIO.BROKER.rROUND.json. For each scenario and broker the
median over rounds is taken. The SVG (hand-written, no matplotlib) has one
small panel per metric with one bar per broker, each panel on its own scale.

usage: bench_plot.py RESULTS_DIR [--svg docs/bench.svg]
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys
from xml.sax.saxutils import escape

BROKERS = ["mosquitto", "lanemq"]
COLORS = {"mosquitto": "#7f8c8d", "lanemq": "#2e86de"}

# (scenario, label, metric key, unit, higher_is_better)
METRICS = [
    ("fanin_q0", "QoS0 64B fan-in 10→1", "out", "msg/s", True),
    ("fanout_q0", "QoS0 64B fan-out 1→10", "out", "msg/s", True),
    ("fanin_q1", "QoS1 64B 10 pubs→1 sub", "out", "msg/s", True),
    ("fanin_q1_1k", "QoS1 1KiB 10 pubs→1 sub", "out", "msg/s", True),
    ("latency_q0", "latency p50 @50% load", "p50", "µs", False),
    ("latency_q0", "latency p99 @50% load", "p99", "µs", False),
    ("idle", "RSS per idle connection", "rss_conn", "bytes", False),
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
    if key in ("p50", "p99"):
        lat = report.get("latency") or {}
        return lat.get(key + "_us")
    if key == "rss_conn":
        idle = report.get("idle") or {}
        return idle.get("rss_per_connection_bytes")
    return None


def load(results):
    data = {}  # (scenario, broker) -> [reports]
    pat = re.compile(r"^(?P<s>[a-z0-9_]+)\.(?P<b>[a-z0-9_-]+)\.r\d+\.json$")
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        m = pat.match(os.path.basename(path))
        if not m:
            continue
        try:
            with open(path) as fh:
                data.setdefault((m["s"], m["b"]), []).append(json.load(fh))
        except (OSError, ValueError) as e:
            print(f"skip {path}: {e}", file=sys.stderr)
    return data


def medians(data):
    rows = []
    for scen, label, key, unit, hib in METRICS:
        vals = {}
        for b in BROKERS:
            reps = data.get((scen, b), [])
            xs = [metric(r, key) for r in reps]
            xs = [x for x in xs if isinstance(x, (int, float))]
            bad = sum(1 for r in reps if r.get("errors") or r.get("timed_out"))
            worst = (min(xs) if hib else max(xs)) if xs else None
            vals[b] = (statistics.median(xs), len(xs), bad, worst) if xs else None
        if any(vals.values()):
            rows.append((scen, label, key, unit, hib, vals))
    return rows


def fmt(v, unit):
    if v is None:
        return "—"
    if unit == "msg/s":
        return f"{v / 1000:.1f}k" if v < 1e6 else f"{v / 1e6:.2f}M"
    return f"{v:,.0f}"


def table(rows, data):
    out = []
    head = (
        f"{'scenario':<36} {'unit':<6} {'mosquitto median (worst)':>28} "
        f"{'lanemq median (worst)':>28} {'lanemq/mosq':>12}"
    )
    out.append(head)
    out.append("-" * len(head))
    for _scen, label, _key, unit, hib, vals in rows:
        m, l = vals.get("mosquitto"), vals.get("lanemq")
        ratio = "—"
        if m and l and m[0]:
            ratio = f"{l[0] / m[0]:.2f}x"
        cell = lambda x: "—" if not x else (
            f"{fmt(x[0], unit)} ({fmt(x[3], unit)}) n={x[1]}{'!' if x[2] else ''}"
        )
        note = "" if hib else "  (lower is better)"
        out.append(f"{label:<36} {unit:<6} {cell(m):>28} {cell(l):>28} {ratio:>12}{note}")
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
    return "\n".join(out)


def svg(rows, title):
    pw, ph = 200, 190  # panel size
    cols = 4
    nrows = (len(rows) + cols - 1) // cols
    width, height = cols * pw + 20, nrows * ph + 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    # legend
    lx = 10
    for b in BROKERS:
        parts.append(f'<rect x="{lx}" y="30" width="10" height="10" fill="{COLORS[b]}"/>')
        parts.append(f'<text x="{lx + 14}" y="39">{b}</text>')
        lx += 90
    for i, (_scen, label, _key, unit, hib, vals) in enumerate(rows):
        x0 = 10 + (i % cols) * pw
        y0 = 55 + (i // cols) * ph
        parts.append(f'<text x="{x0 + 5}" y="{y0 + 12}" font-weight="bold">{escape(label)}</text>')
        parts.append(
            f'<text x="{x0 + 5}" y="{y0 + 25}" fill="#555">{escape(unit)}'
            f'{"" if hib else ", lower is better"}</text>'
        )
        top = max((v[0] for v in vals.values() if v), default=0) or 1
        base_y, bar_h = y0 + ph - 25, ph - 70
        parts.append(
            f'<line x1="{x0 + 5}" y1="{base_y}" x2="{x0 + pw - 15}" y2="{base_y}" stroke="#333"/>'
        )
        for j, b in enumerate(BROKERS):
            bx = x0 + 25 + j * 80
            v = vals.get(b)
            if not v:
                parts.append(f'<text x="{bx + 5}" y="{base_y - 5}" fill="#999">n/a</text>')
            else:
                h = bar_h * v[0] / top
                parts.append(
                    f'<rect x="{bx}" y="{base_y - h:.1f}" width="50" height="{h:.1f}" fill="{COLORS[b]}"/>'
                )
                parts.append(
                    f'<text x="{bx + 25}" y="{base_y - h - 4:.1f}" text-anchor="middle">{fmt(v[0], unit)}</text>'
                )
            parts.append(f'<text x="{bx + 25}" y="{base_y + 14}" text-anchor="middle">{b}</text>')
            if v and v[2]:
                parts.append(
                    f'<text x="{bx + 25}" y="{base_y + 24}" text-anchor="middle" font-size="9" '
                    f'fill="#c0392b">errors in {v[2]}/{v[1]} runs</text>'
                )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--svg", help="write the chart here")
    args = ap.parse_args()
    data = load(args.results)
    if not data:
        sys.exit(f"no results in {args.results}")
    rows = medians(data)
    print(table(rows, data))
    if args.svg:
        machine = ""
        try:
            with open(os.path.join(args.results, "machine.txt")) as fh:
                info = dict(line.split(": ", 1) for line in fh.read().splitlines() if ": " in line)
            machine = f" — {info.get('nproc', '?')} cores, {info.get('cpu', '?')}, {info.get('date', '')[:10]}"
        except OSError:
            pass
        os.makedirs(os.path.dirname(os.path.abspath(args.svg)), exist_ok=True)
        with open(args.svg, "w") as fh:
            fh.write(svg(rows, "lanemq vs mosquitto (median of rounds)" + machine))
        print(f"\nchart: {args.svg}", file=sys.stderr)


if __name__ == "__main__":
    main()
