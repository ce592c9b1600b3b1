#!/usr/bin/env python3
"""Named streams ($stream/<name>) with the Eclipse Paho Python client (paho-mqtt 2.x, MQTT 5).

Run through interop/paho-streams.sh, which starts a broker with the streams below and passes
its port:

    interop/.venv/bin/python interop/paho_streams.py --port PORT [SCENARIO_SUBSTRING...]

Streams the broker must have (declared by paho-streams.sh):

    events   ev/#   regular
    tsx      tsx/#  regular
    lv       lv/#   last-value, key_expression = "message.topic"
    jk       jk/#   last-value, key_expression = "payload.$.device.id"
    resume   rs/#   regular
    subid    sid/#  regular
    restart  rr/#   regular (the broker-restart scenario, --restart-phase 1 and 2)

Semantics: /work/shared/spec/streams.md. Prints PASS/FAIL per scenario and a closing
"paho-streams: N passed, N failed" line; the exit code is the number of failures. Every wait
is bounded. Reuses the client wrapper of interop/paho_scenarios.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

import paho_scenarios as ps  # noqa: E402
from paho_scenarios import Failure, check, payloads  # noqa: E402

WAIT = ps.WAIT


def user_props(m) -> dict[str, str]:
    """The user properties of a received message (Msg) as a dict (last value wins)."""
    up = m.prop("UserProperty", None) or []
    return {k: v for k, v in up}


class SClient(ps.Client):
    """paho_scenarios.Client that also records the DUP flag and reports SUBACK codes."""

    def _on_message(self, c, ud, m):
        super()._on_message(c, ud, m)
        with self.cond:
            self.msgs[-1].dup = bool(m.dup)

    def subscribe_raw(self, topic: str, qos=1, *, offset: str | None = None, sub_id: int | None = None):
        """SUBSCRIBE with an optional stream-offset user property; returns the SUBACK
        (reason code, reason string) without judging it."""
        p = Properties(PacketTypes.SUBSCRIBE)
        if offset is not None:
            p.UserProperty = ("stream-offset", offset)
        if sub_id is not None:
            p.SubscriptionIdentifier = sub_id
        self.c.on_subscribe = self._on_subscribe_p
        rc, mid = self.c.subscribe(topic, options=SubscribeOptions(qos=qos), properties=p)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: subscribe({topic}) returned {rc}")
        check(self._wait(lambda: mid in self.subacks), f"{self.cid}: no SUBACK for {topic}")
        codes, props = self.subacks[mid]
        return codes[0], getattr(props, "ReasonString", None) if props is not None else None

    def _on_subscribe_p(self, c, ud, mid, rcs, properties):
        with self.cond:
            self.subacks[mid] = (rcs, properties)
            self.cond.notify_all()

    def sub_stream(self, topic: str, qos=1, *, offset: str | None = None, sub_id: int | None = None):
        code, why = self.subscribe_raw(topic, qos, offset=offset, sub_id=sub_id)
        check(not code.is_failure, f"{self.cid}: SUBACK for {topic} (stream-offset {offset}): "
                                   f"0x{code.value:02X} {code} {why or ''}")
        return code


def publisher(cid: str) -> SClient:
    return SClient(cid).connect()


def now_us() -> int:
    return time.time_ns() // 1000


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


def s_timestamp_offset():
    """stream-offset = <Unix µs>: messages published before the timestamp are skipped, the
    ones after it are replayed (then live)."""
    pub = publisher("ts-pub")
    for i in range(5):
        pub.publish(f"tsx/{i}", f"a{i}".encode())
    time.sleep(0.3)
    t = now_us()
    time.sleep(0.3)
    for i in range(5):
        pub.publish(f"tsx/{i}", f"b{i}".encode())
    sub = SClient("ts-sub").connect()
    sub.sub_stream("$stream/tsx", offset=str(t))
    got = sub.wait_msgs(5)
    got = sub.quiet(0.5)
    want = [f"b{i}".encode() for i in range(5)]
    check(payloads(got) == want, f"expected only the second batch {want}, got {payloads(got)}")
    check([m.topic for m in got] == [f"tsx/{i}" for i in range(5)],
          f"original topics not kept: {[m.topic for m in got]}")
    for m in got:
        ts = int(user_props(m).get("ts", "0"))
        check(ts >= t, f"message {m.payload!r} has ts {ts} < the requested offset {t}")
    # The same from earliest: both batches.
    sub2 = SClient("ts-sub2").connect()
    sub2.sub_stream("$stream/tsx", offset="earliest")
    got2 = sub2.wait_msgs(10)
    check(len(got2) == 10, f"earliest: expected both batches (10), got {payloads(got2)}")


def s_timestamp_in_the_future_is_live_only():
    """stream-offset = a timestamp 1 h ahead: nothing from history; a live message published
    now (before that time) is not delivered either (timestamps are inclusive lower bounds)."""
    sub = SClient("tsf-sub").connect()
    sub.sub_stream("$stream/tsx", offset=str(now_us() + 3600 * 1_000_000))
    pub = publisher("tsf-pub")
    pub.publish("tsx/f", b"now")
    got = sub.quiet(1.0)
    check(not got, f"messages older than the requested timestamp delivered: {payloads(got)}")


def s_lastvalue_newest_per_topic():
    """is_lastvalue = true, key_expression = message.topic: after several values per topic, a
    replay from earliest delivers only the newest value of each topic, with key = topic."""
    pub = publisher("lv-pub")
    seq = [("lv/a", "a1"), ("lv/b", "b1"), ("lv/a", "a2"), ("lv/c", "c1"), ("lv/b", "b2"),
           ("lv/a", "a3"), ("lv/c", "c2"), ("lv/a", "a4")]
    for t, p in seq:
        pub.publish(t, p.encode())
    time.sleep(0.3)
    sub = SClient("lv-sub").connect()
    sub.sub_stream("$stream/lv", offset="earliest")
    sub.wait_msgs(3)
    got = sub.quiet(0.7)
    pairs = sorted((m.topic, m.payload.decode()) for m in got)
    check(pairs == [("lv/a", "a4"), ("lv/b", "b2"), ("lv/c", "c2")],
          f"expected the newest value per topic [lv/a a4, lv/b b2, lv/c c2], got "
          f"{[(m.topic, m.payload.decode()) for m in got]}")
    for m in got:
        check(user_props(m).get("key") == m.topic, f"key {user_props(m).get('key')!r} != topic {m.topic!r}")
    # A new value is delivered live; a second replay shows it replacing the old one.
    pub.publish("lv/b", b"b3")
    live = sub.wait_msgs(4)
    check(len(live) == 4 and live[3].payload == b"b3", f"live value not delivered: {payloads(live)}")
    sub2 = SClient("lv-sub2").connect()
    sub2.sub_stream("$stream/lv", offset="earliest")
    sub2.wait_msgs(3)
    got2 = sub2.quiet(0.7)
    pairs2 = sorted((m.topic, m.payload.decode()) for m in got2)
    check(pairs2 == [("lv/a", "a4"), ("lv/b", "b3"), ("lv/c", "c2")], f"second replay: {pairs2}")


def s_lastvalue_json_key():
    """key_expression = payload.$.device.id: the newest message per device id; a payload
    without the key is kept as a regular message."""
    pub = publisher("jk-pub")
    seq = [("d1", 1), ("d2", 1), ("d1", 2), ("d2", 2), ("d1", 3)]
    for dev, v in seq:
        pub.publish(f"jk/{v}", json.dumps({"device": {"id": dev}, "v": v}).encode())
    pub.publish("jk/nokey", b'{"other": 1}')
    pub.publish("jk/nokey", b'not json')
    time.sleep(0.3)
    sub = SClient("jk-sub").connect()
    sub.sub_stream("$stream/jk", offset="earliest")
    sub.wait_msgs(4)
    got = sub.quiet(0.7)
    keyed = {}
    plain = []
    for m in got:
        try:
            d = json.loads(m.payload)
            dev = d["device"]["id"]
        except (ValueError, KeyError, TypeError):
            plain.append(m.payload)
            continue
        check(dev not in keyed, f"device {dev} delivered twice: {payloads(got)}")
        keyed[dev] = d["v"]
        check(user_props(m).get("key") == dev, f"key {user_props(m).get('key')!r} != {dev!r}")
    check(keyed == {"d1": 3, "d2": 2}, f"expected newest per device d1=3 d2=2, got {keyed} ({payloads(got)})")
    check(sorted(plain) == sorted([b'{"other": 1}', b"not json"]),
          f"keyless messages not kept as regular messages: {plain}")


def s_resume_after_last_ack():
    """Persistent session (clean_start=False, Session Expiry 3600), QoS 1, manual acks: 30
    messages replayed from earliest, the first 10 acknowledged, DISCONNECT, reconnect: the
    session is present, nothing before #11 is delivered again, #11..#30 all arrive in order
    (unacknowledged ones possibly first as DUP=1 redeliveries, but each at most once more)."""
    pub = publisher("rs-pub")
    n = 30
    for i in range(1, n + 1):
        pub.publish("rs/x", f"{i}".encode())
    c = SClient("rs-sub", manual_ack=True)
    c.connect(clean_start=True, expiry=3600)
    c.sub_stream("$stream/resume", offset="earliest")
    got = c.wait_msgs(n)
    check(payloads(got)[:n] == [str(i).encode() for i in range(1, n + 1)],
          f"first session: expected 1..30 in order, got {payloads(got)}")
    for m in got[:10]:
        c.c.ack(m.mid, 1)
    time.sleep(0.5)
    c.disconnect()
    r = SClient("rs-sub", manual_ack=True)
    r.connect(clean_start=False, expiry=3600)
    check(r.session_present, "session not present on reconnect")
    r.wait_msgs(n - 10, 5)
    got = r.quiet(1.0)
    desc = [(int(m.payload), int(m.dup)) for m in got]
    if os.environ.get("PAHO_STREAMS_VERBOSE"):
        print(f"  after reconnect (payload, dup): {desc}", flush=True)
    check(got, "nothing delivered after the reconnect")
    check(int(got[0].payload) == 11, f"the first message after the reconnect is #{int(got[0].payload)}, "
                                      f"expected #11: {desc}")
    early = [d for d in desc if d[0] <= 10]
    check(not early, f"acknowledged messages (#1..#10) delivered again: {early}")
    firsts: list[int] = []
    for v, _ in desc:
        if v not in firsts:
            firsts.append(v)
    check(firsts == list(range(11, n + 1)), f"#11..#30 not all delivered in order: {desc}")
    seen: dict[int, int] = {}
    for v, _ in desc:
        seen[v] = seen.get(v, 0) + 1
    twice = sorted(v for v, k in seen.items() if k > 1)
    check(not twice, f"delivered more than once after the reconnect: {twice} ({desc})")
    for m in got:
        r.c.ack(m.mid, 1)
    # Now all 30 acknowledged: a third session gets nothing old, only a new live message.
    time.sleep(0.5)
    r.disconnect()
    r3 = SClient("rs-sub", manual_ack=True)
    r3.connect(clean_start=False, expiry=3600)
    check(r3.session_present, "session not present on the second reconnect")
    old = r3.quiet(1.0)
    check(not old, f"all acknowledged, yet delivered again: {[(int(m.payload), int(m.dup)) for m in old]}")
    pub.publish("rs/x", b"31")
    new = r3.wait_msgs(1)
    check(payloads(new) == [b"31"], f"live message after resume: {payloads(new)}")
    r3.c.ack(new[0].mid, 1)
    r3.disconnect(0, SessionExpiryInterval=0)


def s_resume_with_gap_in_acks():
    """As resume_after_last_ack, but #1..#10 and #15 acknowledged (out of order: #15 before
    #1..#10): after the reconnect #11..#14 and #16..#30 arrive in order, #15 and #1..#10 not."""
    pub = publisher("rg-pub")
    n = 30
    for i in range(1, n + 1):
        pub.publish("rs/gap", f"g{i}".encode())
    c = SClient("rg-sub", manual_ack=True)
    c.connect(clean_start=True, expiry=3600)
    c.sub_stream("$stream/resume/rs/#", offset="earliest")
    got = c.wait_msgs(n, pred=lambda m: m.payload.startswith(b"g"))
    got = [m for m in got if m.payload.startswith(b"g")]
    check(payloads(got)[:n] == [f"g{i}".encode() for i in range(1, n + 1)],
          f"first session: expected g1..g30 in order, got {payloads(got)}")
    c.c.ack(got[14].mid, 1)
    for m in got[:10]:
        c.c.ack(m.mid, 1)
    time.sleep(0.5)
    c.disconnect()
    r = SClient("rg-sub", manual_ack=True)
    r.connect(clean_start=False, expiry=3600)
    check(r.session_present, "session not present on reconnect")
    r.wait_msgs(n - 11, 5, pred=lambda m: m.payload.startswith(b"g"))
    got = [m for m in r.quiet(1.0) if m.payload.startswith(b"g")]
    desc = [(int(m.payload[1:]), int(m.dup)) for m in got]
    want = [i for i in range(11, n + 1) if i != 15]
    check([v for v, _ in desc] == want, f"after the reconnect expected {want} once each, got {desc}")
    for m in got:
        r.c.ack(m.mid, 1)
    r.disconnect(0, SessionExpiryInterval=0)


def s_subscription_identifier():
    """The subscription identifier of a $stream/ subscription is on every stream delivery
    (history and live), and the granted QoS is used."""
    pub = publisher("sid-pub")
    for i in range(3):
        pub.publish(f"sid/{i}", f"h{i}".encode(), qos=1)
    sub = SClient("sid-sub").connect()
    code = sub.sub_stream("$stream/subid", qos=1, offset="earliest", sub_id=42)
    check(code.value == 1, f"granted QoS {code.value}, expected 1")
    sub.wait_msgs(3)
    pub.publish("sid/live", b"live", qos=1)
    got = sub.wait_msgs(4)
    check(payloads(got) == [b"h0", b"h1", b"h2", b"live"], f"got {payloads(got)}")
    for m in got:
        check(m.prop("SubscriptionIdentifier") == [42],
              f"{m.topic}: SubscriptionIdentifier {m.prop('SubscriptionIdentifier')}, expected [42]")
        check(m.qos == 1, f"{m.topic}: QoS {m.qos}, expected the granted 1")
    # Another subscription of the same client, with QoS 0 and identifier 43, to the same stream
    # by its filter: deliveries carry 43 and QoS 0.
    sub2 = SClient("sid-sub2").connect()
    sub2.sub_stream("$stream/subid/sid/#", qos=0, offset="earliest", sub_id=43)
    got2 = sub2.wait_msgs(4)
    check(len(got2) == 4, f"$stream/subid/sid/#: got {payloads(got2)}")
    for m in got2:
        check(m.prop("SubscriptionIdentifier") == [43] and m.qos == 0,
              f"{m.topic}: SubscriptionIdentifier {m.prop('SubscriptionIdentifier')} QoS {m.qos}")


def s_user_properties():
    """Every delivery carries stream-offset (@<n>, increasing), ts (µs, close to now) and
    key (default key expression message.from = the publisher's client id)."""
    pub = publisher("up-pub-7")
    t0 = now_us()
    for i in range(3):
        pub.publish(f"ev/{i}", f"u{i}".encode())
    sub = SClient("up-sub").connect()
    sub.sub_stream("$stream/events", offset="earliest")
    got = sub.wait_msgs(3)
    check(len(got) == 3, f"got {payloads(got)}")
    offs = []
    for m in got:
        up = user_props(m)
        so = up.get("stream-offset", "")
        check(so.startswith("@") and so[1:].isdigit(), f"stream-offset {so!r}")
        offs.append(int(so[1:]))
        ts = int(up.get("ts", "0"))
        check(t0 - 2_000_000 <= ts <= now_us() + 2_000_000, f"ts {ts} not near the publish time {t0}")
        check(up.get("key") == "up-pub-7", f"key {up.get('key')!r}, expected the publisher's id")
    check(offs == sorted(offs) and len(set(offs)) == 3, f"positions not increasing: {offs}")
    # @<n> resumes after that position.
    sub2 = SClient("up-sub2").connect()
    sub2.sub_stream("$stream/events", offset=f"@{offs[0]}")
    got2 = sub2.wait_msgs(2)
    got2 = sub2.quiet(0.3)
    check(payloads(got2) == [b"u1", b"u2"], f"@{offs[0]}: expected u1 u2, got {payloads(got2)}")


def s_auto_create():
    """$stream/<new>/<filter>: the stream is created with that filter (auto_create, last-value
    by message.from by default) and delivers; another filter for the same name is refused
    (stream_bound_to_different_topic_filter); $stream/<new> reads it."""
    sub = SClient("ac-sub").connect()
    sub.sub_stream("$stream/auto1/ac/#", offset="earliest")
    pub = publisher("ac-pub")
    pub.publish("ac/x", b"first")
    pub.publish("other/x", b"not-captured")
    got = sub.wait_msgs(1)
    got = sub.quiet(0.5)
    check(payloads(got) == [b"first"], f"auto-created stream delivered {payloads(got)}")
    check(got[0].topic == "ac/x" and "stream-offset" in user_props(got[0]),
          f"not a stream delivery: {got[0].topic} {user_props(got[0])}")
    other = SClient("ac-other").connect()
    code, why = other.subscribe_raw("$stream/auto1/zz/#", offset="earliest")
    check(code.is_failure, f"different filter for auto1 granted: {code}")
    check(why and "stream_bound_to_different_topic_filter" in why,
          f"reason string {why!r} (code 0x{code.value:02X})")
    byname = SClient("ac-byname").connect()
    byname.sub_stream("$stream/auto1", offset="earliest")
    got3 = byname.wait_msgs(1)
    check(payloads(got3) == [b"first"], f"$stream/auto1 from earliest: {payloads(got3)}")


def s_mqtt311_refused():
    """An MQTT 3.1.1 client gets SUBACK 0x80 for $stream/events."""
    c = SClient("v311", protocol=mqtt.MQTTv311).connect()
    rc, mid = c.c.subscribe("$stream/events", 1)
    check(rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe returned {rc}")
    check(c._wait(lambda: mid in c.subacks), "no SUBACK")
    codes = c.subacks[mid]
    v = codes[0].value if hasattr(codes[0], "value") else int(codes[0])
    check(v == 0x80, f"SUBACK {codes}, expected 0x80")


def s_bad_offset_refused():
    """Unparsable stream-offset values are refused with an error code and a reason string."""
    c = SClient("bad-off").connect()
    for off in ["bogus", "@", "@x", "-5", "12.5", ""]:
        code, why = c.subscribe_raw("$stream/events", offset=off)
        check(code.is_failure, f"stream-offset {off!r} granted ({code})")
        check(why, f"stream-offset {off!r}: no reason string (code 0x{code.value:02X})")


SCENARIOS = [v for k, v in list(globals().items()) if k.startswith("s_") and callable(v)]


# --- across a broker restart (paho-streams.sh runs phase 1, restarts the broker, phase 2) -----

RESTART_N = 20
RESTART_ACKED = 8


def restart_phase_1():
    """Before the restart: 20 messages into stream `restart`, a persistent session reads them
    from earliest with manual acks, acknowledges #1..#8, disconnects."""
    pub = publisher("rr-pub")
    for i in range(1, RESTART_N + 1):
        pub.publish("rr/x", f"{i}".encode())
    c = SClient("rr-sub", manual_ack=True)
    c.connect(clean_start=True, expiry=3600)
    c.sub_stream("$stream/restart", offset="earliest")
    got = c.wait_msgs(RESTART_N)
    check(payloads(got) == [f"{i}".encode() for i in range(1, RESTART_N + 1)],
          f"expected 1..{RESTART_N} in order, got {payloads(got)}")
    for m in got[:RESTART_ACKED]:
        c.c.ack(m.mid, 1)
    time.sleep(0.5)
    c.disconnect()


def restart_phase_2():
    """After a graceful broker restart: the session is present, #9..#20 arrive once each in
    order (as DUP redeliveries or fresh reads), #1..#8 not; then live messages follow."""
    r = SClient("rr-sub", manual_ack=True)
    r.connect(clean_start=False, expiry=3600)
    check(r.session_present, "session not present after the broker restart")
    r.wait_msgs(RESTART_N - RESTART_ACKED, 5)
    got = r.quiet(1.0)
    desc = [(int(m.payload), int(m.dup)) for m in got]
    want = list(range(RESTART_ACKED + 1, RESTART_N + 1))
    check([v for v, _ in desc] == want, f"after the restart expected {want} once each, got (payload, dup) {desc}")
    for m in got:
        r.c.ack(m.mid, 1)
    pub = publisher("rr-pub2")
    pub.publish("rr/x", b"live")
    live = r.wait_msgs(len(got) + 1)
    check(payloads(live)[-1:] == [b"live"], f"live message after the restart: {payloads(live)}")
    r.c.ack(live[-1].mid, 1)
    r.disconnect(0, SessionExpiryInterval=0)


RESTART_PHASES = {"1": restart_phase_1, "2": restart_phase_2}

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
        print("paho-streams failures: " + " ".join(failures))
    print(f"paho-streams: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return min(failed, 125)


def run_restart_phase(phase: str) -> int:
    name = f"resume_across_broker_restart (phase {phase})"
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


if __name__ == "__main__":
    sys.exit(main())
