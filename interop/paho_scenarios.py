#!/usr/bin/env python3
"""MQTT 5 interop scenarios driven by the real Eclipse Paho Python client (paho-mqtt 2.x).

Run through interop/paho.sh, which starts a broker and passes its port:

    interop/.venv/bin/python interop/paho_scenarios.py --port PORT [SCENARIO_SUBSTRING...]

Every scenario is a function ``s_*``; it raises ``Failure`` (or any exception) with a reason.
Prints PASS/FAIL per scenario and a closing "paho: N passed, N failed" line; the exit code is
the number of failures. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
import traceback

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

HOST = "127.0.0.1"
PORT = 1883
WAIT = 5.0  # default bound for any single wait


class Failure(Exception):
    pass


def check(cond: bool, reason: str) -> None:
    if not cond:
        raise Failure(reason)


def props(packet_type: int, **kw) -> Properties:
    p = Properties(packet_type)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def pprop(msg: mqtt.MQTTMessage, name: str, default=None):
    p = getattr(msg, "properties", None)
    if p is None:
        return default
    return getattr(p, name, default)


class Msg:
    """A received message, copied out of paho's object (with our own alias resolution)."""

    def __init__(self, m: mqtt.MQTTMessage, topic: str, t: float):
        self.topic = topic
        self.wire_topic = m.topic
        self.payload = m.payload
        self.qos = m.qos
        self.retain = bool(m.retain)
        self.mid = m.mid
        self.props = getattr(m, "properties", None)
        self.t = t

    def prop(self, name: str, default=None):
        if self.props is None:
            return default
        return getattr(self.props, name, default)

    def __repr__(self) -> str:
        return f"<{self.topic} {self.payload[:40]!r} q{self.qos} r{int(self.retain)}>"


class Client:
    """A paho client running its network loop in a thread, with bounded waits."""

    registry: list["Client"] = []

    def __init__(self, cid: str, *, manual_ack: bool = False, protocol=mqtt.MQTTv5):
        self.cid = cid
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=cid,
            protocol=protocol,
            reconnect_on_failure=False,
            manual_ack=manual_ack,
        )
        self.cond = threading.Condition()
        self.msgs: list[Msg] = []
        self.connack = None  # (session_present, reason_code, properties)
        self.disconnected = None  # (reason_code, properties)
        self.subacks: dict[int, list] = {}
        self.aliases: dict[int, str] = {}
        self.alias_errors: list[str] = []
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_disconnect = self._on_disconnect
        Client.registry.append(self)

    # callbacks (network thread) ------------------------------------------------------------
    def _on_connect(self, c, ud, flags, rc, properties):
        with self.cond:
            self.connack = (flags.session_present, rc, properties)
            self.cond.notify_all()

    def _on_message(self, c, ud, m):
        topic = m.topic
        alias = pprop(m, "TopicAlias")
        if alias is not None:
            if topic:
                self.aliases[alias] = topic
            elif alias in self.aliases:
                topic = self.aliases[alias]
            else:
                self.alias_errors.append(f"unknown topic alias {alias} with empty topic")
        elif not topic:
            self.alias_errors.append("empty topic without a Topic Alias")
        with self.cond:
            self.msgs.append(Msg(m, topic, time.monotonic()))
            self.cond.notify_all()

    def _on_subscribe(self, c, ud, mid, rcs, properties):
        with self.cond:
            self.subacks[mid] = rcs
            self.cond.notify_all()

    def _on_disconnect(self, c, ud, flags, rc, properties):
        with self.cond:
            self.disconnected = (rc, properties)
            self.cond.notify_all()

    # actions -------------------------------------------------------------------------------
    def _wait(self, pred, timeout=WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, timeout)

    def connect(self, *, clean_start=True, expiry: int | None = None, keepalive=30, **connect_props):
        p = Properties(PacketTypes.CONNECT)
        if expiry is not None:
            p.SessionExpiryInterval = expiry
        for k, v in connect_props.items():
            setattr(p, k, v)
        self.connack = None
        self.disconnected = None
        if self.c._protocol == mqtt.MQTTv5:
            self.c.connect(HOST, PORT, keepalive, clean_start=clean_start, properties=p)
        else:
            self.c.connect(HOST, PORT, keepalive)
        self.c.loop_start()
        check(self._wait(lambda: self.connack is not None), f"{self.cid}: no CONNACK within {WAIT}s")
        check(not self.connack[1].is_failure, f"{self.cid}: CONNACK refused: {self.connack[1]}")
        return self

    @property
    def session_present(self) -> bool:
        return bool(self.connack and self.connack[0])

    def connack_prop(self, name, default=None):
        if not self.connack or self.connack[2] is None:
            return default
        return getattr(self.connack[2], name, default)

    def subscribe(self, topic: str, qos=1, *, sub_id: int | None = None, **opts):
        p = None
        if sub_id is not None:
            p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id)
        rc, mid = self.c.subscribe(topic, options=SubscribeOptions(qos=qos, **opts), properties=p)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: subscribe({topic}) returned {rc}")
        check(self._wait(lambda: mid in self.subacks), f"{self.cid}: no SUBACK for {topic}")
        codes = self.subacks[mid]
        check(all(not c.is_failure for c in codes), f"{self.cid}: SUBACK for {topic}: {codes}")
        return codes

    def publish(self, topic: str, payload=b"", qos=1, retain=False, **publish_props):
        p = None
        if publish_props:
            p = props(PacketTypes.PUBLISH, **publish_props)
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=p)
        check(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: publish({topic}) returned {info.rc}")
        if qos > 0:
            info.wait_for_publish(WAIT)
            check(info.is_published(), f"{self.cid}: publish({topic}) QoS {qos} not acknowledged")
        return info

    def wait_msgs(self, n: int, timeout=WAIT, pred=None) -> list[Msg]:
        """Wait until at least n (matching) messages arrived; return all matching ones."""
        sel = (lambda: [m for m in self.msgs if pred(m)]) if pred else (lambda: list(self.msgs))
        self._wait(lambda: len(sel()) >= n, timeout)
        return sel()

    def quiet(self, secs: float) -> list[Msg]:
        """Let secs pass; return everything received so far."""
        time.sleep(secs)
        with self.cond:
            return list(self.msgs)

    def disconnect(self, reason: int | None = None, **disconnect_props):
        rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason) if reason is not None else None
        p = props(PacketTypes.DISCONNECT, **disconnect_props) if disconnect_props else None
        self.c.disconnect(reasoncode=rc, properties=p)
        self._wait(lambda: self.disconnected is not None, 2)
        self.c.loop_stop()

    def kill(self):
        """Drop the TCP connection without DISCONNECT (a network failure)."""
        self.c.loop_stop()
        s = self.c.socket()
        if s is not None:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            except OSError:
                pass

    def close(self):
        try:
            if self.c.is_connected():
                self.c.disconnect()
            self.c.loop_stop()
        except Exception:
            pass


def observer(name: str, topic: str, qos=1, **opts) -> Client:
    c = Client(name).connect()
    c.subscribe(topic, qos, **opts)
    return c


def payloads(msgs) -> list[bytes]:
    return [m.payload for m in msgs]


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


def s_will_delay_published_after_delay():
    """Will Delay Interval 2 s, Session Expiry 10 s, network drop: will arrives after ~2 s
    [MQTT-3.1.3-9] (3.1.3.2.2)."""
    obs = observer("wd1-obs", "wd1/will")
    w = Client("wd1-w")
    w.c.will_set("wd1/will", b"late", 1, properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    w.connect(expiry=10)
    t0 = time.monotonic()
    w.kill()
    early = obs.quiet(1.0)
    check(not early, f"will published after {time.monotonic() - t0:.2f}s, before the 2 s delay")
    got = obs.wait_msgs(1, 6)
    check(got, "will not published within 7 s of the network drop")
    dt = got[0].t - t0
    check(got[0].payload == b"late", f"unexpected will payload {got[0].payload!r}")
    check(1.5 <= dt <= 5.0, f"will published {dt:.2f}s after the drop, expected ~2 s")


def s_will_delay_cancelled_by_reconnect():
    """Will Delay Interval 3 s: reconnecting to the session within the delay cancels the will
    (3.1.3.2.2), and a later normal DISCONNECT does not publish it either."""
    obs = observer("wd2-obs", "wd2/will")
    w = Client("wd2-w")
    w.c.will_set("wd2/will", b"should-not", 1, properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=3))
    w.connect(expiry=10)
    w.kill()
    time.sleep(0.7)
    w2 = Client("wd2-w")
    w2.connect(clean_start=False, expiry=10)
    check(w2.session_present, "session not present on reconnect within the will delay")
    got = obs.quiet(3.5)
    check(not got, f"will published although the client reconnected within the delay: {got}")
    w2.disconnect(0, SessionExpiryInterval=0)
    got = obs.quiet(1.0)
    check(not got, f"will published after a normal DISCONNECT: {got}")


def s_will_delay_longer_than_session():
    """Will Delay 30 s, Session Expiry 2 s: the will is published when the session ends
    (whichever happens first, 3.1.3.2.2)."""
    obs = observer("wd3-obs", "wd3/will")
    w = Client("wd3-w")
    w.c.will_set("wd3/will", b"session-ended", 1, properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=30))
    w.connect(expiry=2)
    t0 = time.monotonic()
    w.kill()
    got = obs.wait_msgs(1, 6)
    check(got, "will not published within 6 s although the 2 s session expired")
    dt = got[0].t - t0
    check(1.5 <= dt <= 5.0, f"will published {dt:.2f}s after the drop, expected ~2 s (session end)")


def s_shared_subscription_load_balanced():
    """$share/g/shl/# with 2 members: every message reaches exactly one of them, both get some
    (4.8.2)."""
    a = observer("shl-a", "$share/g/shl/#")
    b = observer("shl-b", "$share/g/shl/#")
    plain = observer("shl-plain", "shl/#")  # a non-shared subscription still gets every message
    pub = Client("shl-pub").connect()
    n = 20
    for i in range(n):
        pub.publish(f"shl/{i % 3}", f"m{i}".encode(), qos=1)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and len(a.msgs) + len(b.msgs) < n:
        time.sleep(0.05)
    time.sleep(0.3)
    pa, pb = payloads(a.msgs), payloads(b.msgs)
    every = [f"m{i}".encode() for i in range(n)]
    check(sorted(pa + pb) == sorted(every), f"not every message exactly once: a={pa} b={pb}")
    check(pa and pb, f"not load-balanced: a got {len(pa)}, b got {len(pb)}")
    check(sorted(payloads(plain.wait_msgs(n))) == sorted(every), "non-shared subscriber missed messages")


def s_shared_subscription_redelivery():
    """A member holding unacknowledged QoS 1 messages ends its session: those messages go to
    the other member (4.8.2: the Server SHOULD send them to another subscribing Client)."""
    b = observer("shr-b", "$share/g/shr/#")
    a = Client("shr-a", manual_ack=True).connect(expiry=0)
    a.subscribe("$share/g/shr/#", 1)
    pub = Client("shr-pub").connect()
    n = 10
    for i in range(n):
        pub.publish("shr/t", f"r{i}".encode(), qos=1)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and len(a.msgs) + len(b.msgs) < n:
        time.sleep(0.05)
    held = set(payloads(a.msgs))
    check(held, f"member a received nothing (b got {len(b.msgs)}) - cannot test redelivery")
    check(len(held) + len(b.msgs) == n, f"a held {len(held)}, b got {len(b.msgs)}, of {n}")
    a.disconnect(0)  # session expiry 0: the session ends now with `held` unacknowledged
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and not held <= set(payloads(b.msgs)):
        time.sleep(0.05)
    missing = held - set(payloads(b.msgs))
    check(not missing, f"{len(missing)} of the {len(held)} messages unacknowledged by the ended "
          f"member were not redelivered to the other member: {sorted(missing)}")


def s_session_resume():
    """clean_start=False with Session Expiry 300: QoS 1 messages queued while offline arrive
    after reconnect and CONNACK has session_present=1 (3.2.2.1.1)."""
    s = Client("res-s").connect(expiry=300)
    s.subscribe("res/t", 1)
    s.disconnect(0)
    pub = Client("res-pub").connect()
    for i in range(3):
        pub.publish("res/t", f"q{i}".encode(), qos=1)
    s2 = Client("res-s").connect(clean_start=False, expiry=300)
    check(s2.session_present, "session_present is 0 on resume")
    got = s2.wait_msgs(3)
    check(payloads(got) == [b"q0", b"q1", b"q2"], f"queued messages: {got}")
    check(all(m.qos == 1 for m in got), f"QoS changed: {got}")
    s2.disconnect(0, SessionExpiryInterval=0)
    s3 = Client("res-s").connect(clean_start=False)
    check(not s3.session_present, "session still present after DISCONNECT with expiry 0")


def s_topic_alias_client_to_server():
    """Publish with TopicAlias=1 and a topic, then with an empty topic and the alias (3.3.2.3.4)."""
    sub = observer("tac-sub", "tac/t")
    pub = Client("tac-pub").connect()
    tam = pub.connack_prop("TopicAliasMaximum", 0)
    check(tam and tam >= 1, f"CONNACK Topic Alias Maximum is {tam}; expected the configured 64")
    pub.publish("tac/t", b"one", qos=1, TopicAlias=1)
    pub.publish("", b"two", qos=1, TopicAlias=1)
    pub.publish("", b"three", qos=0, TopicAlias=1)
    got = sub.wait_msgs(3)
    check([(m.wire_topic, m.payload) for m in got] == [("tac/t", b"one"), ("tac/t", b"two"), ("tac/t", b"three")],
          f"subscriber got {[(m.wire_topic, m.payload) for m in got]}")
    check(all(m.prop("TopicAlias") is None for m in got),
          "server sent a Topic Alias to a client that announced no Topic Alias Maximum [MQTT-3.3.2-9]")
    check(pub.c.is_connected(), "publisher disconnected")


def s_topic_alias_server_to_client():
    """Subscriber with TopicAliasMaximum=10: every message resolves to the right topic, no
    alias above 10 [MQTT-3.3.2-10], never an empty topic without a known alias."""
    sub = Client("tas-sub").connect(TopicAliasMaximum=10)
    sub.subscribe("tas/#", 1)
    pub = Client("tas-pub").connect()
    topics = [f"tas/{i % 3}" for i in range(9)]
    for i, t in enumerate(topics):
        pub.publish(t, f"{i}".encode(), qos=1)
    got = sub.wait_msgs(len(topics))
    check(not sub.alias_errors, f"alias errors: {sub.alias_errors}")
    check([m.topic for m in got] == topics, f"resolved topics {[m.topic for m in got]} != {topics}")
    aliases = [m.prop("TopicAlias") for m in got if m.prop("TopicAlias") is not None]
    check(all(1 <= a <= 10 for a in aliases), f"alias out of range 1..10: {aliases}")
    print(f"    (server used topic aliases on {len(aliases)} of {len(got)} messages, "
          f"{sum(1 for m in got if not m.wire_topic)} with an empty topic)")


def s_message_expiry():
    """Queued for an offline session: MessageExpiryInterval=2 is dropped after 3 s; one with 10
    is delivered with the remaining interval (3.3.2.3.3) [MQTT-3.3.2-5, MQTT-3.3.2-6]."""
    s = Client("exp-s").connect(expiry=300)
    s.subscribe("exp/t", 1)
    s.disconnect(0)
    pub = Client("exp-pub").connect()
    pub.publish("exp/t", b"short", qos=1, MessageExpiryInterval=2)
    pub.publish("exp/t", b"long", qos=1, MessageExpiryInterval=10)
    time.sleep(3.0)
    s2 = Client("exp-s").connect(clean_start=False, expiry=0)
    s2.wait_msgs(1)
    got = s2.quiet(1.0)
    check(payloads(got) == [b"long"], f"expected only b'long', got {got}")
    mei = got[0].prop("MessageExpiryInterval")
    check(mei is not None and 1 <= mei <= 8,
          f"remaining Message Expiry Interval {mei}, expected about 7 (10 minus ~3 s waiting)")


def s_request_response():
    """ResponseTopic + CorrelationData round trip (4.10)."""
    responder = Client("rr-responder")

    def on_msg(c, ud, m):
        rt = pprop(m, "ResponseTopic")
        cd = pprop(m, "CorrelationData")
        p = Properties(PacketTypes.PUBLISH)
        if cd is not None:
            p.CorrelationData = cd
        if rt:
            c.publish(rt, b"re:" + m.payload, qos=1, properties=p)

    responder.c.on_message = on_msg
    responder.connect()
    responder.subscribe("rr/request", 1)
    req = Client("rr-requester").connect()
    req.subscribe("rr/response/me", 1)
    req.publish("rr/request", b"ping", qos=1, ResponseTopic="rr/response/me", CorrelationData=b"\x00\x01corr\xff")
    got = req.wait_msgs(1)
    check(got, "no response")
    check(got[0].payload == b"re:ping", f"response payload {got[0].payload!r}")
    check(got[0].prop("CorrelationData") == b"\x00\x01corr\xff",
          f"correlation data {got[0].prop('CorrelationData')!r}")


def s_subscription_identifiers():
    """Subscription Identifier returned with matching messages; overlapping subscriptions
    carry both identifiers; a subscription without one gets none (3.3.4) [MQTT-3.3.4-3/4/5]."""
    c = Client("sid").connect()
    c.subscribe("sid/a/#", 1, sub_id=5)
    c.subscribe("sid/+/b", 1, sub_id=6)
    c.subscribe("sid/none", 1)
    pub = Client("sid-pub").connect()
    pub.publish("sid/a/c", b"1")
    pub.publish("sid/a/b", b"2")
    pub.publish("sid/none", b"3")
    c.wait_msgs(3)
    got = c.quiet(0.7)
    by = {}
    for m in got:
        by.setdefault(m.topic, []).append(m)
    ids = lambda t: sorted(i for m in by.get(t, []) for i in (m.prop("SubscriptionIdentifier") or []))  # noqa: E731
    check(ids("sid/a/c") == [5], f"sid/a/c identifiers {ids('sid/a/c')}, expected [5]")
    check(ids("sid/a/b") == [5, 6], f"sid/a/b identifiers {ids('sid/a/b')}, expected [5, 6]")
    check(len(by.get("sid/none", [])) == 1 and ids("sid/none") == [],
          f"sid/none: {by.get('sid/none')} identifiers {ids('sid/none')}, expected one message, none")


def s_no_local():
    """No Local: a client's own publications are not sent back to it [MQTT-3.8.3-3]."""
    me = Client("nl-me").connect()
    me.subscribe("nl/t", 1, noLocal=True)
    other = Client("nl-other").connect()
    sanity = observer("nl-sanity", "nl/t")
    me.publish("nl/t", b"self")
    other.publish("nl/t", b"other")
    got = me.wait_msgs(1)
    got = me.quiet(0.7)
    check(payloads(got) == [b"other"], f"no-local subscriber got {payloads(got)}, expected [b'other']")
    check(sorted(payloads(sanity.wait_msgs(2))) == [b"other", b"self"], "plain subscriber missed messages")


def s_retain_as_published():
    """Retain As Published: live retained messages keep RETAIN=1 only with rap [MQTT-3.3.1-12/13]."""
    pub = Client("rap-pub").connect()
    pub.publish("rap/t", b"old", qos=1, retain=True)
    rap0 = observer("rap-0", "rap/t", retainAsPublished=False)
    rap1 = observer("rap-1", "rap/t", retainAsPublished=True)
    pub.publish("rap/t", b"new", qos=1, retain=True)
    g0, g1 = rap0.wait_msgs(2), rap1.wait_msgs(2)
    pub.publish("rap/t", b"", qos=1, retain=True)
    check([(m.payload, m.retain) for m in g0[:2]] == [(b"old", True), (b"new", False)],
          f"without rap: {[(m.payload, m.retain) for m in g0]}")
    check([(m.payload, m.retain) for m in g1[:2]] == [(b"old", True), (b"new", True)],
          f"with rap: {[(m.payload, m.retain) for m in g1]}")


def s_retain_handling():
    """Retain Handling 0: retained sent on every subscribe; 1: only if the subscription is new;
    2: never (3.8.3.1) [MQTT-3.3.1-9/10/11]."""
    pub = Client("rh-pub").connect()
    pub.publish("rh/t", b"kept", qos=1, retain=True)
    try:
        results = {}
        for rh in (0, 1, 2):
            c = Client(f"rh-{rh}").connect()
            c.subscribe("rh/t", 1, retainHandling=rh)
            first = len(c.wait_msgs(1, 1.5))
            c.subscribe("rh/t", 1, retainHandling=rh)  # the same subscription again
            time.sleep(0.7)
            results[rh] = (first, len(c.msgs) - first)
        check(results[0] == (1, 1), f"retain handling 0: (new, repeated) = {results[0]}, expected (1, 1)")
        check(results[1] == (1, 0), f"retain handling 1: (new, repeated) = {results[1]}, expected (1, 0)")
        check(results[2] == (0, 0), f"retain handling 2: (new, repeated) = {results[2]}, expected (0, 0)")
    finally:
        pub.publish("rh/t", b"", qos=1, retain=True)


def s_user_properties_order():
    """User properties forwarded unaltered and in order, duplicates kept [MQTT-3.3.2-18]."""
    sub = observer("up-sub", "up/t")
    pub = Client("up-pub").connect()
    ups = [("a", "1"), ("b", "2"), ("a", "3"), ("z", ""), ("ключ", "значение")]
    pub.publish("up/t", b"x", UserProperty=ups)
    got = sub.wait_msgs(1)
    check(got, "no message")
    check(got[0].prop("UserProperty") == ups, f"user properties {got[0].prop('UserProperty')} != {ups}")


def s_payload_format_and_content_type():
    """Payload Format Indicator and Content Type forwarded unaltered [MQTT-3.3.2-4, MQTT-3.3.2-20]."""
    sub = observer("pf-sub", "pf/t")
    pub = Client("pf-pub").connect()
    pub.publish("pf/t", b'{"k": 1}', PayloadFormatIndicator=1, ContentType="application/json; charset=utf-8")
    pub.publish("pf/t", b"\xff\x00", ContentType="application/octet-stream")
    got = sub.wait_msgs(2)
    check(len(got) == 2, f"got {got}")
    check((got[0].prop("PayloadFormatIndicator"), got[0].prop("ContentType")) == (1, "application/json; charset=utf-8"),
          f"first: PFI={got[0].prop('PayloadFormatIndicator')} CT={got[0].prop('ContentType')}")
    check(got[1].prop("PayloadFormatIndicator") in (None, 0) and got[1].prop("ContentType") == "application/octet-stream",
          f"second: PFI={got[1].prop('PayloadFormatIndicator')} CT={got[1].prop('ContentType')}")


def s_receive_maximum():
    """Client Receive Maximum 2 with manual acks: never more than 2 unacknowledged QoS 1
    PUBLISHes in flight; all arrive as acks free the window [MQTT-3.3.4-9]."""
    c = Client("rm-sub", manual_ack=True).connect(ReceiveMaximum=2)
    c.subscribe("rm/t", 1)
    pub = Client("rm-pub").connect()
    n = 6
    for i in range(n):
        pub.publish("rm/t", f"{i}".encode(), qos=1)
    acked = 0
    max_out = 0
    deadline = time.monotonic() + 15
    while acked < n and time.monotonic() < deadline:
        # Let the broker send whatever its window allows.
        time.sleep(0.4)
        with c.cond:
            outstanding = c.msgs[acked:]
        max_out = max(max_out, len(outstanding))
        check(len(outstanding) <= 2, f"{len(outstanding)} unacknowledged messages in flight (Receive Maximum 2): "
              f"{[(m.payload, m.mid) for m in outstanding]} after {acked} acks")
        if not outstanding:
            continue
        m = outstanding[0]
        c.c.ack(m.mid, m.qos)
        acked += 1
    check(acked == n, f"only {acked} of {n} messages arrived within 15 s")
    check(payloads(c.msgs) == [f"{i}".encode() for i in range(n)], f"order/content: {payloads(c.msgs)}")
    check(max_out == 2, f"window never reached 2 (max in flight {max_out})")


def _disconnect_will(reason: int, tag: str) -> list[Msg]:
    obs = observer(f"dw{tag}-obs", f"dw{tag}/will")
    w = Client(f"dw{tag}-w")
    w.c.will_set(f"dw{tag}/will", b"will-" + tag.encode(), 1)
    w.connect()
    w.disconnect(reason)
    obs.wait_msgs(1, 2.0)
    return obs.quiet(0.3)


def s_disconnect_with_will_0x04():
    """DISCONNECT reason 0x04 (Disconnect with Will Message) publishes the will (3.14.2.1)."""
    got = _disconnect_will(0x04, "4")
    check(payloads(got) == [b"will-4"], f"expected the will, got {got}")


def s_disconnect_normal_0x00():
    """DISCONNECT reason 0x00 discards the will [MQTT-3.14.4-3]."""
    got = _disconnect_will(0x00, "0")
    check(not got, f"will published after a normal DISCONNECT: {got}")


def s_maximum_packet_size():
    """Client Maximum Packet Size 100: a 1000-byte message is not sent to it, later small ones
    are [MQTT-3.1.2-25]."""
    c = Client("mps-sub").connect(MaximumPacketSize=100)
    c.subscribe("mps/t", 1)
    pub = Client("mps-pub").connect()
    pub.publish("mps/t", b"B" * 1000, qos=1)
    pub.publish("mps/t", b"small-1", qos=1)
    pub.publish("mps/t", b"small-2", qos=0)
    c.wait_msgs(2)
    got = c.quiet(0.5)
    check(all(len(m.payload) < 100 for m in got), f"received a {max(len(m.payload) for m in got)}-byte payload")
    check(payloads(got) == [b"small-1", b"small-2"], f"got {got}")
    check(c.c.is_connected(), "client was disconnected")



def s_retained_message_expiry():
    """A retained message whose Message Expiry Interval has passed is not sent to a new
    subscriber; an unexpired one carries the remaining interval (3.3.2.3.3) [MQTT-3.3.2-5/6]."""
    pub = Client("rexp-pub").connect()
    pub.publish("rexp/short", b"short", qos=1, retain=True, MessageExpiryInterval=2)
    pub.publish("rexp/long", b"long", qos=1, retain=True, MessageExpiryInterval=20)
    try:
        time.sleep(3.0)
        sub = Client("rexp-sub").connect()
        sub.subscribe("rexp/#", 1)
        sub.wait_msgs(1)
        got = sub.quiet(0.7)
        check(payloads(got) == [b"long"], f"expected only the unexpired b'long', got {got}")
        mei = got[0].prop("MessageExpiryInterval")
        check(mei is not None and 1 <= mei <= 18, f"remaining Message Expiry Interval {mei}, expected about 17")
        check(got[0].retain, "retained message delivered on subscribe without RETAIN=1 [MQTT-3.3.1-8]")
    finally:
        pub.publish("rexp/long", b"", qos=1, retain=True)


def s_shared_subscription_no_retained():
    """Retained messages are sent for new Non-shared Subscriptions only (3.3.1.3, 4.8.2)."""
    pub = Client("shret-pub").connect()
    pub.publish("shret/t", b"kept", qos=1, retain=True)
    try:
        sh = observer("shret-sh", "$share/g/shret/#")
        plain = observer("shret-plain", "shret/#")
        check(payloads(plain.wait_msgs(1)) == [b"kept"], f"plain subscriber: {plain.msgs}")
        got = sh.quiet(0.7)
        check(not got, f"shared subscriber got retained messages: {got}")
    finally:
        pub.publish("shret/t", b"", qos=1, retain=True)


def s_will_properties_and_retain():
    """Will properties (content type, user properties, response topic, correlation data,
    message expiry) are forwarded and a retained will is kept for late subscribers (3.1.3.2)."""
    obs = observer("wp-obs", "wp/will")
    w = Client("wp-w")
    ups = [("who", "wp-w"), ("why", "crash")]
    w.c.will_set("wp/will", b"bye", 1, retain=True, properties=props(
        PacketTypes.WILLMESSAGE, ContentType="text/plain", UserProperty=ups, ResponseTopic="wp/resp",
        CorrelationData=b"cd", MessageExpiryInterval=60, PayloadFormatIndicator=1))
    w.connect()
    w.kill()
    try:
        got = obs.wait_msgs(1)
        check(got, "will not published")
        m = got[0]
        seen = (m.payload, m.prop("ContentType"), m.prop("UserProperty"), m.prop("ResponseTopic"),
                m.prop("CorrelationData"), m.prop("PayloadFormatIndicator"))
        check(seen == (b"bye", "text/plain", ups, "wp/resp", b"cd", 1), f"will as received: {seen}")
        mei = m.prop("MessageExpiryInterval")
        check(mei is not None and 55 <= mei <= 60, f"will Message Expiry Interval {mei}, expected ~60")
        late = observer("wp-late", "wp/will")
        lg = late.wait_msgs(1)
        check(lg and lg[0].payload == b"bye" and lg[0].retain, f"retained will for a late subscriber: {lg}")
    finally:
        Client("wp-clean").connect().publish("wp/will", b"", qos=1, retain=True)


def s_session_takeover():
    """A second connection with the same Client Identifier takes the session over: the first
    gets DISCONNECT 0x8E [MQTT-3.1.4-3], the second sees session_present and the subscription."""
    a = Client("tko").connect(expiry=60)
    a.subscribe("tko/t", 1)
    b = Client("tko").connect(clean_start=False, expiry=60)
    check(b.session_present, "second connection: session_present 0")
    check(a._wait(lambda: a.disconnected is not None, WAIT), "first connection not disconnected")
    rc = a.disconnected[0]
    check(getattr(rc, "value", rc) == 0x8E, f"first connection: disconnect reason {rc}, expected 0x8E Session taken over")
    pub = Client("tko-pub").connect()
    pub.publish("tko/t", b"after", qos=1)
    check(payloads(b.wait_msgs(1)) == [b"after"], f"subscription not kept: {b.msgs}")
    b.disconnect(0, SessionExpiryInterval=0)


def s_keep_alive_enforced():
    """Keep Alive 1 s and silence: the server closes the connection within 1.5 x keep alive
    [MQTT-3.1.2-22] (MQTT 5: with DISCONNECT 0x8D)."""
    c = Client("ka").connect(keepalive=1)
    ka = c.connack_prop("ServerKeepAlive")
    check(ka in (None, 1), f"Server Keep Alive {ka}")
    c.c.loop_stop()  # paho stops sending PINGREQ
    s = c.c.socket()
    s.settimeout(0.2)
    t0 = time.monotonic()
    data = b""
    closed = None
    while time.monotonic() - t0 < 4.0:
        try:
            chunk = s.recv(64)
        except socket.timeout:
            continue
        except OSError:
            closed = time.monotonic() - t0
            break
        if not chunk:
            closed = time.monotonic() - t0
            break
        data += chunk
    check(closed is not None, f"connection still open {time.monotonic() - t0:.1f}s after the last packet")
    check(closed <= 2.5, f"closed after {closed:.2f}s, expected <= 1.5 s (+ margin)")
    check(closed >= 0.9, f"closed after {closed:.2f}s, before the keep alive elapsed")
    while data.startswith(b"\xd0\x00"):  # a PINGRESP to paho's last PINGREQ
        data = data[2:]
    check(data[:1] == b"\xe0" and len(data) >= 3 and data[2] == 0x8D,
          f"expected DISCONNECT 0x8D before the close, got {data.hex()}")


def s_unsubscribe():
    """UNSUBACK 0x00 for an existing subscription, 0x11 for none; no messages afterwards (3.11)."""
    c = Client("uns").connect()
    c.subscribe("uns/t", 1)
    res = {}

    def on_unsub(cl, ud, mid, rcs, properties):
        with c.cond:
            res[mid] = rcs
            c.cond.notify_all()

    c.c.on_unsubscribe = on_unsub
    _, mid = c.c.unsubscribe(["uns/t", "uns/never"])
    check(c._wait(lambda: mid in res), "no UNSUBACK")
    codes = [getattr(r, "value", r) for r in res[mid]]
    check(codes == [0x00, 0x11], f"UNSUBACK reason codes {codes}, expected [0x00, 0x11]")
    Client("uns-pub").connect().publish("uns/t", b"x", qos=1)
    got = c.quiet(0.7)
    check(not got, f"message after unsubscribe: {got}")


def s_topic_alias_errors():
    """Topic Alias above the announced maximum (64) -> DISCONNECT 0x94 (3.3.2.3.4); alias 0 is
    not permitted [MQTT-3.3.2-8] (0x94, or 0x81/0x82: the spec names no code); an unknown
    alias with an empty topic -> DISCONNECT 0x82 Protocol Error (3.3.2.3.4)."""
    for alias, topic, want in ((0, "tae/t", (0x94, 0x81, 0x82)), (65, "tae/t", (0x94,)), (7, "", (0x82,))):
        c = Client(f"tae-{alias}").connect()
        p = Properties(PacketTypes.PUBLISH)
        object.__setattr__(p, "TopicAlias", alias)  # bypass paho's range check for alias 0
        c.c.publish(topic, b"x", qos=0, properties=p)
        check(c._wait(lambda: c.disconnected is not None, WAIT),
              f"TopicAlias={alias} topic={topic!r}: not disconnected")
        rc = c.disconnected[0]
        check(getattr(rc, "value", rc) in want,
              f"TopicAlias={alias} topic={topic!r}: reason {rc}, expected {' or '.join(f'0x{w:02X}' for w in want)}")
        c.close()


def s_overlapping_subscriptions_qos():
    """Overlapping subscriptions of one client: delivered with the maximum granted QoS
    (3.3.4, non-normative: one message per matching subscription or one with the max QoS)."""
    c = Client("ovl").connect()
    c.subscribe("ovl/#", 0)
    c.subscribe("ovl/t", 2)
    Client("ovl-pub").connect().publish("ovl/t", b"x", qos=2)
    c.wait_msgs(1)
    got = c.quiet(0.7)
    check(got and max(m.qos for m in got) == 2, f"copies received with QoS {[m.qos for m in got]}, expected one with 2")


def s_assigned_client_identifier():
    """Empty Client Identifier: CONNACK carries an Assigned Client Identifier [MQTT-3.2.2-16]."""
    c = Client("").connect()
    aid = c.connack_prop("AssignedClientIdentifier")
    check(aid, f"no Assigned Client Identifier (CONNACK properties {c.connack[2]})")
    d = Client("").connect()
    check(d.connack_prop("AssignedClientIdentifier") != aid, "two clients were assigned the same identifier")


def s_session_expiry():
    """Session Expiry Interval 2: after 3 s offline the session is gone (session_present 0, no
    queued messages) (3.1.2.11.2)."""
    s = Client("sexp").connect(expiry=2)
    s.subscribe("sexp/t", 1)
    s.disconnect(0)
    Client("sexp-pub").connect().publish("sexp/t", b"queued", qos=1)
    time.sleep(3.0)
    s2 = Client("sexp").connect(clean_start=False, expiry=0)
    check(not s2.session_present, "session still present 3 s after its 2 s expiry")
    got = s2.quiet(0.7)
    check(not got, f"messages from the expired session: {got}")


def s_ordering_qos1():
    """200 QoS 1 messages from one publisher arrive in order [MQTT-4.6.0-5]."""
    sub = observer("ord-sub", "ord/t")
    pub = Client("ord-pub").connect()
    n = 200
    infos = [pub.c.publish("ord/t", str(i).encode(), qos=1) for i in range(n)]
    for i in infos:
        i.wait_for_publish(WAIT)
    got = sub.wait_msgs(n, 10)
    check(payloads(got) == [str(i).encode() for i in range(n)],
          f"{len(got)} of {n} received; first out of order at "
          f"{next((k for k, m in enumerate(got) if m.payload != str(k).encode()), None)}")


SCENARIOS = [v for k, v in list(globals().items()) if k.startswith("s_") and callable(v)]


def main() -> int:
    global PORT
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("only", nargs="*", help="run scenarios whose name contains one of these")
    args = ap.parse_args()
    PORT = args.port
    passed = failed = 0
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
            failed += 1
            failures.append(name)
            print(f"FAIL: {name} -- {e}", flush=True)
        except Exception as e:  # a script error is a failure too, with the trace
            failed += 1
            failures.append(name)
            print(f"FAIL: {name} -- {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        finally:
            for c in Client.registry:
                c.close()
            Client.registry.clear()
    print("----")
    if failures:
        print("paho failures: " + " ".join(failures))
    print(f"paho: {passed} passed, {failed} failed", flush=True)
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
