//! Every bound the broker enforces, in one place.
//!
//! TigerBeetle's rule: put a limit on everything. Each field here has a
//! default, a `runnel serve` flag (the field name with `_` turned into `-`)
//! and a reason. `Limits::check` verifies the relations between them at
//! start-up, so a configuration that could never work is refused before the
//! broker opens a socket.

/// The bounds of one broker. Units are last in every name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame a client may send, header included. Bounds the input
    /// buffer of one connection; a batch must fit in one frame.
    pub frame_bytes_max: u32,
    /// Largest payload of one message. Bounds what one slot can pin.
    pub message_bytes_max: u32,
    /// Most messages in one PRODUCE batch, and most ids in one ACK, NACK or
    /// TOUCH. Bounds the work one frame can ask for within a loop turn.
    pub batch_messages_max: u32,
    /// Longest topic name, not counting a dead-letter topic's `.dlq`
    /// suffix. Names are stored per topic and echoed in every FETCH reply.
    pub topic_name_bytes_max: u32,
    /// Most topics, dead-letter topics not counted (each topic has at most
    /// one). Bounds the topic table and the STATS reply.
    pub topics_max: u32,
    /// Most unacknowledged messages one topic may hold (ready, in flight or
    /// delayed). A produce past it gets QUEUE_FULL: backpressure, not
    /// unbounded memory.
    pub topic_messages_max: u64,
    /// Most payload bytes one topic may hold unacknowledged. As above, in
    /// bytes, because a few large messages can exhaust memory too.
    pub topic_bytes_max: u64,
    /// Most simultaneous client connections. Each costs a slab entry and two
    /// buffers; the next connection is told TOO_MANY_CONNECTIONS and closed.
    pub connections_max: u32,
    /// Most reply bytes waiting for one peer. Once half of it waits, the
    /// broker reads no more of the peer's requests until it reads; a peer
    /// that leaves that half unread for frame_timeout_ms, or passes the
    /// whole, is disconnected. So a peer that stops reading cannot make the
    /// broker buffer without end, and one that pipelines and reads is never
    /// cut off.
    pub output_bytes_max: u32,
    /// Most bytes all client connections' buffers may take together: their
    /// partial requests and unread replies, counted by the capacity of the
    /// buffers. `output_bytes_max` and `frame_bytes_max` bound one
    /// connection, not their sum; past this, the broker reads no more from
    /// the connections that hold the most and answers requests with large
    /// replies BUSY, so peers that do not read cannot take the machine's
    /// memory between them.
    pub buffered_bytes_max: u64,
    /// Most bytes of messages in one FETCH reply (a FETCH asking for more is
    /// clamped). Must fit in `output_bytes_max`.
    pub fetch_bytes_max: u32,
    /// Longest long-poll wait a FETCH may ask for; longer waits are clamped.
    pub fetch_wait_ms_max: u32,
    /// Most timers the broker holds: one per message in flight or
    /// NACK-delayed, and one per parked FETCH, over all topics. Bounds the
    /// timing wheel and the in-flight tables (some 110 bytes a timer: the
    /// default is about 1 GiB); a FETCH that would need more is delivered
    /// fewer messages, or answered BUSY when there is room for none. A
    /// `u32`, as the wheel's links are (`wheel::TIMERS_MAX`).
    pub timers_max: u32,
    /// Most bytes read from one connection in one loop turn before the loop
    /// moves on to the others: fairness, so one fast producer cannot starve
    /// every other connection.
    pub read_bytes_per_turn_max: u32,
    /// Time a new connection has to complete HELLO. Bounds how long a
    /// connection that never speaks the protocol holds a slot.
    pub handshake_timeout_ms: u32,
    /// Time a connection may stay silent (no request, no parked FETCH)
    /// before it is closed; 0 never. Reclaims slots of vanished peers.
    pub idle_timeout_ms: u32,
    /// Time a frame may stay incomplete (slowloris): a peer that trickles a
    /// frame slower than this is closed.
    pub frame_timeout_ms: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            frame_bytes_max: 8 << 20,
            message_bytes_max: 1 << 20,
            batch_messages_max: 8192,
            topic_name_bytes_max: 200,
            topics_max: 10_000,
            topic_messages_max: 10_000_000,
            topic_bytes_max: 1 << 30,
            connections_max: 10_000,
            output_bytes_max: 32 << 20,
            buffered_bytes_max: 256 << 20,
            fetch_bytes_max: 8 << 20,
            fetch_wait_ms_max: 300_000,
            timers_max: 10_000_000,
            read_bytes_per_turn_max: 1 << 20,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 600_000,
            frame_timeout_ms: 30_000,
        }
    }
}

/// Bytes a frame header takes (see docs/protocol.md).
pub const FRAME_HEADER_BYTES: u32 = 12;
/// Bytes a PRODUCE body needs besides its topic name and payloads: the
/// topic length, the count and each message's length field.
const PRODUCE_OVERHEAD_BYTES: u64 = 2 + 4;
/// Bytes each message adds to a FETCH reply besides its payload, at most
/// (with the dead-letter fields): the wire layout's own count.
pub const FETCH_MESSAGE_OVERHEAD_BYTES: u32 = crate::codec::message_wire_bytes(0, true) as u32;

impl Limits {
    /// Checks that the limits can work together. Returns a sentence naming
    /// the two limits that clash.
    pub fn check(&self) -> Result<(), String> {
        let one_message_frame = u64::from(FRAME_HEADER_BYTES)
            + PRODUCE_OVERHEAD_BYTES
            + u64::from(self.topic_name_bytes_max)
            + 4
            + u64::from(self.message_bytes_max);
        if u64::from(self.frame_bytes_max) < one_message_frame {
            return Err(format!(
                "frame-bytes-max ({}) must hold one message of message-bytes-max ({}) with its header ({} bytes)",
                self.frame_bytes_max, self.message_bytes_max, one_message_frame
            ));
        }
        if self.fetch_bytes_max < self.message_bytes_max {
            return Err(format!(
                "fetch-bytes-max ({}) must be at least message-bytes-max ({}), or a large message could never be fetched",
                self.fetch_bytes_max, self.message_bytes_max
            ));
        }
        let largest_reply = u64::from(self.fetch_bytes_max)
            + u64::from(FETCH_MESSAGE_OVERHEAD_BYTES) * u64::from(self.batch_messages_max)
            + u64::from(self.topic_name_bytes_max)
            + 64;
        // Reading pauses at half the limit, and one more reply may follow.
        if u64::from(self.output_bytes_max) < 2 * largest_reply {
            return Err(format!(
                "output-bytes-max ({}) must hold twice the largest FETCH reply ({} bytes, from fetch-bytes-max and batch-messages-max)",
                self.output_bytes_max, largest_reply
            ));
        }
        // Output capacity grows by doubling over at most twice the pending
        // bytes (written bytes are dropped once they outnumber the rest), and
        // input over one frame: what one connection at its limits can hold.
        let one_connection = 4 * u64::from(self.output_bytes_max) + 2 * u64::from(self.frame_bytes_max);
        if self.buffered_bytes_max < one_connection {
            return Err(format!(
                "buffered-bytes-max ({}) must hold the buffers of one connection at its limits ({} bytes: 4 x output-bytes-max + 2 x frame-bytes-max), or a lone client could be refused",
                self.buffered_bytes_max, one_connection
            ));
        }
        if self.batch_messages_max == 0 || self.topics_max == 0 || self.connections_max == 0 {
            return Err("batch-messages-max, topics-max and connections-max must be at least 1".into());
        }
        if self.topic_name_bytes_max == 0 || self.topic_name_bytes_max > 1000 {
            return Err("topic-name-bytes-max must be between 1 and 1000".into());
        }
        if self.topic_messages_max == 0 || self.topic_bytes_max == 0 {
            return Err("topic-messages-max and topic-bytes-max must be at least 1".into());
        }
        if u64::from(self.message_bytes_max) > self.topic_bytes_max {
            return Err(format!(
                "topic-bytes-max ({}) must hold one message of message-bytes-max ({})",
                self.topic_bytes_max, self.message_bytes_max
            ));
        }
        if self.handshake_timeout_ms == 0 || self.frame_timeout_ms == 0 {
            return Err("handshake-timeout-ms and frame-timeout-ms must be at least 1".into());
        }
        if self.timers_max == 0 {
            return Err("timers-max must be at least 1".into());
        }
        if self.read_bytes_per_turn_max < 4096 {
            return Err("read-bytes-per-turn-max must be at least 4096".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consistent() {
        assert_eq!(Limits::default().check(), Ok(()));
    }

    #[test]
    fn clashing_limits_are_named() {
        let limits = Limits { frame_bytes_max: 1024, ..Limits::default() };
        let err = limits.check().unwrap_err();
        assert!(err.contains("frame-bytes-max"), "{err}");
        let limits = Limits { output_bytes_max: 1024, ..Limits::default() };
        assert!(limits.check().unwrap_err().contains("output-bytes-max"));
        let limits = Limits { fetch_bytes_max: 10, ..Limits::default() };
        assert!(limits.check().unwrap_err().contains("fetch-bytes-max"));
        let limits = Limits { buffered_bytes_max: 100 << 20, ..Limits::default() };
        assert!(limits.check().unwrap_err().contains("buffered-bytes-max"));
        let limits = Limits {
            buffered_bytes_max: 100 << 20,
            output_bytes_max: 18 << 20,
            frame_bytes_max: 4 << 20,
            ..Limits::default()
        };
        assert_eq!(limits.check(), Ok(()));
    }
}
