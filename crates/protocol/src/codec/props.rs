//! MQTT 5 property identifiers and the table of section 2.2.2.2: which property may appear in
//! which packet, and which may repeat.

pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
pub const CONTENT_TYPE: u8 = 0x03;
pub const RESPONSE_TOPIC: u8 = 0x08;
pub const CORRELATION_DATA: u8 = 0x09;
pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
pub const SERVER_KEEP_ALIVE: u8 = 0x13;
pub const AUTHENTICATION_METHOD: u8 = 0x15;
pub const AUTHENTICATION_DATA: u8 = 0x16;
pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
pub const WILL_DELAY_INTERVAL: u8 = 0x18;
pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
pub const RESPONSE_INFORMATION: u8 = 0x1A;
pub const SERVER_REFERENCE: u8 = 0x1C;
pub const REASON_STRING: u8 = 0x1F;
pub const RECEIVE_MAXIMUM: u8 = 0x21;
pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
pub const TOPIC_ALIAS: u8 = 0x23;
pub const MAXIMUM_QOS: u8 = 0x24;
pub const RETAIN_AVAILABLE: u8 = 0x25;
pub const USER_PROPERTY: u8 = 0x26;
pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

/// The wire type of a property value (section 2.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Byte,
    U16,
    U32,
    VarInt,
    Str,
    Bin,
    Pair,
}

/// The value type of a known property, `None` for an unknown identifier.
pub fn kind(id: u32) -> Option<Kind> {
    let id = u8::try_from(id).ok()?;
    Some(match id {
        PAYLOAD_FORMAT_INDICATOR
        | REQUEST_PROBLEM_INFORMATION
        | REQUEST_RESPONSE_INFORMATION
        | MAXIMUM_QOS
        | RETAIN_AVAILABLE
        | WILDCARD_SUBSCRIPTION_AVAILABLE
        | SUBSCRIPTION_IDENTIFIER_AVAILABLE
        | SHARED_SUBSCRIPTION_AVAILABLE => Kind::Byte,
        SERVER_KEEP_ALIVE | RECEIVE_MAXIMUM | TOPIC_ALIAS_MAXIMUM | TOPIC_ALIAS => Kind::U16,
        MESSAGE_EXPIRY_INTERVAL
        | SESSION_EXPIRY_INTERVAL
        | WILL_DELAY_INTERVAL
        | MAXIMUM_PACKET_SIZE => Kind::U32,
        SUBSCRIPTION_IDENTIFIER => Kind::VarInt,
        CONTENT_TYPE
        | RESPONSE_TOPIC
        | ASSIGNED_CLIENT_IDENTIFIER
        | AUTHENTICATION_METHOD
        | RESPONSE_INFORMATION
        | SERVER_REFERENCE
        | REASON_STRING => Kind::Str,
        CORRELATION_DATA | AUTHENTICATION_DATA => Kind::Bin,
        USER_PROPERTY => Kind::Pair,
        _ => return None,
    })
}

const fn bits(ids: &[u8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < ids.len() {
        m |= 1u64 << ids[i];
        i += 1;
    }
    m
}

/// The set of properties a packet (or the will) may carry, and which of them may repeat.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    pub allowed: u64,
    pub repeatable: u64,
}

const USER: u64 = bits(&[USER_PROPERTY]);

pub const CONNECT: Table = Table {
    allowed: bits(&[
        SESSION_EXPIRY_INTERVAL,
        RECEIVE_MAXIMUM,
        MAXIMUM_PACKET_SIZE,
        TOPIC_ALIAS_MAXIMUM,
        REQUEST_RESPONSE_INFORMATION,
        REQUEST_PROBLEM_INFORMATION,
        USER_PROPERTY,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
    ]),
    repeatable: USER,
};

pub const WILL: Table = Table {
    allowed: bits(&[
        WILL_DELAY_INTERVAL,
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        CONTENT_TYPE,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        USER_PROPERTY,
    ]),
    repeatable: USER,
};

pub const CONNACK: Table = Table {
    allowed: bits(&[
        SESSION_EXPIRY_INTERVAL,
        RECEIVE_MAXIMUM,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        MAXIMUM_PACKET_SIZE,
        ASSIGNED_CLIENT_IDENTIFIER,
        TOPIC_ALIAS_MAXIMUM,
        REASON_STRING,
        USER_PROPERTY,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
        SERVER_KEEP_ALIVE,
        RESPONSE_INFORMATION,
        SERVER_REFERENCE,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
    ]),
    repeatable: USER,
};

pub const PUBLISH: Table = Table {
    allowed: bits(&[
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        TOPIC_ALIAS,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        USER_PROPERTY,
        SUBSCRIPTION_IDENTIFIER,
        CONTENT_TYPE,
    ]),
    repeatable: bits(&[USER_PROPERTY, SUBSCRIPTION_IDENTIFIER]),
};

/// PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK.
pub const ACK: Table = Table {
    allowed: bits(&[REASON_STRING, USER_PROPERTY]),
    repeatable: USER,
};

pub const SUBSCRIBE: Table = Table {
    allowed: bits(&[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY]),
    repeatable: USER,
};

pub const UNSUBSCRIBE: Table = Table {
    allowed: USER,
    repeatable: USER,
};

pub const DISCONNECT: Table = Table {
    allowed: bits(&[
        SESSION_EXPIRY_INTERVAL,
        REASON_STRING,
        USER_PROPERTY,
        SERVER_REFERENCE,
    ]),
    repeatable: USER,
};

pub const AUTH: Table = Table {
    allowed: bits(&[
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
        REASON_STRING,
        USER_PROPERTY,
    ]),
    repeatable: USER,
};

/// Reason codes each MQTT 5 packet may carry (section 2.4 and the packet sections).
pub mod codes {
    pub const CONNACK: &[u8] = &[
        0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
        0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
    ];
    pub const PUBACK: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
    pub const PUBREL: &[u8] = &[0x00, 0x92];
    pub const SUBACK: &[u8] = &[
        0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
    ];
    pub const SUBACK_V311: &[u8] = &[0x00, 0x01, 0x02, 0x80];
    pub const UNSUBACK: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
    pub const DISCONNECT: &[u8] = &[
        0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
        0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
    ];
    pub const AUTH: &[u8] = &[0x00, 0x18, 0x19];
}
