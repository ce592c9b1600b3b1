#!/usr/bin/env python3
"""Stream ACLs with the Eclipse Paho Python client (paho-mqtt 2.x): the SUBACK reason codes of
$stream/ and $s/ subscriptions under the default ACL and under acl/examples/stream-reader.acl.

Run through interop/acl-streams.sh, which starts the broker (stream `events` capturing `t/#`,
history t/1..t/3 already published) and passes its port and which ACL it loaded:

    interop/.venv/bin/python interop/paho_acl.py --port PORT --acl default|reader

Prints "PASS: name" / "FAIL: name -- reason" per scenario (acl-streams.sh counts them); the exit
code is the number of failures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paho.mqtt.client as mqtt  # noqa: E402

import paho_scenarios as ps  # noqa: E402
from paho_scenarios import Failure, check, payloads  # noqa: E402
from paho_streams import SClient, user_props  # noqa: E402

NOT_AUTHORIZED = 0x87


def client(cid: str, username: str | None = None, protocol=mqtt.MQTTv5) -> SClient:
    c = SClient(cid, protocol=protocol)
    if username is not None:
        c.c.username_pw_set(username)
    return c.connect()


def expect_code(c: SClient, topic: str, want: int, offset: str | None = "earliest"):
    code, why = c.subscribe_raw(topic, offset=offset)
    check(code.value == want,
          f"{c.cid}: SUBSCRIBE {topic}: SUBACK 0x{code.value:02X} ({code}, {why!r}), expected 0x{want:02X}")
    return code


def refused_v5(cid: str, username: str | None, topics: list[str]):
    c = client(cid, username)
    for t in topics:
        expect_code(c, t, NOT_AUTHORIZED)
    got = c.quiet(0.5)
    check(not got, f"{cid}: messages although every subscription was refused: {payloads(got)}")


def refused_v311(cid: str, username: str | None, topic: str):
    c = client(cid, username, protocol=mqtt.MQTTv311)
    rc, mid = c.c.subscribe(topic, 1)
    check(rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe returned {rc}")
    check(c._wait(lambda: mid in c.subacks), "no SUBACK")
    code = c.subacks[mid][0]
    v = code.value if hasattr(code, "value") else int(code)
    check(v == 0x80, f"MQTT 3.1.1 SUBSCRIBE {topic}: SUBACK {code}, expected 0x80")


# --- the default ACL (no acl_file) -----------------------------------------------------------


def d_stream_refused_0x87():
    """Default ACL: $stream/events (earliest) -> SUBACK 0x87, nothing delivered."""
    refused_v5("d-stream", None, ["$stream/events"])


def d_stream_refused_for_any_user():
    """Default ACL: a username does not help ($stream/events as user reader -> 0x87)."""
    refused_v5("d-user", "reader", ["$stream/events"])


def d_legacy_and_filter_forms_refused_0x87():
    """Default ACL: $s/earliest/t/#, $stream/events/t/# (bind by filter), $stream/new/n/#
    (auto-create), $stream/+ -> 0x87 each."""
    refused_v5("d-forms", None, ["$s/earliest/t/#", "$stream/events/t/#", "$stream/new/n/#", "$stream/+"])


def d_v311_refused_0x80():
    """Default ACL, MQTT 3.1.1: $stream/events -> SUBACK 0x80."""
    refused_v311("d-v311", None, "$stream/events")


def d_hash_gets_ordinary_traffic_only():
    """Default ACL: a '#' subscriber (QoS 1) receives the ordinary t/x publish exactly once and
    nothing from the stream (no history, no second copy)."""
    c = client("d-hash")
    code = expect_code(c, "#", 1, offset=None)
    check(code.value == 1, "")
    pub = client("d-hash-pub")
    pub.publish("t/x", b"visible", qos=1)
    c.wait_msgs(1)
    got = c.quiet(0.7)
    check([(m.topic, m.payload) for m in got] == [("t/x", b"visible")], f"'#' received {got}")
    check("stream-offset" not in user_props(got[0]), f"'#' got a stream delivery: {user_props(got[0])}")


# --- acl/examples/stream-reader.acl -----------------------------------------------------------


def r_reader_replays_history():
    """stream-reader.acl: reader SUBSCRIBE $stream/events from earliest -> granted; the
    history t/1..t/3 with original topics and stream user properties, then live."""
    c = client("r-reader", "reader")
    code = expect_code(c, "$stream/events", 1)
    check(code.value == 1, "")
    c.wait_msgs(3)
    hist = c.quiet(0.5)
    check([(m.topic, m.payload) for m in hist][:3] == [("t/1", b"m1"), ("t/2", b"m2"), ("t/3", b"m3")],
          f"history: {hist}")
    check(all("stream-offset" in user_props(m) for m in hist), "stream-offset property missing")
    pub = client("r-pub")
    pub.publish("t/live", b"live", qos=1)
    got = c.wait_msgs(len(hist) + 1)
    check(payloads(got) == payloads(hist) + [b"live"], f"history then live: {payloads(got)}")


def r_other_user_refused_0x87():
    """stream-reader.acl: user other and an anonymous client -> 0x87 on $stream/events."""
    refused_v5("r-other", "other", ["$stream/events"])
    refused_v5("r-anon", None, ["$stream/events"])


def r_reader_refused_elsewhere_0x87():
    """stream-reader.acl: reader -> 0x87 on $stream/events/# and $stream/events/t/# (bind or
    auto-create by filter), $stream/fresh/t/# (auto-create), $stream/other, $stream/+,
    $stream/#, $s/earliest/t/#."""
    refused_v5("r-reader-no", "reader", ["$stream/events/#", "$stream/events/t/#", "$stream/fresh/t/#",
                                         "$stream/other", "$stream/+", "$stream/#", "$s/earliest/t/#"])


def r_reader_v311_refused_0x80():
    """stream-reader.acl: reader over MQTT 3.1.1 -> 0x80 (streams need MQTT 5)."""
    refused_v311("r-v311", "reader", "$stream/events")


def r_shared_stream_subscription():
    """stream-reader.acl allows reader `$share/g/$stream/events` (docs/security.md), but the
    broker does not share stream subscriptions: 0x9E (Shared Subscriptions not supported) with a
    reason string; user other is stopped by the ACL first: 0x87."""
    c = client("r-share", "reader")
    code, why = c.subscribe_raw("$share/g/$stream/events", offset="earliest")
    check(code.value == 0x9E and why, f"reader $share/g/$stream/events: 0x{code.value:02X} {why!r}, expected 0x9E")
    o = client("r-share-other", "other")
    expect_code(o, "$share/g/$stream/events", NOT_AUTHORIZED)


def r_ordinary_topics_for_everyone():
    """stream-reader.acl: user other may subscribe t/# and publish; gets the message once."""
    c = client("r-plain", "other")
    code = expect_code(c, "t/#", 1, offset=None)
    check(code.value == 1, "")
    client("r-plain-pub", "other").publish("t/9", b"m9", qos=1)
    c.wait_msgs(1)
    got = c.quiet(0.5)
    check([(m.topic, m.payload) for m in got] == [("t/9", b"m9")], f"t/# received {got}")


SCENARIOS = {
    "default": [v for k, v in list(globals().items()) if k.startswith("d_") and callable(v)],
    "reader": [v for k, v in list(globals().items()) if k.startswith("r_") and callable(v)],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--acl", choices=sorted(SCENARIOS), required=True)
    args = ap.parse_args()
    ps.PORT = args.port
    failed = 0
    for fn in SCENARIOS[args.acl]:
        name = f"paho {args.acl} ACL: {fn.__name__[2:]}"
        t0 = time.monotonic()
        try:
            fn()
            print(f"PASS: {name} ({time.monotonic() - t0:.1f}s)", flush=True)
        except Failure as e:
            failed += 1
            print(f"FAIL: {name} -- {e}", flush=True)
        except Exception as e:
            failed += 1
            print(f"FAIL: {name} -- {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        finally:
            for c in ps.Client.registry:
                c.close()
            ps.Client.registry.clear()
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
