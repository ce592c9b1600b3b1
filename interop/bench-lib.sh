# Helpers shared by the interop/bench-*.sh scripts that run their own broker (sourced; no side
# effects: unlike lib.sh it makes no temp dir and sets no traps).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Wait (up to 120 s) until something accepts on 127.0.0.1:$1; exit status 1 if nothing does.
wait_port() {
  python3 - "$1" <<'PY'
import socket, sys, time
t0 = time.monotonic()
while time.monotonic() - t0 < 120:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.01)
sys.exit(1)
PY
}
