//! A client's PUBLISH: topic alias, limits, ACL, the log append, and the acknowledgements,
//! sent in arrival order once the records are durable (`process_completions`).

use super::*;
use crate::ingest::Admitted;

impl Conn {
    pub(super) fn on_publish(&mut self, p: Publish) -> Result<(), Close> {
        let cfg = &self.broker.config.mqtt;
        let (topic_alias_max, maximum_qos, retain_available, receive_maximum) = (
            cfg.topic_alias_max,
            cfg.maximum_qos,
            cfg.retain_available,
            cfg.receive_maximum,
        );
        let topic: Arc<str> = match p.properties.topic_alias {
            Some(alias) => {
                if alias == 0 || alias > topic_alias_max {
                    return Err(Close::error(rc::TOPIC_ALIAS_INVALID));
                }
                if p.topic.is_empty() {
                    match self.inbound_aliases.get(&alias) {
                        Some(t) => t.clone(),
                        None => return Err(Close::error(rc::PROTOCOL_ERROR)),
                    }
                } else {
                    let t: Arc<str> = p.topic.as_str().into();
                    self.inbound_aliases.insert(alias, t.clone());
                    t
                }
            }
            None if p.topic.is_empty() => return Err(Close::error(rc::PROTOCOL_ERROR)),
            None => match self.last_topic.as_deref().and_then(|l| l.topic.as_ref()) {
                Some(t) if **t == *p.topic => t.clone(),
                _ => p.topic.as_str().into(),
            },
        };
        if !topic::valid_topic_name(&topic) {
            return Err(Close::error(rc::TOPIC_NAME_INVALID));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            return Err(Close::error(rc::PROTOCOL_ERROR));
        }
        if p.qos.as_u8() > maximum_qos {
            return Err(Close::error(rc::QOS_NOT_SUPPORTED));
        }
        if p.retain && !retain_available {
            return Err(Close::error(rc::RETAIN_NOT_SUPPORTED));
        }
        let bad_payload = p.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&p.payload).is_err();
        let pid = p.packet_id;
        let ack = match p.qos {
            QoS::AtMostOnce => Owed::Nothing,
            QoS::AtLeastOnce => Owed::PubAck(pid),
            QoS::ExactlyOnce => Owed::PubRec(pid),
        };
        if p.qos == QoS::ExactlyOnce && self.session.lock().inbound_qos2.contains(&pid) {
            // A resend of a QoS 2 message already received: acknowledge, never deliver twice.
            self.queue_ack(ack, rc::SUCCESS);
            return Ok(());
        }
        if bad_payload {
            self.queue_ack(ack, rc::PAYLOAD_FORMAT_INVALID);
            return Ok(());
        }
        if topic.starts_with("$SYS/") || &*topic == "$SYS" || !self.may_publish(&topic) {
            // Refused: $SYS is the broker's own (clients may read it, never write it), or the
            // ACL denies it. MQTT 5 learns why; 3.1.1 cannot be told, the message is dropped.
            debug!(topic = %topic, "publish refused");
            if self.version.is_v5() {
                self.queue_ack(ack, rc::NOT_AUTHORIZED);
            } else {
                if p.qos == QoS::ExactlyOnce {
                    self.session.lock().inbound_qos2.insert(pid);
                }
                self.queue_ack(ack, rc::SUCCESS);
            }
            return Ok(());
        }
        if p.qos == QoS::ExactlyOnce {
            let mut st = self.session.lock();
            if st.inbound_qos2.len() >= usize::from(receive_maximum) {
                return Err(Close::error(rc::RECEIVE_MAXIMUM_EXCEEDED));
            }
            st.inbound_qos2.insert(pid);
        }
        self.accept(topic, p, ack)
    }

    /// Does the ACL allow publishing on `topic`? The answer for the last topic is remembered
    /// until the ACL is reloaded.
    fn may_publish(&mut self, topic: &Arc<str>) -> bool {
        let generation = self.broker.auth_generation();
        if let Some(l) = self.last_topic.as_deref() {
            if l.acl_generation == generation
                && l.topic.as_ref().is_some_and(|t| Arc::ptr_eq(t, topic))
            {
                return l.allowed;
            }
        }
        let allowed = self.allowed(Action::Publish, topic);
        let l = self.last_topic.get_or_insert_with(Box::default);
        if !l.topic.as_ref().is_some_and(|t| Arc::ptr_eq(t, topic)) {
            // A new topic: its route is computed again too.
            l.topic = Some(topic.clone());
        }
        l.acl_generation = generation;
        l.allowed = allowed;
        allowed
    }

    /// Does the ACL allow this action on this topic (or filter)?
    pub(super) fn allowed(&self, action: Action, topic: &str) -> bool {
        let auth = self.broker.auth();
        let req = Request {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            ip: self.peer.ip(),
            action,
            topic,
        };
        let d = match action {
            Action::Subscribe => auth.acl.check_subscribe(&req, false),
            _ => auth.acl.check(&req),
        };
        if !d.allowed {
            debug!(?action, topic, decision = %d, "ACL denied");
        }
        d.allowed
    }

    /// Send an acknowledgement now, or after the stored messages received before it.
    pub(super) fn queue_ack(&mut self, ack: Owed, code: u8) {
        if self.pending.is_empty() {
            self.send_ack(ack, code);
        } else {
            self.pending.push_back(PendingPub {
                msg: None,
                ack,
                code,
                counted: false,
                after: Vec::new(),
                offset: u64::MAX,
            });
        }
    }

    pub(super) fn send_ack(&mut self, ack: Owed, code: u8) {
        match ack {
            Owed::Nothing => {}
            Owed::PubAck(pid) => self.encode_ack(Packet::PubAck(PubResp::new(pid, code))),
            Owed::PubRec(pid) => self.encode_ack(Packet::PubRec(PubResp::new(pid, code))),
        }
    }

    /// Append an accepted PUBLISH to the log. It is delivered and acknowledged once durable
    /// ([`Conn::process_completions`]); a QoS 0 message that is not retained and has nothing
    /// queued before it is delivered at once (nothing depends on its durability).
    pub(super) fn accept(&mut self, topic: Arc<str>, p: Publish, ack: Owed) -> Result<(), Close> {
        // QoS 0 with nothing queued before it is delivered at once (a retained one updates
        // the retained table at once too; its index entry waits until the record is durable).
        let fast = ack == Owed::Nothing && self.pending.is_empty();
        let retain = p.retain;
        let quiet = fast && !retain;
        let classified = self.broker.classify(&topic);
        if quiet && matches!(classified, Ok(None)) {
            // Nobody waits for it and it is in no lane: it joins the batch of this read,
            // appended under one log lock and delivered with one lock per session
            // ([`Conn::flush_quiet`], at the end of the read or before any other PUBLISH).
            let l = self.last_topic.get_or_insert_with(Box::default);
            if l.quiet.is_empty() {
                l.quiet_at = lanemq_store::now_us();
            }
            let mut msg = Message::received_at(
                l.quiet_at,
                topic,
                p.payload,
                p.qos,
                false,
                p.properties,
                self.client_id.clone(),
            );
            msg.username = self.username.clone();
            l.quiet.push(msg);
            if l.quiet.len() >= QUIET_BATCH_MAX {
                self.flush_quiet()?;
            }
            return Ok(());
        }
        // The log keeps this client's order: what is batched goes first.
        self.flush_quiet()?;
        // The watermark cell guards what a replay after a crash must still route. A QoS 0
        // message that is not retained leaves nothing a replay would redo (QoS 0 is never
        // queued for a session that is away, and a restart has no connected sessions), so
        // the fast path skips it (reading the next offset takes the log's append lock).
        if self.pending.is_empty() && !quiet {
            self.low
                .store(self.broker.persist.store.next_offset(), Ordering::SeqCst);
        }
        let mut msg = Message::new(
            topic,
            p.payload,
            p.qos,
            p.retain,
            p.properties,
            self.client_id.clone(),
        );
        msg.username = self.username.clone();
        let pid = (p.qos == QoS::ExactlyOnce).then_some(p.packet_id);
        // Nobody waits for a QoS 0 message delivered at once: its fsync may be shared with
        // the next record someone waits for (`lanemq_store::QUIET_SYNC_MAX`).
        let cb: Option<lanemq_store::Callback> = if fast && !retain {
            None
        } else {
            let c = self.completions.clone();
            Some(Box::new(move |r| {
                match r {
                    Ok(_) => {
                        c.ok.fetch_add(1, Ordering::Release);
                    }
                    Err(_) => c.failed.store(true, Ordering::Release),
                }
                c.waker.notify_one();
            }))
        };
        let admitted = match classified {
            Ok(lane) => self.broker.admit_as(&mut msg, lane, pid, cb),
            Err(refused) => Ok(refused),
        };
        match admitted {
            Ok(Admitted::Stored(offset)) => msg.offset = offset,
            Ok(Admitted::Refused { code, why }) => {
                // Key too long (0x90) or the parent's lane quota (0x97): not accepted.
                debug!(topic = %msg.topic, %why, "publish refused by the lite layer");
                if self.pending.is_empty() {
                    self.low.store(u64::MAX, Ordering::SeqCst);
                }
                if let Some(pid) = pid {
                    self.session.lock().inbound_qos2.remove(&pid);
                }
                if ack == Owed::Nothing {
                    self.broker
                        .stats
                        .messages_dropped
                        .fetch_add(1, Ordering::Relaxed);
                } else if self.version.is_v5() {
                    self.queue_ack(ack, code);
                } else {
                    // 3.1.1 has no reason codes: the PUBACK cannot say it; the message is
                    // dropped and counted.
                    self.broker
                        .stats
                        .messages_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    self.queue_ack(ack, rc::SUCCESS);
                }
                return Ok(());
            }
            Err(e) => {
                warn!(error = %e, "cannot store a message: closing the connection unacknowledged");
                return Err(Close::error(rc::UNSPECIFIED_ERROR));
            }
        }
        let offset = msg.offset;
        let msg = Arc::new(msg);
        if fast && !retain {
            self.deliver(msg, None);
        } else if fast {
            let mut after = Vec::new();
            self.deliver(msg, Some(&mut after));
            self.pending.push_back(PendingPub {
                msg: None,
                ack,
                code: rc::SUCCESS,
                counted: true,
                after,
                offset,
            });
        } else {
            self.pending.push_back(PendingPub {
                msg: Some(msg),
                ack,
                code: rc::SUCCESS,
                counted: true,
                after: Vec::new(),
                offset,
            });
        }
        Ok(())
    }

    /// Append and deliver the batched QoS 0 messages of this read (see [`Conn::accept`]).
    pub(super) fn flush_quiet(&mut self) -> Result<(), Close> {
        let Some(l) = self.last_topic.as_deref_mut() else {
            return Ok(());
        };
        if l.quiet.is_empty() {
            return Ok(());
        }
        let mut msgs = std::mem::take(&mut l.quiet);
        if let Err(e) = self.broker.admit_quiet(&mut msgs) {
            warn!(error = %e, "cannot store a message: closing the connection");
            return Err(Close::error(rc::UNSPECIFIED_ERROR));
        }
        if self.broker.deliver_quiet(msgs, &mut l.route) > 0 {
            // A subscriber is behind: let it run before this client's next read.
            self.yield_before_read = true;
        }
        Ok(())
    }

    /// Deliver a stored message; returns the PUBACK/PUBREC code.
    pub(super) fn deliver(&mut self, msg: Arc<Message>, deferred: Option<&mut Vec<Op>>) -> u8 {
        // 0x10 only tells a publisher nobody got it; a retained message is kept for later.
        let kept = (msg.retain && !msg.payload.is_empty()) || msg.in_lane;
        let ingested = match self.last_topic.as_deref_mut() {
            Some(l) => self.broker.deliver_cached(msg, deferred, &mut l.route),
            None => self.broker.ingest_with(msg, deferred),
        };
        if ingested.matched || kept || !self.version.is_v5() {
            rc::SUCCESS
        } else {
            rc::NO_MATCHING_SUBSCRIBERS
        }
    }

    /// Deliver and acknowledge the messages the store has made durable, in order.
    pub(super) fn process_completions(&mut self) -> Result<(), Close> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let ok = self.completions.ok.load(Ordering::Acquire);
        let mut durable = false;
        while let Some(front) = self.pending.front() {
            if front.counted {
                if self.completed >= ok {
                    break;
                }
                self.completed += 1;
            }
            let Some(e) = self.pending.pop_front() else {
                break;
            };
            for op in e.after {
                self.broker.persist.submit(op);
            }
            let mut code = e.code;
            if let Some(msg) = e.msg {
                let offset = msg.offset;
                durable = true;
                code = self.deliver(msg, None);
                if let (Owed::PubRec(pid), true, false) = (
                    e.ack,
                    self.persistent(),
                    offset == crate::message::NOT_STORED,
                ) {
                    self.broker.persist.submit(Op::InboundAdd {
                        client: self.client_id.clone(),
                        pid,
                        offset,
                    });
                }
            }
            self.send_ack(e.ack, code);
        }
        if durable {
            // New records are committed: the stream indexer and the lanes read them now.
            self.broker.committed();
        }
        let low = self
            .pending
            .iter()
            .find_map(|e| e.counted.then_some(e.offset))
            .unwrap_or(u64::MAX);
        self.low.store(low, Ordering::SeqCst);
        if self.completions.failed.load(Ordering::Acquire) && self.pending.iter().any(|e| e.counted)
        {
            warn!("the log refused a write: closing the connection unacknowledged");
            return Err(Close::error(rc::UNSPECIFIED_ERROR));
        }
        Ok(())
    }
}
