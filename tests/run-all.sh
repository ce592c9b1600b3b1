#!/usr/bin/env bash
# The project's one test command (CI runs it through .ci/run). See docs/testing.md.
#
#   bash tests/run-all.sh
#
# Phases: setup (mosquitto clients, interop/.venv with paho-mqtt 2.x, only when missing),
# fmt, clippy (-D warnings), build (profile `ci`: release without LTO, all targets, once),
# unit/integration tests (cargo nextest, else cargo test; same artifacts), then every interop
# script interop/*.sh except lib.sh and bench* (each starts its own broker on 127.0.0.1, the
# binary target/ci/lanemq).
#
# Environment:
#   LANEMQ_TEST_QUICK=1   skip clippy
#   INTEROP_TIMEOUT=900   seconds one interop script may take
#   INTEROP_SKIP="a b"    interop scripts (basename without .sh) not to run
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
INTEROP_TIMEOUT=${INTEROP_TIMEOUT:-900}

T_START=$(date +%s)
PHASES=()   # "name|status|seconds"
FAILED=0
# Each phase's output also goes to a file here, for the summary to quote a failed phase.
PHASE_LOGS=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-run-all.XXXXXX")

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# phase NAME CMD...: run CMD, record status and elapsed time; never aborts the script.
phase() {
  local name=$1
  shift
  local t0 rc
  echo
  echo "=== [$name] $* ==="
  t0=$(date +%s)
  set +e
  "$@" 2>&1 | tee "$PHASE_LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  local dt=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    PHASES+=("$name|ok|$dt")
    echo "=== [$name] ok in $(fmt_secs "$dt") ==="
  else
    PHASES+=("$name|FAILED (exit $rc)|$dt")
    FAILED=$((FAILED + 1))
    echo "=== [$name] FAILED (exit $rc) in $(fmt_secs "$dt") ==="
  fi
  return "$rc"
}

summary() {
  local total=$(($(date +%s) - T_START)) p name status dt n_ok=0 n_bad=0
  echo
  echo "=== summary ==="
  for p in "${PHASES[@]}"; do
    IFS='|' read -r name status dt <<<"$p"
    printf '  %-28s %-18s %s\n' "$name" "$status" "$(fmt_secs "$dt")"
    if [ "$status" = ok ]; then n_ok=$((n_ok + 1)); else n_bad=$((n_bad + 1)); fi
  done
  echo "  total wall time: $(fmt_secs "$total")"
  # What failed, quoted from each failed phase's output: its FAIL lines, else its last lines.
  local pat='^(FAIL|KNOWN)|^ +FAIL \['
  for p in "${PHASES[@]}"; do
    IFS='|' read -r name status dt <<<"$p"
    [ "$status" = ok ] && continue
    echo
    echo "--- [$name] failed:"
    if grep -qE "$pat" "$PHASE_LOGS/$name.log" 2>/dev/null; then
      grep -E "$pat" "$PHASE_LOGS/$name.log" | sort -u | cut -c1-600 | head -n 30
    else
      tail -n 20 "$PHASE_LOGS/$name.log" 2>/dev/null | cut -c1-600
    fi
  done
  echo "run-all: $n_ok passed, $n_bad failed"
}

# --- setup -----------------------------------------------------------------------------------
setup() {
  if ! command -v mosquitto_sub >/dev/null 2>&1 || ! command -v mosquitto_pub >/dev/null 2>&1 ||
    ! command -v mosquitto_passwd >/dev/null 2>&1; then
    echo "installing mosquitto-clients and mosquitto (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || return 1
    apt-get install -y -q mosquitto-clients mosquitto || return 1
  else
    echo "mosquitto clients: $(command -v mosquitto_sub)"
  fi
  local py=interop/.venv/bin/python
  if ! "$py" -c 'import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith("2.") else 1)' 2>/dev/null; then
    echo "creating interop/.venv with paho-mqtt 2.x"
    rm -rf interop/.venv
    python3 -m venv interop/.venv || return 1
    interop/.venv/bin/pip install -q --disable-pip-version-check 'paho-mqtt==2.*' || return 1
  fi
  echo "paho-mqtt $("$py" -c 'import paho.mqtt; print(paho.mqtt.__version__)') in interop/.venv"
}

run_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --cargo-profile ci --no-fail-fast
  else
    cargo test --workspace --profile ci --no-fail-fast
  fi
}

# The MQTT protocol tests again, with connections hibernating whenever they are idle for
# 1 ms (so most packets find the connection in the parking lot).
run_tests_hibernating() {
  # --workspace, as the build phase: `-p lanemq-tests` alone unifies features differently and
  # rebuilds dependencies.
  local filter='package(lanemq-tests) & test(/^(mqtt311|mqtt5_connect|mqtt5_features|mqtt5_publish|mqtt5_subscribe|sessions|shared|flow_control|shutdown|malformed|enhanced_auth|hibernate)::/)'
  if cargo nextest --version >/dev/null 2>&1; then
    LANEMQ_TEST_HIBERNATE_MS=1 cargo nextest run --workspace --cargo-profile ci --no-fail-fast -E "$filter"
  else
    LANEMQ_TEST_HIBERNATE_MS=1 cargo test --workspace --profile ci --no-fail-fast --test it
  fi
}

interop_scripts() {
  local f
  for f in interop/*.sh; do
    case "$(basename "$f")" in
      lib.sh | bench*) continue ;;
    esac
    if [[ " ${INTEROP_SKIP:-} " == *" $(basename "$f" .sh) "* ]]; then
      echo "skipping $f (INTEROP_SKIP)" >&2
      continue
    fi
    echo "$f"
  done
}

trap 'echo; echo "interrupted"; summary; exit 130' INT TERM

phase setup setup || { summary; exit 1; }
phase fmt cargo fmt --all -- --check || true
if [ "${LANEMQ_TEST_QUICK:-0}" = 1 ]; then
  echo
  echo "=== [clippy] skipped (LANEMQ_TEST_QUICK=1) ==="
else
  phase clippy cargo clippy --workspace --all-targets -- -D warnings || true
fi
if ! phase build cargo build --profile ci --workspace --all-targets; then
  summary
  exit 1
fi
export LANEMQ_BIN=$ROOT/target/ci/lanemq
phase tests run_tests || true
phase tests-hibernating run_tests_hibernating || true
# The cargo-fuzz targets must keep building (stable toolchain, no instrumentation: running
# them is crates/fuzz/run.sh's job).
phase fuzz-build bash -c 'cd crates/fuzz && cargo build --target-dir ../../target/fuzz' || true
for s in $(interop_scripts); do
  phase "$(basename "$s" .sh)" timeout "$INTEROP_TIMEOUT" bash "$s" || true
done

summary
[ "$FAILED" -eq 0 ]
