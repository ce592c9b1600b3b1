#!/usr/bin/env bash
# The kill -9 durability test (tests/kill9.rs) with many cycles: a child broker with
# fsync = "always" under QoS 1/2 load is killed at a random moment 100 times, restarted on the
# same port and data dir, and every acknowledged message must reach the persistent subscriber
# (QoS 2 exactly once). Prints the final counts, PASS/FAIL, and exits non-zero on failure.
#
#   bash interop/kill9-loop.sh
#
# Environment:
#   KILL9_CYCLES=100     cycles (the test command's cargo test run uses the default 3)
#   KILL9_SEED=N         replay the kill delays of an earlier run (printed at the start)
#   KILL9_TIMEOUT=850    seconds for the whole run (tests/run-all.sh allows 900 per script)
#   LANEMQ_BIN           broker binary (default: target/ci/lanemq, built if missing)
#   KILL9_PROFILE=ci     cargo profile of the test binary (ci: the test command's artifacts)
#   KEEP_TMP=1           keep the data dir and broker log (always kept on failure)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
CYCLES=${KILL9_CYCLES:-100}
TIMEOUT=${KILL9_TIMEOUT:-850}

PROFILE=${KILL9_PROFILE:-ci}

if [ -z "${LANEMQ_BIN:-}" ]; then
  LANEMQ_BIN=$ROOT/target/$PROFILE/lanemq
  if [ ! -x "$LANEMQ_BIN" ]; then
    echo "building the broker: cargo build --profile $PROFILE -p lanemq"
    cargo build --profile "$PROFILE" -p lanemq || exit 2
  fi
fi
if [ ! -x "$LANEMQ_BIN" ]; then
  echo "broker binary $LANEMQ_BIN not found: cargo build --profile $PROFILE -p lanemq" >&2
  exit 2
fi
# The test runs in the tests/ package directory: the path must not be relative.
LANEMQ_BIN=$(realpath "$LANEMQ_BIN")
export LANEMQ_BIN

LOG=$(mktemp "${TMPDIR:-/tmp}/lanemq-kill9-loop.XXXXXX")
trap 'rm -f "$LOG"' EXIT

echo "kill9-loop: $CYCLES cycles against $LANEMQ_BIN (timeout ${TIMEOUT} s)"
# With nextest and --workspace the test binary is the one the test command already built (a
# `cargo test -p lanemq-tests` resolves features differently and rebuilds dependencies).
if cargo nextest --version >/dev/null 2>&1; then
  KILL9_CYCLES=$CYCLES timeout "$TIMEOUT" \
    cargo nextest run --cargo-profile "$PROFILE" --workspace --no-capture \
    -E 'binary(it) & test(/^kill9::/)' 2>&1 | tee "$LOG"
else
  KILL9_CYCLES=$CYCLES timeout "$TIMEOUT" \
    cargo test --profile "$PROFILE" -p lanemq-tests --test it kill9:: -- --nocapture 2>&1 | tee "$LOG"
fi
rc=${PIPESTATUS[0]}

counts=$(grep -E '^acked=' "$LOG" | tail -n 1)
details=$(grep -E '^kill9: details:' "$LOG" | tail -n 1)
echo "----"
echo "final counts: ${counts:-(none printed)}"
[ -n "$details" ] && echo "$details"
if [ "$rc" -eq 0 ]; then
  echo "PASS: kill -9 x $CYCLES, nothing acknowledged lost"
  echo "kill9-loop: 1 passed, 0 failed"
else
  [ "$rc" -eq 124 ] && echo "(timed out after ${TIMEOUT} s)"
  echo "FAIL: kill -9 x $CYCLES -- cargo test exited $rc (see the failure above)"
  echo "kill9-loop: 0 passed, 1 failed"
fi
exit "$rc"
