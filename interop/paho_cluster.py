"""Cluster mode end to end (interop/cluster.sh): three nats-server processes (JetStream,
cluster routes, the log stream at R3) and three lanemq nodes on loopback, driven with
paho-mqtt 2.x. Prints PASS:/FAIL: lines; the shell script counts them.

Scenarios:
  cross_node        QoS 1 from node 1, subscribers on nodes 2 and 3 get every message in order
  every_node        publishers on all three nodes, a subscriber on each node gets all of them,
                    in order per publisher
  retained          a retained message published on node 1 reaches a new subscriber on node 3
  stream_replay     $stream/<name> with stream-offset=earliest gives the same messages with the
                    same stream-offset values on every node
  kill              QoS 1 and QoS 2 load from clients on all nodes; kill -9 of one lanemq node
                    and of one nats-server, both restarted: every PUBACKed/PUBCOMPed message
                    reaches the persistent subscribers on the other nodes, QoS 2 without
                    duplicates, and the restarted node catches up (stream replay identical)

Usage: paho_cluster.py LANEMQ_BIN NATS_SERVER WORK_DIR
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt

# The sessions bucket is refreshed every 0.5 s by the session's node.
SYNC_WAIT = 1.0
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

LANEMQ, NATS, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
RESULTS = []


def result(name, ok, why=""):
    RESULTS.append((name, ok))
    print(("PASS: " + name) if ok else ("FAIL: %s -- %s" % (name, why)), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, secs):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Nats:
    """One nats-server of the three (JetStream, cluster routes)."""

    def __init__(self, i, ports, routes):
        self.i, self.port, self.route = i, ports[i], routes[i]
        self.routes = routes
        self.dir = os.path.join(WORK, "nats%d" % i)
        os.makedirs(self.dir, exist_ok=True)
        self.conf = os.path.join(self.dir, "nats.conf")
        others = ",\n".join(
            '    "nats-route://127.0.0.1:%d"' % r for j, r in enumerate(routes) if j != i
        )
        with open(self.conf, "w") as f:
            f.write(
                """server_name: nats%d
listen: 127.0.0.1:%d
authorization {
  user: lanemq
  password: "cluster-test-secret"
}
jetstream {
  store_dir: "%s/js"
  max_memory_store: 64MB
  max_file_store: 2GB
}
cluster {
  name: lanemq
  listen: 127.0.0.1:%d
  routes: [
%s
  ]
}
"""
                % (i, self.port, self.dir, self.route, others)
            )
        self.proc = None

    def start(self):
        log = open(os.path.join(self.dir, "nats.log"), "ab")
        self.proc = subprocess.Popen([NATS, "-c", self.conf], stdout=log, stderr=log)
        if not wait_port(self.port, 15):
            raise RuntimeError("nats-server %d did not start" % self.i)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Node:
    """One lanemq node in cluster mode."""

    def __init__(self, i, nats_urls):
        self.i = i
        self.port = free_port()
        self.http = free_port()
        self.dir = os.path.join(WORK, "lanemq%d" % i)
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        self.conf = os.path.join(self.dir, "lanemq.toml")
        with open(self.conf, "w") as f:
            f.write(
                """[server]
allow_anonymous = true
acl_file = "%s/allow.acl"

[admin]
bind = "127.0.0.1:%d"
token = "cluster-test-token"

[[streams]]
name = "all"
topic_filter = "t/#"

[[lite.parents]]
name = "agents"
pattern = "agents/{lane}/#"

[cluster]
user = "lanemq"
password = "cluster-test-secret"
"""
                % (self.dir, self.http)
            )
        with open(os.path.join(self.dir, "allow.acl"), "w") as f:
            f.write("allow all subscribe,create filter:$stream/#\nallow all publish filter:#\nallow all subscribe filter:#\n")
        self.nats_urls = nats_urls
        self.proc = None

    def start(self):
        log = open(os.path.join(self.dir, "lanemq.log"), "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.proc = subprocess.Popen(
            [
                LANEMQ,
                "serve",
                "--config",
                self.conf,
                "--mqtt",
                "127.0.0.1:%d" % self.port,
                "--data-dir",
                os.path.join(self.dir, "data"),
                "--cluster",
                ",".join(self.nats_urls),
                "--node-id",
                "node%d" % self.i,
            ],
            stdout=log,
            stderr=log,
            env=env,
        )
        if not wait_port(self.port, 60):
            raise RuntimeError("lanemq node %d did not start (see %s)" % (self.i, self.dir))

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def client(cid, port, clean=True, expiry=0, on_message=None, present=None):
    c = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=cid,
        protocol=mqtt.MQTTv5,
    )
    if on_message:
        c.on_message = on_message
    connected = threading.Event()

    # present: a dict that gets "session_present" once the CONNACK came.
    def on_connect(cl, u, flags, rc, props):
        if present is not None:
            present["session_present"] = flags.session_present
            present["rc"] = rc
        connected.set()

    c.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)
    if expiry:
        props.SessionExpiryInterval = expiry
    c.connect("127.0.0.1", port, keepalive=30, clean_start=clean, properties=props)
    c.loop_start()
    # The CONNACK first (a node may wait for the sessions bucket while JetStream elects).
    connected.wait(25)
    return c


# A session resumed after its node died gets again only what its client received this long
# before the death at most (positions are written every 20 ms; the rest is the pipeline).
RESUME_REPEAT_WINDOW_S = 0.5


class Collector:
    """Messages a subscriber received: (topic, payload, user properties)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.msgs = []
        self.times = {}

    def __call__(self, c, u, m):
        with self.lock:
            ups = dict(m.properties.UserProperty) if hasattr(m.properties, "UserProperty") else {}
            self.msgs.append((m.topic, m.payload.decode(), ups, m.qos))
            self.times.setdefault(m.payload.decode(), time.time())

    def received_at(self):
        """Payload -> when it was first received (the client acknowledges it then)."""
        with self.lock:
            return dict(self.times)

    def count(self):
        with self.lock:
            return len(self.msgs)

    def snapshot(self):
        with self.lock:
            return list(self.msgs)


def subscribe(c, flt, qos, props=None):
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(flt, qos=qos, properties=props)
    done.wait(10)


def wait_count(col, n, secs):
    end = time.time() + secs
    while time.time() < end and col.count() < n:
        time.sleep(0.05)
    return col.count()


def publish_all(c, topic_fmt, n, qos):
    infos = []
    for k in range(n):
        infos.append(c.publish(topic_fmt % k if "%" in topic_fmt else topic_fmt, str(k), qos=qos))
    for i in infos:
        i.wait_for_publish(30)
    return all(i.is_published() for i in infos)


def in_order(payloads):
    vals = [int(p) for p in payloads]
    return vals == sorted(vals) and len(set(vals)) == len(vals)


def cross_node(nodes):
    cols = [Collector(), Collector()]
    subs = [client("x-sub%d" % i, nodes[i + 1].port, on_message=cols[i]) for i in range(2)]
    for s in subs:
        subscribe(s, "t/cross/#", 1)
    pub = client("x-pub", nodes[0].port)
    ok = publish_all(pub, "t/cross/a", 500, 1)
    got = [wait_count(c, 500, 20) for c in cols]
    for s in subs + [pub]:
        s.disconnect()
    orders = [in_order([m[1] for m in c.snapshot()]) for c in cols]
    result(
        "cross_node",
        ok and got == [500, 500] and all(orders),
        "pubacked=%s received=%s in_order=%s" % (ok, got, orders),
    )


def every_node(nodes):
    cols = [Collector() for _ in nodes]
    subs = [client("e-sub%d" % i, n.port, on_message=cols[i]) for i, n in enumerate(nodes)]
    for s in subs:
        subscribe(s, "t/every/#", 1)
    pubs = [client("e-pub%d" % i, n.port) for i, n in enumerate(nodes)]
    threads = [
        threading.Thread(target=publish_all, args=(p, "t/every/p%d" % i, 300, 1))
        for i, p in enumerate(pubs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [wait_count(c, 900, 30) for c in cols]
    ok = got == [900, 900, 900]
    why = "received=%s" % got
    for c in cols:
        msgs = c.snapshot()
        for p in range(3):
            seq = [m[1] for m in msgs if m[0] == "t/every/p%d" % p]
            if not in_order(seq) or len(seq) != 300:
                ok = False
                why += "; publisher %d out of order or missing (%d)" % (p, len(seq))
    for s in subs + pubs:
        s.disconnect()
    result("every_node", ok, why)


def retained(nodes):
    pub = client("r-pub", nodes[0].port)
    pub.publish("t/retained/x", "kept", qos=1, retain=True).wait_for_publish(10)
    pub.disconnect()
    col = Collector()
    end = time.time() + 10
    ok = False
    while time.time() < end and not ok:
        s = client("r-sub", nodes[2].port, on_message=col)
        subscribe(s, "t/retained/#", 1)
        ok = wait_count(col, 1, 2) >= 1
        s.disconnect()
    msgs = col.snapshot()
    result("retained", ok and msgs[0][1] == "kept", "got %r" % msgs[:1])

    # Deleted through node 2's REST API: gone on every node.
    dst, _ = rest(nodes[1], "DELETE", "/api/v5/mqtt/retainer/message/t/retained/x")
    gone = settled(nodes, "/api/v5/mqtt/retainer/message/t/retained/x", 404)
    result(
        "retained_deleted_on_every_node",
        dst in (200, 204) and gone == [404, 404, 404],
        "delete=%s gets after=%s" % (dst, gone),
    )


def stream_read(port, cid, n, secs=20):
    col = Collector()
    c = client(cid, port, on_message=col)
    props = Properties(PacketTypes.SUBSCRIBE)
    props.UserProperty = ("stream-offset", "earliest")
    subscribe(c, "$stream/all", 1, props)
    wait_count(col, n, secs)
    # Then until nothing more arrives for 2 s (the whole history, not a prefix).
    last, quiet_since = col.count(), time.time()
    while time.time() - quiet_since < 2:
        time.sleep(0.1)
        if col.count() != last:
            last, quiet_since = col.count(), time.time()
    c.disconnect()
    return [(m[0], m[1], m[2].get("stream-offset")) for m in col.snapshot()]


def stream_replay(nodes, name="stream_replay", n=None):
    # Everything published under t/ so far is in the stream "all" on every node.
    if n is None:
        n = 500 + 900 + 1
    reads = [stream_read(node.port, "%s-%d" % (name, i), n) for i, node in enumerate(nodes)]
    # A node that restarted may still be catching up with the cluster's log: read it again
    # (up to 60 s) until it has as much as the others.
    end = time.time() + 60
    attempt = 0
    while time.time() < end and len({len(r) for r in reads}) > 1:
        attempt += 1
        longest = max(len(r) for r in reads)
        for i, node in enumerate(nodes):
            if len(reads[i]) < longest:
                reads[i] = stream_read(node.port, "%s-%d-again%d" % (name, i, attempt), longest)
    lens = [len(r) for r in reads]
    same = all(r == reads[0] for r in reads)
    offsets_ok = all(m[2] is not None for m in reads[0])
    result(
        name,
        same and lens[0] >= n and offsets_ok,
        "lengths=%s identical=%s offsets=%s" % (lens, same, offsets_ok),
    )


class Loader:
    """A publisher thread that keeps publishing to one node (reconnecting to the next node
    when its node is gone) and records what was acknowledged."""

    def __init__(self, name, nodes, home, qos, topic=None):
        self.name, self.nodes, self.home, self.qos = name, nodes, home, qos
        # topic(n): the topic of message n (default: one topic per publisher).
        self.topic = topic or (lambda n, name=name: "t/load/" + name)
        self.acked = set()
        self.sent = 0
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        k = 0
        target = self.home
        while not self.stop.is_set():
            try:
                c = client("%s-%d" % (self.name, k), self.nodes[target].port)
            except OSError:
                target = (target + 1) % len(self.nodes)
                time.sleep(0.2)
                continue
            self.connections += 1
            gone = threading.Event()
            c.on_disconnect = lambda *a, g=gone: g.set()
            try:
                while not self.stop.is_set() and not gone.is_set():
                    infos = []
                    for _ in range(20):
                        payload = "%s:%d" % (self.name, self.sent)
                        self.sent += 1
                        infos.append((payload, c.publish(self.topic(self.sent - 1), payload, qos=self.qos)))
                    deadline = time.time() + 10
                    for payload, i in infos:
                        try:
                            i.wait_for_publish(max(0.01, deadline - time.time()))
                        except (RuntimeError, ValueError):
                            continue
                        if i.is_published():
                            self.acked.add(payload)
                    time.sleep(0.01)
            except (OSError, RuntimeError, ValueError):
                pass
            # paho's network thread reconnects on its own: stop it without waiting for it
            # (a new client, on the next node, takes over).
            def drop(c=c):
                try:
                    c.disconnect()
                    c.loop_stop()
                except Exception:  # noqa: BLE001 - the socket may be gone already
                    pass

            threading.Thread(target=drop, daemon=True).start()
            k += 1
            target = (target + 1) % len(self.nodes)
            time.sleep(0.2)


def rest(node, method, path, body=None):
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (node.http, path),
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer cluster-test-token", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def rest_streams(nodes):
    """A stream created through one node's REST API exists on every node, indexes the same
    messages with the same offsets there, and a delete through another node removes it
    everywhere."""
    st, body = rest(nodes[0], "POST", "/api/v5/streams", {"name": "viarest", "topic_filter": "v/#"})
    gets = settled(nodes, "/api/v5/stream/viarest", 200)
    pub = client("v-pub", nodes[1].port)
    ok = publish_all(pub, "v/x", 50, 1)
    pub.disconnect()
    reads = []
    for i, node in enumerate(nodes):
        col = Collector()
        c = client("v-read%d" % i, node.port, on_message=col)
        props = Properties(PacketTypes.SUBSCRIBE)
        props.UserProperty = ("stream-offset", "earliest")
        subscribe(c, "$stream/viarest", 1, props)
        wait_count(col, 50, 20)
        c.disconnect()
        reads.append([(m[1], m[2].get("stream-offset")) for m in col.snapshot()])
    same = all(r == reads[0] for r in reads) and len(reads[0]) == 50
    result(
        "rest_stream_created_on_every_node",
        st in (200, 201) and gets == [200, 200, 200] and ok and same,
        "create=%s %r gets=%s lengths=%s identical=%s"
        % (st, body[:120], gets, [len(r) for r in reads], same),
    )
    dst, _ = rest(nodes[2], "DELETE", "/api/v5/stream/viarest")
    gone = settled(nodes, "/api/v5/stream/viarest", 404)
    dup, _ = rest(nodes[1], "POST", "/api/v5/streams", {"name": "t-dup", "topic_filter": "d/#"})
    dup2, _ = rest(nodes[2], "POST", "/api/v5/streams", {"name": "t-dup", "topic_filter": "d/#"})
    result(
        "rest_stream_deleted_on_every_node",
        dst in (200, 204) and gone == [404, 404, 404] and dup in (200, 201) and dup2 == 409,
        "delete=%s gets after=%s create=%s create again elsewhere=%s" % (dst, gone, dup, dup2),
    )


def stream_auto_created(nodes):
    """A stream auto-created by a SUBSCRIBE on node 1 exists on every node from the same log
    offset: the messages published after it replay identically everywhere."""
    import json

    col = Collector()
    c = client("ac-sub", nodes[0].port, on_message=col)
    subscribe(c, "$stream/autoc/t/auto/#", 1)
    gets = settled(nodes, "/api/v5/stream/autoc", 200)
    pub = client("ac-pub", nodes[2].port)
    ok = publish_all(pub, "t/auto/x", 20, 1)
    pub.disconnect()
    live = wait_count(col, 1, 20)
    c.disconnect()
    counts = []
    for n in nodes:
        end = time.time() + 20
        rec = None
        while time.time() < end:
            code, b = rest(n, "GET", "/api/v5/stream/autoc")
            if code == 200:
                rec = json.loads(b).get("stats", {}).get("message_count")
                if rec:
                    break
            time.sleep(0.2)
        counts.append(rec)
    result(
        "stream_auto_created_on_every_node",
        gets == [200, 200, 200] and ok and live >= 1 and counts[0] is not None and counts.count(counts[0]) == 3,
        "gets right after the SUBSCRIBE=%s pubacked=%s live=%d records per node=%s" % (gets, ok, live, counts),
    )


def settled(nodes, path, want, secs=10):
    """GET `path` on every node until each answers `want` (every node applies a registry change
    when its replicator reaches it: the REST call answers once its own node did), at most
    `secs` seconds; the codes last seen."""
    end = time.time() + secs
    codes = [None] * len(nodes)
    for i, n in enumerate(nodes):
        while True:
            codes[i] = rest(n, "GET", path)[0]
            if codes[i] == want or time.time() >= end:
                break
            time.sleep(0.1)
    return codes


def rest_parents(nodes):
    """A lite parent created through one node's REST API exists on every node from the same
    log offset on (its lanes hold the same offsets everywhere); a delete through another node
    removes it everywhere."""
    import json

    st, body = rest(nodes[0], "POST", "/api/v5/lite/parents", {"name": "tasks", "pattern": "tasks/{lane}/#"})
    gets = settled(nodes, "/api/v5/lite/parents/tasks", 200)
    again, _ = rest(nodes[1], "POST", "/api/v5/lite/parents", {"name": "tasks", "pattern": "tasks/{lane}/#"})
    pub = client("p-pub", nodes[2].port)
    ok = publish_all(pub, "tasks/job-1/run", 30, 1)
    pub.disconnect()
    offsets = []
    for n in nodes:
        end = time.time() + 20
        off = None
        while time.time() < end:
            code, b = rest(n, "GET", "/api/v5/lite/parents/tasks/lanes/job-1")
            if code == 200:
                off = json.loads(b).get("next_offset")
                if off == 30:
                    break
            time.sleep(0.2)
        offsets.append(off)
    result(
        "rest_parent_created_on_every_node",
        st in (200, 201) and gets == [200, 200, 200] and again == 409 and ok and offsets == [30, 30, 30],
        "create=%s %r gets=%s create again elsewhere=%s lane next_offset per node=%s"
        % (st, body[:120], gets, again, offsets),
    )
    dst, _ = rest(nodes[1], "DELETE", "/api/v5/lite/parents/tasks")
    gone = settled(nodes, "/api/v5/lite/parents/tasks", 404)
    result(
        "rest_parent_deleted_on_every_node",
        dst in (200, 204) and gone == [404, 404, 404],
        "delete=%s gets after=%s" % (dst, gone),
    )


def cluster_metrics(nodes):
    """Every node exports its cluster figures on /metrics."""
    vals = []
    for n in nodes:
        st, body = rest(n, "GET", "/metrics")
        m = {}
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("lanemq_cluster_"):
                k, _, v = line.partition(" ")
                m[k] = float(v)
        vals.append(m)
    ok = all(
        m.get("lanemq_cluster_replicated_total", 0) > 0
        and m.get("lanemq_cluster_routed_offset", 0) > 0
        and m.get("lanemq_cluster_replicator_failed") == 0
        for m in vals
    ) and sum(m.get("lanemq_cluster_published_total", 0) for m in vals) > 0
    result("cluster_metrics", ok, "figures: %r" % vals)


def wait_key(d, key, secs):
    end = time.time() + secs
    while time.time() < end and key not in d:
        time.sleep(0.02)
    return d.get(key)


def session_move(nodes):
    """A persistent session made on node 2 resumes on node 3 (queued messages, in order,
    once), then a live connection to node 3 is taken over by a connection to node 1."""
    col = Collector()
    s = client("mv-sub", nodes[1].port, clean=False, expiry=600, on_message=col)
    subscribe(s, "t/move/#", 1)
    time.sleep(0.3)
    s.disconnect()
    s.loop_stop()
    pub = client("mv-pub", nodes[0].port)
    ok = publish_all(pub, "t/move/a", 200, 1)
    time.sleep(0.5)
    col2, present = Collector(), {}
    s2 = client("mv-sub", nodes[2].port, clean=False, expiry=600, on_message=col2, present=present)
    sp = wait_key(present, "session_present", 10)
    got = wait_count(col2, 200, 20)
    vals = [m[1] for m in col2.snapshot()]
    result(
        "session_resumed_on_another_node",
        ok and sp is True and got == 200 and in_order(vals),
        "pubacked=%s session_present=%s received=%d in_order=%s" % (ok, sp, got, in_order(vals)),
    )
    # Live takeover across nodes: the same client id connects to node 1 while connected to node 3.
    gone = threading.Event()
    s2.on_disconnect = lambda *a: gone.set()
    # The connection taken over must not come back by itself (paho reconnects after 1 s):
    # that would take the session back to node 3 while node 1's client receives.
    s2.reconnect_delay_set(min_delay=120, max_delay=120)
    col3, present3 = Collector(), {}
    s3 = client("mv-sub", nodes[0].port, clean=False, expiry=600, on_message=col3, present=present3)
    sp3 = wait_key(present3, "session_present", 10)
    kicked = gone.wait(5)
    s2.loop_stop()
    ok2 = publish_all(pub, "t/move/b", 100, 1)
    got3 = wait_count(col3, 100, 20)
    vals3 = [m[1] for m in col3.snapshot() if m[0] == "t/move/b"]
    result(
        "session_taken_over_across_nodes",
        sp3 is True and kicked and ok2 and len(vals3) == 100 and in_order(vals3),
        "session_present=%s old_connection_closed=%s received=%d" % (sp3, kicked, len(vals3)),
    )
    s3.disconnect()
    pub.disconnect()


class LaneCollector:
    """Lane deliveries of several group members, in arrival order: (member, lane, offset, payload)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.msgs = []

    def member(self, name):
        def on_message(c, u, m):
            ups = dict(m.properties.UserProperty) if hasattr(m.properties, "UserProperty") else {}
            with self.lock:
                self.msgs.append((name, ups.get("lane"), int(ups.get("lane-offset", -1)), m.payload.decode()))

        return on_message

    def snapshot(self):
        with self.lock:
            return list(self.msgs)

    def wait(self, pred, secs):
        end = time.time() + secs
        while time.time() < end and not pred(self.snapshot()):
            time.sleep(0.1)
        return self.snapshot()


def lane_order_ok(msgs, lanes):
    """Per lane, the offsets in arrival order never go back, and each payload is its offset."""
    for lane in lanes:
        offs = [o for (_, l, o, _) in msgs if l == lane]
        if offs != sorted(offs):
            return False
    return all(str(o) == p.split(":")[1] for (_, _, o, p) in msgs)


def publish_lanes(nodes, tag, lanes, first, n):
    """Lane i is published from node i % 3, messages first..first+n-1 (payload lane:k)."""
    pubs = [client("%s-pub%d" % (tag, i), nodes[i].port) for i in range(len(nodes))]
    infos = []
    for k in range(first, first + n):
        for i, lane in enumerate(lanes):
            infos.append(pubs[i % len(pubs)].publish("agents/%s/req" % lane, "%s:%d" % (lane, k), qos=1))
    for i in infos:
        i.wait_for_publish(30)
    ok = all(i.is_published() for i in infos)
    for p in pubs:
        p.disconnect()
    return ok


def lanes_across_nodes(nodes):
    """One consumer group with a member on every node: each lane message once, in lane order."""
    col = LaneCollector()
    members = []
    for i, node in enumerate(nodes):
        m = client("w-%d" % i, node.port, on_message=col.member("node%d" % i))
        subscribe(m, "$share/workers/agents/+/#", 1)
        members.append(m)
    time.sleep(SYNC_WAIT * 2)
    lanes = ["s-%d" % i for i in range(12)]
    ok = publish_lanes(nodes, "w", lanes, 0, 25)
    want = {(l, k) for l in lanes for k in range(25)}
    msgs = col.wait(lambda ms: want <= {(l, o) for (_, l, o, _) in ms}, 30)
    time.sleep(1)
    msgs = col.snapshot()
    got = {(l, o) for (_, l, o, _) in msgs}
    dups = len(msgs) - len(got)
    by_node = {}
    for (name, _, _, _) in msgs:
        by_node[name] = by_node.get(name, 0) + 1
    holders = {l: {name for (name, ll, _, _) in msgs if ll == l} for l in lanes}
    for m in members:
        m.disconnect()
    print("lanes_shared_across_nodes: pubacked=%s delivered=%d duplicates=%d per node=%s" % (ok, len(want & got), dups, by_node), flush=True)
    result(
        "lanes_shared_across_nodes",
        ok and want <= got and dups == 0 and lane_order_ok(msgs, lanes) and len(by_node) >= 2
        and all(len(h) == 1 for h in holders.values()),
        "pubacked=%s delivered=%d of %d duplicates=%d per node=%s in_order=%s"
        % (ok, len(want & got), len(want), dups, by_node, lane_order_ok(msgs, lanes)),
    )


def lanes_node_loss(nodes):
    """Group offsets survive the loss of the node that dispatched a lane: after a kill -9 its
    lanes go on from the committed offsets on the other node, in order."""
    col = LaneCollector()
    m0 = client("v-0", nodes[0].port, on_message=col.member("node0"))
    subscribe(m0, "$share/movers/agents/+/#", 1)
    m1 = client("v-1", nodes[1].port, on_message=col.member("node1"))
    subscribe(m1, "$share/movers/agents/+/#", 1)
    time.sleep(SYNC_WAIT * 2)
    lanes = ["m-%d" % i for i in range(12)]
    ok1 = publish_lanes(nodes[1:], "v1", lanes, 0, 20)
    first = {(l, k) for l in lanes for k in range(20)}
    col.wait(lambda ms: first <= {(l, o) for (_, l, o, _) in ms}, 30)
    on0 = {l for (name, l, _, _) in col.snapshot() if name == "node0"}
    pre = [(l, o) for (_, l, o, _) in col.snapshot()]
    dup_before = len(pre) - len(set(pre))
    # The acks are committed through the log before the kill.
    time.sleep(2)
    before = len(col.snapshot())
    t0 = time.time()
    nodes[0].kill9()
    m0.loop_stop()
    ok2 = publish_lanes(nodes[1:], "v2", lanes, 20, 20)
    second = {(l, k) for l in lanes for k in range(20, 40)}
    msgs = col.wait(lambda ms: second <= {(l, o) for (_, l, o, _) in ms}, 40)
    moved_s = time.time() - t0
    after = msgs[before:]
    again = [(l, o) for (_, l, o, _) in after if o < 20]
    got2 = {(l, o) for (_, l, o, _) in after}
    nodes[0].start()
    m1.disconnect()
    print("lanes_offsets_survive_node_loss: lanes on the killed node=%d, after the kill %d of %d delivered in %.1f s, %d redelivered from before"
          % (len(on0), len(second & got2), len(second), moved_s, len(again)), flush=True)
    result(
        "lanes_offsets_survive_node_loss",
        ok1 and ok2 and len(on0) > 0 and dup_before == 0 and second <= got2 and not again
        and lane_order_ok(after, lanes),
        "lanes on the killed node=%d duplicates before the kill=%d delivered after the kill=%d of %d (in %.1f s) "
        "redelivered from before=%d in_order=%s"
        % (len(on0), dup_before, len(second & got2), len(second), moved_s, len(again), lane_order_ok(after, lanes)),
    )


def kill(nodes, nats):
    # Persistent subscribers on nodes 2 and 3 (QoS 1 and QoS 2); node 1 is the one killed.
    c1, c2 = Collector(), Collector()
    s1 = client("k-sub1", nodes[1].port, clean=False, expiry=600, on_message=c1)
    subscribe(s1, "t/load/#", 1)
    s2 = client("k-sub2", nodes[2].port, clean=False, expiry=600, on_message=c2)
    subscribe(s2, "t/load/#", 2)
    c0 = Collector()
    s0 = client("k-sub0", nodes[0].port, clean=False, expiry=600, on_message=c0)
    subscribe(s0, "t/load/#", 1)
    # A lane consumer group with a member on every node, fed by a QoS 1 lane publisher.
    lcol = LaneCollector()
    lmembers = []
    for i in range(3):
        m = client("kl-%d" % i, nodes[i].port, on_message=lcol.member("node%d" % i))
        subscribe(m, "$share/killers/agents/+/#", 1)
        lmembers.append(m)
    time.sleep(SYNC_WAIT)
    loaders = [Loader("L%d" % i, nodes, i, 1 if i < 2 else 2) for i in range(3)]
    lane_loader = Loader("LK", nodes, 0, 1, topic=lambda n: "agents/k-%d/x" % (n % 8))
    loaders.append(lane_loader)
    for l in loaders:
        l.thread.start()
    time.sleep(4)
    t0 = time.time()
    nodes[0].kill9()
    nats[1].kill9()
    killed_at = time.time()
    s0.loop_stop()
    lmembers[0].loop_stop()
    # Its client comes back on node 2: the session resumes from the sessions bucket.
    c0b, present0 = Collector(), {}
    s0b = client("k-sub0", nodes[1].port, clean=False, expiry=600, on_message=c0b, present=present0)
    sp0 = wait_key(present0, "session_present", 15)
    time.sleep(3)
    nats[1].start()
    nodes[0].start()
    recovered = time.time() - killed_at
    time.sleep(5)
    for l in loaders:
        l.stop.set()
    for l in loaders:
        l.thread.join(30)
        if l.thread.is_alive():
            import traceback
            frame = sys._current_frames().get(l.thread.ident)
            print("kill: publisher %s still running:\n%s" % (l.name, "".join(traceback.format_stack(frame))), flush=True)
    lane_acked = set(lane_loader.acked)
    acked = set().union(*[l.acked for l in loaders if l is not lane_loader])
    # Give the subscribers time to drain.
    end = time.time() + 60
    while time.time() < end:
        got1 = {m[1] for m in c1.snapshot()}
        got2 = {m[1] for m in c2.snapshot()}
        got0 = {m[1] for m in c0.snapshot()} | {m[1] for m in c0b.snapshot()}
        got_lanes = {p for (_, l, _, p) in lcol.snapshot()}
        if acked <= got1 and acked <= got2 and acked <= got0 and lane_acked <= got_lanes:
            break
        time.sleep(0.5)
    got1 = [m[1] for m in c1.snapshot()]
    got2 = [m[1] for m in c2.snapshot()]
    miss1 = len(acked - set(got1))
    miss2 = len(acked - set(got2))
    q2 = [m[1] for m in c2.snapshot() if m[1].startswith("L2:")]
    dup2 = len(q2) - len(set(q2))
    s1.disconnect()
    s2.disconnect()
    print(
        "kill: per publisher (connections, sent, acked)=%s"
        % [(l.connections, l.sent, len(l.acked)) for l in loaders],
        flush=True,
    )
    print(
        "kill: acked=%d sent=%d sub1=%d missing1=%d sub2=%d missing2=%d qos2_duplicates=%d restart_s=%.1f elapsed_s=%.1f"
        % (
            len(acked),
            sum(l.sent for l in loaders),
            len(got1),
            miss1,
            len(got2),
            miss2,
            dup2,
            recovered,
            time.time() - t0,
        ),
        flush=True,
    )
    result(
        "kill_acked_delivered",
        len(acked) > 0 and miss1 == 0 and miss2 == 0,
        "acked=%d missing at node 2: %d, at node 3: %d" % (len(acked), miss1, miss2),
    )
    result("kill_qos2_no_duplicates", dup2 == 0, "%d duplicates" % dup2)
    got0 = {m[1] for m in c0.snapshot()} | {m[1] for m in c0b.snapshot()}
    miss0 = len(acked - got0)
    s0b.disconnect()
    # Lanes: every acknowledged lane message reached the group; per lane the group got the
    # offsets in order (a batch in flight on the killed node comes again from its first
    # uncommitted offset: only first deliveries are compared) and without a gap.
    lmsgs = [m for m in lcol.snapshot() if m[1] and m[1].startswith("k-")]
    lane_missing = len(lane_acked - {p for (_, _, _, p) in lmsgs})
    lanes_ok, again = True, 0
    for lane in {m[1] for m in lmsgs}:
        seen, firsts = set(), []
        for (_, l, o, _) in lmsgs:
            if l != lane:
                continue
            if o in seen:
                again += 1
                continue
            seen.add(o)
            firsts.append(o)
        if firsts != sorted(firsts) or firsts != list(range(firsts[0], firsts[0] + len(firsts))):
            lanes_ok = False
    for m in lmembers[1:]:
        m.disconnect()
    print("kill: lanes acked=%d delivered=%d missing=%d delivered again=%d in order=%s"
          % (len(lane_acked), len(lmsgs), lane_missing, again, lanes_ok), flush=True)
    result(
        "kill_lanes_delivered_in_order",
        len(lane_acked) > 0 and lane_missing == 0 and lanes_ok,
        "lane messages acked=%d missing=%d in order without gaps=%s" % (len(lane_acked), lane_missing, lanes_ok),
    )
    result(
        "kill_session_resumed_on_another_node",
        sp0 is True and miss0 == 0,
        "session_present=%s missing=%d of %d acked" % (sp0, miss0, len(acked)),
    )
    # What the resumed session got again: only what its client received (and acknowledged)
    # in the last moments before its node died, never what it had acknowledged earlier (the
    # node writes the session's position to the log with the acknowledgements).
    before = c0.received_at()
    again0 = [p for p in {m[1] for m in c0b.snapshot()} if p in before]
    oldest = max((t0 - before[p] for p in again0), default=0.0)
    print("kill: resumed session got %d of the %d messages received before the kill again, "
          "the oldest received %.3f s before the kill" % (len(again0), len(before), oldest), flush=True)
    result(
        "kill_session_resume_repeats_only_in_flight",
        oldest <= RESUME_REPEAT_WINDOW_S,
        "%d repeated, the oldest received %.3f s before the kill (at most %.1f s allowed)"
        % (len(again0), oldest, RESUME_REPEAT_WINDOW_S),
    )
    # Per publisher connection, what the persistent subscriber got is in publish order.
    ordered = []
    for l in loaders:
        vals = [int(p.split(":")[1]) for p in got1 if p.startswith(l.name + ":")]
        ordered.append(sum(1 for a, b in zip(vals, vals[1:]) if b < a))
    # Order per publisher is not asserted here: a record in flight to the nats-server that was
    # killed is published again after later ones (docs/cluster.md, "Order"); every_node
    # checks the order without failures.
    print("kill: order per publisher, inversions seen by node 2: %s" % ordered, flush=True)


def main():
    nats_ports = [free_port() for _ in range(3)]
    routes = [free_port() for _ in range(3)]
    nats = [Nats(i, nats_ports, routes) for i in range(3)]
    nodes = []
    try:
        for n in nats:
            n.start()
        urls = ["nats://127.0.0.1:%d" % p for p in nats_ports]
        nodes = [Node(i, urls) for i in range(3)]
        for n in nodes:
            n.start()
        cross_node(nodes)
        every_node(nodes)
        retained(nodes)
        stream_replay(nodes)
        session_move(nodes)
        rest_streams(nodes)
        rest_parents(nodes)
        stream_auto_created(nodes)
        cluster_metrics(nodes)
        lanes_across_nodes(nodes)
        lanes_node_loss(nodes)
        kill(nodes, nats)
        stream_replay(nodes, "stream_replay_after_kill", n=1401 + 300)
    finally:
        for n in nodes:
            n.stop()
        for n in nats:
            n.stop()
    return 0 if all(ok for _, ok in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
