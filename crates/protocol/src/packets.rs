//! Packet types shared by MQTT 3.1.1 and MQTT 5.
//!
//! Optional MQTT 5 properties are `Option`s (absent on the wire when `None`); user properties
//! keep their order and duplicates, as the specification requires (3.3.2.3.7).

use bytes::Bytes;

/// The protocol level carried in CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1 (protocol name `MQIsdp`, level 3); handled with 3.1.1 semantics.
    V31,
    /// MQTT 3.1.1 (level 4).
    V311,
    /// MQTT 5.0 (level 5).
    V5,
}

impl ProtocolVersion {
    pub fn is_v5(self) -> bool {
        matches!(self, ProtocolVersion::V5)
    }
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V31 => 3,
            ProtocolVersion::V311 => 4,
            ProtocolVersion::V5 => 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

pub type UserProperties = Vec<(String, String)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(PubResp),
    PubRec(PubResp),
    PubRel(PubResp),
    PubComp(PubResp),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    Auth(Auth),
}

impl Packet {
    /// The control packet type number (1..=15) of the fixed header.
    pub fn type_id(&self) -> u8 {
        match self {
            Packet::Connect(_) => 1,
            Packet::ConnAck(_) => 2,
            Packet::Publish(_) => 3,
            Packet::PubAck(_) => 4,
            Packet::PubRec(_) => 5,
            Packet::PubRel(_) => 6,
            Packet::PubComp(_) => 7,
            Packet::Subscribe(_) => 8,
            Packet::SubAck(_) => 9,
            Packet::Unsubscribe(_) => 10,
            Packet::UnsubAck(_) => 11,
            Packet::PingReq => 12,
            Packet::PingResp => 13,
            Packet::Disconnect(_) => 14,
            Packet::Auth(_) => 15,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub protocol: ProtocolVersion,
    pub clean_start: bool,
    pub keep_alive: u16,
    pub client_id: String,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    pub properties: ConnectProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub user_properties: UserProperties,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: WillProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAck {
    pub session_present: bool,
    /// MQTT 5 reason code; for 3.1.1 the encoder maps it with [`crate::reason::connack_v311`].
    pub reason_code: u8,
    pub properties: ConnAckProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_qos: Option<u8>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// May be empty in MQTT 5 when a topic alias is used.
    pub topic: String,
    /// 0 for QoS 0.
    pub packet_id: u16,
    pub properties: PublishProperties,
    pub payload: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishProperties {
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
    /// Server to client only; may repeat.
    pub subscription_identifiers: Vec<u32>,
    pub content_type: Option<String>,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PubResp {
    pub packet_id: u16,
    pub reason_code: u8,
    pub properties: AckProperties,
}

impl PubResp {
    pub fn new(packet_id: u16, reason_code: u8) -> PubResp {
        PubResp {
            packet_id,
            reason_code,
            properties: AckProperties::default(),
        }
    }
}

/// Reason string and user properties: the properties of PUBACK..PUBCOMP, SUBACK and UNSUBACK.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckProperties {
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    /// 0: send retained on subscribe, 1: only if the subscription is new, 2: never.
    pub retain_handling: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: String,
    pub options: SubscriptionOptions,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscribe {
    pub packet_id: u16,
    pub filters: Vec<SubscribeFilter>,
    pub properties: SubscribeProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscribeProperties {
    pub subscription_identifier: Option<u32>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubAck {
    pub packet_id: u16,
    /// One per filter: granted QoS (0..=2) or a failure code (>= 0x80; 3.1.1 only knows 0x80).
    pub reason_codes: Vec<u8>,
    pub properties: AckProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub filters: Vec<String>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnsubAck {
    pub packet_id: u16,
    /// MQTT 5 only: one per filter. Not encoded for 3.1.1.
    pub reason_codes: Vec<u8>,
    pub properties: AckProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Disconnect {
    pub reason_code: u8,
    pub properties: DisconnectProperties,
}

impl Disconnect {
    pub fn new(reason_code: u8) -> Disconnect {
        Disconnect {
            reason_code,
            properties: DisconnectProperties::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DisconnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
    pub server_reference: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    pub reason_code: u8,
    pub properties: AuthProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthProperties {
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}
