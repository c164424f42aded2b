//! Error codes: the status byte of a reply (docs/protocol.md, "Error
//! codes").

/// Status codes of error replies. The numbers are part of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// The frame's body does not parse. The client has a bug.
    Malformed = 1,
    /// The opcode is not one this version knows.
    UnknownOp = 2,
    /// HELLO offered no version the broker speaks.
    Version = 3,
    /// A request came before a successful HELLO.
    HelloRequired = 4,
    /// The frame is longer than frame_bytes_max; its body was discarded.
    FrameTooLarge = 5,
    /// A message is longer than message_bytes_max; nothing was stored.
    MessageTooLarge = 6,
    /// Too many messages or ids in one frame, or none.
    BatchTooLarge = 7,
    /// The topic name is empty, too long or has a forbidden byte.
    BadTopic = 8,
    /// The topic does not exist.
    UnknownTopic = 9,
    /// Creating the topic would pass topics_max.
    TooManyTopics = 10,
    /// The topic is at its depth limit; nothing of the batch was stored.
    QueueFull = 11,
    /// The commit log could not write or sync; nothing was acknowledged.
    Storage = 12,
    /// The connection has not presented the auth token.
    Unauthenticated = 13,
    /// The broker is shutting down.
    ShuttingDown = 14,
    /// The broker is at connections_max; the connection will be closed.
    TooManyConnections = 15,
    /// A field has a value the operation cannot take.
    BadArgument = 16,
    /// The broker's connection buffers are full (buffered_bytes_max): a
    /// request with a large reply was not served.
    Busy = 17,
    /// The consumer group does not exist (version 2).
    UnknownGroup = 18,
    /// A group's tag filter does not parse, is too long, or compiles too
    /// large (version 2).
    BadFilter = 19,
    /// Creating the group would pass groups_per_topic_max (version 2).
    TooManyGroups = 20,
    /// Reserved, never sent by this build: a sharded broker does not own
    /// the topic; the client re-routes.
    Moved = 21,
    /// Reserved, never sent by this build: the topic is moving between
    /// shards; the client retries shortly.
    TryAgain = 22,
    /// Reserved, never sent by this build: the broker is not the primary of
    /// the topic; the client re-routes.
    NotPrimary = 23,
    /// Reserved, never sent by this build: a request names topics of
    /// several shards; the client splits it.
    CrossShard = 24,
    /// The id names no scheduled message of the topic: it was never
    /// scheduled, its time has come (it is ready or delivered), or it was
    /// cancelled (version 3).
    NotScheduled = 25,
    /// PEEK: the topic does not hold the message (version 4).
    NotFound = 27,
    /// The broker holds `dedup_entries_max` dedup ids: the PRODUCE would
    /// need one more; nothing of its batch was stored (version 4).
    DedupFull = 29,
}

impl ErrorCode {
    pub fn from_u8(v: u8) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => Malformed,
            2 => UnknownOp,
            3 => Version,
            4 => HelloRequired,
            5 => FrameTooLarge,
            6 => MessageTooLarge,
            7 => BatchTooLarge,
            8 => BadTopic,
            9 => UnknownTopic,
            10 => TooManyTopics,
            11 => QueueFull,
            12 => Storage,
            13 => Unauthenticated,
            14 => ShuttingDown,
            15 => TooManyConnections,
            16 => BadArgument,
            17 => Busy,
            18 => UnknownGroup,
            19 => BadFilter,
            20 => TooManyGroups,
            21 => Moved,
            22 => TryAgain,
            23 => NotPrimary,
            24 => CrossShard,
            25 => NotScheduled,
            27 => NotFound,
            29 => DedupFull,
            _ => return None,
        })
    }

    /// The name used in docs/protocol.md and in client error messages.
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Malformed => "MALFORMED",
            UnknownOp => "UNKNOWN_OP",
            Version => "VERSION",
            HelloRequired => "HELLO_REQUIRED",
            FrameTooLarge => "FRAME_TOO_LARGE",
            MessageTooLarge => "MESSAGE_TOO_LARGE",
            BatchTooLarge => "BATCH_TOO_LARGE",
            BadTopic => "BAD_TOPIC",
            UnknownTopic => "UNKNOWN_TOPIC",
            TooManyTopics => "TOO_MANY_TOPICS",
            QueueFull => "QUEUE_FULL",
            Storage => "STORAGE",
            Unauthenticated => "UNAUTHENTICATED",
            ShuttingDown => "SHUTTING_DOWN",
            TooManyConnections => "TOO_MANY_CONNECTIONS",
            BadArgument => "BAD_ARGUMENT",
            Busy => "BUSY",
            UnknownGroup => "UNKNOWN_GROUP",
            BadFilter => "BAD_FILTER",
            TooManyGroups => "TOO_MANY_GROUPS",
            Moved => "MOVED",
            TryAgain => "TRYAGAIN",
            NotPrimary => "NOT_PRIMARY",
            CrossShard => "CROSSSHARD",
            NotScheduled => "NOT_SCHEDULED",
            NotFound => "NOT_FOUND",
            DedupFull => "DEDUP_FULL",
        }
    }
}
