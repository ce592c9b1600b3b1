//! The CONNECT handshake of a connection: authentication (password file or the enhanced
//! exchange already done), the checks that refuse a CONNECT with its CONNACK reason, session
//! take-over or resume, and the CONNACK with the negotiated limits.

use super::close::will_properties;
use super::*;

/// Check the CONNECT's credentials: against the password file when one is configured
/// (clients without a username count as anonymous), else only `allow_anonymous`. Without a
/// password file a username is taken as given (as mosquitto does), for ACL rules by user.
pub(super) async fn authenticate(broker: &Arc<Broker>, c: &Connect) -> bool {
    let anonymous_ok = broker.config.server.allow_anonymous;
    let auth = broker.auth();
    let Some(user) = c.username.clone() else {
        return anonymous_ok;
    };
    if auth.passwords.is_none() {
        return true;
    }
    let password = c.password.clone().unwrap_or_default();
    // PBKDF2 takes a while by design: keep it off the runtime's worker threads.
    tokio::task::spawn_blocking(move || {
        auth.passwords
            .as_ref()
            .is_some_and(|p| p.verify(&user, &password))
    })
    .await
    .unwrap_or(false)
}

/// Map a decode error of the first packet to a CONNACK where the protocol allows one.
pub(super) async fn reject_bad_connect<W: AsyncWrite + Unpin>(writer: &mut W, err: &DecodeError) {
    let (version, code) = match err {
        DecodeError::UnsupportedProtocolVersion(level) if *level < 5 => {
            (ProtocolVersion::V311, rc::UNSUPPORTED_PROTOCOL_VERSION)
        }
        DecodeError::UnsupportedProtocolVersion(_) => {
            (ProtocolVersion::V5, rc::UNSUPPORTED_PROTOCOL_VERSION)
        }
        _ => {
            debug!(error = %err, "malformed CONNECT");
            return;
        }
    };
    let out = connack_refusal(code, version);
    let _ = tokio::time::timeout(
        Duration::from_millis(FLUSH_TIMEOUT_MS),
        writer.write_all(&out),
    )
    .await;
}

/// A CONNACK refusing the connection with `code`, encoded for `version`.
fn connack_refusal(code: u8, version: ProtocolVersion) -> BytesMut {
    let mut out = BytesMut::new();
    encode(
        &Packet::ConnAck(ConnAck {
            reason_code: code,
            ..Default::default()
        }),
        version,
        &mut out,
    );
    out
}

impl Conn {
    pub(super) async fn handshake<W: AsyncWrite + Unpin>(
        broker: Arc<Broker>,
        c: Connect,
        enhanced: Option<crate::enhanced_auth::Verified>,
        peer: SocketAddr,
        writer: &mut W,
    ) -> std::io::Result<Option<Conn>> {
        let cfg = &broker.config.mqtt;
        let version = c.protocol;
        let v5 = version.is_v5();
        let refuse = |code: u8| connack_refusal(code, version);
        let mut reject: Option<u8> = None;
        if broker.is_shutting_down() {
            reject = Some(rc::SERVER_UNAVAILABLE);
        } else if broker.stats.clients_connected.load(Ordering::Relaxed) >= cfg.max_connections {
            reject = Some(if v5 {
                rc::QUOTA_EXCEEDED
            } else {
                rc::SERVER_UNAVAILABLE
            });
        } else if c.properties.authentication_method.is_some() && enhanced.is_none() {
            // MQTT 3.1.1 has no AUTH; an MQTT 5 CONNECT with a method ran the exchange already.
            reject = Some(rc::BAD_AUTHENTICATION_METHOD);
        } else if enhanced.is_none() && !authenticate(&broker, &c).await {
            broker.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            warn!(
                username = c.username.as_deref().unwrap_or(""),
                client_id = %c.client_id,
                %peer,
                "authentication failed"
            );
            reject = Some(rc::BAD_USER_NAME_OR_PASSWORD);
        } else if c.client_id.is_empty()
            && (version == ProtocolVersion::V31 || (!v5 && !c.clean_start))
        {
            // MQTT 3.1 requires a client id of 1 to 23 characters (CONNACK rc 2); 3.1.1 one
            // for a persistent session [MQTT-3.1.3-8].
            reject = Some(rc::CLIENT_IDENTIFIER_NOT_VALID);
        } else if let Some(w) = &c.will {
            if !topic::valid_topic_name(&w.topic) {
                reject = Some(rc::TOPIC_NAME_INVALID);
            } else if w.qos.as_u8() > cfg.maximum_qos {
                reject = Some(rc::QOS_NOT_SUPPORTED);
            } else if w.retain && !cfg.retain_available {
                reject = Some(rc::RETAIN_NOT_SUPPORTED);
            }
        }
        if let Some(code) = reject {
            debug!(reason = rc::name(code), "CONNECT refused");
            broker.stats.refused(code);
            let out = refuse(code);
            let _ = tokio::time::timeout(
                Duration::from_millis(FLUSH_TIMEOUT_MS),
                writer.write_all(&out),
            )
            .await;
            return Ok(None);
        }

        let mut props = ConnAckProperties::default();
        let client_id: Arc<str> = if c.client_id.is_empty() {
            let id = broker.assign_client_id();
            if v5 {
                props.assigned_client_identifier = Some(id.clone());
            }
            id.into()
        } else {
            c.client_id.as_str().into()
        };
        // Session expiry: 3.1.1 clean session 0 means "never expires".
        let requested_expiry = if v5 {
            c.properties.session_expiry_interval.unwrap_or(0)
        } else if c.clean_start {
            0
        } else {
            u32::MAX
        };
        let session_expiry_s = requested_expiry.min(cfg.max_session_expiry_s);
        if v5 && session_expiry_s != requested_expiry {
            props.session_expiry_interval = Some(session_expiry_s);
        }
        // Keep alive.
        let mut keep_alive_s = c.keep_alive;
        if v5 {
            let wanted = cfg.server_keep_alive_s.unwrap_or(c.keep_alive);
            let granted = if wanted == 0 && cfg.max_keep_alive_s < u16::MAX {
                cfg.max_keep_alive_s
            } else {
                wanted.min(cfg.max_keep_alive_s)
            };
            if granted != c.keep_alive {
                props.server_keep_alive = Some(granted);
            }
            keep_alive_s = granted;
        }
        // 1.5 x the keep alive [MQTT-3.1.2-22], in milliseconds (at most 98,302,500).
        let keep_alive_ms = u32::from(keep_alive_s) * 1500;

        if v5 {
            if cfg.receive_maximum != u16::MAX {
                props.receive_maximum = Some(cfg.receive_maximum);
            }
            if cfg.maximum_qos < 2 {
                props.maximum_qos = Some(cfg.maximum_qos);
            }
            if !cfg.retain_available {
                props.retain_available = Some(false);
            }
            props.maximum_packet_size = Some(cfg.max_packet_size_bytes);
            if let Some(v) = &enhanced {
                props.authentication_method = Some(v.method.clone());
                props.authentication_data = Some(v.server_final.clone());
            }
            if cfg.topic_alias_max > 0 {
                props.topic_alias_maximum = Some(cfg.topic_alias_max);
            }
            if c.properties.request_response_information == Some(true) {
                if let Some(info) = &cfg.response_information {
                    props.response_information = Some(info.replace("{client_id}", &client_id));
                }
            }
        }

        // The CONNACK must fit the client's Maximum Packet Size too [MQTT-3.1.2-24]: the
        // optional properties go first; a client whose limit is below even that gets no
        // CONNACK, and the connection closes (before any session is touched).
        if let Some(max) = c.properties.maximum_packet_size.filter(|_| v5) {
            let size = |props: &ConnAckProperties| {
                lanemq_protocol::encoded_len(
                    &Packet::ConnAck(ConnAck {
                        session_present: false,
                        reason_code: rc::SUCCESS,
                        properties: props.clone(),
                    }),
                    version,
                )
            };
            let max = usize::try_from(max).unwrap_or(usize::MAX);
            if size(&props) > max {
                props.reason_string = None;
                props.user_properties.clear();
                props.response_information = None;
            }
            if size(&props) > max {
                warn!(
                    client_id = %client_id,
                    %peer,
                    maximum_packet_size = max,
                    connack_bytes = size(&props),
                    "the client's Maximum Packet Size is smaller than the CONNACK; closing"
                );
                return Ok(None);
            }
        }
        // Cluster mode: a session another node owns is taken over from it first.
        let adopted = if broker.clustered() {
            crate::cluster_sessions::adopt(&broker, &client_id, c.clean_start).await
        } else {
            None
        };
        let limits = broker.queue_limits();
        let (session, mut resumed) = broker.open_session(&client_id, c.clean_start, || {
            Session::new(client_id.clone(), version, limits)
        });
        let waker = Arc::new(ConnWaker::new());
        let mut wbuf = BytesMut::new();
        let generation;
        {
            let mut st = session.lock();
            if st.connected {
                // Take-over: the old connection sees the new generation and leaves with 0x8E.
                st.wake();
            }
            st.generation += 1;
            generation = st.generation;
            session.set_online(&mut st, true);
            st.waker = Some(waker.clone());
            st.kick = None;
            st.protocol = version;
            st.expiry_s = session_expiry_s;
            st.identity = Some((c.username.as_deref().map(Arc::from), peer.ip()));
            st.connected_at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        if broker.clustered()
            && crate::cluster_sessions::install_and_claim(&broker, &session, adopted).await
        {
            resumed = true;
        }
        if resumed {
            // The rules may have changed while the session was away (a reload, a restart),
            // and its client may come back as someone else: what it may no longer read goes.
            broker.revoke_denied(&session, false);
        }
        let persist = &broker.persist;
        if session_expiry_s > 0 {
            let will_delay_s = c
                .will
                .as_ref()
                .and_then(|w| w.properties.will_delay_interval)
                .unwrap_or(0);
            persist.submit(Op::SessionPut {
                client: client_id.clone(),
                meta: SessionMeta {
                    expiry_s: session_expiry_s,
                    protocol: version.level(),
                    disconnected_at_us: 0,
                    will_delay_s,
                },
            });
            match &c.will {
                Some(w) if will_delay_s > 0 => {
                    let mut msg = Message::new(
                        w.topic.as_str().into(),
                        w.payload.clone(),
                        w.qos,
                        w.retain,
                        will_properties(w),
                        client_id.clone(),
                    );
                    msg.username = c.username.as_deref().map(Arc::from);
                    let rec = crate::persist::record_in(&msg, None);
                    persist.submit(Op::WillPut {
                        client: client_id.clone(),
                        record: Box::new(rec),
                    });
                }
                _ => {
                    persist.submit(Op::WillRemove {
                        client: client_id.clone(),
                    });
                }
            }
        } else if resumed {
            // The session no longer outlives its connection: forget its persisted state.
            persist.submit(Op::SessionRemove {
                client: client_id.clone(),
            });
        }
        let connack = ConnAck {
            session_present: resumed,
            reason_code: rc::SUCCESS,
            properties: props,
        };
        encode(&Packet::ConnAck(connack), version, &mut wbuf);

        let waker_for_store = waker.clone();
        let send_window = c
            .properties
            .receive_maximum
            .unwrap_or(u16::MAX)
            .min(cfg.max_inflight_messages);
        let client_max_packet = c.properties.maximum_packet_size.unwrap_or(u32::MAX);
        let mut conn = Conn {
            broker: broker.clone(),
            version,
            client_id,
            session,
            generation,
            waker,
            keep_alive_ms,
            send_window,
            client_max_packet,
            client_alias_max: if v5 && cfg.outbound_topic_aliases {
                c.properties.topic_alias_maximum.unwrap_or(0)
            } else {
                0
            },
            inbound_aliases: LazyMap::new(),
            outbound_aliases: LazyMap::new(),
            problem_info: c.properties.request_problem_information.unwrap_or(true),
            will: c.will.map(Box::new),
            session_expiry_s,
            wbuf,
            rate: (cfg.max_publish_rate_per_s > 0)
                .then(|| Box::new(RateLimit::new(cfg.max_publish_rate_per_s))),
            username: c.username.as_deref().map(Arc::from),
            pending: LazyDeque::new(),
            completions: Arc::new(Completions {
                ok: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                waker: waker_for_store,
            }),
            completed: 0,
            low: broker.persist.register_low(),
            barriers: LazyDeque::new(),
            abs_written: 0,
            peer,
            feeders: LazyMap::new(),
            enhanced: enhanced
                .as_ref()
                .map(|v| Box::new(crate::enhanced_auth::Live::new(v))),
            last_topic: None,
            yield_before_read: false,
            held: false,
        };
        if resumed {
            broker
                .lite
                .send(crate::lite::Event::Online(conn.session.clone()));
            conn.resend_inflight();
            let subs: Vec<Arc<StreamSub>> =
                conn.session.lock().stream_subs.values().cloned().collect();
            for sub in subs {
                conn.start_feeder(sub);
            }
        }
        broker
            .stats
            .clients_connected
            .fetch_add(1, Ordering::Relaxed);
        broker
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        debug!(resumed, keep_alive_s, "client connected");
        Ok(Some(conn))
    }
}
