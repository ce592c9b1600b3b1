//! The start of a broker on an existing data directory: [`Broker::restore`] rebuilds sessions,
//! subscriptions, queues, inflight state, stream subscriptions and retained messages from the
//! index (`persist.rs`'s `b_*` trees and the queue journal), then replays the log from the
//! index watermark through [`Broker::deliver`] so nothing a client was told was stored is
//! missing. Runs once, blocking, before any listener accepts.
//!
//! Invariant: a message the index already recorded as routed (a `Routed` marker, a queue
//! entry) is not applied twice — `replay_offsets` skips it during the replay.

use crate::broker::Broker;
use crate::message::{Delivery, Message, NOT_STORED};
use crate::persist::Op;
use crate::router::Subscriber;
use crate::session::Session;
use crate::session::Spilled;
use lanemq_protocol::QoS;
use lanemq_store::RecordIn;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tracing::warn;

/// What [`Broker::restore`] found, for the log line and for the timers to start.
#[derive(Default)]
pub struct Restored {
    pub sessions: usize,
    pub sessions_expired: usize,
    pub queued: usize,
    pub retained: usize,
    pub replayed: u64,
    /// Offline sessions and the seconds left before they expire (u32::MAX: never).
    pub expiries: Vec<(Arc<Session>, u32)>,
    /// Pending wills: (client, message, seconds until due).
    pub wills: Vec<(Arc<str>, Message, u64)>,
}

impl Broker {
    /// Rebuild sessions, subscriptions, queues, inflight state and retained messages from the
    /// index, then replay the log from the index watermark. Blocking; run before listening.
    pub fn restore(self: &Arc<Self>) -> Result<Restored, crate::persist::PersistError> {
        use crate::persist::record_pid;
        use crate::session::{Inflight, InflightStage, Subscription};
        use crate::sub_codec::decode_sub;
        let p = self.persist.clone();
        let mut out = Restored::default();
        let now = crate::message::now_us();
        // Retained messages.
        for (topic, offset, carried) in p.load_retained()? {
            if let Some(r) = carried {
                let m = crate::persist::carried_message(&r, offset);
                self.retained
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(topic.into(), Arc::new(m));
                out.retained += 1;
                continue;
            }
            match p.store.read(offset) {
                Ok(r) => {
                    let m = Message::from_record(&r);
                    self.retained
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(topic.into(), Arc::new(m));
                    out.retained += 1;
                }
                Err(e) => {
                    warn!(%topic, offset, error = %e, "retained message not in the log; dropped")
                }
            }
        }
        // Sessions.
        let wills: HashMap<String, RecordIn> = p.load_wills()?.into_iter().collect();
        for (client, meta) in p.load_sessions()? {
            let away_s = if meta.disconnected_at_us == 0 {
                0
            } else {
                now.saturating_sub(meta.disconnected_at_us) / 1_000_000
            };
            let will = wills.get(&client);
            if meta.expiry_s != u32::MAX && away_s >= u64::from(meta.expiry_s) {
                p.remove_session_now(&client)?;
                out.sessions_expired += 1;
                if let Some(w) = will {
                    out.wills.push((client.as_str().into(), will_message(w), 0));
                }
                continue;
            }
            let left = if meta.expiry_s == u32::MAX {
                u32::MAX
            } else {
                meta.expiry_s - away_s as u32
            };
            let protocol = match meta.protocol {
                5 => lanemq_protocol::ProtocolVersion::V5,
                3 => lanemq_protocol::ProtocolVersion::V31,
                _ => lanemq_protocol::ProtocolVersion::V311,
            };
            let client_id: Arc<str> = client.as_str().into();
            let session = Arc::new(Session::new(
                client_id.clone(),
                protocol,
                self.queue_limits(),
            ));
            let subs = p.load_subs(&client)?;
            let queue = p.load_queue(&client)?;
            let inflight: HashMap<u64, (u16, u8)> = p
                .load_inflight(&client)?
                .into_iter()
                .map(|(pid, seq, stage)| (seq, (pid, stage)))
                .collect();
            let inbound = p.load_inbound(&client)?;
            let queued_seqs: HashSet<u64> = queue.iter().map(|q| q.seq).collect();
            for (&seq, &(pid, _)) in &inflight {
                if !queued_seqs.contains(&seq) {
                    // Its delivery finished just before a crash: forget the stale state.
                    p.submit(Op::InflightRemove {
                        client: client_id.clone(),
                        pid,
                    });
                }
            }
            let max_seq = queue
                .iter()
                .map(|q| q.seq)
                .chain(inflight.keys().copied())
                .max()
                .unwrap_or(0);
            {
                let mut st = session.lock();
                st.expiry_s = meta.expiry_s;
                st.next_seq = max_seq + 1;
                let mut seen = HashSet::new();
                for (filter, v) in &subs {
                    let (options, sub_id) = decode_sub(v);
                    st.subscriptions
                        .insert(filter.clone(), Subscription { options, sub_id });
                }
                let (first, end) = (p.store.first_offset(), p.store.committed_offset());
                for row in queue {
                    let crate::persist::QueuedRow {
                        seq,
                        offset,
                        qos,
                        retain,
                        carried,
                    } = row;
                    st.next_seq = st.next_seq.max(seq + 1);
                    if carried.is_none() && (offset < first || offset >= end) {
                        warn!(%client, offset, "queued message not in the log; dropped");
                        p.submit(Op::QueueRemove {
                            client: client_id.clone(),
                            seq,
                        });
                        continue;
                    }
                    seen.insert(offset);
                    let qos = QoS::from_u8(qos).unwrap_or(QoS::AtLeastOnce);
                    let Some(&(pid, stage)) = inflight.get(&seq) else {
                        // Not sent yet: a log position, read when the client takes it.
                        st.spilled
                            .push_back(Spilled::restored(offset, seq, qos, retain));
                        out.queued += 1;
                        continue;
                    };
                    let msg = match carried {
                        Some(r) => Arc::new(crate::persist::carried_message(&r, offset)),
                        None => match p.store.read(offset) {
                            Ok(r) => Arc::new(Message::from_record(&r)),
                            Err(e) => {
                                warn!(%client, offset, error = %e, "queued message not in the log; dropped");
                                continue;
                            }
                        },
                    };
                    let d = Delivery {
                        msg,
                        qos,
                        retain,
                        sub_ids: Vec::new(),
                        share: None,
                        seq,
                        stream: None,
                        lane: None,
                    };
                    let stage = match stage {
                        1 => InflightStage::PubAck,
                        2 => InflightStage::PubRec,
                        _ => InflightStage::PubComp,
                    };
                    st.pids_in_use.insert(pid);
                    st.inflight.push_back(Inflight {
                        packet_id: pid,
                        stage,
                        delivery: d,
                    });
                    out.queued += 1;
                }
                for (pid, _offset, received) in &inbound {
                    if *received {
                        st.inbound_qos2.insert(*pid);
                    }
                }
                st.replay_offsets = Some(Box::new(seen));
                for (filter, s) in p.load_stream_subs(&client)? {
                    st.stream_subs.insert(
                        filter.clone(),
                        crate::stream_sub::StreamSub::restored(filter, s),
                    );
                }
            }
            // Subscriptions go into the router (lock order: router after the session lock
            // was released).
            for (filter, v) in &subs {
                let (options, sub_id) = decode_sub(v);
                if crate::sub_codec::is_lane_replay(v) {
                    if let Some((parent, sel)) = self.lite.lane_filter(filter) {
                        // A private one-lane replay: it goes on from its stored position.
                        self.lite
                            .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                                session: session.clone(),
                                filter: filter.clone(),
                                group: None,
                                parent,
                                sel,
                                inner: filter.clone(),
                                qos: options.qos.min(QoS::AtLeastOnce),
                                sub_id,
                                start: None,
                                stored: true,
                            })));
                        continue;
                    }
                }
                self.add_subscription(
                    &session,
                    filter,
                    Subscriber {
                        session: session.clone(),
                        options,
                        sub_id,
                    },
                );
            }
            self.sessions_lock()
                .insert(client_id.clone(), session.clone());
            if let Some(w) = will {
                let delay = u64::from(meta.will_delay_s.min(left));
                let due = if meta.disconnected_at_us == 0 {
                    delay
                } else {
                    delay.saturating_sub(away_s)
                };
                out.wills.push((client_id.clone(), will_message(w), due));
            }
            out.expiries.push((session, left));
            out.sessions += 1;
        }
        // Replay what the index may not have: records after the watermark.
        let inbound_state: Mutex<HashMap<(String, u16), u64>> = Mutex::new(HashMap::new());
        for s in self.sessions_lock().values() {
            for (pid, offset, _) in p.load_inbound(&s.client_id)? {
                inbound_state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((s.client_id.to_string(), pid), offset);
            }
        }
        // The index thread runs from here on; a low-watermark cell keeps it from moving the
        // watermark past records not replayed yet.
        let from = p.index.watermark()?.max(p.store.first_offset());
        let low = p.register_low();
        low.store(from, Ordering::SeqCst);
        p.start();
        let end = p.store.committed_offset();
        let mut reader = p.store.reader(from);
        let mut replayed = 0u64;
        'replay: loop {
            let batch = reader.next_batch(1024, 4 << 20)?;
            if batch.is_empty() {
                break;
            }
            for r in &batch {
                if r.offset >= end {
                    break 'replay;
                }
                low.store(r.offset, Ordering::SeqCst);
                replayed += 1;
                if p.is_routed(r.offset)? {
                    continue;
                }
                if let (2, Some(pid)) = (r.qos, record_pid(r)) {
                    if let Some(s) = self.get_session(&r.client_id) {
                        let key = (r.client_id.clone(), pid);
                        let mut known = inbound_state.lock().unwrap_or_else(|e| e.into_inner());
                        if known.get(&key).is_none_or(|&o| o < r.offset) {
                            known.insert(key, r.offset);
                            s.lock().inbound_qos2.insert(pid);
                            p.submit(Op::InboundAdd {
                                client: s.client_id.clone(),
                                pid,
                                offset: r.offset,
                            });
                        }
                    }
                }
                self.deliver(Arc::new(Message::from_record(r)));
            }
        }
        drop(low);
        out.replayed = replayed;
        for s in self.sessions_lock().values() {
            s.lock().replay_offsets = None;
        }
        Ok(out)
    }
}

fn will_message(r: &RecordIn) -> Message {
    let mut m = Message::new(
        r.topic.clone(),
        r.payload.clone(),
        QoS::from_u8(r.qos).unwrap_or(QoS::AtMostOnce),
        r.retain,
        crate::message::from_store_properties(&r.properties),
        r.client_id.clone(),
    );
    m.offset = NOT_STORED;
    m
}
