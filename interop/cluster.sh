#!/usr/bin/env bash
# Cluster mode end to end (docs/cluster.md): three nats-server processes (JetStream, cluster
# routes; the log stream at R3) and three lanemq nodes with --cluster on loopback, driven by
# paho-mqtt (interop/paho_cluster.py): delivery across nodes in order per publisher, retained
# messages, identical stream replay on every node, and kill -9 of one lanemq node and of one
# nats-server under QoS 1/2 load (every acknowledged message delivered, QoS 2 without
# duplicates, the restarted node catches up).
#
#   bash interop/cluster.sh
#
# Installs Debian's nats-server with apt-get when it is missing.
# Environment: LANEMQ_BIN (default target/release/lanemq), NATS_SERVER, KEEP_TMP=1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
. interop/lib.sh

NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
if [ ! -x "$NATS_SERVER" ]; then
  echo "nats-server missing: apt-get install nats-server"
  if [ "$(id -u)" = 0 ]; then
    apt_install nats-server || true
  else
    sudo bash -c "$(declare -f apt_install); apt_install nats-server" || true
  fi
  NATS_SERVER=$(command -v nats-server || echo /usr/sbin/nats-server)
fi
if [ ! -x "$NATS_SERVER" ]; then
  echo "nats-server is not installed and apt-get install nats-server failed" >&2
  exit 2
fi
PY=$(paho_python) || exit 2
if [ ! -x "$LANEMQ_BIN" ]; then
  echo "broker binary $LANEMQ_BIN not found: cargo build --release -p lanemq" >&2
  exit 2
fi
echo "cluster: $("$NATS_SERVER" --version 2>&1 | head -1), lanemq $LANEMQ_BIN"
timeout 600 "$PY" interop/paho_cluster.py "$LANEMQ_BIN" "$NATS_SERVER" "$WORK" | tee "$WORK/results.txt"
add_results "$WORK/results.txt"
if [ "$N_FAIL" -gt 0 ]; then
  for f in "$WORK"/lanemq*/lanemq.log; do
    echo "--- last 20 lines of $f ---"
    tail -n 20 "$f"
  done
fi
summary cluster
[ "$N_FAIL" -eq 0 ]
