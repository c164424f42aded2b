//! The limits a decoder holds frames to: the broker's own, and those a
//! HELLO reply reports to the client.

use super::PropsLimits;

/// The broker's limits a peer must know: the decoder enforces the sizes,
/// and the HELLO reply reports them all (`crate::limits` has their reasons).
/// A version-1 HELLO reply carries only the first four, one of versions 2
/// to 5 the first twelve; the others read as 0 from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    pub frame_bytes_max: u32,
    pub message_bytes_max: u32,
    pub batch_messages_max: u32,
    pub topic_name_bytes_max: u32,
    /// Most reply bytes waiting for one peer (version 2 reports it).
    pub output_bytes_max: u32,
    /// Most message bytes in one FETCH reply (version 2 reports it).
    pub fetch_bytes_max: u32,
    /// Time a connection may stay silent, ms; 0 never (version 2 reports it).
    pub idle_timeout_ms: u32,
    pub group_name_bytes_max: u32,
    pub tags_per_message_max: u32,
    pub tag_bytes_max: u32,
    pub props_bytes_max: u32,
    pub filter_bytes_max: u32,
    /// Most credit of one push subscription (version 3; the HELLO reply
    /// reports it from version 6): SUBSCRIBE or CREDIT asking for more
    /// gets BAD_ARGUMENT.
    pub subscription_credit_max: u32,
    /// Longest message key, bytes (version 4; reported from version 6).
    pub key_bytes_max: u32,
    /// Longest dedup id, bytes (version 4; reported from version 6).
    pub dedup_id_bytes_max: u32,
    /// Longest NACK reason, bytes (version 4; reported from version 6).
    pub nack_reason_bytes_max: u32,
    /// Most messages one LOOKUP returns (version 4; reported from
    /// version 6).
    pub lookup_results_max: u32,
}

/// The protocol version whose HELLO reply reports the limits of versions
/// 3 and 4 (`subscription_credit_max` to `lookup_results_max`).
pub const SINCE_HELLO_FEATURE_LIMITS: u16 = super::V6;

impl DecodeLimits {
    /// Limits loose enough for any frame a client may receive.
    pub const CLIENT: DecodeLimits = DecodeLimits {
        frame_bytes_max: u32::MAX,
        message_bytes_max: u32::MAX,
        batch_messages_max: u32::MAX,
        topic_name_bytes_max: 1000,
        output_bytes_max: u32::MAX,
        fetch_bytes_max: u32::MAX,
        idle_timeout_ms: 0,
        group_name_bytes_max: 1000,
        tags_per_message_max: u32::MAX,
        tag_bytes_max: u32::MAX,
        props_bytes_max: u32::MAX,
        filter_bytes_max: u32::MAX,
        subscription_credit_max: u32::MAX,
        key_bytes_max: u32::MAX,
        dedup_id_bytes_max: u32::MAX,
        nack_reason_bytes_max: u32::MAX,
        lookup_results_max: u32::MAX,
    };

    /// These limits as a HELLO reply of `version` reports them: version 1
    /// carries the first four, versions 2 to 5 the first twelve, version 6
    /// all; the others read as 0.
    pub fn reported(&self, version: u16) -> DecodeLimits {
        if version >= SINCE_HELLO_FEATURE_LIMITS {
            return *self;
        }
        let v2 = DecodeLimits {
            subscription_credit_max: 0,
            key_bytes_max: 0,
            dedup_id_bytes_max: 0,
            nack_reason_bytes_max: 0,
            lookup_results_max: 0,
            ..*self
        };
        if version >= 2 {
            return v2;
        }
        DecodeLimits {
            output_bytes_max: 0,
            fetch_bytes_max: 0,
            idle_timeout_ms: 0,
            group_name_bytes_max: 0,
            tags_per_message_max: 0,
            tag_bytes_max: 0,
            props_bytes_max: 0,
            filter_bytes_max: 0,
            ..v2
        }
    }

    /// The limits of message properties.
    pub fn props(&self) -> PropsLimits {
        PropsLimits {
            tags_per_message_max: self.tags_per_message_max,
            tag_bytes_max: self.tag_bytes_max,
            props_bytes_max: self.props_bytes_max,
            key_bytes_max: self.key_bytes_max,
        }
    }
}

impl From<&crate::limits::Limits> for DecodeLimits {
    fn from(l: &crate::limits::Limits) -> Self {
        DecodeLimits {
            frame_bytes_max: l.frame_bytes_max,
            message_bytes_max: l.message_bytes_max,
            batch_messages_max: l.batch_messages_max,
            topic_name_bytes_max: l.topic_name_bytes_max,
            output_bytes_max: l.output_bytes_max,
            fetch_bytes_max: l.fetch_bytes_max,
            idle_timeout_ms: l.idle_timeout_ms,
            group_name_bytes_max: l.group_name_bytes_max,
            tags_per_message_max: l.tags_per_message_max,
            tag_bytes_max: l.tag_bytes_max,
            props_bytes_max: l.props_bytes_max,
            filter_bytes_max: l.filter_bytes_max,
            subscription_credit_max: l.subscription_credit_max,
            key_bytes_max: l.key_bytes_max,
            dedup_id_bytes_max: l.dedup_id_bytes_max,
            nack_reason_bytes_max: l.nack_reason_bytes_max,
            lookup_results_max: l.lookup_results_max,
        }
    }
}
