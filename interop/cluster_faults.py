"""Cluster mode under faults (interop/cluster-faults.sh): three nats-server processes and three
lanemq nodes, each in its own network namespace on one bridge, faults injected with iptables
(inside the namespaces), signals, and a delaying TCP proxy on the nats-server routes
(interop/delay_proxy.py), under a QoS 1 + QoS 2 load checked by paho-mqtt 2.x clients.

Runs inside the harness namespace that cluster-faults.sh made (it reaches the nodes over the
bridge); starts every server with `ip netns exec`. Prints one PASS:/FAIL: line per scenario
(the shell script counts them) and a table at the end.

Addresses (namespace <prefix>-<role>): nats-server i on 10.77.0.1i (client 4222, routes 6222,
monitoring 8222), lanemq node i on 10.77.0.2i (MQTT 1883, admin 18083), this harness 10.77.0.5.
nats-server i reaches its peer j through the proxy in its own namespace, 127.0.0.1:700j ->
10.77.0.1j:6222, and advertises its route address as 127.0.0.1:700i, so every route goes
through a proxy (a gossiped address too).

Workload of a scenario k: on every lanemq node one QoS 1 and one QoS 2 publisher, each
publishing "k:<pubid>:<seq>" on f/k/<pubid> at FAULTS_RATE msg/s with at most 100 unacknowledged
(a new connection, Clean Start, when the old one is gone: a publish not acknowledged on its
connection is never sent again, so it counts as not acknowledged, whether it arrives or not).
Acknowledged = PUBACK (QoS 1) / PUBREC and PUBCOMP (QoS 2) with a reason code below 0x80.
On every node one persistent subscriber (Clean Start 0, Session Expiry 600 s, `f/#` at QoS 2),
for the life of the cluster, reconnecting to its own node; a reconnect without Session Present
is a lost session. No client ever reconnects by itself (paho's loop is driven by hand). A named stream f<k> (filter f/k/#) is created through the REST API before the
workload.

Each scenario: a healthy check (every nats-server's /healthz, the log stream and the sessions
stream each with a leader that sees every replica current, lanemq nodes up with their
replicator running and at the same routed offset, then messages flowing from every node to
every node), the fault, the heal, then:
  lost        acknowledged messages a subscriber did not receive (summed over the 3), must be 0
  lost_log    acknowledged messages missing from the stream f<k> of a node (the most), must be 0
  dup_q2      extra copies of QoS 2 publishers' messages at the subscribers, must be 0
  dup_q1      the same for QoS 1 (reported)
  inv         order inversions per (publisher, subscriber): first deliveries whose sequence is
              below the previous one's (reported)
  recovery    seconds from the heal until a message published after the heal went from every
              node to every node (must happen within RECOVERY_CAP s)
  logs        every node's stream f<k> (GET /api/v5/stream/f<k>/messages: the $stream replay
              over HTTP) holds the same records (offset, topic, payload, qos, retain, ts,
              client id, properties) and every node routed the log to the same offset
              (lanemq_cluster_routed_offset); must hold
  nats copies whether every nats-server's own copy of the log stream (/jsz: messages, bytes,
              first and last sequence) is the same (reported; a scenario that leaves them
              different makes the next one start on a fresh cluster)
  (also shown: flow_in_fault, how many of the 9 (publisher node, subscriber node) pairs
  delivered a message published during the fault)
A lanemq node that exited, or whose replicator failed, or a lost persistent session fails the
scenario. A scenario runs on the cluster the one before left, unless that one left it with
diverged logs (lanemq's or nats-servers'), a node down, a failed replicator, no delivery, or not
healthy within 30 s: then
on a fresh cluster (new data directories, new subscribers), so that each verdict is about its
own fault.

Usage: cluster_faults.py LABEL NATS_SERVER LANEMQ_BIN WORK_DIR NS_PREFIX DEADLINE_EPOCH
Environment: FAULTS_RATE (100), FAULTS_SCENARIOS (all: s1 s2 s3 s4 s5a s5b s6),
FAULTS_SYNC_ALWAYS=1 (jetstream sync_interval: always), FAULTS_FAULT_S (12), FAULTS_HOLD (seconds:
start a cluster and wait that long before the scenarios, to look at it by hand).
"""

import collections
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

LABEL, NATS_BIN, LANEMQ_BIN, WORK, PREFIX = sys.argv[1:6]
DEADLINE = float(sys.argv[6])
HERE = os.path.dirname(os.path.abspath(__file__))
RATE = float(os.environ.get("FAULTS_RATE", "100"))
SCENARIOS = os.environ.get("FAULTS_SCENARIOS", "s1 s2 s3 s4 s5a s5b s6").split()
SYNC_ALWAYS = os.environ.get("FAULTS_SYNC_ALWAYS", "0") == "1"
FAULT_S = float(os.environ.get("FAULTS_FAULT_S", "12"))
WINDOW = 100  # unacknowledged publishes per publisher
RECOVERY_CAP = 45.0
DRAIN_CAP = 30.0
DRAIN_QUIET = 8.0
SCENARIO_MIN_S = 75  # do not start a scenario with less time than this before the deadline

NET = "10.77.0"
SUBNET = NET + ".0/24"
HARNESS_IP = NET + ".5"
NATS_IP = ["%s.1%d" % (NET, i + 1) for i in range(3)]
NODE_IP = ["%s.2%d" % (NET, i + 1) for i in range(3)]
NATS_NS = ["%s-n%d" % (PREFIX, i + 1) for i in range(3)]
NODE_NS = ["%s-m%d" % (PREFIX, i + 1) for i in range(3)]
ALL_NS = NATS_NS + NODE_NS
STREAM = "LANEMQ_LOG"
TOKEN = "faults-token"
NATS_USER, NATS_PASS = "lanemq", "faults-secret"

RESULTS = []
T0 = time.time()
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def now():
    return time.time()


def log(msg):
    t = now()
    print("  [%6.1f %s.%03dZ] %s" % (t - T0, time.strftime("%H:%M:%S", time.gmtime(t)), int(t * 1000) % 1000, msg), flush=True)


def result(name, ok, why):
    RESULTS.append((name, ok))
    print(("PASS: %s/%s -- %s" if ok else "FAIL: %s/%s -- %s") % (LABEL, name, why), flush=True)


# --- processes and the network ----------------------------------------------------------------


def nsexec(ns, *cmd):
    return ["ip", "netns", "exec", ns] + list(cmd)


def run(cmd, check=True, timeout=20):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r


def ipt(ns, *args):
    run(nsexec(ns, "iptables", "-w", "5", *args))


def firewall_init():
    """Every node namespace: chains FAULTS_IN (from INPUT) and FAULTS_OUT (from OUTPUT), empty."""
    for ns in ALL_NS:
        for chain, hook in (("FAULTS_IN", "INPUT"), ("FAULTS_OUT", "OUTPUT")):
            run(nsexec(ns, "iptables", "-w", "5", "-N", chain), check=False)
            ipt(ns, "-F", chain)
            if run(nsexec(ns, "iptables", "-w", "5", "-C", hook, "-j", chain), check=False).returncode != 0:
                ipt(ns, "-I", hook, "-j", chain)


def heal_all():
    for ns in ALL_NS:
        ipt(ns, "-F", "FAULTS_IN")
        ipt(ns, "-F", "FAULTS_OUT")


def cut(ns, peers):
    """Drop everything between namespace ns and the addresses (or prefixes) peers, both ways."""
    for p in peers:
        ipt(ns, "-A", "FAULTS_IN", "-s", p, "-j", "DROP")
        ipt(ns, "-A", "FAULTS_OUT", "-d", p, "-j", "DROP")


def loss(ns, probability):
    """Drop a share of the packets this namespace receives from the other nodes (the harness's
    own connections are spared, so only node-to-node traffic suffers)."""
    ipt(ns, "-A", "FAULTS_IN", "-s", HARNESS_IP, "-j", "RETURN")
    ipt(ns, "-A", "FAULTS_IN", "-s", SUBNET, "-m", "statistic", "--mode", "random",
        "--probability", str(probability), "-j", "DROP")


def tcp_up(ip, port, secs):
    end = now() + secs
    while now() < end:
        try:
            socket.create_connection((ip, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def http(url, method="GET", body=None, timeout=10, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError) as e:
        return None, str(e).encode()


class Proc:
    def __init__(self, name, ns, argv, logpath, env=None):
        self.name, self.ns, self.argv, self.logpath, self.env = name, ns, argv, logpath, env
        self.proc = None
        self.stopped = False

    def start(self):
        logf = open(self.logpath, "ab")
        self.proc = subprocess.Popen(nsexec(self.ns, *self.argv), stdout=logf, stderr=logf,
                                     env=self.env, start_new_session=True)
        logf.close()
        self.stopped = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def kill9(self):
        if self.proc is not None:
            if self.alive():
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace=10):
        if self.proc is None:
            return
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_size(self):
        try:
            return os.path.getsize(self.logpath)
        except OSError:
            return 0

    def log_since(self, offset):
        try:
            with open(self.logpath, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class Nats(Proc):
    def __init__(self, i, base):
        self.i = i
        self.dir = os.path.join(base, "nats%d" % (i + 1))
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "nats.conf")
        routes = ",\n".join('    "nats-route://127.0.0.1:700%d"' % (j + 1) for j in range(3) if j != i)
        with open(conf, "w") as f:
            f.write("""server_name: nats%d
listen: %s:4222
http: %s:8222
authorization {
  user: %s
  password: "%s"
}
jetstream {
  store_dir: "%s/js"
  max_memory_store: 64MB
  max_file_store: 2GB%s
}
cluster {
  name: lanemq
  listen: %s:6222
  advertise: "127.0.0.1:700%d"
  routes: [
%s
  ]
}
""" % (i + 1, NATS_IP[i], NATS_IP[i], NATS_USER, NATS_PASS, self.dir,
       "\n  sync_interval: always" if SYNC_ALWAYS else "", NATS_IP[i], i + 1, routes))
        super().__init__("nats%d" % (i + 1), NATS_NS[i], [NATS_BIN, "-c", conf],
                         os.path.join(self.dir, "nats.log"))
        pairs = ["127.0.0.1:700%d=%s:6222" % (j + 1, NATS_IP[j]) for j in range(3) if j != i]
        self.proxy = Proc("proxy%d" % (i + 1), NATS_NS[i],
                          [sys.executable, os.path.join(HERE, "delay_proxy.py")] + pairs,
                          os.path.join(self.dir, "proxy.log"))

    def start(self):
        super().start()
        if not tcp_up(NATS_IP[self.i], 4222, 15):
            raise RuntimeError("nats-server %d did not listen within 15 s" % (self.i + 1))

    def monitor(self, path, timeout=3):
        st, body = http("http://%s:8222%s" % (NATS_IP[self.i], path), timeout=timeout)
        if st != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None


class Node(Proc):
    def __init__(self, i, base):
        self.i = i
        self.dir = os.path.join(base, "lanemq%d" % (i + 1))
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        conf = os.path.join(self.dir, "lanemq.toml")
        acl = os.path.join(self.dir, "allow.acl")
        with open(conf, "w") as f:
            f.write("""[server]
allow_anonymous = true
acl_file = "%s"

[admin]
bind = "%s:18083"
token = "%s"

[cluster]
user = "%s"
password = "%s"
""" % (acl, NODE_IP[i], TOKEN, NATS_USER, NATS_PASS))
        with open(acl, "w") as f:
            f.write("allow all subscribe,create filter:$stream/#\nallow all publish filter:#\n"
                    "allow all subscribe filter:#\n")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        urls = ",".join("nats://%s:4222" % ip for ip in NATS_IP)
        super().__init__("node%d" % (i + 1), NODE_NS[i],
                         [LANEMQ_BIN, "serve", "--config", conf, "--mqtt", "%s:1883" % NODE_IP[i],
                          "--data-dir", os.path.join(self.dir, "data"), "--cluster", urls,
                          "--node-id", "node%d" % (i + 1)],
                         os.path.join(self.dir, "lanemq.log"), env=env)

    def start(self, wait=60):
        super().start()
        if not tcp_up(NODE_IP[self.i], 1883, wait):
            raise RuntimeError("lanemq node %d did not listen within %d s" % (self.i + 1, wait))

    def rest(self, method, path, body=None, timeout=10):
        return http("http://%s:18083%s" % (NODE_IP[self.i], path), method, body, timeout, TOKEN)

    def metrics(self):
        st, body = self.rest("GET", "/metrics", timeout=5)
        if st != 200:
            return None
        m = {}
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("lanemq_cluster_"):
                k, _, v = line.partition(" ")
                try:
                    m[k] = float(v)
                except ValueError:
                    pass
        return m


# --- MQTT clients ------------------------------------------------------------------------------


class TrackClient(mqtt.Client):
    """paho's client, noting PUBRECs with a failure reason code (paho goes on with PUBREL)."""

    def __init__(self, cid):
        super().__init__(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                         protocol=mqtt.MQTTv5)
        self.pubrec_failed = set()

    def _handle_pubrec(self):
        try:
            r = _packet.decode_pubrec(self._in_packet["command"], self._in_packet["packet"], self._protocol)
            if r.reason is not None and r.reason.value >= 0x80:
                self.pubrec_failed.add(r.mid)
        except Exception:  # noqa: BLE001 - paho reports the malformed packet itself
            pass
        return super()._handle_pubrec()


def connect(c, ip, clean, expiry, first, timeout=25.0):
    """Connect (first) or reconnect c and run its loop until the CONNACK: (ok, session_present,
    receive_maximum, why). No automatic reconnect anywhere: the caller decides."""
    res = {}

    def on_connect(cl, u, flags, rc, props):
        res["sp"] = flags.session_present
        res["rc"] = rc
        res["rm"] = getattr(props, "ReceiveMaximum", 65535) if props is not None else 65535

    c.on_connect = on_connect
    try:
        if first:
            props = Properties(PacketTypes.CONNECT)
            if expiry:
                props.SessionExpiryInterval = expiry
            c.connect(ip, 1883, keepalive=15, clean_start=clean, properties=props)
        else:
            c.reconnect()
    except (OSError, ValueError) as e:
        return False, None, 0, "connect: %s" % e
    end = now() + timeout
    while "rc" not in res and now() < end:
        rc = c.loop(0.1)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return False, None, 0, "loop before CONNACK: %s" % rc
    if "rc" not in res:
        return False, None, 0, "no CONNACK in %.0f s" % timeout
    if res["rc"].is_failure:
        return False, None, 0, "CONNACK %s" % res["rc"]
    return True, res["sp"], res["rm"], ""


class Subscriber(threading.Thread):
    """The persistent subscriber of node i: `f/#` at QoS 2, for the whole run."""

    def __init__(self, i, gen):
        super().__init__(daemon=True)
        self.i = i
        self.cid = "%s-c%d-fsub-%d" % (LABEL, gen, i + 1)
        self.lock = threading.Lock()
        self.recv = collections.defaultdict(list)  # scenario -> [(pubid, seq, t, qos)]
        self.events = []  # (t, text)
        self.session_lost = []  # times
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.connected = False
        self.crashed = None

    def on_message(self, c, u, m):
        t = now()
        try:
            k, pubid, seq = m.payload.decode().split(":")
            seq = int(seq)
        except ValueError:
            self.events.append((t, "unexpected payload %r on %s" % (m.payload[:40], m.topic)))
            return
        with self.lock:
            self.recv[k].append((pubid, seq, t, m.qos))

    def snapshot(self, k):
        with self.lock:
            return list(self.recv.get(k, []))

    def run(self):
        try:
            self.work()
        except Exception as e:  # noqa: BLE001 - reported as a harness error
            self.crashed = "%s: %r" % (type(e).__name__, e)
            self.events.append((now(), "subscriber thread died: " + self.crashed))
            self.connected = False

    def work(self):
        c = TrackClient(self.cid)
        c.on_message = self.on_message
        first = True
        subscribed = False
        while not self.stop.is_set():
            ok, sp, _, why = connect(c, NODE_IP[self.i], clean=False, expiry=600, first=first)
            first = False  # paho keeps host, port and CONNECT properties for reconnect()
            if not ok:
                self.events.append((now(), "connect failed: " + why))
                c._sock_close()
                self.stop.wait(0.5)
                continue
            if subscribed and not sp:
                self.session_lost.append(now())
                self.events.append((now(), "reconnected without Session Present: session lost"))
            if not sp:
                granted = {}
                c.on_subscribe = lambda cl, u, mid, rcs, props: granted.update(rc=rcs)
                c.subscribe("f/#", qos=2)
                end = now() + 15
                while "rc" not in granted and now() < end:
                    if c.loop(0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                        break
                if "rc" not in granted or granted["rc"][0].value != 2:
                    self.events.append((now(), "SUBSCRIBE f/# not granted QoS 2: %s" % granted.get("rc")))
                    c._sock_close()
                    self.stop.wait(0.5)
                    continue
                subscribed = True
            self.connected = True
            self.ready.set()
            while not self.stop.is_set():
                rc = c.loop(0.1)
                if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    self.events.append((now(), "connection lost: %s" % rc))
                    break
            self.connected = False
            if self.stop.is_set():
                break
            c._sock_close()
            self.stop.wait(0.5)
        try:
            c.disconnect()
            c.loop(0.1)
        except Exception:  # noqa: BLE001 - closing anyway
            pass


class Publisher(threading.Thread):
    """Publishes k:<pubid>:<seq> on f/k/<pubid> to node i at RATE msg/s, at most WINDOW
    unacknowledged; a new Clean Start connection (new client id) when the old one is gone."""

    def __init__(self, k, i, qos):
        super().__init__(daemon=True)
        self.k, self.i, self.qos = k, i, qos
        self.pubid = "m%dq%d" % (i + 1, qos)
        self.topic = "f/%s/%s" % (k, self.pubid)
        self.sent_at = []  # seq -> time of the publish() call
        self.acked = {}  # seq -> ack time
        self.refused = 0  # acks with a failure reason code
        self.abandoned = 0  # in flight when a connection ended
        self.connections = 0
        self.events = []
        self.stop = threading.Event()
        self.crashed = None

    def run(self):
        try:
            self.work()
        except Exception as e:  # noqa: BLE001 - reported as a harness error
            self.crashed = "%s: %r" % (type(e).__name__, e)
            self.events.append((now(), "publisher thread died: " + self.crashed))

    def work(self):
        seq = 0
        n = 0
        next_t = now()
        while not self.stop.is_set():
            c = TrackClient("%s-fp-%s-%s-%d" % (LABEL, self.k, self.pubid, n))
            n += 1
            outstanding = {}

            def on_publish(cl, u, mid, rc, props, outstanding=outstanding, c=c):
                s = outstanding.pop(mid, None)
                if s is None:
                    return
                if rc.value < 0x80 and mid not in c.pubrec_failed:
                    self.acked[s] = now()
                else:
                    self.refused += 1

            c.on_publish = on_publish
            c.max_inflight_messages_set(WINDOW)
            ok, _, rm, why = connect(c, NODE_IP[self.i], clean=True, expiry=0, first=True)
            if not ok:
                self.events.append((now(), "connect failed: " + why))
                c._sock_close()
                self.stop.wait(0.5)
                continue
            self.connections += 1
            window = max(1, min(WINDOW, rm))
            lost = False
            while not self.stop.is_set():
                t = now()
                if next_t < t - 1.0:
                    next_t = t  # no burst after a stall
                while next_t <= t and len(outstanding) < window:
                    payload = "%s:%s:%d" % (self.k, self.pubid, seq)
                    info = c.publish(self.topic, payload, qos=self.qos)
                    if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and info.rc != MQTTErrorCode.MQTT_ERR_NO_CONN:
                        self.events.append((now(), "publish rc %s" % info.rc))
                    self.sent_at.append(t)
                    outstanding[info.mid] = seq
                    seq += 1
                    next_t += 1.0 / RATE
                rc = c.loop(min(0.02, max(0.0, next_t - now())))
                if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    self.events.append((now(), "connection lost: %s (%d in flight)" % (rc, len(outstanding))))
                    lost = True
                    break
            if not lost:
                # Stopping: wait a little for the acks of what is in flight.
                end = now() + 3
                while outstanding and now() < end:
                    if c.loop(0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                        break
                try:
                    c.disconnect()
                    c.loop(0.1)
                except Exception:  # noqa: BLE001 - closing anyway
                    pass
            self.abandoned += len(outstanding)
            c._sock_close()
            if not self.stop.is_set():
                self.stop.wait(0.5)


# --- the cluster -------------------------------------------------------------------------------


class Cluster:
    """One cluster: fresh data directories under WORK/c<gen>, its own persistent subscribers."""

    def __init__(self, gen):
        self.gen = gen
        base = os.path.join(WORK, "c%d" % gen)
        self.nats = [Nats(i, base) for i in range(3)]
        self.nodes = [Node(i, base) for i in range(3)]
        self.subs = []
        self.start_problems = []

    def start(self):
        """Start everything; None, or why it did not come up."""
        t = now()
        try:
            self.start_servers()
        except RuntimeError as e:
            return str(e)
        self.subs = [Subscriber(i, self.gen) for i in range(3)]
        for s in self.subs:
            s.start()
        for s in self.subs:
            s.ready.wait(max(0.1, t + 60 - now()))
        if not all(s.ready.is_set() for s in self.subs):
            return "persistent subscribers not connected and subscribed: %s" % [s.events[-1:] for s in self.subs]
        log("cluster c%d up in %.1f s%s" % (self.gen, now() - t, "" if not self.start_problems else
                                            " (start problems: %s)" % self.start_problems))
        return None

    def start_servers(self):
        firewall_init()
        heal_all()
        for n in self.nats:
            n.proxy.start()
        time.sleep(0.3)
        for n in self.nats:
            n.start()
        end = now() + 30
        while now() < end and not all(
                http("http://%s:8222/healthz" % NATS_IP[n.i], timeout=2)[0] == 200 for n in self.nats):
            time.sleep(0.5)
        for n in self.nodes:
            try:
                n.start()
            except RuntimeError as e:
                # docs/cluster.md: a start waits for JetStream (cluster.connect_timeout_ms);
                # a node that gives up earlier is reported, and started once more.
                last = ANSI.sub("", n.log_since(0)).strip().splitlines()[-1:]
                self.start_problems.append("%s: %s (last log line: %s)" % (n.name, e, last))
                log("START PROBLEM: %s" % self.start_problems[-1])
                n.stop()
                n.start()

    def stop(self):
        for s in self.subs:
            s.stop.set()
        for s in self.subs:
            s.join(5)
        for n in self.nodes:
            n.stop()
        for n in self.nats:
            n.stop()
            n.proxy.stop(3)

    def stream_detail(self, n, stream):
        for path in ("/jsz?acc=%24G&streams=true", "/jsz?accounts=true&streams=true"):
            j = n.monitor(path)
            if not j:
                continue
            for acc in j.get("account_details") or []:
                for s in acc.get("stream_detail") or []:
                    if s.get("name") == stream:
                        return s.get("cluster") or {}
        return None

    def replica_states(self, stream=STREAM):
        """Each nats-server's own copy of the stream: (messages, bytes, first_seq, last_seq),
        None where a server does not answer."""
        out = []
        for n in self.nats:
            st = None
            if n.alive():
                for path in ("/jsz?acc=%24G&streams=true", "/jsz?accounts=true&streams=true"):
                    j = n.monitor(path)
                    for acc in (j or {}).get("account_details") or []:
                        for s in acc.get("stream_detail") or []:
                            if s.get("name") == stream:
                                x = s.get("state") or {}
                                st = (x.get("messages"), x.get("bytes"), x.get("first_seq"), x.get("last_seq"))
                    if st is not None:
                        break
            out.append(st)
        return out

    def replicas_agree(self, secs=10):
        """Whether every nats-server holds the same copy of the log stream (waits up to `secs`
        for followers to catch up), and the copies last seen."""
        end = now() + secs
        while True:
            states = self.replica_states()
            if None not in states and len(set(states)) == 1:
                return True, states
            if now() >= end:
                return False, states
            time.sleep(0.5)

    def stream_state(self, stream=STREAM):
        """(leader, replicas [(name, current)]) of a stream, as its leader sees them (only
        the leader's view of the replicas is current)."""
        leader = None
        for n in self.nats:
            if n.alive():
                cl = self.stream_detail(n, stream)
                if cl and cl.get("leader"):
                    leader = cl["leader"]
                    break
        if not leader or not leader.startswith("nats"):
            return None, []
        cl = self.stream_detail(self.nats[int(leader[4:]) - 1], stream) or {}
        if cl.get("leader") != leader:
            return None, []
        reps = [(r.get("name"), bool(r.get("current")) and not r.get("offline"))
                for r in cl.get("replicas") or []]
        return leader, reps

    def leader_index(self):
        leader, _ = self.stream_state()
        if leader and leader.startswith("nats"):
            return int(leader[4:]) - 1
        return None

    def health(self):
        """None when healthy, else why not."""
        for n in self.nats:
            if not n.alive():
                return "%s is not running" % n.name
            st, body = http("http://%s:8222/healthz" % NATS_IP[n.i], timeout=3)
            if st != 200:
                return "%s /healthz: %s %s" % (n.name, st, body[:100])
        for stream in (STREAM, STREAM + "_SESSIONS"):
            leader, reps = self.stream_state(stream)
            if not leader:
                return "%s has no leader" % stream
            if len(reps) != 2 or not all(c for _, c in reps):
                return "%s replicas not current: leader %s, replicas %s" % (stream, leader, reps)
        for n in self.nodes:
            if not n.alive():
                return "%s is not running" % n.name
            m = n.metrics()
            if m is None:
                return "%s /metrics does not answer" % n.name
            if m.get("lanemq_cluster_replicator_failed", 0) != 0:
                return "%s: lanemq_cluster_replicator_failed = %s" % (n.name, m.get("lanemq_cluster_replicator_failed"))
        for s in self.subs:
            if not s.connected:
                return "subscriber of node%d not connected" % (s.i + 1)
        offs = self.routed_offsets()
        if None in offs or len(set(offs)) != 1:
            return "routed log offsets differ: %s" % offs
        return None

    def wait_healthy(self, secs):
        end = now() + secs
        why = "not checked"
        while now() < end:
            why = self.health()
            if why is None:
                return None
            time.sleep(1)
        return why

    def routed_offsets(self):
        out = []
        for n in self.nodes:
            m = n.metrics() if n.alive() else None
            out.append(None if m is None else m.get("lanemq_cluster_routed_offset"))
        return out

    def read_stream(self, node, name, pages=400):
        """Every message of a named stream through node's REST API, or (None, why)."""
        recs = []
        offset = "earliest"
        for _ in range(pages):
            st, body = node.rest("GET", "/api/v5/stream/%s/messages?offset=%s&limit=1000" % (name, offset), timeout=20)
            if st != 200:
                return None, "HTTP %s %s" % (st, body[:120])
            j = json.loads(body)
            data = j.get("data") or []
            for m in data:
                recs.append((m.get("offset"), m.get("topic"), m.get("payload"), m.get("qos"), m.get("retain"),
                             m.get("ts"), m.get("from_clientid"), json.dumps(m.get("properties"), sort_keys=True)))
            if not data or j.get("next") in (None, offset):
                return recs, ""
            offset = j["next"]
        return recs, "more than %d pages" % pages


# --- scenarios ---------------------------------------------------------------------------------


class Scenario:
    """name, what it does; inject() applies the fault, heal() removes it and returns the heal
    time; hold: seconds between them."""

    def __init__(self, key, name, hold):
        self.key, self.name, self.hold = key, name, hold
        self.detail = ""

    def inject(self, cl):
        raise NotImplementedError

    def heal(self, cl):
        heal_all()
        return now()


class NatsIsolated(Scenario):
    def inject(self, cl):
        li = cl.leader_index()
        self.v = 0 if li is None else li
        self.detail = "isolated nats%d (stream leader: %s)" % (self.v + 1, "nats%d" % (li + 1) if li is not None else "unknown")
        cut(NATS_NS[self.v], [SUBNET])


class NodeIsolated(Scenario):
    def inject(self, cl):
        self.detail = "isolated node2 from every nats-server"
        cut(NODE_NS[1], NATS_IP)


class Minority(Scenario):
    def inject(self, cl):
        li = cl.leader_index()
        v = 0 if li is None else li
        m = (v + 2) % 3
        self.detail = "minority {nats%d (stream leader: %s), node%d} | majority {the rest}" % (
            v + 1, "nats%d" % (li + 1) if li is not None else "unknown", m + 1)
        majority = [NATS_IP[j] for j in range(3) if j != v] + [NODE_IP[j] for j in range(3) if j != m]
        cut(NATS_NS[v], majority)
        cut(NODE_NS[m], majority)


class LeaderStopped(Scenario):
    def inject(self, cl):
        li = cl.leader_index()
        if li is None:
            raise RuntimeError("no stream leader found on the monitoring endpoints")
        self.v = li
        self.detail = "SIGSTOP nats%d (the stream leader) for %.0f s" % (li + 1, self.hold)
        cl.nats[li].signal(signal.SIGSTOP)

    def heal(self, cl):
        cl.nats[self.v].signal(signal.SIGCONT)
        return now()


class Loss(Scenario):
    def inject(self, cl):
        self.detail = "5 %% packet loss into every node from every other node for %.0f s" % self.hold
        for ns in ALL_NS:
            loss(ns, 0.05)


class Delay(Scenario):
    def inject(self, cl):
        self.detail = "100 +- 50 ms delay on every route between nats-servers for %.0f s" % self.hold
        for n in cl.nats:
            n.proxy.signal(signal.SIGUSR1)

    def heal(self, cl):
        for n in cl.nats:
            n.proxy.signal(signal.SIGUSR2)
        return now()


class AllNatsKilled(Scenario):
    def inject(self, cl):
        self.detail = "kill -9 of the three nats-servers, restarted %.0f s later" % self.hold
        for n in cl.nats:
            n.signal(signal.SIGKILL)
        for n in cl.nats:
            n.kill9()

    def heal(self, cl):
        t = now()
        for n in cl.nats:
            n.start()
        return t


def make_scenarios():
    all_ = {
        "s1": NatsIsolated("s1", "s1_nats_isolated", FAULT_S),
        "s2": NodeIsolated("s2", "s2_node_isolated_from_nats", FAULT_S),
        "s3": Minority("s3", "s3_minority_partition", FAULT_S),
        "s4": LeaderStopped("s4", "s4_stream_leader_sigstop", 10),
        "s5a": Loss("s5a", "s5a_packet_loss_5pct", FAULT_S),
        "s5b": Delay("s5b", "s5b_route_delay_100ms", FAULT_S),
        "s6": AllNatsKilled("s6", "s6_all_nats_kill9", 5),
    }
    for k in SCENARIOS:
        if k not in all_:
            result(k, False, "unknown scenario (FAULTS_SCENARIOS takes %s)" % " ".join(all_))
    return [all_[k] for k in SCENARIOS if k in all_]


def pairs_flowing(subs, pubs, since):
    """{(publisher node, subscriber node): first receive time of a message published at or
    after `since`}."""
    out = {}
    by_id = {p.pubid: p for p in pubs}
    for s in subs:
        for (pubid, seq, t, _) in s.snapshot(pubs[0].k):
            p = by_id.get(pubid)
            if p is None or seq >= len(p.sent_at) or p.sent_at[seq] < since:
                continue
            key = (p.i, s.i)
            if key not in out or t < out[key]:
                out[key] = t
    return out


def wait_pairs(subs, pubs, since, cap):
    end = now() + cap
    while now() < end:
        got = pairs_flowing(subs, pubs, since)
        if len(got) == 9:
            return got
        time.sleep(0.2)
    return pairs_flowing(subs, pubs, since)


def evaluate(subs, pubs, k):
    acked = {(p.pubid, s) for p in pubs for s in list(p.acked)}
    q2 = {p.pubid for p in pubs if p.qos == 2}
    lost, dup_q2, dup_q1, inv = 0, 0, 0, 0
    lost_per_sub = []
    for s in subs:
        recs = s.snapshot(k)
        counts = collections.Counter((pid, seq) for (pid, seq, _, _) in recs)
        missing = acked - set(counts)
        lost += len(missing)
        lost_per_sub.append(len(missing))
        for (pid, seq), c in counts.items():
            if c > 1:
                if pid in q2:
                    dup_q2 += c - 1
                else:
                    dup_q1 += c - 1
        seen = set()
        last = {}
        for (pid, seq, _, _) in recs:
            if (pid, seq) in seen:
                continue
            seen.add((pid, seq))
            if pid in last and seq < last[pid]:
                inv += 1
            last[pid] = seq
    return acked, lost, lost_per_sub, dup_q2, dup_q1, inv


def compare_logs(cl, name, acked):
    """Wait until every node routed the log to the same offset, then read stream `name` on
    every node: (identical, lost_log, log_dups_q2, why)."""
    # Until the offsets are equal and still, or still for 3 s, or 15 s.
    end = now() + 15
    offs, prev, still_since = cl.routed_offsets(), None, now()
    while now() < end:
        offs = cl.routed_offsets()
        if offs != prev:
            prev, still_since = offs, now()
        elif None not in offs and len(set(offs)) == 1 or now() - still_since >= 3:
            break
        time.sleep(1)
    same_offset = None not in offs and len(set(offs)) == 1
    reads = []
    for n in cl.nodes:
        recs, why = cl.read_stream(n, name)
        if recs is None:
            return False, None, None, "%s: stream %s: %s; routed offsets %s" % (n.name, name, why, offs)
        reads.append(recs)
    digests = [hashlib.sha256(json.dumps(r).encode()).hexdigest()[:12] for r in reads]
    identical = all(r == reads[0] for r in reads)
    why = "routed offsets %s, stream %s: %s records, digests %s" % (
        [int(o) if o is not None else None for o in offs], name, [len(r) for r in reads], digests)
    if not identical:
        for i in range(1, 3):
            if reads[i] != reads[0]:
                first = next((j for j in range(min(len(reads[0]), len(reads[i]))) if reads[0][j] != reads[i][j]), None)
                if first is None:
                    why += "; node%d is a %s of node1's" % (i + 1, "prefix" if len(reads[i]) < len(reads[0]) else "extension")
                else:
                    a, b = reads[0][first], reads[i][first]
                    fields = [f for f, x, y in zip(("offset", "topic", "payload", "qos", "retain", "ts", "client", "props"), a, b) if x != y]
                    why += "; node%d differs from node1 at record %d (%s): %r vs %r" % (i + 1, first, ",".join(fields), a[:6], b[:6])
    lost_log = 0
    dups = 0
    for recs in reads:
        payloads = collections.Counter(r[2] for r in recs)
        have = set()
        for p in payloads:
            try:
                _, pid, seq = p.split(":")
                have.add((pid, int(seq)))
            except (ValueError, AttributeError):
                pass
        lost_log = max(lost_log, len(acked - have))
        dups = max(dups, sum(c - 1 for p, c in payloads.items() if c > 1 and isinstance(p, str) and "q2:" in p))
    return identical and same_offset, lost_log, dups, why


def error_lines(proc, since, limit=3):
    text = ANSI.sub("", proc.log_since(since))
    lines = [ln for ln in text.splitlines() if " ERROR " in ln or "panicked" in ln]
    warns = sum(1 for ln in text.splitlines() if " WARN " in ln)
    return lines[:limit], len(lines), warns


def fresh_cluster(state, why):
    if state["cl"] is not None:
        state["cl"].stop()
    state["gen"] += 1
    log("fresh cluster c%d (%s)" % (state["gen"], why))
    state["cl"] = Cluster(state["gen"])
    return state["cl"].start()


def run_scenario(state, sc, table):
    """state: the cluster in use ("cl"), its generation ("gen"), and why it must not be used
    again ("dirty": a scenario left its logs diverged, a node down, ...)."""
    log("=== %s/%s ===" % (LABEL, sc.name))
    t_start = now()
    repaired = ""
    if state["dirty"]:
        err = fresh_cluster(state, state["dirty"])
        state["dirty"] = None
        if err:
            state["dirty"] = "the last one did not start"
            result(sc.name, False, "the cluster did not start: %s" % err)
            table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "no start", "FAIL"))
            return
    cl = state["cl"]
    why = cl.wait_healthy(30)
    if why is not None:
        err = fresh_cluster(state, "not healthy: %s" % why)
        repaired = " (on a fresh cluster: the one before was not healthy: %s)" % why
        cl = state["cl"]
        why = err or cl.wait_healthy(45)
    if why is not None:
        state["dirty"] = "not healthy"
        result(sc.name, False, "cluster not healthy before the fault: %s" % why)
        table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "not healthy", "FAIL"))
        return
    log_marks = [n.log_size() for n in cl.nodes]
    sname = "f%s" % sc.key
    st, body = cl.nodes[int(sc.key[1]) % 3].rest("POST", "/api/v5/streams", {"name": sname, "topic_filter": "f/%s/#" % sc.key}, timeout=35)
    if st not in (200, 201):
        result(sc.name, False, "creating stream %s: HTTP %s %s" % (sname, st, body[:160]))
        table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "no stream", "FAIL"))
        return
    pubs = [Publisher(sc.key, i, q) for i in range(3) for q in (1, 2)]
    t_load = now()
    for p in pubs:
        p.start()
    got = wait_pairs(cl.subs, pubs, t_load, 30)
    if len(got) < 9:
        for p in pubs:
            p.stop.set()
        for p in pubs:
            p.join(10)
        missing = sorted({(a + 1, b + 1) for a in range(3) for b in range(3)} - {(a + 1, b + 1) for (a, b) in got})
        result(sc.name, False, "no delivery before the fault for (publisher node, subscriber node) %s%s" % (missing, repaired))
        table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "no flow", "FAIL"))
        return
    log("healthy: delivery between every pair of nodes in %.1f s" % (max(got.values()) - t_load))
    time.sleep(2)
    t_fault = now()
    try:
        sc.inject(cl)
    except (RuntimeError, subprocess.SubprocessError) as e:
        heal_all()
        for p in pubs:
            p.stop.set()
        result(sc.name, False, "injecting the fault failed: %s" % e)
        table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "inject failed", "FAIL"))
        return
    log("fault: %s" % sc.detail)
    time.sleep(sc.hold)
    during = pairs_flowing(cl.subs, pubs, t_fault + 1)
    t_heal = sc.heal(cl)
    log("healed after %.1f s (pairs of nodes delivering while faulted: %d of 9)" % (t_heal - t_fault, len(during)))
    got = wait_pairs(cl.subs, pubs, t_heal, RECOVERY_CAP)
    recovery = (max(got.values()) - t_heal) if len(got) == 9 else None
    if recovery is None:
        missing = sorted({(a + 1, b + 1) for a in range(3) for b in range(3)} - {(a + 1, b + 1) for (a, b) in got})
        log("delivery not recovered within %.0f s for (publisher node, subscriber node) %s" % (RECOVERY_CAP, missing))
    else:
        log("delivery recovered %.1f s after the heal" % recovery)
    time.sleep(2)
    for p in pubs:
        p.stop.set()
    for p in pubs:
        p.join(15)
    acked = {(p.pubid, s) for p in pubs for s in list(p.acked)}
    # Drain: until every subscriber has every acknowledged message, or nothing arrived for
    # DRAIN_QUIET s, or the cap.
    end = now() + DRAIN_CAP
    last_total, last_change = -1, now()
    while now() < end:
        snaps = [s.snapshot(sc.key) for s in cl.subs]
        if all(acked <= {(pid, seq) for (pid, seq, _, _) in snap} for snap in snaps):
            break
        total = sum(len(snap) for snap in snaps)
        if total != last_total:
            last_total, last_change = total, now()
        elif now() - last_change > DRAIN_QUIET:
            break
        time.sleep(0.5)
    log("drained in %.1f s" % (now() - end + DRAIN_CAP))
    time.sleep(1)
    acked, lost, lost_per_sub, dup_q2, dup_q1, inv = evaluate(cl.subs, pubs, sc.key)
    identical, lost_log, log_dups, why_logs = compare_logs(cl, sname, acked)
    # A nats-server whose copy of the log differs from the others' (a leader cut off that kept
    # writes it never committed, on nats-server 2.9) would serve the next scenario a log that
    # is not the cluster's: reported, and the next scenario gets a fresh cluster.
    nats_same, nats_states = cl.replicas_agree()
    if not nats_same:
        log("nats-server copies of %s differ (messages, bytes, first_seq, last_seq): %s" % (STREAM, nats_states))
    sent = sum(len(p.sent_at) for p in pubs)
    crashed = [n.name for n in cl.nodes if not n.alive()]
    lost_sessions = [s.i + 1 for s in cl.subs for t in s.session_lost if t >= t_start]
    failed_repl = []
    for n in cl.nodes:
        m = n.metrics() if n.alive() else None
        if m is not None and m.get("lanemq_cluster_replicator_failed", 0) != 0:
            failed_repl.append(n.name)
    log("publishers (pubid, connections, sent, acked, refused, abandoned): %s" % [
        (p.pubid, p.connections, len(p.sent_at), len(p.acked), p.refused, p.abandoned) for p in pubs])
    for s in cl.subs:
        ev = [e for (t, e) in s.events if t >= t_start]
        if ev:
            log("subscriber of node%d: %d events, first: %s" % (s.i + 1, len(ev), ev[:3]))
    for n, mark in zip(cl.nodes, log_marks):
        errs, nerr, nwarn = error_lines(n, mark)
        if nerr or nwarn:
            log("%s log during the scenario: %d ERROR, %d WARN lines%s" % (
                n.name, nerr, nwarn, "".join("\n      " + e[:300] for e in errs)))
    log("logs: %s" % why_logs)
    harness = [p.pubid + ": " + p.crashed for p in pubs if p.crashed] + [
        "sub%d: %s" % (s.i + 1, s.crashed) for s in cl.subs if s.crashed]
    ok = (not harness and lost == 0 and (lost_log == 0) and dup_q2 == 0 and recovery is not None and identical
          and not crashed and not lost_sessions and not failed_repl and len(acked) > 0)
    reasons = []
    if harness:
        reasons.append("harness error (the checker itself failed): %s" % harness)
    if len(acked) == 0:
        reasons.append("nothing acknowledged")
    if lost:
        reasons.append("acked but not received: %d (per subscriber %s)" % (lost, lost_per_sub))
    if lost_log:
        reasons.append("acked but missing from the stream: %s" % lost_log)
    if dup_q2:
        reasons.append("QoS 2 duplicates: %d" % dup_q2)
    if recovery is None:
        reasons.append("delivery not recovered within %.0f s" % RECOVERY_CAP)
    if not identical:
        reasons.append("node logs differ")
    if crashed:
        reasons.append("lanemq exited: %s" % crashed)
    if lost_sessions:
        reasons.append("sessions lost (subscriber of node %s)" % lost_sessions)
    if failed_repl:
        reasons.append("replicator failed on %s" % failed_repl)
    if not identical or crashed or failed_repl or recovery is None or not nats_same:
        state["dirty"] = "the last scenario left it %s" % ", ".join(
            x for x, bad in (("with diverged logs", not identical), ("with a node down", crashed),
                             ("with nats-servers holding different copies of the log", not nats_same),
                             ("with a failed replicator", failed_repl),
                             ("without delivery", recovery is None)) if bad)
    rec = "%.1f" % recovery if recovery is not None else ">%.0f" % RECOVERY_CAP
    summary = ("%s; sent=%d acked=%d lost=%d lost_log=%s dup_q2=%d dup_q1=%d log_dup_q2=%s inversions=%d "
               "flow_in_fault=%d/9 recovery_s=%s logs_identical=%s nats_copies_identical=%s%s" % (
                   sc.detail, sent, len(acked), lost, lost_log, dup_q2, dup_q1, log_dups, inv, len(during), rec,
                   "yes" if identical else "no", "yes" if nats_same else "no", repaired))
    result(sc.name, ok, summary if ok else "; ".join(reasons) + " -- " + summary)
    table.append((sc.name, sent, len(acked), lost, lost_log, dup_q2, dup_q1, inv, "%d/9" % len(during), rec,
                  "yes" if identical else "no", "PASS" if ok else "FAIL"))
    log("scenario took %.0f s" % (now() - t_start))


def print_table(table):
    hdr = ("scenario", "sent", "acked", "lost", "lost_log", "dup_q2", "dup_q1", "inversions", "flow_in_fault",
           "recovery_s", "logs_identical", "result")
    rows = [hdr] + [tuple(str(x) for x in r) for r in table]
    widths = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
    print("%s: results (nats-server %s, %s)" % (LABEL, NATS_VERSION, "sync_interval: always" if SYNC_ALWAYS else "default sync"))
    for r in rows:
        print("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)), flush=True)


def main():
    global NATS_VERSION
    NATS_VERSION = subprocess.run([NATS_BIN, "--version"], capture_output=True, text=True).stdout.strip()

    def on_term(*_):
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)
    state = {"cl": None, "gen": 0, "dirty": "first start"}
    table = []
    try:
        log("%s: %s, lanemq %s, rate %.0f msg/s per publisher, work dir %s" % (LABEL, NATS_VERSION, LANEMQ_BIN, RATE, WORK))
        hold = float(os.environ.get("FAULTS_HOLD", "0"))
        if hold > 0:
            err = fresh_cluster(state, "FAULTS_HOLD: a cluster to look at by hand for %.0f s" % hold)
            state["dirty"] = err
            time.sleep(hold)
        for sc in make_scenarios():
            if DEADLINE - now() < SCENARIO_MIN_S:
                result(sc.name, False, "not run: %.0f s left of the time budget" % (DEADLINE - now()))
                table.append((sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "NOT RUN"))
                continue
            try:
                run_scenario(state, sc, table)
            finally:
                heal_all()
                if state["cl"] is not None:
                    for n in state["cl"].nats:
                        n.signal(signal.SIGCONT)
                        n.proxy.signal(signal.SIGUSR2)
    finally:
        print_table(table)
        if state["cl"] is not None:
            state["cl"].stop()
    return 0 if all(ok for _, ok in RESULTS) else 1


NATS_VERSION = "?"
if __name__ == "__main__":
    sys.exit(main())
