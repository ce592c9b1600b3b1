#!/usr/bin/env bash
# Run interop/bench_plot.py with matplotlib: the venv interop/.venv-plot (gitignored) with the
# pinned matplotlib is created when it is missing (pip from PyPI), as tests/run-all.sh does for
# interop/.venv. Arguments go to bench_plot.py unchanged, e.g.
#
#   bash interop/bench-plot.sh target/bench-results/X --data-out docs/bench-data --out-dir docs/charts
#   bash interop/bench-plot.sh --data docs/bench-data/streams.json --out-dir docs/charts
#
# If the venv cannot be set up (no network), the table is still printed with the system
# python3 and bench_plot.py says that the charts need matplotlib.
# Sourced (`source interop/bench-plot.sh`), it only defines plot_python; nothing runs.
PLOT_MATPLOTLIB=${PLOT_MATPLOTLIB:-matplotlib==3.11.2}

# plot_python: prints the python that has the pinned matplotlib, setting up the venv if needed.
plot_python() {
  local root venv py want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=$root/interop/.venv-plot
  py=$venv/bin/python
  want=${PLOT_MATPLOTLIB#matplotlib==}
  if ! "$py" -c "import matplotlib, sys; sys.exit(0 if matplotlib.__version__ == '$want' else 1)" 2>/dev/null; then
    echo "creating interop/.venv-plot with $PLOT_MATPLOTLIB" >&2
    rm -rf "$venv"
    if ! { python3 -m venv "$venv" >&2 &&
      "$venv/bin/pip" install -q --disable-pip-version-check "$PLOT_MATPLOTLIB" >&2; }; then
      echo "could not set up interop/.venv-plot; no charts (the table is still printed)" >&2
      rm -rf "$venv"
      echo python3
      return 1
    fi
  fi
  echo "$py"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  PY=$(plot_python)
  exec "$PY" "$(cd "$(dirname "$0")" && pwd)/bench_plot.py" "$@"
fi
