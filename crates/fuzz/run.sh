#!/usr/bin/env bash
# Run every cargo-fuzz target for a given number of seconds each (default 1800: 30 minutes,
# so a full run of the four targets takes 2 hours; not part of the test command).
#   crates/fuzz/run.sh [seconds] [extra libFuzzer args...]
# A crash leaves its input under crates/fuzz/artifacts/<target>/; make it a regression test.
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Only a stable toolchain is required:
# RUSTC_BOOTSTRAP=1 unlocks the -Z flags cargo-fuzz passes to rustc (sanitizer, coverage).
set -euo pipefail
secs="${1:-1800}"
shift || true
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list --fuzz-dir "$PWD"); do
    echo "== fuzzing $target for ${secs}s"
    mkdir -p "corpus/$target" "seeds/$target"
    cargo fuzz run --fuzz-dir "$PWD" "$target" "corpus/$target" "seeds/$target" -- -max_total_time="$secs" "$@"
done
