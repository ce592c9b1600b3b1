//! The end of a connection: the will (now or after its delay), the session's expiry timer,
//! and the timers restored after a restart.

use super::*;

/// After a restart: expiry timers for the restored (offline) sessions, and pending wills.
pub fn start_restored_timers(broker: &Arc<Broker>, restored: crate::restore::Restored) {
    for (session, left) in restored.expiries {
        let generation = session.lock().generation;
        schedule_expiry(broker, &session, generation, left.max(1));
    }
    for (client, msg, due_s) in restored.wills {
        let broker = broker.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(due_s)).await;
            let resumed = broker.get_session(&client).is_some_and(|s| {
                let st = s.lock();
                st.generation != 0 || st.connected
            });
            broker.persist.submit(Op::WillRemove {
                client: client.clone(),
            });
            if !resumed {
                broker.publish_internal(msg);
            }
        });
    }
}

/// Remove the session after its expiry interval unless a connection resumed it.
pub(super) fn schedule_expiry(
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    generation: u64,
    expiry_s: u32,
) {
    if expiry_s == 0 {
        broker.expire_session(session, generation);
    } else if expiry_s != u32::MAX {
        let broker = broker.clone();
        let session = session.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(u64::from(expiry_s))).await;
            broker.expire_session(&session, generation);
        });
    }
}

pub(super) fn will_properties(w: &Will) -> lanemq_protocol::PublishProperties {
    lanemq_protocol::PublishProperties {
        payload_format_indicator: w.properties.payload_format_indicator,
        message_expiry_interval: w.properties.message_expiry_interval,
        content_type: w.properties.content_type.clone(),
        response_topic: w.properties.response_topic.clone(),
        correlation_data: w.properties.correlation_data.clone(),
        user_properties: w.properties.user_properties.clone(),
        ..Default::default()
    }
}

pub(super) fn publish_will(broker: &Arc<Broker>, client_id: &Arc<str>, will: Will) {
    broker.persist.submit(Op::WillRemove {
        client: client_id.clone(),
    });
    let mut props = lanemq_protocol::PublishProperties {
        payload_format_indicator: will.properties.payload_format_indicator,
        message_expiry_interval: will.properties.message_expiry_interval,
        content_type: will.properties.content_type,
        response_topic: will.properties.response_topic,
        correlation_data: will.properties.correlation_data,
        user_properties: will.properties.user_properties,
        ..Default::default()
    };
    props.topic_alias = None;
    let msg = Message::new(
        will.topic.as_str().into(),
        will.payload,
        will.qos,
        will.retain,
        props,
        client_id.clone(),
    );
    broker.publish_internal(msg);
}

impl Conn {
    /// The end of a connection: [`Conn::finish`], then [`linger`] after a DISCONNECT sent
    /// by the server (MQTT 5).
    pub(super) async fn close_down<R, W>(self, close: Close, reader: &mut R, writer: &mut W)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let v5 = self.version.is_v5();
        self.finish(close, writer).await;
        if close.reason.is_some() && v5 {
            linger(reader).await;
        }
    }

    /// Send the final DISCONNECT, flush, detach from the session, schedule its expiry and the
    /// will.
    pub(super) async fn finish<W: AsyncWrite + Unpin>(mut self, close: Close, writer: &mut W) {
        // Stream feeders belong to the connection; the positions stay with the session.
        for (_, j) in self.feeders.drain() {
            j.abort();
        }
        let stream_subs: Vec<Arc<StreamSub>> =
            self.session.lock().stream_subs.values().cloned().collect();
        for sub in &stream_subs {
            crate::streams::save_position(&self.broker.persist, &self.session, sub, true);
        }
        // Messages already appended: wait (bounded) until durable, then deliver and ack them,
        // so nothing stored is left unrouted.
        let deadline = Instant::now() + Duration::from_millis(FLUSH_TIMEOUT_MS);
        while self.pending.iter().any(|e| e.counted)
            && !self.completions.failed.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            let _ = tokio::time::timeout(Duration::from_millis(5), self.waker.notified()).await;
            if self.process_completions().is_err() {
                break;
            }
        }
        let _ = self.process_completions();
        self.pending.clear();
        self.low.store(u64::MAX, Ordering::SeqCst);
        // Bytes behind a write barrier go out only once the index has flushed them.
        while !self.barriers.is_empty() && Instant::now() < deadline {
            if self.writable() == self.wbuf.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let writable = self.writable();
        self.wbuf.truncate(writable);
        self.barriers.clear();
        if let (Some(code), true) = (close.reason, self.version.is_v5()) {
            let mut d = Disconnect::new(code);
            if code == rc::QUOTA_EXCEEDED {
                d.properties.reason_string = Some("outbound queue limit reached".into());
            }
            self.encode(&Packet::Disconnect(d));
        }
        if !self.wbuf.is_empty() {
            let buf = std::mem::take(&mut self.wbuf);
            let _ = tokio::time::timeout(
                Duration::from_millis(FLUSH_TIMEOUT_MS),
                writer.write_all(&buf),
            )
            .await;
        }
        let _ =
            tokio::time::timeout(Duration::from_millis(FLUSH_TIMEOUT_MS), writer.shutdown()).await;
        self.broker
            .stats
            .clients_connected
            .fetch_sub(1, Ordering::Relaxed);

        let (still_ours, resumed_elsewhere, expiry) = {
            let mut st = self.session.lock();
            if !st.ended && st.generation == self.generation {
                self.session.set_online(&mut st, false);
                st.waker = None;
                (true, false, st.expiry_s)
            } else {
                (false, !st.ended || st.replaced, 0)
            }
        };
        // A new connection to this session (a take-over, or a reconnect that came before
        // this connection finished closing) cancels a delayed will [MQTT-3.1.3-9].
        let taken_over = matches!(close.reason, Some(rc::SESSION_TAKEN_OVER)) || resumed_elsewhere;
        debug!(peer = %self.peer, will = close.will, "client disconnected");
        let broker = self.broker.clone();
        if still_ours {
            broker
                .lite
                .send(crate::lite::Event::Offline(self.session.clone()));
        }
        if still_ours {
            if expiry > 0 {
                broker.persist.submit(Op::SessionPut {
                    client: self.client_id.clone(),
                    meta: SessionMeta {
                        expiry_s: expiry,
                        protocol: self.version.level(),
                        disconnected_at_us: crate::message::now_us(),
                        will_delay_s: self
                            .will
                            .as_ref()
                            .filter(|_| close.will)
                            .and_then(|w| w.properties.will_delay_interval)
                            .unwrap_or(0),
                    },
                });
            }
            schedule_expiry(&broker, &self.session, self.generation, expiry);
        }
        let Some(will) = self.will.take().filter(|_| close.will) else {
            if self.persistent() {
                broker.persist.submit(Op::WillRemove {
                    client: self.client_id.clone(),
                });
            }
            return;
        };
        let delay = will.properties.will_delay_interval.unwrap_or(0);
        if taken_over {
            // A new connection for this client id exists: a delayed will is cancelled; an
            // immediate one is published [MQTT-3.1.3-9].
            if delay == 0 {
                publish_will(&broker, &self.client_id, *will);
            }
            return;
        }
        let delay = if still_ours { delay.min(expiry) } else { 0 };
        if delay == 0 {
            publish_will(&broker, &self.client_id, *will);
        } else {
            let session = self.session.clone();
            let generation = self.generation;
            let client_id = self.client_id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
                // A new connection for the client id, resuming this session or starting a
                // new one, cancels the will [MQTT-3.1.2-8].
                let reconnected = {
                    let st = session.lock();
                    st.generation != generation || st.connected || st.replaced
                };
                if !reconnected {
                    publish_will(&broker, &client_id, *will);
                }
            });
        }
    }
}
