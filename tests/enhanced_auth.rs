//! MQTT 5 enhanced authentication (§4.12) with SCRAM-SHA-512 and SCRAM-SHA-256: the CONNECT
//! exchange, its reason codes, re-authentication (§4.12.1), AUTH out of turn. The client side
//! of SCRAM is `lanemq_acl::scram::Client`; interop/mqttjs.sh runs the same exchange with an
//! independent implementation on MQTT.js.

use crate::common;

use bytes::Bytes;
use common::*;
use lanemq_acl::scram::{Client, ClientFinal, Mechanism};
use lanemq_acl::PasswordFile;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Auth, AuthProperties, Connect, Packet, QoS};
use std::time::Duration;

/// A broker offering both methods over a password file with alice (`$7$`, as
/// mosquitto_passwd writes) and bob (`SCRAM-SHA-256$`); anonymous clients refused.
async fn server_with(methods: &[&str]) -> (TestServer, std::path::PathBuf) {
    let mut cfg = config();
    std::fs::create_dir_all(&cfg.server.data_dir).expect("data dir");
    let passwd = cfg.server.data_dir.join("passwd");
    let mut pf = PasswordFile::new();
    pf.upsert("alice", b"wonderland").expect("alice");
    pf.upsert_scram_sha256("bob", b"builder").expect("bob");
    pf.save(&passwd).expect("save passwd");
    cfg.server.password_file = Some(passwd.clone());
    cfg.server.allow_anonymous = false;
    cfg.server.auth_methods = methods.iter().map(|m| m.to_string()).collect();
    cfg.mqtt.connect_timeout_ms = 1_000;
    (TestServer::start(cfg).await, passwd)
}

async fn server() -> (TestServer, std::path::PathBuf) {
    server_with(&["SCRAM-SHA-512", "SCRAM-SHA-256"]).await
}

fn auth(code: u8, method: &str, data: &str) -> Packet {
    Packet::Auth(Auth {
        reason_code: code,
        properties: AuthProperties {
            authentication_method: Some(method.to_string()),
            authentication_data: Some(Bytes::from(data.to_string())),
            ..Default::default()
        },
    })
}

fn data_of(p: &Option<Bytes>) -> String {
    String::from_utf8(p.clone().expect("Authentication Data").to_vec()).expect("UTF-8")
}

/// CONNECT with `mech` as `user`/`password`, up to the client-final-message. Returns the
/// client, the state that checks the server, and the packet that ended the exchange.
async fn scram_connect(
    srv: &TestServer,
    c: Connect,
    mech: Mechanism,
    user: &str,
    password: &str,
) -> (RawClient, ClientFinal, Packet) {
    let (client, first) =
        Client::start(mech, user, password.as_bytes(), "fyko+d2lbbFgONRv9qkxdawL");
    let mut c = c;
    c.properties.authentication_method = Some(mech.name().into());
    c.properties.authentication_data = Some(Bytes::from(first));
    let (mut raw, got) = RawClient::connect(srv.addr, c).await;
    let Ok(Packet::Auth(a)) = got else {
        panic!("expected AUTH 0x18 with the server-first-message, got {got:?}");
    };
    assert_eq!(a.reason_code, rc::CONTINUE_AUTHENTICATION);
    assert_eq!(
        a.properties.authentication_method.as_deref(),
        Some(mech.name())
    );
    let (fin, client_final) = client
        .finish(&data_of(&a.properties.authentication_data))
        .expect("server-first-message");
    raw.send(auth(
        rc::CONTINUE_AUTHENTICATION,
        mech.name(),
        &client_final,
    ))
    .await;
    let end = raw.recv().await;
    (raw, fin, end)
}

#[tokio::test]
async fn mqtt5_4_12_scram_sha512_and_sha256_connect() {
    let (srv, _) = server().await;
    for (mech, user, pw) in [
        (Mechanism::Sha512, "alice", "wonderland"),
        (Mechanism::Sha256, "bob", "builder"),
    ] {
        let (mut c, fin, end) = scram_connect(&srv, connect_v5(user), mech, user, pw).await;
        let Packet::ConnAck(ack) = end else {
            panic!("{mech}: expected CONNACK, got {end:?}");
        };
        assert_eq!(ack.reason_code, rc::SUCCESS, "{mech}: {ack:?}");
        assert_eq!(
            ack.properties.authentication_method.as_deref(),
            Some(mech.name())
        );
        // The client verifies the server-final-message: the server knew the keys.
        fin.verify_server(&data_of(&ack.properties.authentication_data))
            .expect("server signature");
        // An authenticated session works.
        let topic = format!("scram/{user}");
        c.subscribe(&topic, QoS::AtLeastOnce).await;
        c.publish_qos1(&topic, b"hi").await;
        assert_eq!(c.recv_publish().await.topic, topic);
        c.disconnect().await;
    }
}

/// A whole re-authentication on `c` (AUTH 0x19, the server-first, the client-final) with
/// `user`/`password`; returns the state that checks the server's final AUTH.
async fn reauthenticate(
    c: &mut RawClient,
    mech: Mechanism,
    user: &str,
    password: &str,
) -> ClientFinal {
    let (client, first) = Client::start(mech, user, password.as_bytes(), "re-nonce");
    c.send(auth(rc::RE_AUTHENTICATE, mech.name(), &first)).await;
    let Packet::Auth(a) = c.recv().await else {
        panic!("expected AUTH 0x18 with the server-first-message");
    };
    assert_eq!(a.reason_code, rc::CONTINUE_AUTHENTICATION);
    let (fin, client_final) = client
        .finish(&data_of(&a.properties.authentication_data))
        .expect("server-first-message");
    c.send(auth(
        rc::CONTINUE_AUTHENTICATION,
        mech.name(),
        &client_final,
    ))
    .await;
    fin
}

#[tokio::test]
async fn mqtt5_4_12_wrong_proof_or_unknown_user_is_0x86() {
    let (srv, _) = server().await;
    for (mech, user, pw) in [
        (Mechanism::Sha512, "alice", "wrong"),
        (Mechanism::Sha512, "nobody", "wonderland"),
        // bob's entry is SCRAM-SHA-256 only: SCRAM-SHA-512 has nothing to check against.
        (Mechanism::Sha512, "bob", "builder"),
        (Mechanism::Sha256, "alice", "wonderland"),
    ] {
        let (mut c, fin, end) = scram_connect(&srv, connect_v5("x"), mech, user, pw).await;
        let Packet::ConnAck(ack) = end else {
            panic!("expected CONNACK 0x86, got {end:?}");
        };
        assert_eq!(
            ack.reason_code,
            rc::BAD_USER_NAME_OR_PASSWORD,
            "{mech} {user}"
        );
        assert!(ack.properties.reason_string.is_some());
        assert!(ack.properties.authentication_data.is_none());
        drop(fin);
        c.expect_closed().await;
    }
    let failures = srv
        .server()
        .broker()
        .stats
        .auth_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(failures, 4, "each failure is counted");
}

#[tokio::test]
async fn mqtt5_4_12_0_1_method_not_offered_is_0x8c() {
    let (srv, _) = server_with(&["SCRAM-SHA-512"]).await;
    for method in ["SCRAM-SHA-256", "SCRAM-SHA-1", "scram-sha-512"] {
        let mut c = connect_v5("m");
        c.properties.authentication_method = Some(method.into());
        c.properties.authentication_data = Some(Bytes::from_static(b"n,,n=alice,r=abc"));
        let (mut raw, got) = RawClient::connect(srv.addr, c).await;
        match got {
            Ok(Packet::ConnAck(a)) => {
                assert_eq!(a.reason_code, rc::BAD_AUTHENTICATION_METHOD, "{method}")
            }
            other => panic!("{method}: expected CONNACK 0x8C, got {other:?}"),
        }
        raw.expect_closed().await;
    }
}

#[tokio::test]
async fn mqtt5_4_12_malformed_scram_is_0x87() {
    let (srv, _) = server().await;
    for first in [
        &b"p=tls-server-end-point,,n=alice,r=abc"[..], // channel binding required
        b"n,a=bob,n=alice,r=abc",                      // another authorization identity
        b"n,,r=abc",                                   // no user
        b"\xff\xfe",                                   // not UTF-8
    ] {
        let mut c = connect_v5("m");
        c.properties.authentication_method = Some("SCRAM-SHA-512".into());
        c.properties.authentication_data = Some(Bytes::copy_from_slice(first));
        let (mut raw, got) = RawClient::connect(srv.addr, c).await;
        match got {
            Ok(Packet::ConnAck(a)) => assert_eq!(a.reason_code, rc::NOT_AUTHORIZED, "{first:?}"),
            other => panic!("expected CONNACK 0x87, got {other:?}"),
        }
        raw.expect_closed().await;
    }
    // A CONNECT User Name other than the SCRAM user.
    let mut c = connect_v5("m");
    c.username = Some("bob".into());
    let (mut raw, _, end) = scram_connect(&srv, c, Mechanism::Sha512, "alice", "wonderland").await;
    match end {
        Packet::ConnAck(a) => assert_eq!(a.reason_code, rc::NOT_AUTHORIZED),
        other => panic!("expected CONNACK 0x87, got {other:?}"),
    }
    raw.expect_closed().await;
}

#[tokio::test]
async fn mqtt5_4_12_exchange_out_of_turn() {
    let (srv, _) = server().await;
    let start = |id: &str| {
        let (_, first) = Client::start(Mechanism::Sha512, "alice", b"wonderland", "n0");
        let mut c = connect_v5(id);
        c.properties.authentication_method = Some("SCRAM-SHA-512".into());
        c.properties.authentication_data = Some(Bytes::from(first));
        c
    };
    // A PUBLISH instead of the AUTH: CONNACK 0x82 Protocol Error.
    let (mut raw, got) = RawClient::connect(srv.addr, start("o1")).await;
    assert!(matches!(got, Ok(Packet::Auth(_))), "{got:?}");
    raw.send(Packet::Publish(publish("t", QoS::AtMostOnce, 0, b"x")))
        .await;
    match raw.recv().await {
        Packet::ConnAck(a) => assert_eq!(a.reason_code, rc::PROTOCOL_ERROR),
        other => panic!("expected CONNACK 0x82, got {other:?}"),
    }
    raw.expect_closed().await;
    // An AUTH with another method.
    let (mut raw, _) = RawClient::connect(srv.addr, start("o2")).await;
    raw.send(auth(
        rc::CONTINUE_AUTHENTICATION,
        "SCRAM-SHA-256",
        "c=biws,r=x,p=AAAA",
    ))
    .await;
    match raw.recv().await {
        Packet::ConnAck(a) => assert_eq!(a.reason_code, rc::PROTOCOL_ERROR),
        other => panic!("expected CONNACK 0x82, got {other:?}"),
    }
    raw.expect_closed().await;
    // No answer: the connection is closed after connect_timeout_ms, without a session.
    let (mut raw, _) = RawClient::connect(srv.addr, start("o3")).await;
    let t = std::time::Instant::now();
    raw.expect_closed().await;
    assert!(
        t.elapsed()
            < Duration::from_millis(srv.server().broker().config.mqtt.connect_timeout_ms + 2_000)
    );
    srv.assert_alive_as("alice", "wonderland").await;
}

#[tokio::test]
async fn mqtt5_4_12_0_7_auth_without_method_is_a_protocol_error() {
    let (srv, _) = server().await;
    let mut c = connect_v5("plain");
    c.username = Some("alice".into());
    c.password = Some(Bytes::from_static(b"wonderland"));
    let mut raw = RawClient::connect_ok(srv.addr, c).await;
    raw.send(auth(rc::RE_AUTHENTICATE, "SCRAM-SHA-512", "n,,n=alice,r=x"))
        .await;
    raw.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_4_12_1_reauthentication() {
    let (srv, passwd) = server().await;
    let (mut c, _, end) = scram_connect(
        &srv,
        connect_v5("re"),
        Mechanism::Sha512,
        "alice",
        "wonderland",
    )
    .await;
    assert!(
        matches!(end, Packet::ConnAck(ref a) if a.reason_code == rc::SUCCESS),
        "{end:?}"
    );
    c.subscribe("re/t", QoS::AtLeastOnce).await;

    // A re-authentication, with traffic going on in the middle of it.
    let (client, first) = Client::start(Mechanism::Sha512, "alice", b"wonderland", "renonce");
    c.send(auth(rc::RE_AUTHENTICATE, "SCRAM-SHA-512", &first))
        .await;
    let Packet::Auth(a) = c.recv().await else {
        panic!("expected AUTH 0x18");
    };
    assert_eq!(a.reason_code, rc::CONTINUE_AUTHENTICATION);
    c.publish_qos1("re/t", b"during").await;
    let mut got_auth = None;
    let (fin, client_final) = client
        .finish(&data_of(&a.properties.authentication_data))
        .expect("server-first");
    c.send(auth(
        rc::CONTINUE_AUTHENTICATION,
        "SCRAM-SHA-512",
        &client_final,
    ))
    .await;
    let mut delivered = false;
    while got_auth.is_none() || !delivered {
        match c.recv().await {
            Packet::Auth(a) => got_auth = Some(a),
            Packet::Publish(p) => {
                assert_eq!(&p.payload[..], b"during");
                c.send(Packet::PubAck(lanemq_protocol::PubResp::new(
                    p.packet_id,
                    0,
                )))
                .await;
                delivered = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let a = got_auth.expect("AUTH");
    assert_eq!(a.reason_code, rc::SUCCESS, "re-authentication succeeded");
    fin.verify_server(&data_of(&a.properties.authentication_data))
        .expect("server signature");

    // 0x18 without a re-authentication in progress: Protocol Error.
    let (mut c2, _, _) = scram_connect(
        &srv,
        connect_v5("re2"),
        Mechanism::Sha512,
        "alice",
        "wonderland",
    )
    .await;
    c2.send(auth(
        rc::CONTINUE_AUTHENTICATION,
        "SCRAM-SHA-512",
        "c=biws,r=x,p=AAAA",
    ))
    .await;
    c2.expect_disconnect(rc::PROTOCOL_ERROR).await;

    // Re-authenticating with credentials that do not verify: alice has no SCRAM-SHA-256
    // entry, so even her right password fails: DISCONNECT 0x87 (DISCONNECT has no 0x86).
    let (mut c3, _, _) =
        scram_connect(&srv, connect_v5("re3"), Mechanism::Sha256, "bob", "builder").await;
    reauthenticate(&mut c3, Mechanism::Sha256, "alice", "wonderland").await;
    c3.expect_disconnect(rc::NOT_AUTHORIZED).await;

    // The password file changes and is reloaded: the next re-authentication uses it.
    let mut pf = PasswordFile::load(&passwd).expect("load");
    pf.upsert("alice", b"new-password").expect("change");
    pf.upsert("carol", b"c").expect("carol");
    pf.save(&passwd).expect("save");
    srv.server().broker().reload_auth().expect("reload");
    reauthenticate(&mut c, Mechanism::Sha512, "alice", "wonderland").await;
    c.expect_disconnect(rc::NOT_AUTHORIZED).await;

    // Another user's valid credentials on alice's connection: 0x87.
    let (mut c4, _, _) = scram_connect(
        &srv,
        connect_v5("re4"),
        Mechanism::Sha512,
        "alice",
        "new-password",
    )
    .await;
    reauthenticate(&mut c4, Mechanism::Sha512, "carol", "c").await;
    c4.expect_disconnect(rc::NOT_AUTHORIZED).await;
}

#[tokio::test]
async fn scram_sha256_entries_take_connect_passwords() {
    let (srv, _) = server().await;
    for (version_v5, pw, ok) in [
        (true, "builder", true),
        (false, "builder", true),
        (true, "no", false),
    ] {
        let mut c = if version_v5 {
            connect_v5("pw")
        } else {
            connect_v311("pw")
        };
        c.username = Some("bob".into());
        c.password = Some(Bytes::from(pw));
        let (c, got) = RawClient::connect(srv.addr, c).await;
        let Ok(Packet::ConnAck(ack)) = got else {
            panic!("expected CONNACK, got {got:?}");
        };
        assert_eq!(ack.reason_code == rc::SUCCESS, ok, "{ack:?}");
        if ok {
            c.disconnect().await;
        }
    }
}

impl TestServer {
    /// [`TestServer::assert_alive`] for a broker that refuses anonymous clients.
    async fn assert_alive_as(&self, user: &str, password: &str) {
        let mut c = connect_v5("");
        c.username = Some(user.into());
        c.password = Some(Bytes::from(password.to_string()));
        let mut c = RawClient::connect_ok(self.addr, c).await;
        c.subscribe("alive/x", QoS::AtLeastOnce).await;
        c.publish_qos1("alive/x", b"ping").await;
        assert_eq!(c.recv_publish().await.topic, "alive/x");
        c.disconnect().await;
    }
}
