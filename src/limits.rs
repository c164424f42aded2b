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
    /// Most topics, dead-letter topics not counted while their origin
    /// exists (each topic has at most one, made only beside it; one that
    /// outlives its origin counts). Bounds the topic table and the STATS
    /// reply: at most twice this many topics.
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
    /// Most work items the requests of one loop turn do, over every
    /// connection: messages produced and delivered, ids acknowledged,
    /// NACKed or touched, topics and groups listed. Once a turn has done
    /// this much (or `work_bytes_per_turn_max`), a request that can do more
    /// than a little waits for the next turn, whose first served are the
    /// connections left waiting, and a FETCH gets no more messages than
    /// the turn has left (at least one). The deliveries at the turn's sync
    /// (parked FETCHes answered, pushes) have as much again; the groups
    /// they do not reach are served first at the next sync. So no load
    /// holds the loop for long: a turn does at most this and one request
    /// more, and a PING waits at most about two turns (bench W11).
    pub work_items_per_turn_max: u32,
    /// Most bytes of requests decoded and replies written by one loop
    /// turn's requests, over every connection, and as much again for the
    /// deliveries at its sync: `work_items_per_turn_max` in bytes, for
    /// loads of few large messages.
    pub work_bytes_per_turn_max: u32,
    /// Most bytes of the `/metrics` exposition rendered in one loop turn,
    /// over every scrape: a scrape of many topics is rendered a slice a
    /// turn (formatting is some ten times the cost of copying a byte), so
    /// that it never holds the loop, whatever the number of topics or of
    /// scrapers.
    pub metrics_bytes_per_turn_max: u32,
    /// Time a new connection has to complete HELLO. Bounds how long a
    /// connection that never speaks the protocol holds a slot.
    pub handshake_timeout_ms: u32,
    /// Time a connection may stay silent (no request, no parked FETCH, no
    /// push subscription) before it is closed; 0 never. Reclaims slots of
    /// vanished peers.
    pub idle_timeout_ms: u32,
    /// Time a frame may stay incomplete (slowloris): a peer that trickles a
    /// frame slower than this is closed.
    pub frame_timeout_ms: u32,
    /// Longest consumer-group name. Names are stored per group, written in
    /// the group's log records and echoed with every dead letter of the
    /// group. At most 1000, as topic names.
    pub group_name_bytes_max: u32,
    /// Most consumer groups of one topic, its default group included. A
    /// message is released only once every group is done with it, so each
    /// group adds a check to every acknowledgement, and a row to
    /// LIST_GROUPS and STATS.
    pub groups_per_topic_max: u32,
    /// Most tags on one message. Tags are interned per topic and a group's
    /// filter is decided once per distinct set of tags, so few short tags
    /// keep that table small.
    pub tags_per_message_max: u32,
    /// Longest tag, in bytes of UTF-8.
    pub tag_bytes_max: u32,
    /// Most distinct tag sets (a message's set of tags) among the messages
    /// one topic holds. Each set is interned once per topic, with its tags,
    /// and every group keeps a filter decision per set, so this bounds
    /// those tables; a PRODUCE that would bring one more set gets
    /// QUEUE_FULL. At most 65535: a message stores its set's number in two
    /// bytes.
    pub tag_sets_per_topic_max: u32,
    /// Most bytes of one message's properties (its tags and headers, with
    /// their type and length fields). Properties are kept in memory with
    /// the message; they also count toward message_bytes_max. At most 65535,
    /// the most the properties' u16 length can say.
    pub props_bytes_max: u32,
    /// Longest tag filter of a consumer group (`*`, a list `a || b`, or a
    /// regular expression).
    pub filter_bytes_max: u32,
    /// Most memory one compiled regular-expression filter may take, its
    /// program and its search cache (its compile is stopped once the
    /// program passes it): a pattern such as `(a{100}){100}` is short but
    /// compiles to a huge program; past this it gets BAD_FILTER instead of
    /// taking the broker's memory and a loop turn's time.
    pub filter_compiled_bytes_max: u32,
    /// Most memory all compiled filters may take together, broker-wide
    /// (`FilterTable`). A filter is compiled once per text and shared by
    /// every group that uses it, so this bounds the distinct filters, not
    /// the groups: without it, 9-byte requests (`re:\w{5}`, some 170 KB
    /// compiled) on many topics' groups would take the machine's memory. A
    /// CREATE_GROUP with a new filter past it gets BAD_FILTER. Recovery
    /// keeps every logged group's filter, past it or not.
    pub compiled_filters_bytes_max: u64,
    /// Most credit one push subscription may have: messages in flight to
    /// its connection from its group at once (NSQ's max RDY). Each takes a
    /// timer and a pushed copy in the connection's output, so this bounds
    /// what one subscriber can hold; `output_bytes_max` still bounds what
    /// waits unread for it.
    pub subscription_credit_max: u32,
    /// Most push subscriptions one connection may have. Each is visited
    /// when its group gets messages; this bounds the table a connection can
    /// fill and the work its subscriptions add to a turn.
    pub subscriptions_per_connection_max: u32,
    // Time and identity (protocol version 3).
    /// Farthest ahead of the broker's clock a message may be scheduled, ms
    /// (a delivery time or delay past it gets BAD_ARGUMENT). A year and a
    /// day by default: a scheduled message holds its topic's room
    /// (`topic_messages_max`, `topic_bytes_max`) until its time, so
    /// schedules without an end would fill a topic for good.
    pub schedule_ahead_ms_max: u64,
    // Keys and inspection (protocol version 4).
    /// Longest message key, bytes. Keys are kept in memory by the key
    /// index, once per distinct key, so short keys keep it small.
    pub key_bytes_max: u32,
    /// Most ids the key index keeps per key, newest kept (the oldest is
    /// forgotten first): the most messages one LOOKUP returns. Bounds the
    /// reply and the index's list for a key that many messages share.
    pub lookup_results_max: u32,
    /// Most entries (keyed messages) the key index of one topic keeps;
    /// past it the oldest is forgotten. The index is a cache of the log
    /// for LOOKUP, never needed for delivery, so it is bounded rather than
    /// allowed to refuse a produce.
    pub key_index_entries_per_topic_max: u32,
    // Idempotent produce (protocol version 4).
    /// Longest dedup window a topic may ask for, ms (CREATE_TOPIC past it
    /// gets BAD_ARGUMENT). A day by default: every dedup id is kept that
    /// long, so a longer window holds more entries for no retry that
    /// still needs them.
    pub dedup_window_ms_max: u32,
    /// Most dedup ids the broker remembers, over all topics (some 100
    /// bytes each besides the id: the default is about 100 MiB at the
    /// longest ids). Broker-wide, as `timers_max` is, because memory is the
    /// broker's, not a topic's; a PRODUCE that would need one more gets
    /// DEDUP_FULL rather than forgetting an id still in its window.
    pub dedup_entries_max: u32,
    /// Longest dedup id, bytes (BAD_ARGUMENT past it). An id is kept in
    /// memory for its whole window: a producer id and a sequence number
    /// fit in far less.
    pub dedup_id_bytes_max: u32,
    // Retries that back off (protocol version 4).
    /// Longest wait a group's retry policy may set (its cap), ms
    /// (CREATE_GROUP past it gets BAD_ARGUMENT). A day by default: a
    /// message waiting for retry holds its topic's room and a timer, so a
    /// wait must end within the time an operator still looks at it.
    pub retry_delay_ms_max: u32,
    /// Longest reason a NACK may give, bytes (BAD_ARGUMENT past it). The
    /// last reason is kept in memory with each message a group still
    /// needs and written into its log record: a sentence, not a stack
    /// trace.
    pub nack_reason_bytes_max: u32,
    // Retention and replay (protocol version 4).
    /// Longest retention by age a topic may ask for, ms (CREATE_TOPIC past
    /// it gets BAD_ARGUMENT). A year: retained messages cost disk, not
    /// memory, but one retaining topic keeps whole segments (and the other
    /// topics' records in them) on disk.
    pub retention_ms_max: u64,
    /// Largest retention by size a topic may ask for, bytes of its log
    /// (BAD_ARGUMENT past it). A TiB: the bound on the disk one topic's
    /// retention may hold.
    pub retention_bytes_max: u64,
    /// Most bytes of the log files read per loop turn for replays, over
    /// every group replaying retained messages (or one record, if larger).
    /// A megabyte is a fraction of a millisecond from the page cache and a
    /// few from a disk: a group replaying a gigabyte never stalls the
    /// other connections, and still reads hundreds of MB/s on a busy loop.
    pub replay_read_bytes_per_turn: u64,
    /// Most bytes per second of the log files read for replays, over every
    /// replaying group (0: unpaced, as much as each turn may). After a turn
    /// reads, the next replay read waits until the average is back under
    /// this. The loop reads synchronously: from a cold disk a megabyte
    /// stalls the turn for milliseconds, and back-to-back reads keep the
    /// disk busy under every durable turn's `fdatasync`. 64 MiB/s replays a
    /// gigabyte in 16 s with the loop stalled a fraction of its time
    /// (bench/README.md, "Replay from the files").
    pub replay_read_bytes_per_sec: u64,
    /// Most messages a replay puts back ahead of its group's cursor: what
    /// a replaying group costs in memory, at most this many messages (one
    /// block's worth), whatever the size of the replay.
    pub replay_window_messages_max: u32,
    // The commit log.
    /// Bytes of the disk that client produces leave free, past what
    /// restating every topic takes (the log's headroom): produces get
    /// STORAGE this short of full, so that what frees the disk is still
    /// written on a disk that refuses them. Compaction's copies of the
    /// live messages of the segment it cleans may use three quarters of
    /// it, so a full disk's segment is cleaned once its live messages fit
    /// there; the last quarter is what acks and admin records keep while
    /// it cleans (and all of it, once produces stopped, holds the acks of
    /// about 130,000 messages). Raise it if one segment keeps more live
    /// messages than that (large messages, a consumer far behind). At
    /// least 64 KiB.
    pub produce_headroom_bytes: u64,
    /// Most bytes of records the log keeps for its next commit while
    /// commits fail (a failing or full disk): a failed turn's acks, dead
    /// letters and topic changes, already done in memory, are written with
    /// the next commit so the log catches up. Past it they are dropped,
    /// with an error logged, and a restart may redeliver acknowledged
    /// messages: a disk that never comes back must not take the broker's
    /// memory. 0 keeps none.
    pub unwritten_records_bytes_max: u64,
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
            work_items_per_turn_max: 4096,
            work_bytes_per_turn_max: 4 << 20,
            metrics_bytes_per_turn_max: 256 << 10,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 600_000,
            frame_timeout_ms: 30_000,
            group_name_bytes_max: 200,
            groups_per_topic_max: 64,
            tags_per_message_max: 8,
            tag_bytes_max: 128,
            tag_sets_per_topic_max: 4096,
            props_bytes_max: 16 << 10,
            filter_bytes_max: 4096,
            filter_compiled_bytes_max: 256 << 10,
            compiled_filters_bytes_max: 64 << 20,
            subscription_credit_max: 8192,
            subscriptions_per_connection_max: 64,
            schedule_ahead_ms_max: 366 * 24 * 3600 * 1000,
            key_bytes_max: 128,
            lookup_results_max: 32,
            key_index_entries_per_topic_max: 1_000_000,
            dedup_window_ms_max: 24 * 3600 * 1000,
            dedup_entries_max: 1_000_000,
            dedup_id_bytes_max: 64,
            retry_delay_ms_max: 24 * 3600 * 1000,
            nack_reason_bytes_max: 256,
            retention_ms_max: 365 * 24 * 3600 * 1000,
            retention_bytes_max: 1 << 40,
            replay_read_bytes_per_turn: 1 << 20,
            replay_read_bytes_per_sec: 64 << 20,
            replay_window_messages_max: 4096,
            produce_headroom_bytes: 1 << 20,
            unwritten_records_bytes_max: 64 << 20,
        }
    }
}

/// The least `produce_headroom_bytes`: with less, the quarter kept for
/// acks while compaction copies holds a few hundred, and the copies'
/// three quarters hardly a segment's worth of live messages.
pub const PRODUCE_HEADROOM_BYTES_MIN: u64 = 64 << 10;

/// Bytes a frame header takes (see docs/protocol.md).
pub const FRAME_HEADER_BYTES: u32 = 12;
/// Bytes a PRODUCE body needs besides its topic name and messages: the
/// topic length and the count.
const PRODUCE_OVERHEAD_BYTES: u64 = 2 + 4;
/// Bytes a message of a PRODUCE takes besides its properties and payload,
/// at most: the properties' length (version 2) and the payload's.
const PRODUCE_MESSAGE_OVERHEAD_BYTES: u64 = 2 + 4;
/// Bytes each message adds to a FETCH reply besides its payload,
/// properties and origin group's name (which FETCH's byte budget counts),
/// at most: the wire layout's own count.
pub const FETCH_MESSAGE_OVERHEAD_BYTES: u32 = crate::codec::MESSAGE_WIRE_OVERHEAD_BYTES_MAX as u32;
/// Most bytes of properties a message can have: their length is a u16.
pub const PROPS_BYTES_LIMIT: u32 = u16::MAX as u32;
/// Most results one LOOKUP may be set to return: each carries its
/// message's properties and every group's state, so the reply stays well
/// under `output_bytes_max`.
const LOOKUP_RESULTS_LIMIT: u32 = 1024;
/// Most bytes of a topic or group name (a u16 string; kept well under it).
const NAME_BYTES_LIMIT: u32 = 1000;

impl Limits {
    /// Checks that the limits can work together. Returns a sentence naming
    /// the two limits that clash.
    pub fn check(&self) -> Result<(), String> {
        self.check_groups()?;
        self.check_disk()?;
        if self.replay_read_bytes_per_turn == 0 || self.replay_window_messages_max == 0 {
            return Err("replay-read-bytes-per-turn and replay-window-messages-max must be at least 1".into());
        }
        let one_message_frame = u64::from(FRAME_HEADER_BYTES)
            + PRODUCE_OVERHEAD_BYTES
            + u64::from(self.topic_name_bytes_max)
            + PRODUCE_MESSAGE_OVERHEAD_BYTES
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
        self.check_turn()?;
        if self.dedup_id_bytes_max == 0 || self.dedup_id_bytes_max > PROPS_BYTES_LIMIT {
            return Err(format!("dedup-id-bytes-max must be between 1 and {PROPS_BYTES_LIMIT}"));
        }
        if self.retry_delay_ms_max == 0 {
            return Err("retry-delay-ms-max must be at least 1".into());
        }
        if self.nack_reason_bytes_max > u32::from(u16::MAX) {
            return Err("nack-reason-bytes-max must be at most 65535 (its length is a u16)".into());
        }
        Ok(())
    }

    /// The limits of a loop turn's work.
    fn check_turn(&self) -> Result<(), String> {
        if self.read_bytes_per_turn_max < 4096 {
            return Err("read-bytes-per-turn-max must be at least 4096".into());
        }
        if self.work_items_per_turn_max == 0 || self.work_bytes_per_turn_max == 0 {
            return Err("work-items-per-turn-max and work-bytes-per-turn-max must be at least 1".into());
        }
        if self.metrics_bytes_per_turn_max < 1024 {
            return Err("metrics-bytes-per-turn-max must be at least 1024 (a line of the exposition)".into());
        }
        Ok(())
    }

    /// The limits of names, consumer groups, tags and headers (first: the
    /// sizes of replies derive from them).
    fn check_groups(&self) -> Result<(), String> {
        if self.topic_name_bytes_max == 0 || self.topic_name_bytes_max > NAME_BYTES_LIMIT {
            return Err(format!("topic-name-bytes-max must be between 1 and {NAME_BYTES_LIMIT}"));
        }
        if self.group_name_bytes_max == 0 || self.group_name_bytes_max > NAME_BYTES_LIMIT {
            return Err(format!("group-name-bytes-max must be between 1 and {NAME_BYTES_LIMIT}"));
        }
        if self.groups_per_topic_max == 0 {
            return Err("groups-per-topic-max must be at least 1 (the default group)".into());
        }
        if self.props_bytes_max > PROPS_BYTES_LIMIT {
            return Err(format!(
                "props-bytes-max must be at most {PROPS_BYTES_LIMIT}: the properties' length is a u16"
            ));
        }
        // A tag entry is its type, its u16 length and its bytes.
        if self.tag_bytes_max == 0 || u64::from(self.tag_bytes_max) + 3 > u64::from(self.props_bytes_max) {
            return Err(format!(
                "tag-bytes-max ({}) must be at least 1, and props-bytes-max ({}) must hold one tag of it with its 3-byte type and length",
                self.tag_bytes_max, self.props_bytes_max
            ));
        }
        if self.tag_sets_per_topic_max == 0 || self.tag_sets_per_topic_max > crate::queue::TAG_SETS_MAX {
            return Err(format!(
                "tag-sets-per-topic-max must be between 1 and {}: a message stores its tag set's number in two bytes",
                crate::queue::TAG_SETS_MAX
            ));
        }
        if self.filter_bytes_max == 0 || self.filter_compiled_bytes_max == 0 {
            return Err("filter-bytes-max and filter-compiled-bytes-max must be at least 1".into());
        }
        if self.compiled_filters_bytes_max < u64::from(self.filter_compiled_bytes_max) {
            return Err(format!(
                "compiled-filters-bytes-max ({}) must hold one filter of filter-compiled-bytes-max ({})",
                self.compiled_filters_bytes_max, self.filter_compiled_bytes_max
            ));
        }
        if self.subscription_credit_max == 0 || self.subscriptions_per_connection_max == 0 {
            return Err("subscription-credit-max and subscriptions-per-connection-max must be at least 1".into());
        }
        self.check_keys()
    }

    /// The room produces leave on a full disk must hold compaction's
    /// copies and the acks written while it copies.
    fn check_disk(&self) -> Result<(), String> {
        if self.produce_headroom_bytes < PRODUCE_HEADROOM_BYTES_MIN {
            return Err(format!(
                "produce-headroom-bytes ({}) must be at least {PRODUCE_HEADROOM_BYTES_MIN}: compaction copies live messages into it to free a full disk",
                self.produce_headroom_bytes
            ));
        }
        Ok(())
    }

    /// The key limits: a key entry (type, u16 length, key) must fit in the
    /// properties, and a LOOKUP reply must stay small.
    fn check_keys(&self) -> Result<(), String> {
        if self.key_bytes_max == 0 || u64::from(self.key_bytes_max) + 3 > u64::from(self.props_bytes_max) {
            return Err(format!(
                "key-bytes-max ({}) must be at least 1, and props-bytes-max ({}) must hold one key of it with its 3-byte type and length",
                self.key_bytes_max, self.props_bytes_max
            ));
        }
        if self.lookup_results_max == 0 || self.lookup_results_max > LOOKUP_RESULTS_LIMIT {
            return Err(format!("lookup-results-max must be between 1 and {LOOKUP_RESULTS_LIMIT}"));
        }
        if self.key_index_entries_per_topic_max < self.lookup_results_max {
            return Err("key-index-entries-per-topic-max must be at least lookup-results-max".into());
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

    #[test]
    fn the_room_produces_leave_on_a_full_disk_is_checked() {
        let limits = Limits { produce_headroom_bytes: PRODUCE_HEADROOM_BYTES_MIN - 1, ..Limits::default() };
        assert!(limits.check().unwrap_err().contains("produce-headroom-bytes"));
        let limits = Limits { produce_headroom_bytes: PRODUCE_HEADROOM_BYTES_MIN, ..Limits::default() };
        assert_eq!(limits.check(), Ok(()));
    }

    #[test]
    fn group_and_property_limits_are_checked() {
        let refused = |l: Limits, name: &str| {
            let err = l.check().expect_err(name);
            assert!(err.contains(name), "{err}");
        };
        refused(Limits { group_name_bytes_max: 0, ..Limits::default() }, "group-name-bytes-max");
        refused(Limits { group_name_bytes_max: 1001, ..Limits::default() }, "group-name-bytes-max");
        refused(Limits { groups_per_topic_max: 0, ..Limits::default() }, "groups-per-topic-max");
        refused(Limits { props_bytes_max: 65536, ..Limits::default() }, "props-bytes-max");
        refused(Limits { tag_bytes_max: 0, ..Limits::default() }, "tag-bytes-max");
        refused(Limits { tag_bytes_max: 100, props_bytes_max: 102, ..Limits::default() }, "tag-bytes-max");
        let short_keys = Limits { key_bytes_max: 100, ..Limits::default() };
        assert_eq!(Limits { tag_bytes_max: 100, props_bytes_max: 103, ..short_keys.clone() }.check(), Ok(()));
        refused(Limits { key_bytes_max: 0, ..Limits::default() }, "key-bytes-max");
        refused(Limits { props_bytes_max: 102, tag_bytes_max: 10, ..short_keys }, "key-bytes-max");
        refused(Limits { lookup_results_max: 0, ..Limits::default() }, "lookup-results-max");
        refused(Limits { lookup_results_max: 1025, ..Limits::default() }, "lookup-results-max");
        let index = Limits { key_index_entries_per_topic_max: 31, ..Limits::default() };
        refused(index, "key-index-entries-per-topic-max");
        refused(Limits { tag_sets_per_topic_max: 0, ..Limits::default() }, "tag-sets-per-topic-max");
        refused(Limits { tag_sets_per_topic_max: 65536, ..Limits::default() }, "tag-sets-per-topic-max");
        assert_eq!(Limits { tag_sets_per_topic_max: 65535, ..Limits::default() }.check(), Ok(()));
        refused(Limits { filter_bytes_max: 0, ..Limits::default() }, "filter-bytes-max");
        let one = Limits::default().filter_compiled_bytes_max;
        let all = |n: u64| Limits { compiled_filters_bytes_max: n, ..Limits::default() };
        refused(all(u64::from(one) - 1), "compiled-filters-bytes-max");
        assert_eq!(all(u64::from(one)).check(), Ok(()));
        refused(Limits { work_items_per_turn_max: 0, ..Limits::default() }, "work-items-per-turn-max");
        refused(Limits { work_bytes_per_turn_max: 0, ..Limits::default() }, "work-bytes-per-turn-max");
        refused(Limits { metrics_bytes_per_turn_max: 1023, ..Limits::default() }, "metrics-bytes-per-turn-max");
        assert_eq!(
            Limits { work_items_per_turn_max: 1, work_bytes_per_turn_max: 1, ..Limits::default() }.check(),
            Ok(())
        );
        // Every message of the largest FETCH reply may be a dead letter
        // with properties: their fields count, their bytes are in the budget.
        let d = Limits::default();
        let largest = u64::from(d.fetch_bytes_max)
            + u64::from(FETCH_MESSAGE_OVERHEAD_BYTES) * u64::from(d.batch_messages_max)
            + u64::from(d.topic_name_bytes_max)
            + 64;
        let tight = Limits { output_bytes_max: 2 * largest as u32, ..d };
        assert_eq!(tight.check(), Ok(()));
        refused(Limits { output_bytes_max: 2 * largest as u32 - 1, ..tight }, "output-bytes-max");
    }
}
