//! MQTT 5 enhanced authentication (§4.12) with SCRAM-SHA-512 and SCRAM-SHA-256: the exchange
//! between a CONNECT and its CONNACK, and re-authentication on a live connection (AUTH 0x19).
//!
//! This module owns the choice of method (`server.auth_methods`), the credentials (from the
//! password file in force at each exchange, so a reload applies to the next
//! re-authentication) and the reason codes:
//! * a method that is not offered: 0x8C Bad authentication method;
//! * an unknown user or a wrong proof: 0x86 Bad User Name or Password;
//! * a SCRAM message that breaks RFC 5802 (or a CONNECT User Name other than the SCRAM user,
//!   or a re-authentication as someone else): 0x87 Not authorized;
//! * a failed re-authentication: DISCONNECT 0x87 whatever the cause (DISCONNECT has no 0x86);
//! * an AUTH out of turn or with another method: 0x82 Protocol Error.
//!
//! Invariants: the whole CONNECT exchange runs within `mqtt.connect_timeout_ms` of the
//! CONNECT; nothing about a session is touched before it succeeds; the SCRAM arithmetic lives
//! in `lanemq_acl::scram` and no password-equivalent leaves it.

use crate::broker::Broker;
use bytes::{Bytes, BytesMut};
use lanemq_acl::scram::{self, ClientFirst, Mechanism, ServerFirst};
use lanemq_protocol::reason as rc;
use lanemq_protocol::{
    decode, encode, Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, Packet,
    ProtocolVersion,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

/// Why an exchange failed: the reason code and a sentence for the Reason String.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub code: u8,
    pub reason: String,
}

impl Failure {
    fn new(code: u8, reason: impl Into<String>) -> Failure {
        Failure {
            code,
            reason: reason.into(),
        }
    }
}

/// An exchange waiting for the client-final-message.
pub(crate) struct Pending {
    state: ServerFirst,
}

/// A successful exchange.
pub(crate) struct Verified {
    pub method: String,
    pub username: Arc<str>,
    /// The server-final-message, sent as Authentication Data of the CONNACK or final AUTH.
    pub server_final: Bytes,
}

/// Enhanced-authentication state of a live connection that authenticated with a method.
pub(crate) struct Live {
    pub method: String,
    pub username: Arc<str>,
    /// A re-authentication in progress.
    pending: Option<Pending>,
}

/// Answer a client-first-message (CONNECT or AUTH 0x19) sent with `method`.
fn begin(broker: &Broker, method: &str, data: Option<&Bytes>) -> Result<(Pending, Bytes), Failure> {
    let offered = broker
        .config
        .server
        .auth_methods
        .iter()
        .any(|m| m == method);
    let (Some(mech), true) = (Mechanism::from_name(method), offered) else {
        return Err(Failure::new(
            rc::BAD_AUTHENTICATION_METHOD,
            format!("authentication method {method:?} is not offered"),
        ));
    };
    let auth = broker.auth();
    let Some(passwords) = auth.passwords.as_ref() else {
        return Err(Failure::new(
            rc::BAD_AUTHENTICATION_METHOD,
            "no password file is configured",
        ));
    };
    let data = data.ok_or_else(|| {
        Failure::new(
            rc::NOT_AUTHORIZED,
            format!("{mech} needs the client-first-message as Authentication Data"),
        )
    })?;
    let first = ClientFirst::parse(data).map_err(scram_failure)?;
    let credentials = passwords.scram_credentials(&first.username, mech);
    let nonce = scram::server_nonce().map_err(|e| {
        Failure::new(
            rc::UNSPECIFIED_ERROR,
            format!("random number generator failed: {e}"),
        )
    })?;
    let (state, server_first) = ServerFirst::start(first, credentials, &nonce);
    Ok((Pending { state }, Bytes::from(server_first)))
}

/// Verify a client-final-message.
fn complete(pending: Pending, method: &str, data: Option<&Bytes>) -> Result<Verified, Failure> {
    let data = data.ok_or_else(|| {
        Failure::new(
            rc::NOT_AUTHORIZED,
            "the client-final-message is missing from Authentication Data",
        )
    })?;
    let v = pending.state.finish(data).map_err(scram_failure)?;
    Ok(Verified {
        method: method.to_string(),
        username: Arc::from(v.username),
        server_final: Bytes::from(v.server_final),
    })
}

fn scram_failure(e: scram::ScramError) -> Failure {
    let code = if e.is_credentials() {
        rc::BAD_USER_NAME_OR_PASSWORD
    } else {
        rc::NOT_AUTHORIZED
    };
    Failure::new(code, e.to_string())
}

fn auth_packet(code: u8, method: &str, data: Bytes) -> Packet {
    Packet::Auth(Auth {
        reason_code: code,
        properties: AuthProperties {
            authentication_method: Some(method.to_string()),
            authentication_data: Some(data),
            ..Default::default()
        },
    })
}

fn note_failure(broker: &Broker, c: &Connect, f: &Failure, peer: std::net::SocketAddr) {
    broker.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
    warn!(
        method = c.properties.authentication_method.as_deref().unwrap_or(""),
        client_id = %c.client_id,
        %peer,
        reason = rc::name(f.code),
        detail = %f.reason,
        "enhanced authentication failed"
    );
}

/// Run the exchange of a CONNECT that carries an Authentication Method: AUTH 0x18 with the
/// server-first-message, then the client's AUTH 0x18. On success the CONNECT's User Name is
/// the authenticated user and the result goes into the CONNACK. On failure a CONNACK with the
/// reason code has been sent (or the client left) and `None` is returned.
pub(crate) async fn connect_exchange<R, W>(
    broker: &Arc<Broker>,
    c: &mut Connect,
    reader: &mut R,
    writer: &mut W,
    rbuf: &mut BytesMut,
    peer: std::net::SocketAddr,
) -> std::io::Result<Option<Verified>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let method = c
        .properties
        .authentication_method
        .clone()
        .unwrap_or_default();
    let cfg = &broker.config.mqtt;
    let outcome = async {
        let (pending, server_first) =
            begin(broker, &method, c.properties.authentication_data.as_ref())?;
        let mut out = BytesMut::new();
        encode(
            &auth_packet(rc::CONTINUE_AUTHENTICATION, &method, server_first),
            ProtocolVersion::V5,
            &mut out,
        );
        writer
            .write_all(&out)
            .await
            .map_err(|e| Failure::new(rc::UNSPECIFIED_ERROR, e.to_string()))?;
        let reply = loop {
            match decode(rbuf, ProtocolVersion::V5, cfg.max_packet_size_bytes) {
                Ok(Some(p)) => break p,
                Ok(None) => {}
                Err(e) => return Err(Failure::new(rc::MALFORMED_PACKET, e.to_string())),
            }
            match reader.read_buf(rbuf).await {
                Ok(0) | Err(_) => {
                    return Err(Failure::new(0, "the client left during authentication"))
                }
                Ok(_) => {}
            }
        };
        let a = match reply {
            Packet::Auth(a) => a,
            Packet::Disconnect(_) => {
                return Err(Failure::new(0, "the client left during authentication"))
            }
            other => {
                return Err(Failure::new(
                    rc::PROTOCOL_ERROR,
                    format!(
                        "expected AUTH during authentication, got packet type {}",
                        other.type_id()
                    ),
                ))
            }
        };
        if a.reason_code != rc::CONTINUE_AUTHENTICATION
            || a.properties.authentication_method.as_deref() != Some(method.as_str())
        {
            return Err(Failure::new(
                rc::PROTOCOL_ERROR,
                "an AUTH during authentication must be 0x18 with the CONNECT's method",
            ));
        }
        let v = complete(pending, &method, a.properties.authentication_data.as_ref())?;
        if c.username.as_deref().is_some_and(|u| u != &*v.username) {
            return Err(Failure::new(
                rc::NOT_AUTHORIZED,
                "the CONNECT's User Name is not the user who authenticated",
            ));
        }
        Ok(v)
    };
    let timeout = Duration::from_millis(cfg.connect_timeout_ms);
    let result = match tokio::time::timeout(timeout, outcome).await {
        Ok(r) => r,
        Err(_) => Err(Failure::new(0, "no AUTH within the connect timeout")),
    };
    match result {
        Ok(v) => {
            c.username = Some(v.username.to_string());
            debug!(method = %v.method, user = %v.username, "enhanced authentication succeeded");
            Ok(Some(v))
        }
        Err(f) if f.code == 0 => {
            debug!(reason = %f.reason, "enhanced authentication abandoned");
            Ok(None)
        }
        Err(f) => {
            note_failure(broker, c, &f, peer);
            let mut props = ConnAckProperties::default();
            if c.properties.request_problem_information.unwrap_or(true) {
                props.reason_string = Some(f.reason.clone());
            }
            let mut out = BytesMut::new();
            encode(
                &Packet::ConnAck(ConnAck {
                    session_present: false,
                    reason_code: f.code,
                    properties: props,
                }),
                ProtocolVersion::V5,
                &mut out,
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), writer.write_all(&out)).await;
            Ok(None)
        }
    }
}

impl Live {
    /// After a successful CONNECT exchange.
    pub(crate) fn new(v: &Verified) -> Live {
        Live {
            method: v.method.clone(),
            username: v.username.clone(),
            pending: None,
        }
    }

    /// An AUTH on a live connection (§4.12.1): AUTH 0x19 starts a re-authentication, the
    /// client's AUTH 0x18 finishes it. Returns the AUTH to send, or the DISCONNECT reason code.
    pub(crate) fn on_auth(&mut self, broker: &Broker, a: Auth) -> Result<Packet, u8> {
        if a.properties.authentication_method.as_deref() != Some(self.method.as_str()) {
            debug!("AUTH with another method than the CONNECT's");
            return Err(rc::PROTOCOL_ERROR);
        }
        let data = a.properties.authentication_data.as_ref();
        // DISCONNECT cannot carry 0x86 or 0x8C (MQTT 5 §3.14.2.1): a failed
        // re-authentication ends with 0x87 Not authorized; the log says why.
        let fail = |f: Failure| {
            broker.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            warn!(user = %self.username, reason = rc::name(f.code), detail = %f.reason,
                "re-authentication failed");
            match f.code {
                rc::BAD_USER_NAME_OR_PASSWORD | rc::BAD_AUTHENTICATION_METHOD => rc::NOT_AUTHORIZED,
                code => code,
            }
        };
        match (a.reason_code, self.pending.take()) {
            (rc::RE_AUTHENTICATE, None) => {
                let (pending, server_first) = begin(broker, &self.method, data).map_err(fail)?;
                self.pending = Some(pending);
                Ok(auth_packet(
                    rc::CONTINUE_AUTHENTICATION,
                    &self.method,
                    server_first,
                ))
            }
            (rc::CONTINUE_AUTHENTICATION, Some(pending)) => {
                let v = complete(pending, &self.method, data).map_err(fail)?;
                if v.username != self.username {
                    return Err(fail(Failure::new(
                        rc::NOT_AUTHORIZED,
                        format!(
                            "re-authentication as {:?} on a connection of {:?}",
                            v.username, self.username
                        ),
                    )));
                }
                debug!(user = %v.username, "re-authentication succeeded");
                Ok(auth_packet(rc::SUCCESS, &self.method, v.server_final))
            }
            _ => {
                debug!(
                    reason_code = a.reason_code,
                    "AUTH out of turn (0x19 starts a re-authentication, 0x18 continues one)"
                );
                Err(rc::PROTOCOL_ERROR)
            }
        }
    }
}
