//! The stored form of a subscription's options: 6 bytes (QoS, flags, subscription
//! identifier), kept in the index for every persistent subscription and inside a stored
//! stream subscription. Low level: imports nothing of the crate.

use lanemq_protocol::QoS;

/// A subscription's persisted value.
pub fn encode_sub(o: &lanemq_protocol::SubscriptionOptions, sub_id: Option<u32>) -> [u8; 6] {
    let flags = u8::from(o.no_local)
        | (u8::from(o.retain_as_published) << 1)
        | ((o.retain_handling & 3) << 2);
    let id = sub_id.unwrap_or(0).to_be_bytes();
    [o.qos.as_u8(), flags, id[0], id[1], id[2], id[3]]
}

/// Flag bit (in the flags byte of a stored subscription) of a private one-lane replay
/// (a plain subscription with `lane-offset`): restored as a replay, not into the router.
pub const SUB_FLAG_LANE_REPLAY: u8 = 0x10;

/// Is the stored subscription `v` a private one-lane replay?
pub fn is_lane_replay(v: &[u8; 6]) -> bool {
    v[1] & SUB_FLAG_LANE_REPLAY != 0
}

pub fn decode_sub(v: &[u8; 6]) -> (lanemq_protocol::SubscriptionOptions, Option<u32>) {
    let o = lanemq_protocol::SubscriptionOptions {
        qos: QoS::from_u8(v[0]).unwrap_or(QoS::AtMostOnce),
        no_local: v[1] & 1 != 0,
        retain_as_published: v[1] & 2 != 0,
        retain_handling: (v[1] >> 2) & 3,
    };
    let id = u32::from_be_bytes([v[2], v[3], v[4], v[5]]);
    (o, (id != 0).then_some(id))
}
