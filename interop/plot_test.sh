#!/usr/bin/env bash
# The benchmark charts (interop/bench_plot.py, matplotlib in interop/.venv-plot): no broker.
#   - every docs/bench-data/*.json renders to a well-formed SVG with one bar per value and a
#     legend entry per series, its medians agree with its rounds, two renders are
#     byte-identical and docs/charts/FAMILY.svg is that render (the committed chart is current)
#   - a fabricated results directory in the bench-vs-mosquitto.sh format (test fixtures written
#     here) gives the table, the family data files and the charts
# Prints PASS/FAIL per check; exits non-zero if any failed. Sets up interop/.venv-plot (pip,
# PyPI) when it is missing.
#
#   bash interop/plot_test.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
source "$INTEROP_ROOT/interop/bench-plot.sh"
cd "$INTEROP_ROOT"

PY=$(plot_python) || { fail venv "could not set up interop/.venv-plot with $PLOT_MATPLOTLIB"; summary plot_test; exit 1; }
pass "venv interop/.venv-plot: matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"

# report: turn the PASS:/FAIL: lines of a checker into pass/fail calls
report() {
  local line
  while IFS= read -r line; do
    case $line in
    PASS:*) pass "${line#PASS: }" ;;
    FAIL:*) line=${line#FAIL: }; fail "${line%% -- *}" "${line#* -- }" ;;
    *) echo "$line" ;;
    esac
  done
}

DATA=(docs/bench-data/*.json)
ARGS=()
for f in "${DATA[@]}"; do ARGS+=(--data "$f"); done
for d in a b; do
  if ! "$PY" interop/bench_plot.py "${ARGS[@]}" --out-dir "$WORK/$d" >"$WORK/table-$d.txt" 2>"$WORK/err-$d.txt"; then
    fail "render docs/bench-data ($d)" "$(tail -3 "$WORK/err-$d.txt")"
  fi
done

# check_svgs DIR DATA_FILE...: well-formed SVG, one bar per value, a legend text per series
CHECK=$(cat <<'PY'
import json, os, statistics, sys
import xml.etree.ElementTree as ET
NS = "{http://www.w3.org/2000/svg}"
def check(svg, fam, name):
    try:
        root = ET.parse(svg).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"FAIL: {name}: well-formed SVG -- {e}")
        return
    if root.tag != NS + "svg":
        print(f"FAIL: {name}: well-formed SVG -- root is {root.tag}")
        return
    bars = [g for g in root.iter(NS + "g") if (g.get("id") or "").startswith("bar-")]
    want = sum(1 for p in fam["panels"] for s in p["series"] for v in p["values"][s] if v is not None)
    texts = {"".join(t.itertext()).strip() for t in root.iter(NS + "text")}
    series = {s for p in fam["panels"] for s in p["series"]}
    missing = sorted(series - texts)
    commit = fam.get("commit")
    foot = " ".join(texts)
    if len(bars) != want:
        print(f"FAIL: {name}: bars -- {len(bars)} bars, the data has {want} values")
    elif missing:
        print(f"FAIL: {name}: legend -- no text label for {missing}")
    elif commit and commit not in foot:
        print(f"FAIL: {name}: footer -- commit {commit} not in the chart")
    else:
        print(f"PASS: {name}: well-formed SVG, {want} bars, legend {sorted(series)}")
for path in sys.argv[2:]:
    fam = json.load(open(path))
    check(os.path.join(sys.argv[1], fam["family"] + ".svg"), fam, fam["family"])
PY
)
report < <("$PY" -c "$CHECK" "$WORK/a" "${DATA[@]}")

# the medians and worst rounds of the data files agree with their rounds
report < <("$PY" - "${DATA[@]}" <<'PY'
import json, statistics, sys
for path in sys.argv[1:]:
    fam = json.load(open(path))
    bad = []
    if "measured on" not in fam.get("source", ""):
        bad.append("source does not say where the figures come from and what they were measured on")
    for p in fam["panels"]:
        for s in p["series"]:
            for g, v in zip(p["groups"], p["values"][s]):
                if not isinstance(v, dict) or not v.get("rounds"):
                    continue
                r = v["rounds"]
                if "median" in v and abs(v["median"] - statistics.median(r)) > 1e-9:
                    bad.append(f"{p['title']}/{g}/{s}: median {v['median']} != median of {r}")
                if "worst" in v and v["worst"] not in (min(r), max(r)):
                    bad.append(f"{p['title']}/{g}/{s}: worst {v['worst']} not min/max of {r}")
    name = f"{fam['family']}: data consistent"
    print(f"FAIL: {name} -- {'; '.join(bad)}" if bad else f"PASS: {name}")
PY
)

for f in "${DATA[@]}"; do
  fam=$(basename "$f" .json)
  if ! cmp -s "$WORK/a/$fam.svg" "$WORK/b/$fam.svg"; then
    fail "$fam: re-render identical" "two renders of $f differ"
  elif ! cmp -s "$WORK/a/$fam.svg" "docs/charts/$fam.svg"; then
    fail "$fam: docs/charts/$fam.svg current" "differs from a render of $f (bash interop/bench-plot.sh --data $f --out-dir docs/charts)"
  else
    pass "$fam: re-render byte-identical, docs/charts/$fam.svg current"
  fi
done

# ---- a fabricated results directory in the bench-vs-mosquitto.sh format (test fixtures)
RES=$WORK/results-fixture
"$PY" - "$RES" <<'PY'
import json, os, sys
res = sys.argv[1]
os.makedirs(res)
def report(out, in_=None, p50=None, p99=None, rss=None, idle=None, qos=0):
    lat = None if p50 is None else {"samples": 1000, "mean_us": p50, "p50_us": p50, "p90_us": p99,
                                     "p99_us": p99, "p999_us": p99 * 2, "max_us": p99 * 3}
    return {"tool": "lanemq-bench fixture", "client": "raw-tcp", "mode": "idle" if idle else "throughput",
            "opts": {"qos": qos}, "published": 1000, "received": 1000, "expected": 1000, "loss": 0,
            "msgs_per_sec_in": in_ or out, "msgs_per_sec_out": out, "latency": lat,
            "broker_rss_max_kb": rss, "idle": {"rss_per_connection_bytes": idle} if idle else None,
            "timed_out": False, "errors": []}
brokers = {"mosquitto": 1.0, "lanemq": 5.0, "rumqttd": 2.0}
for b, k in brokers.items():
    for r in (1, 2, 3):
        f = 1 + 0.1 * r
        reps = {
            "fanin_q0": report(70000 * k * f), "fanout_q0": report(120000 * k * f),
            "fanin_q1": report(50000 * k * f, p50=900, p99=20000, qos=1),
            "latency_q0": report(35000, p50=500 / k * f, p99=1600 / k * f),
            "idle": report(0, idle=700 * k * f),
            "slow_consumer_q1": report(8000 * k * f, in_=80000 * f, p50=900, p99=20000, rss=9000 * k, qos=1),
        }
        for s, rep in reps.items():
            with open(os.path.join(res, f"{s}.{b}.r{r}.json"), "w") as fh:
                json.dump(rep, fh)
with open(os.path.join(res, "machine.txt"), "w") as fh:
    fh.write("date: 2026-01-01T00:00:00+00:00\nnproc: 2\ncpu: fixture\ngit: abc1234\n"
             "rounds: 3 duration: 5 warmup: 1 inflight: 100 idle: 10000\nlatency_rate: 35000\n")
with open(os.path.join(res, "meta.json"), "w") as fh:
    json.dump({"commit": "abc1234", "date": "2026-01-01T00:00:00+00:00", "loadavg_start": "0.50 0.40 0.30 1/100 1",
               "loadavg_end": "1.50 1.00 0.50 1/100 2", "rounds": 3}, fh)
PY
if "$PY" interop/bench_plot.py "$RES" --data-out "$WORK/fx-data" --out-dir "$WORK/fx-charts" --svg "$WORK/fx-all.svg" \
  >"$WORK/fx-table.txt" 2>"$WORK/fx-err.txt"; then
  if grep -q 'mosquitto median (worst)' "$WORK/fx-table.txt" && grep -q 'rumqttd median (worst)' "$WORK/fx-table.txt" &&
    grep -q '^QoS0 64B fan-in 10→1 .* 5.00x$' "$WORK/fx-table.txt"; then
    pass "results dir: table with a column per broker and the lanemq/mosquitto ratio"
  else
    fail "results dir: table" "$(cat "$WORK/fx-table.txt")"
  fi
  FX=()
  for fam in throughput latency memory slow-consumer; do
    if [ -f "$WORK/fx-data/$fam.json" ]; then FX+=("$WORK/fx-data/$fam.json"); else fail "results dir: $fam data" "no $fam.json"; fi
  done
  report < <("$PY" -c "$CHECK" "$WORK/fx-charts" "${FX[@]}" | sed 's/^\(PASS\|FAIL\): /\1: results dir: /')
  if "$PY" -c 'import json,sys; f=json.load(open(sys.argv[1])); v=f["panels"][0]["values"]["lanemq"][0]
sys.exit(0 if f["commit"]=="abc1234" and f["rounds"]==3 and "0.50 → 1.50" in f["loadavg"] and len(v["rounds"])==3 and v["median"]==v["rounds"][1] else 1)' \
    "$WORK/fx-data/throughput.json"; then
    pass "results dir: data file carries commit, rounds, load average and the per-round values"
  else
    fail "results dir: data file meta" "$(head -c 600 "$WORK/fx-data/throughput.json")"
  fi
  if "$PY" -c 'import sys, xml.etree.ElementTree as ET; ET.parse(sys.argv[1])' "$WORK/fx-all.svg" 2>/dev/null; then
    pass "results dir: --svg FILE (all families in one chart) is well-formed"
  else
    fail "results dir: --svg FILE" "not a well-formed SVG"
  fi
else
  fail "results dir: bench_plot.py" "$(tail -5 "$WORK/fx-err.txt")"
fi

summary plot_test
[ "$N_FAIL" -eq 0 ]
