"""A small TCP proxy that can delay what it forwards (interop/cluster-faults.sh).

Each nats-server of the fault test reaches its cluster peers through one of these, started
in the nats-server's own network namespace: `LISTEN=TARGET` pairs, e.g.

    delay_proxy.py 127.0.0.1:7002=10.77.0.12:6222 127.0.0.1:7003=10.77.0.13:6222

Every accepted connection is forwarded to its TARGET, both ways. Signals switch the delay:

    SIGUSR1  on:  each chunk read is written DELAY_MS +- JITTER_MS later (uniform, default
             100 +- 50 ms); a chunk is never written before the one read before it in the
             same direction (TCP order), so a chunk's delay is at least its own draw
    SIGUSR2  off: new chunks go through at once (chunks already waiting keep their time)

Buffers are bounded: at most QUEUE_CHUNKS chunks of at most CHUNK bytes wait per direction;
when the queue is full the proxy stops reading that side (TCP back-pressure). A connection
whose one side closes (or fails) is closed on the other side too.
SIGTERM / SIGINT stop the proxy. Prints one line per state change to stdout.
"""

import asyncio
import os
import random
import signal
import sys
import time

CHUNK = 32 * 1024
QUEUE_CHUNKS = 128  # at most 4 MiB waiting per direction
DELAY_MS = float(os.environ.get("DELAY_MS", "100"))
JITTER_MS = float(os.environ.get("JITTER_MS", "50"))

state = {"delay": False, "conns": 0}


def log(msg):
    print("%.3f delay_proxy[%d]: %s" % (time.time(), os.getpid(), msg), flush=True)


async def pipe(reader, writer):
    """Copy reader to writer through a bounded queue, each chunk released at its time."""
    queue = asyncio.Queue(maxsize=QUEUE_CHUNKS)
    loop = asyncio.get_running_loop()

    async def read_side():
        last_release = 0.0
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                now = loop.time()
                if state["delay"]:
                    d = max(0.0, DELAY_MS + random.uniform(-JITTER_MS, JITTER_MS)) / 1000.0
                    release = max(last_release, now + d)
                else:
                    release = max(last_release, now)
                last_release = release
                await queue.put((release, data))
        except (ConnectionError, OSError):
            pass
        finally:
            await queue.put((0.0, None))

    async def write_side():
        try:
            while True:
                release, data = await queue.get()
                if data is None:
                    break
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                if writer.can_write_eof():
                    writer.write_eof()
            except (ConnectionError, OSError, RuntimeError):
                pass

    rtask = asyncio.create_task(read_side())
    try:
        await write_side()
    finally:
        rtask.cancel()
        try:
            await rtask
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
            pass


def make_handler(target_host, target_port):
    async def handle(creader, cwriter):
        try:
            treader, twriter = await asyncio.wait_for(
                asyncio.open_connection(target_host, target_port), timeout=5
            )
        except (OSError, asyncio.TimeoutError):
            cwriter.close()
            return
        state["conns"] += 1
        tasks = [asyncio.create_task(pipe(creader, twriter)), asyncio.create_task(pipe(treader, cwriter))]
        try:
            # NATS routes do not half-close: once one direction ended, the connection is over.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            state["conns"] -= 1
            for w in (cwriter, twriter):
                try:
                    w.close()
                except (OSError, RuntimeError):
                    pass

    return handle


async def main(pairs):
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def set_delay(on):
        state["delay"] = on
        log("delay %s (%.0f +- %.0f ms), %d connections" % ("on" if on else "off", DELAY_MS, JITTER_MS, state["conns"]))

    loop.add_signal_handler(signal.SIGUSR1, set_delay, True)
    loop.add_signal_handler(signal.SIGUSR2, set_delay, False)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    servers = []
    for pair in pairs:
        listen, _, target = pair.partition("=")
        lhost, _, lport = listen.rpartition(":")
        thost, _, tport = target.rpartition(":")
        srv = await asyncio.start_server(make_handler(thost, int(tport)), lhost, int(lport), reuse_address=True)
        servers.append(srv)
        log("listening on %s -> %s" % (listen, target))
    await stop.wait()
    for srv in servers:
        srv.close()
    log("stopped")


if __name__ == "__main__":
    if len(sys.argv) < 2 or any("=" not in a for a in sys.argv[1:]):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(main(sys.argv[1:]))
