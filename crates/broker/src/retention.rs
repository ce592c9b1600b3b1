//! Log retention: whole segments go when `storage.retention_max_bytes` /
//! `retention_max_age_s` ask for it, and what still refers to them is carried first, so a
//! retained status published once, or a message queued for a session that stays away, never
//! keeps the log from shrinking.
//!
//! Every `storage.retention_interval_s`, and as soon as the log is past a limit (checked every
//! 200 ms), [`Retention::run_once`]:
//! 1. asks the store how far the limits want to cut (`Store::retention_cut`); when that is
//!    not past the previous cut, it only deletes (step 4);
//! 2. raises the carry floor to the cut: from then on a queue entry or a spilled delivery
//!    that refers to a record below it keeps its own copy of the message
//!    (`Persist::carry_floor`);
//! 3. carries every retained message and every persisted queue entry (queued, inflight,
//!    spilled) whose record lies between the previous cut and this one: the record is copied
//!    into its sled value (`Op::RetainCarry`, `Op::QueueCarry`); a spilled delivery of a
//!    session that is not persisted keeps the message in memory instead;
//! 4. waits until those ops are flushed, then deletes the segments below
//!    `min(cut, index watermark, the streams' lowest referenced offset)`.
//!
//! Invariants:
//! - a segment is deleted only after every reference into it from a retained message or a
//!   session queue is durable elsewhere (the carry ops are flushed before the delete);
//! - a carry op rewrites a value only if it still refers to the same record, so a carry
//!   never brings back an entry that was delivered or replaced meanwhile;
//! - last-value streams keep their own copies already; regular named streams and lanes are
//!   not carried: their data *is* the log, bounded by their own retention (a regular stream
//!   still pins the log until its entries expire).

use crate::broker::Broker;
use crate::message::Message;
use crate::persist::{record_in, Op};
use crate::session::Session;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How often the log's size is compared with the limits between two passes.
const CHECK_MS: u64 = 200;

/// What one carry pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CarryReport {
    /// Retained messages copied into the index.
    pub retained: u64,
    /// Persisted queue entries copied into the index.
    pub queued: u64,
    /// Spilled deliveries of non-persistent sessions that now hold their message in memory.
    pub in_memory: u64,
    /// Payload bytes copied.
    pub bytes: u64,
}

/// Retention state kept between passes.
#[derive(Debug)]
pub struct Retention {
    /// Every reference below this offset is carried (or its record is gone).
    carried_to: u64,
}

impl Retention {
    pub fn new(broker: &Broker) -> Retention {
        Retention {
            carried_to: broker.persist.store.first_offset(),
        }
    }

    /// One pass (blocking: file reads, waits for the index thread).
    pub fn run_once(&mut self, broker: &Broker) {
        let p = &broker.persist;
        let now = crate::message::now_us();
        let cut = p.store.retention_cut(now);
        if cut > self.carried_to {
            p.raise_carry_floor(cut);
            let report = carry(broker, self.carried_to, cut);
            // Wait until every carry op (and everything before it) is flushed.
            let done = Arc::new(crate::waker::ConnWaker::new());
            let ticket = p.submit(Op::Wake(done.clone()));
            while p.flushed() < ticket {
                if p.is_failed() {
                    warn!("log retention: the index failed, nothing deleted");
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            self.carried_to = cut;
            if report != CarryReport::default() {
                info!(
                    retained = report.retained,
                    queued = report.queued,
                    in_memory = report.in_memory,
                    bytes = report.bytes,
                    below = cut,
                    "log retention: messages carried out of old segments"
                );
            }
        }
        let watermark = p.index.watermark().unwrap_or(0);
        // Streams pin what they still index (and what they have not indexed yet).
        let streams = broker.streams.min_referenced_offset();
        match p
            .store
            .apply_retention(now, self.carried_to.min(watermark).min(streams))
        {
            Ok(r) => debug!(report = ?r, "log retention"),
            Err(e) => warn!(error = %e, "log retention failed"),
        }
    }
}

/// Carry every reference to a record in `[from, to)` (see the module doc, step 3).
pub fn carry(broker: &Broker, from: u64, to: u64) -> CarryReport {
    let p = &broker.persist;
    let mut report = CarryReport::default();
    let inside = |o: u64| o >= from && o < to;
    for (topic, m) in broker.retained_snapshot() {
        if inside(m.offset) {
            report.retained += 1;
            report.bytes += m.payload.len() as u64;
            p.submit(Op::RetainCarry {
                topic,
                offset: m.offset,
                record: Box::new(record_in(&m, None)),
            });
        }
    }
    for s in broker.sessions_snapshot() {
        carry_session(broker, &s, &inside, &mut report);
    }
    report
}

fn carry_session(
    broker: &Broker,
    s: &Session,
    inside: &dyn Fn(u64) -> bool,
    report: &mut CarryReport,
) {
    let p = &broker.persist;
    // Deliveries in memory: copy the message into the index (persisted entries only).
    let to_read: Vec<(u64, u64)> = {
        let st = s.lock();
        for d in st
            .queue
            .iter()
            .chain(st.inflight.iter().map(|i| &i.delivery))
        {
            if d.seq != 0 && inside(d.msg.offset) {
                report.queued += 1;
                report.bytes += d.msg.payload.len() as u64;
                p.submit(Op::QueueCarry {
                    client: s.client_id.clone(),
                    seq: d.seq,
                    offset: d.msg.offset,
                    record: Box::new(record_in(&d.msg, None)),
                });
            }
        }
        st.spilled
            .keys()
            .filter(|&(offset, _, carried)| !carried && inside(offset))
            .map(|(offset, seq, _)| (seq, offset))
            .collect()
    };
    if to_read.is_empty() {
        return;
    }
    // Spilled deliveries: read their records now, without the session lock. A persisted
    // entry is carried into the index whatever happened to it meanwhile (the op checks that
    // it still refers to this record); one of a non-persistent session keeps its message in
    // memory if it is still spilled.
    let mut keep: HashMap<u64, Arc<Message>> = HashMap::new();
    for (seq, offset) in to_read {
        let m = match p.store.read(offset) {
            Ok(r) => Arc::new(Message::from_record(&r)),
            Err(e) => {
                warn!(client = %s.client_id, offset, error = %e, "log retention: queued message not in the log");
                continue;
            }
        };
        report.bytes += m.payload.len() as u64;
        if seq == 0 {
            keep.insert(offset, m);
        } else {
            report.queued += 1;
            p.submit(Op::QueueCarry {
                client: s.client_id.clone(),
                seq,
                offset,
                record: Box::new(record_in(&m, None)),
            });
        }
    }
    if keep.is_empty() {
        return;
    }
    let mut st = s.lock();
    report.in_memory += st
        .spilled
        .carry_unpersisted(|offset| keep.get(&offset).cloned());
}

/// Run [`Retention::run_once`] every `storage.retention_interval_s`, and sooner when the
/// log has grown past a limit (checked every [`CHECK_MS`]: a burst of traffic would otherwise
/// overshoot `retention_max_bytes` by what arrives in one interval).
pub fn spawn(broker: Arc<Broker>) {
    let every = Duration::from_secs(broker.config.storage.retention_interval_s);
    tokio::spawn(async move {
        let mut state = Retention::new(&broker);
        let mut last = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(CHECK_MS).min(every));
        tick.tick().await;
        loop {
            tick.tick().await;
            if broker.is_shutting_down() {
                return;
            }
            let over =
                broker.persist.store.retention_cut(crate::message::now_us()) > state.carried_to;
            if !over && last.elapsed() < every {
                continue;
            }
            last = tokio::time::Instant::now();
            let b = broker.clone();
            match tokio::task::spawn_blocking(move || {
                state.run_once(&b);
                state
            })
            .await
            {
                Ok(s) => state = s,
                Err(_) => return,
            }
        }
    });
}
