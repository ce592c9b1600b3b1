//! TLS and WebSocket listeners, end to end: a real server on 127.0.0.1:0 with a certificate
//! made at test time (rcgen), clients speaking MQTT 5 through tokio-rustls and
//! tokio-tungstenite, and (when installed) mosquitto_pub / mosquitto_sub over TLS.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use lanemq_broker::{Config, ListenerConfig, ListenerKind, Server};
use lanemq_protocol::{
    decode, encode, Connect, ConnectProperties, Packet, ProtocolVersion, Publish, QoS, Subscribe,
    SubscribeFilter, SubscriptionOptions,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const V5: ProtocolVersion = ProtocolVersion::V5;
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Certificates and server

struct Certs {
    dir: PathBuf,
    ca_pem: String,
    cert_path: PathBuf,
    key_path: PathBuf,
    ca_path: PathBuf,
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and a server certificate for `localhost` / `127.0.0.1` signed by it, written as PEM.
fn make_certs(name: &str) -> Certs {
    let dir = std::env::temp_dir().join(format!("lanemq-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "lanemq test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let cert_path = dir.join("server.crt");
    let key_path = dir.join("server.key");
    let ca_path = dir.join("ca.crt");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::write(&ca_path, ca.pem()).unwrap();
    Certs {
        dir,
        ca_pem: ca.pem(),
        cert_path,
        key_path,
        ca_path,
    }
}

fn listener(kind: ListenerKind, certs: Option<&Certs>) -> ListenerConfig {
    ListenerConfig {
        kind,
        bind: "127.0.0.1:0".parse().unwrap(),
        cert_path: certs.map(|c| c.cert_path.clone()),
        key_path: certs.map(|c| c.key_path.clone()),
        ..ListenerConfig::default()
    }
}

fn config(listeners: Vec<ListenerConfig>, dir: &Path) -> Config {
    let mut config = Config {
        listeners,
        ..Config::default()
    };
    config.server.sys_interval_s = 0;
    config.admin.enable = false;
    config.server.data_dir = dir.join("data");
    config
}

/// Server with listeners [tls, ws, tcp].
async fn start(certs: &Certs) -> (Server, SocketAddr, SocketAddr) {
    let config = config(
        vec![
            listener(ListenerKind::Tls, Some(certs)),
            listener(ListenerKind::Ws, None),
            listener(ListenerKind::Tcp, None),
        ],
        &certs.dir,
    );
    let server = Server::start(config).await.unwrap();
    let addrs = server.local_addrs().to_vec();
    (server, addrs[0], addrs[1])
}

// ---------------------------------------------------------------------------------------------
// Clients

fn tls_connector(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_connect(addr: SocketAddr, ca_pem: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tls_connector(ca_pem).connect(name, tcp).await.unwrap()
}

async fn ws_connect(addr: SocketAddr, path: &str) -> WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let (ws, resp) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    assert_eq!(
        resp.headers()
            .get("Sec-WebSocket-Protocol")
            .map(|v| v.to_str().unwrap()),
        Some("mqtt")
    );
    ws
}

fn bytes_of(p: &Packet) -> BytesMut {
    let mut out = BytesMut::new();
    encode(p, V5, &mut out);
    out
}

fn connect_packet(client_id: &str) -> Packet {
    Packet::Connect(Box::new(Connect {
        protocol: V5,
        clean_start: true,
        keep_alive: 60,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    }))
}

fn subscribe_packet(filter: &str) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        }],
        ..Subscribe::default()
    })
}

fn publish_packet(topic: &str, payload: Bytes) -> Packet {
    Packet::Publish(Publish {
        qos: QoS::AtMostOnce,
        topic: topic.into(),
        payload,
        ..Publish::default()
    })
}

/// MQTT over any byte stream (plain or TLS).
struct StreamClient<S> {
    s: S,
    buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> StreamClient<S> {
    fn new(s: S) -> Self {
        StreamClient {
            s,
            buf: BytesMut::new(),
        }
    }
    async fn send(&mut self, p: &Packet) {
        self.s.write_all(&bytes_of(p)).await.unwrap();
        self.s.flush().await.unwrap();
    }
    async fn recv(&mut self) -> Packet {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = decode(&mut self.buf, V5, u32::MAX).unwrap() {
                    return p;
                }
                let n = self.s.read_buf(&mut self.buf).await.unwrap();
                assert!(n > 0, "connection closed while waiting for a packet");
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }
}

/// MQTT over a WebSocket client: incoming binary messages are concatenated before decoding.
struct WsClient {
    ws: WebSocketStream<TcpStream>,
    buf: BytesMut,
}

impl WsClient {
    async fn send_raw(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::Binary(Bytes::copy_from_slice(bytes)))
            .await
            .unwrap();
    }
    async fn send(&mut self, p: &Packet) {
        self.send_raw(&bytes_of(p)).await;
    }
    async fn recv(&mut self) -> Packet {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = decode(&mut self.buf, V5, u32::MAX).unwrap() {
                    return p;
                }
                match self.ws.next().await {
                    Some(Ok(Message::Binary(b))) => self.buf.extend_from_slice(&b),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    other => panic!("unexpected websocket item: {other:?}"),
                }
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }
}

fn assert_connack_ok(p: Packet) {
    match p {
        Packet::ConnAck(c) => assert_eq!(c.reason_code, 0, "{c:?}"),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

fn assert_suback(p: Packet) {
    match p {
        Packet::SubAck(s) => assert_eq!(s.reason_codes, vec![1], "{s:?}"),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

fn expect_publish(p: Packet, topic: &str, payload: &[u8]) {
    match p {
        Packet::Publish(p) => {
            assert_eq!(p.topic, topic);
            assert_eq!(p.payload.len(), payload.len());
            assert!(p.payload == payload, "payload differs");
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_ws_clients_exchange_messages() {
    let certs = make_certs("exchange");
    let (server, tls_addr, ws_addr) = start(&certs).await;

    // Subscriber over TLS.
    let mut tls = StreamClient::new(tls_connect(tls_addr, &certs.ca_pem).await);
    tls.send(&connect_packet("tls-sub")).await;
    assert_connack_ok(tls.recv().await);
    tls.send(&subscribe_packet("from-ws/#")).await;
    assert_suback(tls.recv().await);

    // Subscriber and publisher over WebSocket. CONNECT split across two WS messages,
    // SUBSCRIBE and PUBLISH sharing one.
    let mut ws = WsClient {
        ws: ws_connect(ws_addr, "/mqtt").await,
        buf: BytesMut::new(),
    };
    let connect = bytes_of(&connect_packet("ws-pub"));
    ws.send_raw(&connect[..5]).await;
    ws.send_raw(&connect[5..]).await;
    assert_connack_ok(ws.recv().await);
    ws.send(&subscribe_packet("from-tls/#")).await;
    assert_suback(ws.recv().await);

    let mut both = bytes_of(&publish_packet("from-ws/a", Bytes::from_static(b"one")));
    both.extend_from_slice(&bytes_of(&publish_packet(
        "from-ws/b",
        Bytes::from_static(b"two"),
    )));
    ws.send_raw(&both).await;
    expect_publish(tls.recv().await, "from-ws/a", b"one");
    expect_publish(tls.recv().await, "from-ws/b", b"two");

    // Large payloads both ways: many TLS records, a WS message larger than one read.
    let big: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    tls.send(&publish_packet("from-tls/big", big.clone())).await;
    expect_publish(ws.recv().await, "from-tls/big", &big);
    ws.send(&publish_packet("from-ws/big", big.clone())).await;
    expect_publish(tls.recv().await, "from-ws/big", &big);

    // A burst of small messages, delivered in order.
    for i in 0..200u32 {
        tls.send(&publish_packet(
            "from-tls/burst",
            Bytes::from(i.to_be_bytes().to_vec()),
        ))
        .await;
    }
    for i in 0..200u32 {
        expect_publish(ws.recv().await, "from-tls/burst", &i.to_be_bytes());
    }

    // Ping frames are answered while MQTT goes on.
    ws.ws
        .send(Message::Ping(Bytes::from_static(b"hi")))
        .await
        .unwrap();
    let pong = tokio::time::timeout(WAIT, ws.ws.next()).await.unwrap();
    assert!(
        matches!(pong, Some(Ok(Message::Pong(ref p))) if p.as_ref() == b"hi"),
        "{pong:?}"
    );

    server.shutdown(Duration::from_secs(2)).await;
}

async fn raw_http(addr: SocketAddr, request: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_refuses_wrong_path_and_subprotocol() {
    let dir = std::env::temp_dir().join(format!("lanemq-ws-{}", std::process::id()));
    let mut config = config(vec![listener(ListenerKind::Ws, None)], &dir);
    config.mqtt.max_packet_size_bytes = 1024;
    let server = Server::start(config).await.unwrap();
    let addr = server.local_addrs()[0];

    // Upgrade on another path.
    let resp = raw_http(
        addr,
        &upgrade_request("/other", "Sec-WebSocket-Protocol: mqtt\r\n"),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 404 "), "{resp}");

    // Same through a WebSocket client.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let err = tokio_tungstenite::client_async(format!("ws://{addr}/nope"), tcp)
        .await
        .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 404),
        other => panic!("expected an HTTP 404, got {other:?}"),
    }

    // Plain HTTP GET on another path, and on the MQTT path without an upgrade.
    let resp = raw_http(addr, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 404 "), "{resp}");
    let resp = raw_http(addr, "GET /mqtt HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 426 "), "{resp}");
    assert!(resp.contains("\r\nUpgrade: websocket\r\n"), "{resp}");
    assert!(
        resp.contains("\r\nConnection: Upgrade, close\r\n"),
        "{resp}"
    );

    // Only unknown subprotocols offered.
    let resp = raw_http(
        addr,
        &upgrade_request("/mqtt", "Sec-WebSocket-Protocol: chat, stomp\r\n"),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 400 "), "{resp}");

    // mqttv3.1 is accepted and echoed; the one offered first wins.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        upgrade_request(
            "/mqtt?x=1",
            "Sec-WebSocket-Protocol: chat, mqttv3.1, mqtt\r\n",
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = vec![0u8; 1024];
    let n = tokio::time::timeout(WAIT, tcp.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.contains("Sec-WebSocket-Protocol: mqttv3.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
        "{head}"
    );
    drop(tcp);

    // A text message closes the connection with 1003.
    let mut ws = ws_connect(addr, "/mqtt").await;
    ws.send(Message::Text("hello".into())).await.unwrap();
    let close = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    match close {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Unsupported),
        other => panic!("expected Close 1003, got {other:?}"),
    }

    // A message over max_packet_size_bytes + 64 KiB closes the connection with 1009.
    let mut ws = ws_connect(addr, "/mqtt").await;
    ws.send(Message::Binary(Bytes::from(vec![
        0u8;
        1024 + 64 * 1024 + 1
    ])))
    .await
    .unwrap();
    let close = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    match close {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Size),
        other => panic!("expected Close 1009, got {other:?}"),
    }

    // Not a GET.
    let resp = raw_http(
        addr,
        &upgrade_request("/mqtt", "").replacen("GET", "POST", 1),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 405 "), "{resp}");
    // An endless request head.
    let huge = format!("GET /mqtt HTTP/1.1\r\nX-Pad: {}\r\n", "a".repeat(9000));
    let resp = raw_http(addr, &huge).await;
    assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");

    server.shutdown(Duration::from_secs(2)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_tls_files_fail_start_naming_the_file() {
    let certs = make_certs("bad");

    let missing = certs.dir.join("missing.crt");
    let mut l = listener(ListenerKind::Tls, Some(&certs));
    l.cert_path = Some(missing.clone());
    let err = Server::start(config(vec![l], &certs.dir))
        .await
        .err()
        .expect("start must fail")
        .to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");

    // Certificate and key swapped.
    let mut l = listener(ListenerKind::Tls, Some(&certs));
    l.cert_path = Some(certs.key_path.clone());
    l.key_path = Some(certs.cert_path.clone());
    let err = Server::start(config(vec![l], &certs.dir))
        .await
        .err()
        .expect("start must fail")
        .to_string();
    assert!(err.contains(&certs.key_path.display().to_string()), "{err}");
    assert!(err.contains("no PEM certificate"), "{err}");

    // A key that does not belong to the certificate.
    let other_key = certs.dir.join("other.key");
    std::fs::write(
        &other_key,
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let mut l = listener(ListenerKind::Tls, Some(&certs));
    l.key_path = Some(other_key.clone());
    let err = Server::start(config(vec![l], &certs.dir))
        .await
        .err()
        .expect("start must fail")
        .to_string();
    assert!(err.contains(&other_key.display().to_string()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_timeouts_and_garbage() {
    let certs = make_certs("timeout");
    let mut config = config(
        vec![
            listener(ListenerKind::Tls, Some(&certs)),
            listener(ListenerKind::Ws, None),
        ],
        &certs.dir,
    );
    config.mqtt.connect_timeout_ms = 300;
    let server = Server::start(config).await.unwrap();
    let addr = server.local_addrs()[0];
    let ws_addr = server.local_addrs()[1];

    // Silent clients, and one that never finishes its HTTP request: dropped after the
    // handshake timeout.
    for (addr, send) in [
        (addr, ""),
        (ws_addr, ""),
        (ws_addr, "GET /mqtt HTTP/1.1\r\n"),
    ] {
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(send.as_bytes()).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(WAIT, idle.read(&mut buf))
            .await
            .expect("server must drop a silent client")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    // Plain MQTT on the TLS port: refused, and the server keeps serving TLS.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(&bytes_of(&connect_packet("plain")))
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut out)).await;
    let mut tls = StreamClient::new(tls_connect(addr, &certs.ca_pem).await);
    tls.send(&connect_packet("after-garbage")).await;
    assert_connack_ok(tls.recv().await);

    server.shutdown(Duration::from_secs(2)).await;
}

/// mosquitto_pub / mosquitto_sub against the TLS listener, verifying the certificate with
/// `--cafile`. Skipped (with a note) when mosquitto-clients is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_clients_over_tls() {
    let have = |bin: &str| {
        std::process::Command::new(bin)
            .arg("--help")
            .output()
            .is_ok()
    };
    if !have("mosquitto_pub") || !have("mosquitto_sub") {
        eprintln!(
            "note: mosquitto_pub/mosquitto_sub not installed; skipping the mosquitto TLS check"
        );
        return;
    }
    let certs = make_certs("mosquitto");
    let (server, tls_addr, _) = start(&certs).await;
    let port = tls_addr.port().to_string();
    let ca = certs.ca_path.display().to_string();
    let run = |bin: &'static str, args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .args(&args)
                .output()
                .unwrap()
        })
    };
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "-h",
            "localhost",
            "-p",
            &port,
            "--cafile",
            &ca,
            "-V",
            "mqttv5",
            "-t",
            "mosq/tls",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let out = run(
        "mosquitto_pub",
        common(&["-r", "-q", "1", "-m", "hello over tls"]),
    )
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "mosquitto_pub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run("mosquitto_sub", common(&["-C", "1", "-W", "10"]))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "mosquitto_sub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello over tls"
    );
    server.shutdown(Duration::from_secs(2)).await;
}

/// A subscriber that stops reading while a burst is queued for it, then resumes: every byte
/// must arrive without any further traffic (buffered TLS records / WS messages get flushed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_subscriber_drains_fully() {
    let certs = make_certs("drain");
    let (server, tls_addr, ws_addr) = start(&certs).await;
    let tcp_addr = server.local_addrs()[2];

    let mut tls = StreamClient::new(tls_connect(tls_addr, &certs.ca_pem).await);
    tls.send(&connect_packet("drain-tls")).await;
    assert_connack_ok(tls.recv().await);
    tls.send(&subscribe_packet("drain/#")).await;
    assert_suback(tls.recv().await);
    let mut ws = WsClient {
        ws: ws_connect(ws_addr, "/mqtt").await,
        buf: BytesMut::new(),
    };
    ws.send(&connect_packet("drain-ws")).await;
    assert_connack_ok(ws.recv().await);
    ws.send(&subscribe_packet("drain/#")).await;
    assert_suback(ws.recv().await);

    // 96 x 64 KiB while neither subscriber reads: more than the socket buffers hold, less
    // than outbound_buffer_bytes_max, so nothing is dropped.
    let mut publisher = StreamClient::new(TcpStream::connect(tcp_addr).await.unwrap());
    publisher.send(&connect_packet("drain-pub")).await;
    assert_connack_ok(publisher.recv().await);
    const N: u32 = 96;
    for i in 0..N {
        let mut payload = vec![(i % 251) as u8; 64 * 1024];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        publisher
            .send(&publish_packet("drain/x", Bytes::from(payload)))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..N {
        let mut payload = vec![(i % 251) as u8; 64 * 1024];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        expect_publish(tls.recv().await, "drain/x", &payload);
        expect_publish(ws.recv().await, "drain/x", &payload);
    }
    server.shutdown(Duration::from_secs(2)).await;
}
