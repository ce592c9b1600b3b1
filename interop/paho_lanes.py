#!/usr/bin/env python3
"""Lite-topic lanes (issue 6) with the Eclipse Paho Python client (paho-mqtt 2.x, MQTT 5).

Run through interop/paho-lanes.sh, which starts a broker with the lite parents below and passes
its port:

    interop/.venv/bin/python interop/paho_lanes.py --port PORT [SCENARIO_SUBSTRING...]

Lite parents the broker must have (declared by paho-lanes.sh; [lite] sweep_interval_ms = 500):

    agents  agents/{lane}/#  shared                  worker pool, reject (group "workers")
    crash   crash/{lane}/#   shared                  consumer killed mid-batch (group "pool"),
                                                     holder resumes (one-lane group "solo")
    tasks   tasks/{lane}/#   shared, max_attempts 2  suspend (group "sus"), retry (group "rt")
    ttl     ttl/{lane}/#     shared, ttl_s 2         TTL expiry (group "ttlg")
    sess    sess/{lane}/#    shared                  resume of one lane by lane-offset, new
                                                     groups at latest / <n>
    quota   quota/{lane}/#   max_lanes 3, max_key_bytes 8   refusals (group "qg")
    excl    excl/{lane}/#    exclusive               lane owners (group "ex")
    mk      mk/{lane}/#      key_levels 2            two-level keys (groups "mkg" on mk/+/+/#, "mk1")
    rm      rm/{lane}/#      shared                  Receive Maximum of a member (group "rmg")

Semantics: /work/shared/spec/lite.md (and docs/lanes.md once written). Every lane delivery
carries the user properties `lane` (the key) and `lane-offset` (dense per lane from 0). Acks with
a reason code or user properties (`lane-suspend-ms`, PUBACK >= 0x80) are not expressible with
paho's public API (`Client.ack(mid, qos)` sends a bare 2-byte PUBACK), so LClient.puback()
encodes the MQTT 5 PUBACK itself (packet id, reason code, properties packed by paho's Properties) and queues it on
the paho connection's own output queue, the same path Client.ack() uses.

Prints PASS/FAIL per scenario and a closing "paho-lanes: N passed, N failed, N skipped" line;
the exit code is the number of failures. Every wait is bounded; all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import struct
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

import paho_scenarios as ps  # noqa: E402
from paho_scenarios import Failure, check  # noqa: E402

PUBACK = 0x40

# One order over the deliveries of all clients: a delivery gets the next number when its
# on_message callback runs. A lane's next message can only go out after the broker got the ack of
# the previous one, which is sent from inside that callback, so this order is consistent with a
# lane's delivery order even when consecutive messages of a lane go to different members.
ORDER_LOCK = threading.Condition()
ORDER = [0]


def note(msg: str) -> None:
    print(f"  {msg}", flush=True)


def sample(xs, n=8) -> str:
    xs = list(xs)
    s = ", ".join(str(x) for x in xs[:n])
    return f"[{s}{', ...' if len(xs) > n else ''}] ({len(xs)})"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


class Delivery:
    """One received PUBLISH with its lane properties and our handling of it."""

    __slots__ = ("cid", "topic", "payload", "qos", "dup", "mid", "up", "lane", "off", "n", "t",
                 "acked", "ack_reason", "lane_count", "off_count")

    def __init__(self, cid: str, m: ps.Msg, dup: bool, n: int, t: float):
        self.cid = cid
        self.topic = m.topic
        self.payload = m.payload
        self.qos = m.qos
        self.dup = dup
        self.mid = m.mid
        self.up = list(m.prop("UserProperty", None) or [])
        lanes = [v for k, v in self.up if k == "lane"]
        offs = [v for k, v in self.up if k == "lane-offset"]
        self.lane_count = len(lanes)
        self.off_count = len(offs)
        self.lane = lanes[-1] if lanes else None
        try:
            self.off = int(offs[-1]) if offs else None
        except ValueError:
            self.off = None
        self.n = n
        self.t = t
        self.acked = False
        self.ack_reason = None

    @property
    def text(self) -> str:
        return self.payload.decode(errors="replace")

    def prop(self, k: str):
        vals = [v for kk, v in self.up if kk == k]
        return vals[-1] if vals else None

    def __repr__(self) -> str:
        return (f"<#{self.n} {self.cid} {self.topic} {self.text!r} lane={self.lane} off={self.off} "
                f"dup={int(self.dup)} mid={self.mid}{' acked' if self.acked else ''}>")


def ack_all(c: "LClient", d: Delivery) -> None:
    c.ack(d)


class LClient(ps.Client):
    """paho_scenarios.Client with manual acks, a delivery handler run in on_message (default: ack
    everything at once), the global delivery order, and PUBACKs with reason code and properties."""

    def __init__(self, cid: str, handler=ack_all, **kw):
        kw.setdefault("manual_ack", True)
        super().__init__(cid, **kw)
        self.handler = handler
        self.deliveries: list[Delivery] = []
        self.handler_errors: list[str] = []
        self.pub_rc: dict[int, object] = {}
        self.c.on_publish = self._on_publish
        self.c.max_inflight_messages_set(200)  # publish_many pipelines (before connect: paho 2.x)

    def _on_message(self, c, ud, m):
        super()._on_message(c, ud, m)
        with ORDER_LOCK:
            n = ORDER[0]
            ORDER[0] += 1
            d = Delivery(self.cid, self.msgs[-1], bool(m.dup), n, time.monotonic())
            self.deliveries.append(d)
        try:
            if self.handler is not None:
                self.handler(self, d)
        except Exception as e:  # reported by the scenario (a callback exception would be lost)
            self.handler_errors.append(f"{type(e).__name__}: {e}")
        with ORDER_LOCK:
            ORDER_LOCK.notify_all()

    def _on_publish(self, c, ud, mid, rc, properties):
        with self.cond:
            self.pub_rc[mid] = rc
            self.cond.notify_all()

    # acks ---------------------------------------------------------------------------------
    def ack(self, d: Delivery) -> None:
        """paho's own manual ack (Client.ack): PUBACK 0x00 without properties."""
        rc = self.c.ack(d.mid, d.qos)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: ack({d.mid}) returned {rc}")
        d.acked = True
        d.ack_reason = 0

    def puback(self, d: Delivery, reason: int = 0, user_props: list[tuple[str, str]] | None = None) -> None:
        """An MQTT 5 PUBACK with a reason code and user properties, encoded here and queued on
        the paho connection (paho 2.x's Client.ack() cannot carry either)."""
        p = Properties(PacketTypes.PUBACK)
        for kv in user_props or []:
            p.UserProperty = kv
        body = struct.pack("!HB", d.mid, reason) + p.pack()
        pkt = bytes([PUBACK]) + varint(len(body)) + body
        rc = self.c._packet_queue(PUBACK, pkt, d.mid, 1)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: raw PUBACK for {d.mid} returned {rc}")
        d.acked = reason == 0 and not user_props
        d.ack_reason = reason

    # subscribe ----------------------------------------------------------------------------
    def subscribe_lane(self, topic: str, qos=1, *, offset: str | None = None) -> int:
        """SUBSCRIBE (optionally with the user property lane-offset); returns the granted QoS,
        failing on a refusal."""
        p = Properties(PacketTypes.SUBSCRIBE)
        if offset is not None:
            p.UserProperty = ("lane-offset", offset)
        self.c.on_subscribe = self._on_subscribe_p
        rc, mid = self.c.subscribe(topic, options=SubscribeOptions(qos=qos),
                                   properties=p if offset is not None else None)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: subscribe({topic}) returned {rc}")
        check(self._wait(lambda: mid in self.subacks), f"{self.cid}: no SUBACK for {topic}")
        codes, props = self.subacks[mid]
        code = codes[0]
        why = getattr(props, "ReasonString", None) if props is not None else None
        check(not code.is_failure, f"{self.cid}: SUBACK for {topic} (lane-offset {offset}): "
                                   f"0x{code.value:02X} {code} {why or ''}")
        return code.value

    def _on_subscribe_p(self, c, ud, mid, rcs, properties):
        with self.cond:
            self.subacks[mid] = (rcs, properties)
            self.cond.notify_all()

    # publish ------------------------------------------------------------------------------
    def publish_many(self, msgs, qos=1, timeout=20.0, user_props=None) -> dict[int, object]:
        """Publish (topic, payload) pairs pipelined (paho's in-flight window), in order; wait
        for every PUBACK; return {index: reason code}."""
        p = None
        if user_props:
            p = Properties(PacketTypes.PUBLISH)
            for kv in user_props:
                p.UserProperty = kv
        infos = []
        for topic, payload in msgs:
            info = self.c.publish(topic, payload, qos=qos, properties=p)
            check(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: publish({topic}) returned {info.rc}")
            infos.append(info)
        if qos == 0:
            return {}
        deadline = time.monotonic() + timeout
        for info in infos:
            left = deadline - time.monotonic()
            if left > 0 and not info.is_published():
                info.wait_for_publish(left)
        unacked = sum(1 for i in infos if not i.is_published())
        check(unacked == 0, f"{self.cid}: {unacked} of {len(infos)} QoS {qos} publishes not acknowledged "
                            f"within {timeout}s")
        with self.cond:
            self.cond.wait_for(lambda: all(i.mid in self.pub_rc for i in infos), 2.0)
            return {k: self.pub_rc.get(i.mid) for k, i in enumerate(infos)}

    def publish_rc(self, topic: str, payload: bytes, qos=1) -> int | None:
        """One publish; the PUBACK reason code (None for QoS 0)."""
        info = self.c.publish(topic, payload, qos=qos)
        check(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: publish({topic}) returned {info.rc}")
        if qos == 0:
            return None
        info.wait_for_publish(ps.WAIT)
        check(info.is_published(), f"{self.cid}: publish({topic}) not acknowledged within {ps.WAIT}s")
        with self.cond:
            self.cond.wait_for(lambda: info.mid in self.pub_rc, 2.0)
            rc = self.pub_rc.get(info.mid)
        return rc.value if rc is not None and hasattr(rc, "value") else rc


def wait_until(pred, timeout: float) -> bool:
    """Until pred() (evaluated under the delivery lock, re-checked on every delivery)."""
    with ORDER_LOCK:
        return ORDER_LOCK.wait_for(pred, timeout)


def poll_until(pred, timeout: float, interval=0.1) -> bool:
    """Until pred() (for predicates too costly to re-check on every delivery), polled."""
    deadline = time.monotonic() + timeout
    while True:
        with ORDER_LOCK:
            if pred():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_quiet(clients, idle: float, timeout: float) -> None:
    """Until no client got a delivery for `idle` seconds (at most `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ORDER_LOCK:
            last = max((c.deliveries[-1].t for c in clients if c.deliveries), default=0.0)
        now = time.monotonic()
        if now - last >= idle:
            return
        time.sleep(min(idle - (now - last) + 0.01, max(0.0, deadline - now)))


def check_lane_props(ds, expect_lane) -> None:
    """Every delivery carries exactly one `lane` and one decimal `lane-offset`, `lane` equal to
    expect_lane(delivery)."""
    bad = []
    for d in ds:
        want = expect_lane(d)
        if d.lane_count != 1 or d.off_count != 1 or d.off is None or d.lane != want:
            bad.append((d.topic, d.up, f"expected lane={want!r}"))
    check(not bad, f"lane/lane-offset user properties wrong (need exactly one each, lane = key): {sample(bad, 4)}")


def handler_errors(clients) -> None:
    errs = [f"{c.cid}: {e}" for c in clients for e in c.handler_errors]
    check(not errs, f"errors in the delivery handlers: {sample(errs, 4)}")


def all_deliveries(clients) -> list[Delivery]:
    with ORDER_LOCK:
        return sorted((d for c in clients for d in c.deliveries), key=lambda d: d.n)


def parse_key_seq(d: Delivery) -> tuple[str, int]:
    """Payloads are '<lane key>:<seq>'."""
    k, _, s = d.text.rpartition(":")
    return k, int(s)


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


def s_worker_pool():
    """4 consumers in group `workers` ($share/workers/agents/+/#, one asks QoS 2 and must be
    granted 1), manual acks; 1,000 lanes x 5 QoS 1 messages: every message processed exactly once
    (nobody fails, so nothing is redelivered), per lane in order by payload seq and by lane-offset
    (0..4), lane = key, original topic kept, QoS 1, and the lanes spread over all members. Two
    members ack at once, two after a short random processing time in a worker thread."""
    n_lanes, n_seq = 1000, 5
    # wp-c0, wp-c1 ack in the callback; wp-c2, wp-c3 "process" each message 0-3 ms in a worker
    # thread and then ack (in receive order, MQTT-4.6.0-2), so lanes stay in flight longer.
    stop = threading.Event()
    workers = []

    def slow_member(cid: str, seed: int) -> "LClient":
        q: queue.Queue = queue.Queue()
        rnd = random.Random(seed)
        c = LClient(cid, handler=lambda c, d: q.put(d))

        def work():
            while not stop.is_set():
                try:
                    d = q.get(timeout=0.1)
                except queue.Empty:
                    continue
                time.sleep(rnd.random() * 0.003)
                c.ack(d)

        t = threading.Thread(target=work, name=f"{cid}-worker", daemon=True)
        t.start()
        workers.append(t)
        return c

    cons = [LClient("wp-c0"), LClient("wp-c1"), slow_member("wp-c2", 2), slow_member("wp-c3", 3)]
    try:
        _worker_pool(cons, n_lanes, n_seq)
    finally:
        stop.set()
        for t in workers:
            t.join(2)


def _worker_pool(cons, n_lanes, n_seq):
    for i, c in enumerate(cons):
        c.connect(clean_start=True)
        g = c.subscribe_lane("$share/workers/agents/+/#", qos=2 if i == 3 else 1)
        check(g == 1, f"{c.cid}: granted QoS {g} for a lane group subscription, expected 1 "
                      f"(requested {2 if i == 3 else 1})")
    pub = LClient("wp-pub", handler=None).connect()
    msgs = [(f"agents/s-{lane}/step/{seq}", f"s-{lane}:{seq}".encode())
            for seq in range(n_seq) for lane in range(n_lanes)]
    t0 = time.monotonic()
    rcs = pub.publish_many(msgs, timeout=30)
    t_pub = time.monotonic() - t0
    bad_rc = [(msgs[i][0], str(rc)) for i, rc in rcs.items() if rc is None or rc.is_failure]
    check(not bad_rc, f"PUBACK failures: {sample(bad_rc)}")
    total = n_lanes * n_seq
    want = {p.decode() for _, p in msgs}
    ok = poll_until(lambda: len({d.text for c in cons for d in c.deliveries}) >= total, 20)
    t_all = time.monotonic() - t0
    wait_quiet(cons, 0.5, 3)  # late duplicates
    handler_errors(cons)
    ds = all_deliveries(cons)
    got = Counter()
    for d in ds:
        got[d.text] += 1
    missing = sorted(want - set(got), key=lambda s: (int(s.split(":")[0][2:]), int(s.split(":")[1])))
    check(ok and not missing, f"{len(missing)} of {total} messages never delivered within 20 s: {sample(missing)}")
    extra = sorted(set(got) - want)
    check(not extra, f"unexpected messages: {sample(extra)}")
    dups = sorted(k for k, v in got.items() if v > 1)
    check(not dups, f"{len(dups)} messages delivered more than once although every member acked "
                    f"everything and stayed connected: {sample(dups)}")
    check_lane_props(ds, lambda d: d.text.split(":")[0])
    bad_topic = [(d.topic, d.text) for d in ds
                 if d.topic != "agents/{}/step/{}".format(*d.text.split(":"))]
    check(not bad_topic, f"original topic not kept: {sample(bad_topic, 4)}")
    bad_qos = [(d.cid, d.text, d.qos) for d in ds if d.qos != 1]
    check(not bad_qos, f"delivered with QoS other than 1: {sample(bad_qos, 4)}")
    per_lane = defaultdict(list)
    for d in ds:
        per_lane[d.lane].append(d)
    bad_order, bad_off = [], []
    for lane, lds in per_lane.items():
        seqs = [parse_key_seq(d)[1] for d in lds]
        offs = [d.off for d in lds]
        if seqs != list(range(n_seq)):
            bad_order.append((lane, seqs, [d.cid for d in lds]))
        if offs != list(range(n_seq)) or offs != seqs:
            bad_off.append((lane, offs, seqs))
    check(not bad_order, f"{len(bad_order)} lanes not delivered in order (lane, seqs in delivery order, "
                         f"members): {sample(bad_order, 4)}")
    check(not bad_off, f"{len(bad_off)} lanes with lane-offset not 0..4 matching the publish order "
                       f"(lane, offsets, seqs): {sample(bad_off, 4)}")
    per_member = {c.cid: len(c.deliveries) for c in cons}
    lanes_per_member = {c.cid: len({d.lane for d in c.deliveries}) for c in cons}
    note(f"published {total} in {t_pub:.1f}s, all delivered after {t_all:.1f}s; messages per member "
         f"{per_member}, lanes per member {lanes_per_member}")
    # A new batch goes to the least loaded member, so the two members that hold each batch
    # 0-3 ms longer get fewer; on an idle 2-core machine about 12 % each, and 7 % when the
    # machine was busy with a build (CI, 2026-12-06). Every member must still get a real share.
    low = {k: v for k, v in per_member.items() if v < total // 20}
    check(not low, f"shared mode does not balance lanes across members: members with < 5% of the "
                   f"messages: {low} (all: {per_member})")


def s_consumer_killed_mid_batch():
    """4 members of group `pool` on crash/+/# (persistent sessions, expiry 300 s). The victim acks
    only lane offsets 0 and 1 and holds every later message un-acked (so it stops in the middle of
    its lane batches); 200 lanes x 5 messages; once deliveries settle the victim's socket is
    closed abruptly (RST, no DISCONNECT; its session stays). The 3 others must then get every
    message it held, as new PUBLISH packets (DUP=0): per lane the acknowledged deliveries are
    exactly offsets 0..4 once each in order (nothing lost, nothing acked twice), only the victim's
    un-acked messages are delivered twice, and while the victim was connected no other member got
    a message of a lane the victim was holding."""
    n_lanes, n_seq = 200, 5

    def victim_handler(c, d):
        if d.off is not None and d.off < 2:
            c.ack(d)

    victim = LClient("kc-victim", handler=victim_handler)
    others = [LClient(f"kc-c{i}") for i in range(3)]
    cons = [victim] + others
    for c in others[:2] + [victim] + others[2:]:
        c.connect(clean_start=True, expiry=300)
        c.subscribe_lane("$share/pool/crash/+/#", qos=1)
    pub = LClient("kc-pub", handler=None).connect()
    msgs = [(f"crash/k-{lane}/m", f"k-{lane}:{seq}".encode()) for lane in range(n_lanes) for seq in range(n_seq)]
    rcs = pub.publish_many(msgs, timeout=30)
    bad_rc = [(msgs[i][0], str(rc)) for i, rc in rcs.items() if rc is None or rc.is_failure]
    check(not bad_rc, f"PUBACK failures: {sample(bad_rc)}")
    want = {(f"k-{lane}", seq) for lane in range(n_lanes) for seq in range(n_seq)}

    def acked_set():
        return {parse_key_seq(d) for c in cons for d in c.deliveries if d.acked}

    def held_set():
        return {parse_key_seq(d) for d in victim.deliveries if not d.acked}

    # Settle: all lanes the victim does not hold complete, or nothing moves for 1 s.
    def settled():
        held = held_set()
        first_held = {}
        for k, s in held:
            first_held[k] = min(s, first_held.get(k, 99))
        covered = acked_set() | {(k, s) for (k, s) in want if k in first_held and s >= first_held[k]}
        return want <= covered

    settled_ok = poll_until(settled, 10)
    if not settled_ok:
        wait_quiet(cons, 1.0, 5)
    handler_errors(cons)
    with ORDER_LOCK:
        held = sorted(held_set())
        held_lanes = {k for k, _ in held}
        kill_n = ORDER[0]
        n_victim = len(victim.deliveries)
    check(held, f"the victim holds no un-acked message (it got {n_victim} deliveries): nothing to test "
                f"(lanes not spread over the members?)")
    stuck = sorted({k for (k, s) in want - acked_set()} - held_lanes)
    note(f"before the kill: victim got {n_victim} deliveries, holds {len(held)} un-acked in "
         f"{len(held_lanes)} lanes; lanes not held by it and not complete: {len(stuck)}")
    victim.kill()
    t_kill = time.monotonic()
    ok = poll_until(lambda: want <= acked_set(), 15)
    t_done = time.monotonic() - t_kill
    wait_quiet(others, 0.5, 3)
    handler_errors(cons)
    ds = all_deliveries(cons)
    acked = acked_set()
    lost_held = sorted(set(held) - acked)
    check(not lost_held, f"{len(lost_held)} of the {len(held)} messages the killed member held were never "
                         f"delivered to (and acked by) another member within 15 s: {sample(lost_held)}")
    missing = sorted(want - acked)
    check(ok and not missing, f"{len(missing)} messages never processed: {sample(missing)}; "
                              f"lanes not held by the victim that were stuck before the kill: {sample(stuck)}")
    check_lane_props(ds, lambda d: parse_key_seq(d)[0])
    bad_off = [(d.text, d.off) for d in ds if d.off != parse_key_seq(d)[1]]
    check(not bad_off, f"lane-offset does not match the publish order: {sample(bad_off, 4)}")
    first_held = {}
    for k, s in held:
        first_held[k] = min(s, first_held.get(k, 99))
    early = [(d.cid, d.text) for d in ds if d.cid != victim.cid and d.n < kill_n
             and parse_key_seq(d)[0] in first_held and parse_key_seq(d)[1] >= first_held[parse_key_seq(d)[0]]]
    check(not early, f"a lane held by the (still connected) victim was also delivered to another "
                     f"member (two batches in flight for one lane): {sample(early, 4)}")
    per_lane = defaultdict(list)
    for d in ds:
        per_lane[parse_key_seq(d)[0]].append(d)
    bad = []
    for k, lds in per_lane.items():
        seqs = [parse_key_seq(d)[1] for d in lds if d.acked]
        if seqs != list(range(n_seq)):
            bad.append((k, [(d.cid[3:], parse_key_seq(d)[1], "a" if d.acked else "-") for d in lds]))
    check(not bad, f"{len(bad)} lanes whose acknowledged deliveries are not 0..4 once each in order "
                   f"(member, seq, acked): {sample(bad, 3)}")
    seen: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
    for d in ds:
        seen[parse_key_seq(d)].append(d)
    bad_dup = []
    for key, dl in seen.items():
        for d in dl[:-1]:  # every delivery but the last must have been an un-acked victim one
            if not (d.cid == victim.cid and not d.acked):
                bad_dup.append((key, [(x.cid, int(x.acked)) for x in dl]))
                break
    check(not bad_dup, f"messages delivered again although acknowledged (only the killed member's "
                       f"un-acked messages may come twice): {sample(bad_dup, 4)}")
    handed = [d for d in ds if d.cid != victim.cid and d.n >= kill_n and parse_key_seq(d) in set(held)]
    dup_handed = [(d.cid, d.text) for d in handed if d.dup]
    check(not dup_handed, f"held messages handed to another member with DUP=1 (must be new PUBLISH "
                          f"packets): {sample(dup_handed, 4)}")
    note(f"after the kill: {len(handed)} held messages redelivered to the others within {t_done:.1f}s")
    # Drop the victim's persistent session (it would otherwise keep the redelivered state).
    v2 = LClient("kc-victim")
    v2.connect(clean_start=True, expiry=0)
    for c in others:
        c.disconnect(0, SessionExpiryInterval=0)


def s_holder_resumes_with_dup():
    """A one-lane group ($share/solo/crash/solo-1/#, a new group: from earliest) with a single
    persistent member (expiry 300 s): of solo-1's 3 messages it acks #0 and holds #1, #2; its
    socket is dropped (no other member online, so the batch stays with the session); on the
    reconnect with Clean Start 0 the session is present and #1, #2 come again with DUP=1 and the
    same lane-offsets (MQTT-4.4.0-1), #0 does not; then a live #3 arrives with DUP=0, offset 3. No
    message of the parent's other lanes reaches the one-lane group."""

    def first(c, d):
        if d.off == 0:
            c.ack(d)

    m = LClient("solo-m", handler=first)
    m.connect(clean_start=True, expiry=300)
    pub = LClient("solo-pub", handler=None).connect()
    # Stored before the member joins (the new group starts from earliest), so its first batch
    # holds all three: published after the SUBSCRIBE, the first batch could be cut at #1 when
    # #2 was indexed a moment later (seen once in CI), and #2 would then wait behind the held #1.
    pub.publish_many([("crash/solo-1/m", f"solo-1:{i}".encode()) for i in range(3)] + [("crash/solo-2/m", b"solo-2:0")])
    time.sleep(0.2)
    m.subscribe_lane("$share/solo/crash/solo-1/#", qos=1)
    ok = wait_until(lambda: len(m.deliveries) >= 3, 5)
    wait_quiet([m], 0.3, 2)
    first_s = [(d.text, d.off, int(d.dup)) for d in m.deliveries]
    check(ok and first_s == [("solo-1:0", 0, 0), ("solo-1:1", 1, 0), ("solo-1:2", 2, 0)],
          f"first session: expected solo-1 offsets 0, 1, 2 (DUP=0) only, got {first_s}")
    time.sleep(0.2)  # the PUBACK of #0 reaches the broker before the drop
    m.kill()
    time.sleep(0.3)
    r = LClient("solo-m")
    r.connect(clean_start=False, expiry=300)
    check(r.session_present, "session not present on the reconnect (Clean Start 0, expiry 300)")
    ok = wait_until(lambda: len(r.deliveries) >= 2, 5)
    wait_quiet([r], 0.5, 2)
    again = [(d.text, d.off, int(d.dup)) for d in r.deliveries]
    check(ok and again == [("solo-1:1", 1, 1), ("solo-1:2", 2, 1)],
          f"after the reconnect: expected the held #1, #2 again with DUP=1 (and not the acked #0), "
          f"got (payload, offset, dup) {again}")
    pub.publish("crash/solo-1/m", b"solo-1:3")
    ok = wait_until(lambda: len(r.deliveries) >= 3, 5)
    wait_quiet([r], 0.3, 2)
    handler_errors([m, r])
    got = [(d.text, d.off, int(d.dup)) for d in r.deliveries]
    check(ok and got[2:] == [("solo-1:3", 3, 0)], f"live #3 after the resume: got {got}")
    r.disconnect(0, SessionExpiryInterval=0)


def s_new_group_latest():
    """A new group with lane-offset = latest ($share/late/sess/+/#) gets nothing of the lanes'
    history, only messages published after the SUBSCRIBE; a new one-lane group with lane-offset = 1
    ($share/from1/sess/lt-a/#) starts that lane at offset 1."""
    pub = LClient("lt-pub", handler=None).connect()
    pub.publish_many([("sess/lt-a/x", f"lt-a:{i}".encode()) for i in range(3)] + [("sess/lt-b/x", b"lt-b:0")])
    late = LClient("lt-late").connect()
    late.subscribe_lane("$share/late/sess/+/#", qos=1, offset="latest")
    from1 = LClient("lt-from1").connect()
    from1.subscribe_lane("$share/from1/sess/lt-a/#", qos=1, offset="1")
    old = late.quiet(0.7)
    check(not old, f"lane-offset=latest: history delivered {ps.payloads(old)}")
    pub.publish_many([("sess/lt-a/x", b"lt-a:3"), ("sess/lt-b/x", b"lt-b:1")])
    ok = wait_until(lambda: len(late.deliveries) >= 2 and len(from1.deliveries) >= 3, 5)
    wait_quiet([late, from1], 0.3, 2)
    handler_errors([late, from1])
    got = sorted((d.text, d.off) for d in late.deliveries)
    check(ok and got == [("lt-a:3", 3), ("lt-b:1", 1)], f"lane-offset=latest: expected only the live "
                                                        f"lt-a:3 (offset 3) and lt-b:1 (offset 1), got {got}")
    got1 = [(d.text, d.off) for d in from1.deliveries]
    check(got1 == [("lt-a:1", 1), ("lt-a:2", 2), ("lt-a:3", 3)],
          f"one-lane group with lane-offset=1: expected lt-a offsets 1, 2, 3, got {got1}")


def s_receive_maximum():
    """A member that CONNECTs with Receive Maximum 3 and acks slowly (40 ms per message, in a worker
    thread) never has more than 3 lane deliveries un-acked (MQTT-3.3.4-9), although a lane batch
    is 32 and 6 lanes x 5 messages are ready (parent rm, group rmg); all 30 arrive, in order per
    lane."""
    stop = threading.Event()
    q: queue.Queue = queue.Queue()
    out = {"now": 0, "max": 0}
    lock = threading.Lock()

    def handler(c, d):
        with lock:
            out["now"] += 1
            out["max"] = max(out["max"], out["now"])
        q.put(d)

    c = LClient("rm-c", handler=handler)

    def work():
        while not stop.is_set():
            try:
                d = q.get(timeout=0.1)
            except queue.Empty:
                continue
            time.sleep(0.04)
            with lock:
                out["now"] -= 1  # before the PUBACK: the next PUBLISH can only follow it
            c.ack(d)

    t = threading.Thread(target=work, name="rm-worker", daemon=True)
    t.start()
    try:
        pub = LClient("rm-pub", handler=None).connect()
        pub.publish_many([(f"rm/r-{lane}/x", f"r-{lane}:{seq}".encode()) for lane in range(6) for seq in range(5)])
        c.connect(ReceiveMaximum=3)
        c.subscribe_lane("$share/rmg/rm/+/#", qos=1)
        ok = poll_until(lambda: len({d.text for d in c.deliveries}) >= 30, 10)
        wait_quiet([c], 0.3, 2)
    finally:
        stop.set()
        t.join(2)
    handler_errors([c])
    got = {d.text for d in c.deliveries}
    check(ok, f"only {len(got)} of 30 delivered within 10 s")
    check(out["max"] <= 3, f"{out['max']} lane deliveries un-acked at once at a client with Receive Maximum 3")
    per = defaultdict(list)
    for d in c.deliveries:
        per[d.lane].append(d.off)
    bad = {k: v for k, v in per.items() if v != list(range(5))}
    check(not bad, f"lanes not delivered 0..4 once each in order: {bad}")
    note(f"at most {out['max']} un-acked at once")


def s_partial_batch_acks_kept():
    """A one-lane group ($share/pag/sess/pa-1/#) with one member: the batch of offsets 0..4 is
    delivered, the member acks 0..2 and holds 3 and 4, then DISCONNECTs (the session ends, the
    group has no member left). A new member of the group must get only 3 and 4: the acks of 0..2
    were commits (the group offset is the first un-acked offset), not to be redelivered."""
    def handler(c, d):
        if d.off is not None and d.off <= 2:
            c.ack(d)

    pub = LClient("pa-pub", handler=None).connect()
    pub.publish_many([("sess/pa-1/x", f"pa-1:{i}".encode()) for i in range(5)])
    m = LClient("pa-m1", handler=handler).connect()
    m.subscribe_lane("$share/pag/sess/pa-1/#", qos=1)
    ok = wait_until(lambda: len(m.deliveries) >= 5, 5)
    wait_quiet([m], 0.3, 2)
    got = [(d.text, d.off) for d in m.deliveries]
    check(ok and got == [(f"pa-1:{i}", i) for i in range(5)], f"expected pa-1 offsets 0..4, got {got}")
    time.sleep(0.3)
    m.disconnect()
    m2 = LClient("pa-m2").connect()
    m2.subscribe_lane("$share/pag/sess/pa-1/#", qos=1)
    ok = wait_until(lambda: len(m2.deliveries) >= 2, 5)
    wait_quiet([m2], 0.5, 2)
    handler_errors([m, m2])
    got = [(d.text, d.off) for d in m2.deliveries]
    check(ok and got == [("pa-1:3", 3), ("pa-1:4", 4)],
          f"the next member got (payload, offset) {got}, expected only the un-acked 3, 4 (0..2 were acked "
          f"by the previous member before it left)")


def s_suspend_one_lane():
    """Group `sus` on tasks/+/#. Lane sus-a: #0 is answered with PUBACK 0x00 + lane-suspend-ms=1500
    and #1 is published during the pause: nothing of sus-a is delivered for 1.5 s, then #0 comes
    again as a new PUBLISH (DUP=0, lane-offset 0) followed by #1 (offset 1), once each. Meanwhile
    10 messages on other lanes flow (each delivered within 0.5 s of its publish). Lane sus-b (one
    message) is suspended 3 times for 100 ms: with max_attempts = 2 on this parent, suspends count
    no attempt, so nothing goes to $dlq, and the final PUBACK 0x00 commits it (a later #1 has
    lane-offset 1 and #0 does not come again). Lane sus-c: lane-suspend-ms=1 is clamped to 50 ms."""
    st = Counter()

    def handler(c, d):
        if d.lane == "sus-a" and d.off == 0:
            st["a"] += 1
            if st["a"] == 1:
                c.puback(d, 0, [("lane-suspend-ms", "1500")])
                return
        if d.lane == "sus-b" and d.off == 0:
            st["b"] += 1
            if st["b"] <= 3:
                c.puback(d, 0, [("lane-suspend-ms", "100")])
                return
        if d.lane == "sus-c" and d.off == 0:
            st["c"] += 1
            if st["c"] == 1:
                c.puback(d, 0, [("lane-suspend-ms", "1")])  # clamped to 50 ms
                return
        c.ack(d)

    dlq = LClient("su-dlq").connect()
    dlq.subscribe_lane("$dlq/#", qos=1)
    cons = LClient("su-c", handler=handler).connect()
    cons.subscribe_lane("$share/sus/tasks/+/#", qos=1)
    pub = LClient("su-pub", handler=None).connect()
    pub.publish("tasks/sus-a/x", b"sus-a:0")
    check(wait_until(lambda: st["a"] >= 1, 5), "sus-a #0 not delivered within 5 s")
    t_s = cons.deliveries[[d.text for d in cons.deliveries].index("sus-a:0")].t
    pub.publish("tasks/sus-a/x", b"sus-a:1")
    pub.publish("tasks/sus-b/x", b"sus-b:0")
    pub.publish("tasks/sus-c/x", b"sus-c:0")
    pub_t = {}
    for i in range(10):
        pub_t[f"sus-o{i}:0"] = time.monotonic()
        pub.publish(f"tasks/sus-o{i}/x", f"sus-o{i}:0".encode())
        time.sleep(0.1)
    ok = wait_until(lambda: st["b"] >= 4 and st["c"] >= 2 and any(d.text == "sus-a:1" for d in cons.deliveries), 8)
    if ok:
        pub.publish("tasks/sus-b/x", b"sus-b:1")
        wait_until(lambda: any(d.text == "sus-b:1" for d in cons.deliveries), 5)
    wait_quiet([cons, dlq], 0.3, 2)
    handler_errors([cons, dlq])
    ds = all_deliveries([cons])
    a = [d for d in ds if d.lane == "sus-a"]
    desc = [(d.text, d.off, int(d.dup), round(d.t - t_s, 3)) for d in a]
    check(ok, f"within 8 s: sus-a deliveries (payload, offset, dup, t since the first) {desc}; "
              f"sus-b #0 delivered {st['b']} times (expected 4)")
    check([(d.text, d.off) for d in a] == [("sus-a:0", 0), ("sus-a:0", 0), ("sus-a:1", 1)],
          f"sus-a: expected #0, after the pause #0 again, then #1; got (payload, offset, dup, t since "
          f"the first delivery) {desc}")
    dup1 = [x for x in desc if x[2]]
    check(not dup1, f"a suspended message must come again as a NEW PUBLISH (DUP=0): {dup1}")
    gap = a[1].t - a[0].t
    check(gap >= 1.5, f"suspended for 1500 ms but redelivered after {gap:.3f}s: {desc}")
    check(gap <= 3.5, f"suspended for 1500 ms but redelivered only after {gap:.3f}s")
    b = [d for d in ds if d.lane == "sus-b"]
    bdesc = [(d.text, d.off, int(d.dup), round(d.t - t_s, 3)) for d in b]
    check([(d.text, d.off) for d in b] == [("sus-b:0", 0)] * 4 + [("sus-b:1", 1)],
          f"sus-b: expected #0 four times (3 suspends of 100 ms, then acked) and then #1 at offset 1, got "
          f"(payload, offset, dup, t) {bdesc}")
    check(not [x for x in bdesc if x[2]], f"sus-b: redelivered with DUP=1: {bdesc}")
    for i in (1, 2, 3):
        g = b[i].t - b[i - 1].t
        check(g >= 0.1, f"sus-b suspend #{i} of 100 ms: redelivered after {g:.3f}s ({bdesc})")
    cc = [d for d in ds if d.lane == "sus-c"]
    cdesc = [(d.text, d.off, int(d.dup), round(d.t - cc[0].t, 3)) for d in cc] if cc else []
    check([(d.text, d.off) for d in cc] == [("sus-c:0", 0)] * 2,
          f"sus-c (lane-suspend-ms=1, then acked): expected #0 twice, got {cdesc}")
    check(cc[1].t - cc[0].t >= 0.05, f"lane-suspend-ms=1 must be clamped to 50 ms, redelivered after "
                                     f"{cc[1].t - cc[0].t:.3f}s")
    others = {d.text: d for d in ds if d.lane and d.lane.startswith("sus-o")}
    miss = sorted(set(pub_t) - set(others))
    check(not miss, f"other lanes' messages not delivered: {miss}")
    slow = sorted((k, round(others[k].t - pub_t[k], 3)) for k in pub_t if others[k].t - pub_t[k] > 0.5)
    check(not slow, f"other lanes did not flow while sus-a was suspended (delivery delay > 0.5 s): {slow}")
    during = [k for k in pub_t if others[k].t < a[1].t]
    check(len(during) >= 8, f"only {len(during)} of the other lanes' messages arrived during the 1.5 s "
                            f"suspension of sus-a: {during}")
    dl = [(d.topic, d.up) for d in dlq.deliveries]
    check(not dl, f"suspends counted as attempts (max_attempts = 2): dead-lettered {dl}")
    note(f"sus-a redelivered after {gap:.3f}s; {len(during)} other-lane messages meanwhile")


def s_retry_to_dlq_at_max_attempts():
    """Parent tasks (max_attempts = 2), group `rt`: lane rt-a's #0 answered PUBACK 0x00 +
    lane-retry-ms=100 every time: it comes again as a new PUBLISH (DUP=0) after >= 100 ms; the
    retry counts an attempt, so at the 2nd retry it is dead-lettered to $dlq/rt/tasks/rt-a/x
    (attempts = 2, lane, lane-offset 0, original-topic) instead of a 3rd delivery, and the lane goes
    on with #1 (offset 1)."""

    def handler(c, d):
        if d.text == "rt-a:0":
            c.puback(d, 0, [("lane-retry-ms", "100")])
        else:
            c.ack(d)

    dlq = LClient("rt-dlq").connect()
    dlq.subscribe_lane("$dlq/#", qos=1)
    cons = LClient("rt-c", handler=handler).connect()
    cons.subscribe_lane("$share/rt/tasks/+/#", qos=1)
    pub = LClient("rt-pub", handler=None).connect()
    pub.publish("tasks/rt-a/x", b"rt-a:0")
    ok = wait_until(lambda: len(dlq.deliveries) >= 1, 5)
    pub.publish("tasks/rt-a/x", b"rt-a:1")
    wait_until(lambda: any(d.text == "rt-a:1" for d in cons.deliveries), 5)
    wait_quiet([cons, dlq], 0.5, 2)
    handler_errors([cons, dlq])
    a = [d for d in cons.deliveries if d.lane == "rt-a"]
    desc = [(d.text, d.off, int(d.dup), round(d.t - a[0].t, 3)) for d in a] if a else []
    dl = [(d.topic, d.text, d.up) for d in dlq.deliveries]
    check(ok, f"not dead-lettered within 5 s after 2 lane-retry-ms answers (max_attempts = 2): "
              f"deliveries (payload, offset, dup, t) {desc}")
    check([(d.text, d.off) for d in a] == [("rt-a:0", 0), ("rt-a:0", 0), ("rt-a:1", 1)],
          f"expected #0 twice (both answered lane-retry-ms) then #1; got (payload, offset, dup, t) {desc}")
    check(not [x for x in desc if x[2]], f"a retried message must come again as a new PUBLISH (DUP=0): {desc}")
    check(a[1].t - a[0].t >= 0.1, f"lane-retry-ms=100 but redelivered after {a[1].t - a[0].t:.3f}s")
    check(len(dl) == 1 and dl[0][0] == "$dlq/rt/tasks/rt-a/x" and dl[0][1] == "rt-a:0",
          f"expected one dead letter $dlq/rt/tasks/rt-a/x 'rt-a:0', got {dl}")
    up = {k: v for k, v in dlq.deliveries[0].up}
    for k, v in (("original-topic", "tasks/rt-a/x"), ("lane", "rt-a"), ("lane-offset", "0"), ("attempts", "2")):
        check(up.get(k) == v, f"dead letter: user property {k} = {up.get(k)!r}, expected {v!r} (all: {dl[0][2]})")
    check(up.get("reason"), f"dead letter without a reason user property: {dl[0][2]}")


def s_reject_to_dlq():
    """Group `workers` on agents/+/#: PUBACK 0x80 for rej-1 #0 and 0x83 for rej-2 #0: both appear on
    $dlq/workers/<original topic> (for a $dlq/# subscriber) with the original payload and the user
    properties original-topic, lane, lane-offset, attempts (>= 1), reason (0x80 / 0x83); the lanes
    go on (#1 delivered, offset committed); neither message is delivered again to the group, not
    to the same member and not to a member that joins after the first one left."""
    seen = Counter()

    def handler(c, d):
        seen[d.text] += 1
        if d.text == "rej-1:0":
            c.puback(d, 0x80)
        elif d.text == "rej-2:0":
            c.puback(d, 0x83, [("why", "test")])
        else:
            c.ack(d)  # rej-1:1, rej-1:2, and whatever another scenario left in group workers

    dlq = LClient("rj-dlq", handler=ack_all).connect()
    dlq.subscribe_lane("$dlq/#", qos=1)
    r1 = LClient("rj-c1", handler=handler).connect()
    r1.subscribe_lane("$share/workers/agents/+/#", qos=1)
    pub = LClient("rj-pub", handler=None).connect()
    rcs = pub.publish_many([("agents/rej-1/job", b"rej-1:0"), ("agents/rej-1/job", b"rej-1:1"),
                            ("agents/rej-2/x/y", b"rej-2:0")])
    check(all(rc is not None and not rc.is_failure for rc in rcs.values()), f"PUBACKs {rcs}")
    ok = wait_until(lambda: len(dlq.deliveries) >= 2 and seen["rej-1:1"] >= 1, 5)
    wait_quiet([r1, dlq], 0.5, 2)
    handler_errors([r1, dlq])
    dl = [(d.topic, d.text, d.up) for d in dlq.deliveries]
    check(ok, f"within 5 s: DLQ deliveries {dl}, rej-1 #1 delivered {seen['rej-1:1']} times")
    check(len(dlq.deliveries) == 2, f"expected exactly 2 dead-lettered messages, got {dl}")
    by_topic = {d.topic: d for d in dlq.deliveries}
    exp = {
        "$dlq/workers/agents/rej-1/job": ("rej-1:0", "agents/rej-1/job", "rej-1", "0x80"),
        "$dlq/workers/agents/rej-2/x/y": ("rej-2:0", "agents/rej-2/x/y", "rej-2", "0x83"),
    }
    check(set(by_topic) == set(exp), f"DLQ topics {sorted(by_topic)}, expected {sorted(exp)}")
    for t, (payload, orig, lane, reason) in exp.items():
        d = by_topic[t]
        check(d.text == payload, f"{t}: payload {d.text!r}, expected {payload!r}")
        up = {k: v for k, v in d.up}
        for k, v in (("original-topic", orig), ("lane", lane), ("lane-offset", "0"), ("reason", reason)):
            check(up.get(k) == v, f"{t}: user property {k} = {up.get(k)!r}, expected {v!r} (all: {d.up})")
        att = up.get("attempts")
        check(att is not None and att.isdigit(), f"{t}: user property attempts = {att!r}, expected a decimal")
        note(f"{t}: user properties {d.up}")
    again = {k: v for k, v in seen.items() if k.startswith("rej-") and v > 1}
    check(not again, f"delivered to the group more than once: {again}")
    r1.disconnect()
    # A new member of the group: the rejected (committed) messages do not come back; the lane
    # continues at the next offset.
    r2 = LClient("rj-c2", handler=handler).connect()
    r2.subscribe_lane("$share/workers/agents/+/#", qos=1)
    pub.publish("agents/rej-1/job", b"rej-1:2")
    ok = wait_until(lambda: any(d.text == "rej-1:2" for d in r2.deliveries), 5)
    wait_quiet([r2], 0.5, 2)
    rej = [(d.text, d.off) for d in r2.deliveries if d.lane in ("rej-1", "rej-2")]
    check(ok, f"rej-1 #2 not delivered to the new member within 5 s: {rej}")
    check(rej == [("rej-1:2", 2)], f"the new member got {rej}, expected only rej-1 #2 at lane-offset 2 "
                                   f"(#0 rejected, #1 acked: both committed)")
    check(len(dlq.deliveries) == 2, f"dead-lettered again: {[(d.topic, d.text) for d in dlq.deliveries]}")


def s_ttl_expiry():
    """Parent ttl (ttl_s = 2, sweep every 500 ms), group `ttlg`: publishes at 0, 1.2 s and 2.4 s get
    lane-offsets 0, 1, 2 (the TTL counts from the last publish, not from creation); after > 2 s
    without a publish (+ a sweep) the lane is expired: the next publish is lane-offset 0 again and
    is delivered to the group (its old committed offset is gone). Lane ttl-h's #0 is held un-acked
    by the member through the expiry: the in-flight state goes with the lane, so the next publish
    (offset 0 again) is delivered although the old one was never acked; the late PUBACK of the old
    one then changes nothing (no redelivery, the connection stays)."""
    held = []

    def handler(c, d):
        if d.text == "ttl-h:0":
            held.append(d)
        else:
            c.ack(d)

    c = LClient("ttl-c", handler=handler).connect()
    c.subscribe_lane("$share/ttlg/ttl/+/#", qos=1)
    pub = LClient("ttl-pub", handler=None).connect()
    t_exp = 2.4 + 2.0 + 0.5 + 1.0
    plan = [("ttl-k", "ttl-k:0", 0.0), ("ttl-h", "ttl-h:0", 0.0), ("ttl-k", "ttl-k:1", 1.2),
            ("ttl-k", "ttl-k:2", 2.4), ("ttl-k", "ttl-k:3", t_exp), ("ttl-h", "ttl-h:1", t_exp)]
    t0 = time.monotonic()
    for lane, payload, at in plan:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        rc = pub.publish_rc(f"ttl/{lane}/x", payload.encode())
        check(isinstance(rc, int) and rc < 0x80, f"PUBACK for {payload}: {rc} (refused)")
        check(wait_until(lambda p=payload: any(d.text == p for d in c.deliveries), 5),
              f"{payload} not delivered within 5 s: {[(d.text, d.off) for d in c.deliveries]}")
    wait_quiet([c], 0.3, 2)
    handler_errors([c])
    got = [(d.text, d.off, d.lane) for d in c.deliveries if d.lane == "ttl-k"]
    want = [("ttl-k:0", 0, "ttl-k"), ("ttl-k:1", 1, "ttl-k"), ("ttl-k:2", 2, "ttl-k"), ("ttl-k:3", 0, "ttl-k")]
    check(got == want, f"(payload, lane-offset, lane): got {got}, expected {want} (offset 2 for #2: not "
                       f"expired 1.2 s after the last publish; offset 0 for #3: expired after 3.5 s idle)")
    goth = [(d.text, d.off, int(d.dup)) for d in c.deliveries if d.lane == "ttl-h"]
    check(goth == [("ttl-h:0", 0, 0), ("ttl-h:1", 0, 0)],
          f"ttl-h (#0 held un-acked through the expiry): expected #0 then the new #1 at lane-offset 0, "
          f"got (payload, offset, dup) {goth}")
    c.ack(held[0])  # the late PUBACK of the expired lane's message
    late = c.quiet(0.7)
    check(c.c.is_connected() and c.disconnected is None,
          f"connection closed after the late PUBACK of an expired lane's message: {c.disconnected}")
    goth2 = [(d.text, d.off) for d in c.deliveries if d.lane == "ttl-h"]
    check(len(goth2) == 2, f"ttl-h after the late PUBACK: {goth2} ({len(late)} deliveries in all)")


def s_resume_by_lane_offset():
    """Parent sess: 5 messages on lane r1 (interleaved with lane r2). A plain (non-shared)
    SUBSCRIBE sess/r1/# with lane-offset = 2 replays r1 from offset 2 (2, 3, 4: only r1, in order,
    with lane = r1, the publisher's user property kept), then goes live (5); lane-offset =
    earliest replays 0..5; without the property it is an ordinary subscription (no history, live
    only), and an ordinary subscriber from before the publishes got all 6 once in order."""
    live = LClient("rs-live", manual_ack=False, handler=None).connect()
    live.subscribe_lane("sess/r1/#", qos=1)
    pub = LClient("rs-pub", handler=None).connect()
    msgs = []
    for i in range(5):
        msgs.append(("sess/r1/x", f"r1:{i}".encode()))
        if i < 2:
            msgs.append(("sess/r2/x", f"r2:{i}".encode()))
    rcs = pub.publish_many(msgs, user_props=[("origin", "rs-pub")])
    check(all(rc is not None and not rc.is_failure for rc in rcs.values()), f"PUBACKs {rcs}")
    rs = LClient("rs-from2").connect()
    rs.subscribe_lane("sess/r1/#", qos=1, offset="2")
    ok = wait_until(lambda: len(rs.deliveries) >= 3, 5)
    wait_quiet([rs], 0.5, 2)
    got = [(d.text, d.off) for d in rs.deliveries]
    check(ok and got == [("r1:2", 2), ("r1:3", 3), ("r1:4", 4)],
          f"lane-offset=2: expected r1 offsets 2, 3, 4 in order, got (payload, offset) {got}")
    early = LClient("rs-early").connect()
    early.subscribe_lane("sess/r1/#", qos=1, offset="earliest")
    plain = LClient("rs-plain", manual_ack=False, handler=None).connect()
    plain.subscribe_lane("sess/r1/#", qos=1)
    ok_e = wait_until(lambda: len(early.deliveries) >= 5, 5)
    hist = plain.quiet(0.5)
    check(not hist, f"an ordinary subscription (no lane-offset) replayed history: {ps.payloads(hist)}")
    check(ok_e, f"lane-offset=earliest: got {[(d.text, d.off) for d in early.deliveries]}")
    pub.publish("sess/r1/x", b"r1:5", UserProperty=("origin", "rs-pub"))
    wait_until(lambda: len(rs.deliveries) >= 4 and len(early.deliveries) >= 6
               and len(plain.deliveries) >= 1 and len(live.deliveries) >= 6, 5)
    wait_quiet([rs, early, plain, live], 0.5, 2)
    handler_errors([rs, early, plain, live])
    got = [(d.text, d.off) for d in rs.deliveries]
    check(got == [("r1:2", 2), ("r1:3", 3), ("r1:4", 4), ("r1:5", 5)],
          f"lane-offset=2 then live: expected r1 offsets 2..5 once each in order, got {got}")
    got_e = [(d.text, d.off) for d in early.deliveries]
    check(got_e == [(f"r1:{i}", i) for i in range(6)], f"lane-offset=earliest then live: got {got_e}")
    check_lane_props(rs.deliveries + early.deliveries, lambda d: "r1")
    no_origin = [d.text for d in rs.deliveries + early.deliveries if d.prop("origin") != "rs-pub"]
    check(not no_origin, f"the publisher's user property origin=rs-pub lost: {no_origin}")
    got_p = [d.text for d in plain.deliveries]
    check(got_p == ["r1:5"], f"ordinary subscription after the publishes: expected only the live r1:5, got {got_p}")
    got_l = [d.text for d in live.deliveries]
    check(got_l == [f"r1:{i}" for i in range(6)],
          f"ordinary subscription from before: expected r1:0..5 once in order, got {got_l}")


def s_multi_level_key():
    """Parent mk (mk/{lane}/#, key_levels = 2): the key is two topic levels joined by '/'
    (mk/u1/s1/x and mk/u1/s1/y/z are lane u1/s1, mk/u2/s1 with '#' matching no level is lane
    u2/s1). Group mkg on mk/+/+/# (each key level '+') gets every lane in order with lane = the
    two-level key; a one-lane
    group on mk/u1/s2/# gets only u1/s2; a plain subscription to mk/u1/s1/# with lane-offset = 0
    replays only u1/s1."""
    g = LClient("mk-g").connect()
    g.subscribe_lane("$share/mkg/mk/+/+/#", qos=1)
    one = LClient("mk-one").connect()
    one.subscribe_lane("$share/mk1/mk/u1/s2/#", qos=1)
    pub = LClient("mk-pub", handler=None).connect()
    msgs = [("mk/u1/s1/x", b"u1/s1:0"), ("mk/u1/s2/x", b"u1/s2:0"), ("mk/u1/s1/y/z", b"u1/s1:1"),
            ("mk/u2/s1", b"u2/s1:0"), ("mk/u1/s2/x", b"u1/s2:1")]
    rcs = pub.publish_many(msgs)
    check(all(rc is not None and not rc.is_failure for rc in rcs.values()), f"PUBACKs {rcs}")
    rp = LClient("mk-replay").connect()
    rp.subscribe_lane("mk/u1/s1/#", qos=1, offset="0")
    ok = wait_until(lambda: len(g.deliveries) >= 5 and len(one.deliveries) >= 2 and len(rp.deliveries) >= 2, 5)
    wait_quiet([g, one, rp], 0.3, 2)
    handler_errors([g, one, rp])
    per = defaultdict(list)
    for d in g.deliveries:
        per[d.lane].append((d.text, d.off, d.topic))
    want = {"u1/s1": [("u1/s1:0", 0, "mk/u1/s1/x"), ("u1/s1:1", 1, "mk/u1/s1/y/z")],
            "u1/s2": [("u1/s2:0", 0, "mk/u1/s2/x"), ("u1/s2:1", 1, "mk/u1/s2/x")],
            "u2/s1": [("u2/s1:0", 0, "mk/u2/s1")]}
    check(ok and dict(per) == want, f"group mkg per lane (payload, offset, topic): got {dict(per)}, expected {want}")
    got1 = [(d.text, d.off, d.lane) for d in one.deliveries]
    check(got1 == [("u1/s2:0", 0, "u1/s2"), ("u1/s2:1", 1, "u1/s2")], f"one-lane group on mk/u1/s2/#: got {got1}")
    gotr = [(d.text, d.off, d.lane) for d in rp.deliveries]
    check(gotr == [("u1/s1:0", 0, "u1/s1"), ("u1/s1:1", 1, "u1/s1")], f"replay of mk/u1/s1/# from 0: got {gotr}")


def s_refusals():
    """Parent quota (max_lanes 3, max_key_bytes 8), group `qg`: QoS 1 publishes to 3 new lanes get
    PUBACK 0x00, a 4th lane 0x97 (quota exceeded), an existing lane still 0x00, a 9-byte key 0x90
    (topic name invalid); at QoS 0 the refused ones are dropped; the group gets only the accepted
    messages (lane-offsets 0, 0, 0, 1). The accepted ones must get 0x00, not 0x10 (No matching
    subscribers): the group member is subscribed."""
    c = LClient("q-c").connect()
    c.subscribe_lane("$share/qg/quota/+/#", qos=1)
    pub = LClient("q-pub", handler=None).connect()
    codes = []
    for topic, payload, want in [("quota/q1/x", "q1:0", 0x00), ("quota/q2/x", "q2:0", 0x00),
                                 ("quota/q3/x", "q3:0", 0x00), ("quota/q4/x", "q4:0", 0x97),
                                 ("quota/q1/x", "q1:1", 0x00), ("quota/key-9byte/x", "key-9byte:0", 0x90)]:
        rc = pub.publish_rc(topic, payload.encode())
        codes.append((topic, rc, want))
    def hx(rc):
        return f"0x{rc:02X}" if isinstance(rc, int) else str(rc)

    # The refusals first; the exact success code of the accepted ones last (so that one wrong
    # success code does not hide the rest).
    bad = [(t, hx(rc), hx(w)) for t, rc, w in codes
           if (w != 0 and rc != w) or (w == 0 and not (isinstance(rc, int) and rc < 0x80))]
    check(not bad, f"PUBACK codes (topic, got, expected): {bad}")
    pub.publish_rc("quota/q5/x", b"q5:0", qos=0)
    pub.publish_rc("quota/longer-key/x", b"longer-key:0", qos=0)
    pub.publish_rc("quota/q2/x", b"q2:1", qos=0)
    wait_until(lambda: len(c.deliveries) >= 5, 5)
    wait_quiet([c], 0.5, 2)
    handler_errors([c])
    got = sorted((d.text, d.off) for d in c.deliveries)
    want = sorted([("q1:0", 0), ("q2:0", 0), ("q3:0", 0), ("q1:1", 1), ("q2:1", 1)])
    check(got == want, f"the group got (payload, lane-offset) {got}, expected {want}")
    wrong = [(t, hx(rc)) for t, rc, w in codes if w == 0 and rc != 0]
    check(not wrong, f"accepted lane publishes with a group member subscribed got PUBACK {wrong}, "
                     f"expected 0x00: 0x10 (No matching subscribers) says nobody will get the message, "
                     f"but the group does (MQTT 5 3.4.2.1)")


def s_exclusive_owner():
    """Parent excl (mode exclusive), group `ex` with 2 members on excl/+/#: 20 lanes x 2 messages,
    each lane delivered to one member only. A third member subscribes to exactly one lane
    ($share/ex/excl/e-3/#): from then on e-3 goes to it only (newest explicit subscriber wins, the
    old owner gets no more of e-3, offsets continue at 2), other lanes stay with their owners and
    never go to the one-lane member; when the owner of another lane disconnects, that lane moves
    to the remaining all-lanes member."""
    m1 = LClient("ex-m1").connect()
    m1.subscribe_lane("$share/ex/excl/+/#", qos=1)
    m2 = LClient("ex-m2").connect()
    m2.subscribe_lane("$share/ex/excl/+/#", qos=1)
    pub = LClient("ex-pub", handler=None).connect()
    msgs = [(f"excl/e-{lane}/x", f"e-{lane}:{seq}".encode()) for seq in range(2) for lane in range(20)]
    rcs = pub.publish_many(msgs)
    check(all(rc is not None and not rc.is_failure for rc in rcs.values()), f"PUBACKs {rcs}")
    ok = poll_until(lambda: len({d.text for c in (m1, m2) for d in c.deliveries}) >= 40, 5)
    wait_quiet([m1, m2], 0.3, 2)
    handler_errors([m1, m2])
    ds = all_deliveries([m1, m2])
    check(ok, f"not all 40 messages delivered within 5 s: {sample(sorted({d.text for d in ds}), 50)}")
    owners = defaultdict(set)
    for d in ds:
        owners[d.lane].add(d.cid)
    shared = {k: sorted(v) for k, v in owners.items() if len(v) > 1}
    check(not shared, f"exclusive mode: lanes delivered to more than one member: {shared}")
    check_lane_props(ds, lambda d: parse_key_seq(d)[0])
    owner = {k: next(iter(v)) for k, v in owners.items()}
    note(f"lanes per member: {dict(Counter(owner.values()))}")
    m3 = LClient("ex-m3").connect()
    m3.subscribe_lane("$share/ex/excl/e-3/#", qos=1)
    n_before = ORDER[0]
    more = [("excl/e-3/x", f"e-3:{s}".encode()) for s in (2, 3, 4)] + [("excl/e-4/x", b"e-4:2")]
    pub.publish_many(more)
    ok = poll_until(lambda: sum(1 for c in (m1, m2, m3) for d in c.deliveries if d.n >= n_before) >= 4, 5)
    wait_quiet([m1, m2, m3], 0.3, 2)
    new = [(d.cid, d.text, d.off) for d in all_deliveries([m1, m2, m3]) if d.n >= n_before]
    check(ok, f"within 5 s after the one-lane subscription got only {new}")
    e3 = [x for x in new if x[1].startswith("e-3:")]
    check(e3 == [("ex-m3", "e-3:2", 2), ("ex-m3", "e-3:3", 3), ("ex-m3", "e-3:4", 4)],
          f"e-3 after {m3.cid} subscribed to exactly that lane (old owner {owner['e-3']}): expected "
          f"offsets 2, 3, 4 to {m3.cid} only, got (member, payload, offset) {e3}")
    e4 = [x for x in new if x[1].startswith("e-4:")]
    check(e4 == [(owner["e-4"], "e-4:2", 2)], f"e-4 (owner {owner['e-4']}) after the takeover of e-3: {e4}")
    # The owner of e-5 leaves: e-5 moves to the other all-lanes member, not to the e-3-only one.
    leaver = m1 if owner["e-5"] == m1.cid else m2
    stayer = m2 if leaver is m1 else m1
    leaver.disconnect()
    n_before = ORDER[0]
    pub.publish("excl/e-5/x", b"e-5:2")
    ok = poll_until(lambda: any(d.n >= n_before for c in (stayer, m3) for d in c.deliveries), 5)
    wait_quiet([stayer, m3], 0.3, 2)
    handler_errors([m1, m2, m3])
    new = [(d.cid, d.text, d.off) for d in all_deliveries([stayer, m3]) if d.n >= n_before]
    check(new == [(stayer.cid, "e-5:2", 2)], f"e-5 after its owner {leaver.cid} disconnected: expected it on "
                                             f"{stayer.cid} at offset 2, got {new}")


SCENARIOS = [v for k, v in list(globals().items()) if k.startswith("s_") and callable(v)]

# --- across a broker restart (paho-lanes.sh runs phase 1, restarts the broker, phase 2) --------


def restart_phase_1():
    """Before the restart: lane pr-1 (parent sess), a new one-lane group prg
    ($share/prg/sess/pr-1/#): offsets 0..2 delivered and all acked (a finished batch), then 3 (and
    4 if in the same batch) delivered and held un-acked; DISCONNECT (the session ends)."""
    def handler(c, d):
        if d.off is not None and d.off <= 2:
            c.ack(d)

    pub = LClient("pr-pub", handler=None).connect()
    pub.publish_many([("sess/pr-1/x", f"pr-1:{i}".encode()) for i in range(3)])
    m = LClient("pr-m1", handler=handler).connect()
    m.subscribe_lane("$share/prg/sess/pr-1/#", qos=1)
    ok = wait_until(lambda: len(m.deliveries) >= 3, 5)
    wait_quiet([m], 0.3, 2)
    pub.publish_many([("sess/pr-1/x", f"pr-1:{i}".encode()) for i in (3, 4)])
    ok = wait_until(lambda: len(m.deliveries) >= 4, 5) and ok
    wait_quiet([m], 0.3, 2)
    handler_errors([m])
    got = [(d.text, d.off) for d in m.deliveries]
    # 4 comes in the batch of 3 or waits behind the held 3: either is right.
    check(ok and got[:4] == [(f"pr-1:{i}", i) for i in range(4)] and got[4:] in ([], [("pr-1:4", 4)]),
          f"expected pr-1 offsets 0..3 (and maybe 4), got {got}")
    time.sleep(0.5)  # past lite.flush_interval_ms (100 ms): the commit of 0..2 is durable
    m.disconnect()


def restart_phase_2():
    """After a graceful broker restart (same data dir): a new member of group prg gets only the
    un-acked offsets 3 and 4 (the group offset survived), a live publish continues the lane at
    offset 5 (the lane's next offset survived), and a plain replay from lane-offset 0 returns
    0..5 (the lane index survived)."""
    m = LClient("pr-m2").connect()
    m.subscribe_lane("$share/prg/sess/pr-1/#", qos=1)
    ok = wait_until(lambda: len(m.deliveries) >= 2, 5)
    wait_quiet([m], 0.5, 2)
    got = [(d.text, d.off) for d in m.deliveries]
    check(ok and got == [("pr-1:3", 3), ("pr-1:4", 4)],
          f"after the restart: expected the un-acked offsets 3, 4 only, got (payload, offset) {got}")
    pub = LClient("pr-pub2", handler=None).connect()
    pub.publish("sess/pr-1/x", b"pr-1:5")
    ok = wait_until(lambda: len(m.deliveries) >= 3, 5)
    wait_quiet([m], 0.3, 2)
    got = [(d.text, d.off) for d in m.deliveries]
    check(ok and got[2:] == [("pr-1:5", 5)], f"live publish after the restart: expected offset 5, got {got}")
    rp = LClient("pr-replay").connect()
    rp.subscribe_lane("sess/pr-1/#", qos=1, offset="0")
    ok = wait_until(lambda: len(rp.deliveries) >= 6, 5)
    wait_quiet([rp], 0.3, 2)
    handler_errors([m, rp])
    got = [(d.text, d.off) for d in rp.deliveries]
    check(ok and got == [(f"pr-1:{i}", i) for i in range(6)], f"replay from lane-offset 0 after the "
                                                             f"restart: expected 0..5, got {got}")


RESTART_PHASES = {"1": restart_phase_1, "2": restart_phase_2}


def run_restart_phase(phase: str) -> int:
    name = f"group_offsets_across_broker_restart (phase {phase})"
    t0 = time.monotonic()
    try:
        RESTART_PHASES[phase]()
        print(f"PASS: {name} ({time.monotonic() - t0:.1f}s)", flush=True)
        return 0
    except Exception as e:
        print(f"FAIL: {name} -- {type(e).__name__}: {e}", flush=True)
        if not isinstance(e, Failure):
            traceback.print_exc()
        return 1
    finally:
        for c in ps.Client.registry:
            c.close()
        ps.Client.registry.clear()


# Scenarios that check the spec but fail against the current broker: reported as SKIP with the
# reason (so the test command stays green) until fixed; PASS again once they pass.
KNOWN_BROKER_BUGS: dict = {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--restart-phase", choices=sorted(RESTART_PHASES),
                    help="run one phase of the broker-restart scenario instead of the scenarios")
    ap.add_argument("only", nargs="*", help="run scenarios whose name contains one of these")
    args = ap.parse_args()
    ps.PORT = args.port
    if args.restart_phase:
        return run_restart_phase(args.restart_phase)
    passed = failed = skipped = 0
    failures = []
    for fn in SCENARIOS:
        name = fn.__name__[2:]
        if args.only and not any(o in name for o in args.only):
            continue
        t0 = time.monotonic()
        try:
            fn()
            passed += 1
            print(f"PASS: {name} ({time.monotonic() - t0:.1f}s)", flush=True)
        except Failure as e:
            if name in KNOWN_BROKER_BUGS:
                skipped += 1
                print(f"SKIP: {name} -- known broker bug: {KNOWN_BROKER_BUGS[name]}; got: {e}", flush=True)
                continue
            failed += 1
            failures.append(name)
            print(f"FAIL: {name} -- {e}", flush=True)
        except Exception as e:  # a script error is a failure too, with the trace
            failed += 1
            failures.append(name)
            print(f"FAIL: {name} -- {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        finally:
            for c in ps.Client.registry:
                c.close()
            ps.Client.registry.clear()
    print("----")
    if failures:
        print("paho-lanes failures: " + " ".join(failures))
    print(f"paho-lanes: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
