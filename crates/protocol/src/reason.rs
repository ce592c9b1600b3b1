//! MQTT 5 reason codes (section 2.4) and their MQTT 3.1.1 CONNACK return-code equivalents.

pub const SUCCESS: u8 = 0x00;
pub const NORMAL_DISCONNECTION: u8 = 0x00;
pub const GRANTED_QOS_0: u8 = 0x00;
pub const GRANTED_QOS_1: u8 = 0x01;
pub const GRANTED_QOS_2: u8 = 0x02;
pub const DISCONNECT_WITH_WILL: u8 = 0x04;
pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
pub const CONTINUE_AUTHENTICATION: u8 = 0x18;
pub const RE_AUTHENTICATE: u8 = 0x19;
pub const UNSPECIFIED_ERROR: u8 = 0x80;
pub const MALFORMED_PACKET: u8 = 0x81;
pub const PROTOCOL_ERROR: u8 = 0x82;
pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
pub const UNSUPPORTED_PROTOCOL_VERSION: u8 = 0x84;
pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
pub const NOT_AUTHORIZED: u8 = 0x87;
pub const SERVER_UNAVAILABLE: u8 = 0x88;
pub const SERVER_BUSY: u8 = 0x89;
pub const BANNED: u8 = 0x8A;
pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
pub const SESSION_TAKEN_OVER: u8 = 0x8E;
pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
pub const TOPIC_NAME_INVALID: u8 = 0x90;
pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
pub const PACKET_TOO_LARGE: u8 = 0x95;
pub const MESSAGE_RATE_TOO_HIGH: u8 = 0x96;
pub const QUOTA_EXCEEDED: u8 = 0x97;
pub const ADMINISTRATIVE_ACTION: u8 = 0x98;
pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
pub const RETAIN_NOT_SUPPORTED: u8 = 0x9A;
pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
pub const USE_ANOTHER_SERVER: u8 = 0x9C;
pub const SERVER_MOVED: u8 = 0x9D;
pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
pub const CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: u8 = 0xA1;
pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0xA2;

/// MQTT 3.1.1 CONNACK return codes (section 3.2.2.3).
pub mod v311 {
    pub const ACCEPTED: u8 = 0x00;
    pub const UNACCEPTABLE_PROTOCOL_VERSION: u8 = 0x01;
    pub const IDENTIFIER_REJECTED: u8 = 0x02;
    pub const SERVER_UNAVAILABLE: u8 = 0x03;
    pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x04;
    pub const NOT_AUTHORIZED: u8 = 0x05;
}

/// The MQTT 3.1.1 CONNACK return code closest to an MQTT 5 CONNACK reason code.
pub fn connack_v311(code: u8) -> u8 {
    match code {
        SUCCESS => v311::ACCEPTED,
        UNSUPPORTED_PROTOCOL_VERSION => v311::UNACCEPTABLE_PROTOCOL_VERSION,
        CLIENT_IDENTIFIER_NOT_VALID => v311::IDENTIFIER_REJECTED,
        BAD_USER_NAME_OR_PASSWORD | BAD_AUTHENTICATION_METHOD => v311::BAD_USER_NAME_OR_PASSWORD,
        NOT_AUTHORIZED | BANNED => v311::NOT_AUTHORIZED,
        _ => v311::SERVER_UNAVAILABLE,
    }
}

/// A short human-readable name, used in logs and reason strings.
pub fn name(code: u8) -> &'static str {
    match code {
        0x00 => "success",
        0x01 => "granted QoS 1",
        0x02 => "granted QoS 2",
        0x04 => "disconnect with will message",
        0x10 => "no matching subscribers",
        0x11 => "no subscription existed",
        0x18 => "continue authentication",
        0x19 => "re-authenticate",
        0x80 => "unspecified error",
        0x81 => "malformed packet",
        0x82 => "protocol error",
        0x83 => "implementation specific error",
        0x84 => "unsupported protocol version",
        0x85 => "client identifier not valid",
        0x86 => "bad user name or password",
        0x87 => "not authorized",
        0x88 => "server unavailable",
        0x89 => "server busy",
        0x8A => "banned",
        0x8B => "server shutting down",
        0x8C => "bad authentication method",
        0x8D => "keep alive timeout",
        0x8E => "session taken over",
        0x8F => "topic filter invalid",
        0x90 => "topic name invalid",
        0x91 => "packet identifier in use",
        0x92 => "packet identifier not found",
        0x93 => "receive maximum exceeded",
        0x94 => "topic alias invalid",
        0x95 => "packet too large",
        0x96 => "message rate too high",
        0x97 => "quota exceeded",
        0x98 => "administrative action",
        0x99 => "payload format invalid",
        0x9A => "retain not supported",
        0x9B => "QoS not supported",
        0x9C => "use another server",
        0x9D => "server moved",
        0x9E => "shared subscriptions not supported",
        0x9F => "connection rate exceeded",
        0xA0 => "maximum connect time",
        0xA1 => "subscription identifiers not supported",
        0xA2 => "wildcard subscriptions not supported",
        _ => "unknown reason code",
    }
}
