//! SUBSCRIBE and UNSUBSCRIBE: options, ACL, shared and lane groups, retained messages, and
//! `$stream/` subscriptions (binding to a stream, auto-create, the feeder).

use super::*;

impl Conn {
    pub(super) fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let v5 = self.version.is_v5();
        let broker = self.broker.clone();
        let cfg = &broker.config.mqtt;
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut retained: Vec<Delivery> = Vec::new();
        let mut sub_ticket = None;
        let mut reasons: Vec<String> = Vec::new();
        for f in &s.filters {
            let (group, inner) = match topic::parse_shared(&f.filter) {
                Ok(Some(sh)) => (Some(sh.group), sh.filter),
                Ok(None) => (None, f.filter.as_str()),
                Err(_) => {
                    codes.push(if v5 {
                        rc::TOPIC_FILTER_INVALID
                    } else {
                        rc::UNSPECIFIED_ERROR
                    });
                    continue;
                }
            };
            if group.is_some() && f.options.no_local {
                // [MQTT-3.8.3-4]
                return Err(Close::error(rc::PROTOCOL_ERROR));
            }
            if !topic::valid_filter(inner) {
                codes.push(if v5 {
                    rc::TOPIC_FILTER_INVALID
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            if inner
                .split('/')
                .nth(usize::from(cfg.max_topic_levels))
                .is_some()
            {
                let shown: String = f.filter.chars().take(64).collect();
                reasons.push(format!(
                    "{shown}...: more than {} topic levels (mqtt.max_topic_levels)",
                    cfg.max_topic_levels
                ));
                codes.push(if v5 {
                    rc::TOPIC_FILTER_INVALID
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            if !self.allowed(Action::Subscribe, &f.filter) {
                codes.push(if v5 {
                    rc::NOT_AUTHORIZED
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            if lanemq_streams::subscribe::is_stream_filter(inner) {
                let code = if group.is_some() {
                    reasons.push(format!(
                        "{}: stream subscriptions cannot be shared",
                        f.filter
                    ));
                    if v5 {
                        rc::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                    } else {
                        rc::UNSPECIFIED_ERROR
                    }
                } else {
                    let (code, t) = self.subscribe_stream(
                        &f.filter,
                        f.options,
                        s.properties.subscription_identifier,
                        &s.properties.user_properties,
                        &mut reasons,
                    );
                    if t.is_some() {
                        sub_ticket = t;
                    }
                    code
                };
                codes.push(code);
                continue;
            }
            let denied = cfg
                .deny_subscribe
                .iter()
                .any(|d| d == inner || (!topic::has_wildcards(inner) && topic::matches(d, inner)));
            if denied {
                codes.push(if v5 {
                    cfg.deny_subscribe_reason_code
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            let qos =
                QoS::from_u8(f.options.qos.as_u8().min(cfg.maximum_qos)).unwrap_or(QoS::AtMostOnce);
            let mut options = f.options;
            options.qos = qos;
            let sub_id = s.properties.subscription_identifier;
            if let Some((parent, sel)) = self.broker.lite.lane_filter(inner) {
                use crate::lite::Start;
                let next = self.broker.persist.store.next_offset();
                let start = match Start::from_user_properties(&s.properties.user_properties, next) {
                    Ok(st) => st,
                    Err(why) => {
                        reasons.push(format!("{}: {why}", f.filter));
                        codes.push(if v5 {
                            rc::IMPLEMENTATION_SPECIFIC_ERROR
                        } else {
                            rc::UNSPECIFIED_ERROR
                        });
                        continue;
                    }
                };
                let one = matches!(sel, lanemq_lite::LaneSel::One(_));
                if group.is_some() || (start.is_some() && one) {
                    // A lane group (or a private replay of one lane): QoS at most 1
                    // [MQTT-4.8.2-5 would strand a lane at QoS 2], never in the router.
                    let qos = qos.min(QoS::AtLeastOnce);
                    options.qos = qos;
                    self.session
                        .lock()
                        .subscriptions
                        .insert(f.filter.clone(), Subscription { options, sub_id });
                    self.broker
                        .lite
                        .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                            session: self.session.clone(),
                            filter: f.filter.clone(),
                            group: group.map(str::to_string),
                            parent,
                            sel,
                            inner: inner.to_string(),
                            qos,
                            sub_id,
                            start,
                            stored: group.is_some() || self.persistent(),
                        })));
                    if self.persistent() {
                        // A private replay is stored too, flagged: it is restored with its
                        // session and goes on from its stored position.
                        let mut value = crate::sub_codec::encode_sub(&options, sub_id);
                        if group.is_none() {
                            value[1] |= crate::sub_codec::SUB_FLAG_LANE_REPLAY;
                        }
                        let t = self.broker.persist.submit(Op::SubPut {
                            client: self.client_id.clone(),
                            filter: f.filter.clone(),
                            value,
                        });
                        sub_ticket = Some(t);
                    }
                    codes.push(qos.as_u8());
                    continue;
                }
            }
            let existed = self
                .session
                .lock()
                .subscriptions
                .insert(f.filter.clone(), Subscription { options, sub_id })
                .is_some();
            let send_retained = group.is_none()
                && (options.retain_handling == 0 || (options.retain_handling == 1 && !existed));
            let matching = self.broker.add_subscription_retained(
                &self.session,
                &f.filter,
                Subscriber {
                    session: self.session.clone(),
                    options,
                    sub_id,
                },
                send_retained,
            );
            if self.persistent() {
                let t = self.broker.persist.submit(Op::SubPut {
                    client: self.client_id.clone(),
                    filter: f.filter.clone(),
                    value: crate::sub_codec::encode_sub(&options, sub_id),
                });
                sub_ticket = Some(t);
            }
            codes.push(qos.as_u8());
            for m in matching {
                let q = m.qos.min(qos);
                retained.push(Delivery {
                    msg: m,
                    qos: q,
                    retain: true,
                    sub_ids: sub_id.into_iter().collect(),
                    share: None,
                    seq: 0,
                    stream: None,
                    lane: None,
                });
            }
        }
        if let Some(t) = sub_ticket {
            // SUBACK once the subscription is durable.
            self.barrier(t);
        }
        let mut properties = AckProperties::default();
        if !reasons.is_empty() {
            properties.reason_string = Some(reasons.join("; "));
        }
        self.encode_ack(Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            properties,
        }));
        for d in retained {
            self.session.push(d, Some(&self.broker.persist));
        }
        Ok(())
    }

    pub(super) fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut codes = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            let stream_sub = self.session.lock().stream_subs.remove(f);
            if let Some(sub) = stream_sub {
                sub.end();
                if let Some(j) = self.feeders.remove(f) {
                    j.abort();
                }
                if self.persistent() {
                    let t = self.broker.persist.submit(Op::StreamSubRemove {
                        client: self.client_id.clone(),
                        filter: f.clone(),
                    });
                    self.barrier(t);
                }
                codes.push(rc::SUCCESS);
                continue;
            }
            let had = self.session.lock().subscriptions.remove(f).is_some();
            if had {
                self.broker.remove_subscription(&self.session, f);
                if self.persistent() {
                    let t = self.broker.persist.submit(Op::SubRemove {
                        client: self.client_id.clone(),
                        filter: f.clone(),
                    });
                    self.barrier(t);
                }
            }
            codes.push(if had {
                rc::SUCCESS
            } else {
                rc::NO_SUBSCRIPTION_EXISTED
            });
        }
        self.encode_ack(Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            properties: Default::default(),
        }));
    }

    pub(super) fn start_feeder(&mut self, sub: Arc<StreamSub>) {
        let filter = sub.filter.clone();
        let j = crate::streams::spawn_feeder(
            self.broker.streams.clone(),
            self.broker.persist.clone(),
            self.session.clone(),
            sub,
            self.generation,
        );
        if let Some(old) = self.feeders.insert(filter, j) {
            old.abort();
        }
    }

    /// SUBSCRIBE to `$stream/<name>[/<filter>]` or `$s/<offset>/<filter>` (already authorized
    /// on the full filter): the policy is [`crate::streams::subscribe`]; the connection only
    /// starts the feeder. Returns the SUBACK code and the ticket of the persisted
    /// subscription; failures add a reason to `reasons`.
    pub(super) fn subscribe_stream(
        &mut self,
        filter: &str,
        options: lanemq_protocol::SubscriptionOptions,
        sub_id: Option<u32>,
        user_properties: &[(String, String)],
        reasons: &mut Vec<String>,
    ) -> (u8, Option<u64>) {
        if !self.version.is_v5() {
            reasons.push(format!("{filter}: stream subscriptions need MQTT 5"));
            return (rc::UNSPECIFIED_ERROR, None);
        }
        let req = crate::streams::SubscribeRequest {
            filter,
            options,
            sub_id,
            user_properties,
            maximum_qos: self.broker.config.mqtt.maximum_qos,
            persistent: self.persistent(),
        };
        let answer = crate::streams::subscribe(
            &self.broker.streams,
            &self.broker.persist,
            &self.session,
            req,
            |f| self.allowed_auto_create(f),
            |def, internal| {
                if internal {
                    self.broker.create_stream_internal(def)
                } else {
                    self.broker.create_stream(def)
                }
            },
        );
        match answer {
            Ok(s) => {
                if let Some(note) = s.note {
                    reasons.push(format!("{filter}: {note}"));
                }
                if !s.kept || self.feeders.get(filter).is_none_or(|j| j.is_finished()) {
                    self.start_feeder(s.sub);
                }
                (s.qos, s.ticket)
            }
            Err(r) => {
                reasons.push(format!("{filter}: {}", r.why));
                (r.code, None)
            }
        }
    }

    /// May this client auto-create the stream of `filter` (`create` on the stream name and
    /// `subscribe` on the filter the new stream would capture)?
    pub(super) fn allowed_auto_create(&self, filter: &str) -> bool {
        let auth = self.broker.auth();
        let req = Request {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            ip: self.peer.ip(),
            action: Action::Subscribe,
            topic: filter,
        };
        let d = auth.acl.check_subscribe(&req, true);
        if !d.allowed {
            debug!(topic = filter, decision = %d, "ACL denied stream auto-create");
        }
        d.allowed
    }
}
