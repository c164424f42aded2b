//! What the client hands back, owned: its errors, delivered and pushed
//! messages, inspections, group listings and replies; and what it sends,
//! a message to produce with its properties.

use super::*;

/// Why a call failed.
#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    /// The broker answered with an error status.
    Broker {
        code: u8,
        message: String,
    },
    /// The broker sent something this client cannot parse.
    Protocol(String),
    /// The call needs protocol version `needed`; the broker speaks only
    /// `version`. Nothing was sent.
    Version {
        needed: u16,
        version: u16,
    },
    /// The call's arguments cannot be put in a frame (a tag with a space,
    /// properties over 65535 bytes). Nothing was sent.
    Invalid(String),
}

impl Error {
    /// Whether the broker closed the connection between two frames, as a
    /// graceful stop does once it has sent every reply (docs/protocol.md,
    /// "Closing"), rather than resetting it or cutting a frame short. A
    /// broker whose process ended without a graceful stop closes the same
    /// way: what this tells is that nothing was cut, not why it closed.
    pub fn is_closed_between_frames(&self) -> bool {
        let Error::Io(e) = self else { return false };
        let closed = e.get_ref().and_then(|inner| inner.downcast_ref::<Closed>());
        closed.is_some_and(|c| c.partial_frame_bytes == 0)
    }

    /// The broker's error code, if this is a broker error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Broker { code, .. } => ErrorCode::from_u8(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "connection: {e}"),
            Error::Broker { code, message } => {
                let name = ErrorCode::from_u8(*code).map_or("UNKNOWN", ErrorCode::name);
                write!(f, "broker error {name} ({code}): {message}")
            }
            Error::Protocol(m) => write!(f, "protocol: {m}"),
            Error::Version { needed, version } => write!(
                f,
                "this needs protocol version {needed} (consumer groups, tags, headers); the broker speaks version {version}"
            ),
            Error::Invalid(m) => write!(f, "invalid request: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// What a read found when the broker closed the connection (the payload of
/// an `io::Error` of kind `UnexpectedEof`): whether it closed between two
/// frames, or with a frame begun and cut short.
#[derive(Debug)]
pub(super) struct Closed {
    /// Bytes of the next frame received before the end; 0 between frames.
    pub(super) partial_frame_bytes: usize,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.partial_frame_bytes {
            0 => write!(f, "broker closed the connection"),
            n => write!(f, "broker closed the connection in the middle of a frame ({n} bytes of it received)"),
        }
    }
}

impl std::error::Error for Closed {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A delivered message, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub id: u64,
    pub born_ms: u64,
    pub delivery_count: u16,
    pub dead: Option<DeadInfo>,
    /// With `dead`: the group that dead-lettered it ("" = the default
    /// group, and always "" in a version-1 session).
    pub origin_group: String,
    /// Its properties as the broker sent them (empty in a version-1
    /// session): read them with `tags`, `headers` and `header`.
    pub props: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Delivered {
    /// The properties; validated when the reply was decoded.
    fn parsed_props(&self) -> Props<'_> {
        Props::parse(&self.props, codec::CODEC_VERSION_MAX, &PropsLimits::ANY).unwrap_or_default()
    }
    /// The message's tags, in order.
    pub fn tags(&self) -> Vec<&str> {
        self.parsed_props().tags().collect()
    }
    /// The message's headers, in order (a key may repeat).
    pub fn headers(&self) -> Vec<(&str, &[u8])> {
        self.parsed_props().headers().collect()
    }
    /// The value of the first header named `key`.
    pub fn header(&self, key: &str) -> Option<&[u8]> {
        self.parsed_props().header(key)
    }
    /// Its key, if it has one (version 4).
    pub fn key(&self) -> Option<&[u8]> {
        self.parsed_props().key()
    }

    /// A dead letter's last NACK reason (property 7, version 4), if it
    /// has one.
    pub fn last_nack_reason(&self) -> Option<&str> {
        self.parsed_props().last_nack_reason()
    }
    /// The time it was scheduled for, if it was (version 3).
    pub fn deliver_at_ms(&self) -> Option<u64> {
        match self.parsed_props().schedule() {
            Some(props::Prop::DeliverAt(at)) => Some(at),
            _ => None,
        }
    }
}

/// A message to produce with properties (version 2): its payload, tags and
/// headers. `ProduceMessage::new(b"...").tag("eu").header("trace", b"7")`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceMessage<'a> {
    pub payload: &'a [u8],
    /// The properties blob being built.
    pub(super) props: Vec<u8>,
    /// Why a tag or header could not be added (too long for its u16
    /// length); the send refuses the message.
    pub(super) invalid: Option<String>,
}

impl<'a> ProduceMessage<'a> {
    pub fn new(payload: &'a [u8]) -> ProduceMessage<'a> {
        ProduceMessage { payload, props: Vec::new(), invalid: None }
    }
    /// Adds a tag (checked when the message is sent).
    pub fn tag(mut self, tag: &str) -> ProduceMessage<'a> {
        match u16::try_from(tag.len()) {
            Ok(_) => props::put_tag(&mut self.props, tag),
            Err(_) => self.invalid = Some(format!("a tag of {} bytes", tag.len())),
        }
        self
    }
    /// Adds a header (a key may repeat).
    pub fn header(mut self, key: &str, value: &[u8]) -> ProduceMessage<'a> {
        match u16::try_from(2 + key.len() + value.len()) {
            Ok(_) => props::put_header(&mut self.props, key, value),
            Err(_) => self.invalid = Some(format!("a header of {} bytes", key.len() + value.len())),
        }
        self
    }
    /// Delivers it at `at_ms`, wall-clock ms since the Unix epoch on the
    /// broker's clock (version 3; a time not in the future delivers it at
    /// once).
    pub fn deliver_at(mut self, at_ms: u64) -> ProduceMessage<'a> {
        props::put_time(&mut self.props, props::PROP_DELIVER_AT, at_ms);
        self
    }
    /// Gives it a key (version 4): LOOKUP finds the topic's recent
    /// messages by it. At most one, of 1 to `key_bytes_max` bytes.
    pub fn key(mut self, key: &[u8]) -> ProduceMessage<'a> {
        match u16::try_from(key.len()) {
            Ok(_) => props::put_key(&mut self.props, key),
            Err(_) => self.invalid = Some(format!("a key of {} bytes", key.len())),
        }
        self
    }
    /// Delivers it `delay_ms` after the broker receives it (version 3).
    pub fn delay(mut self, delay_ms: u64) -> ProduceMessage<'a> {
        props::put_time(&mut self.props, props::PROP_DELAY, delay_ms);
        self
    }
    /// Gives it a dedup id (version 4): within its topic's dedup window, a
    /// second message with it is not stored (docs/protocol.md, "Idempotent
    /// produce (version 4)").
    pub fn dedup_id(mut self, id: &[u8]) -> ProduceMessage<'a> {
        match u16::try_from(id.len()) {
            Ok(n) if n > 0 => props::put_dedup_id(&mut self.props, id),
            _ => self.invalid = Some(format!("a dedup id of {} bytes", id.len())),
        }
        self
    }
    /// Whether it has a dedup id.
    pub fn has_dedup_id(&self) -> bool {
        self.invalid.is_none() && Props::trusted(&self.props).dedup_id().is_some()
    }
    /// Whether it has properties.
    pub fn has_props(&self) -> bool {
        !self.props.is_empty()
    }
}

/// What LOOKUP or PEEK tells of one message (version 4), owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    pub id: u64,
    /// The message, while the topic holds it.
    pub message: Option<InspectedMessage>,
    /// Its state in every group (a broadcast group's members each).
    pub groups: Vec<GroupLine>,
}

/// A message as LOOKUP or PEEK shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InspectedMessage {
    /// Broker wall clock at produce, ms since the Unix epoch.
    pub born_ms: u64,
    /// A dead letter's origin.
    pub dead: Option<DeadInfo>,
    /// Its properties (read them with `key`).
    pub props: Vec<u8>,
    /// Its payload's length, bytes.
    pub len: u32,
    /// Its payload: PEEK's, not LOOKUP's.
    pub payload: Option<Vec<u8>>,
}

impl InspectedMessage {
    /// Its key, if it has one.
    pub fn key(&self) -> Option<&[u8]> {
        Props::parse(&self.props, codec::CODEC_VERSION_MAX, &PropsLimits::ANY).ok()?.key()
    }
}

/// A message's state in one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLine {
    /// The group ("" is the default group).
    pub group: String,
    pub state: State,
    /// Deliveries so far (for a dead letter, before it was moved).
    pub deliveries: u16,
    /// In flight: the ack deadline; waiting: when it is ready again;
    /// scheduled: when it is due. Wall clock ms; 0 for other states.
    pub until_ms: u64,
    /// In flight: the consumer holding it; for a broadcast member, its
    /// consumer; else 0.
    pub consumer: u64,
    /// Dead-lettered: a `DeadReason` number; else 0.
    pub dead_reason: u8,
    /// The reason its last NACK in the group gave, while the group still
    /// needs it or once it dead-lettered it (empty: none).
    pub last_nack_reason: String,
}

/// One group of LIST_GROUPS, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    /// "" is the default group.
    pub name: String,
    pub broadcast: bool,
    /// Ordered by key (version 4).
    pub ordered: bool,
    /// The settings in effect (the topic's filled in).
    pub ack_timeout_ms: u32,
    pub max_deliveries: u16,
    /// The tag filter; `*` or empty for every message.
    pub filter: String,
    /// The retry policy (version 4); None: ready again at once.
    pub retry: Option<crate::queue::RetryPolicy>,
    pub stats: GroupStats,
}

/// What an ACK, NACK or TOUCH did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdsResult {
    /// How many ids took effect.
    pub done: u32,
    /// The ids that did not.
    pub failed: Vec<u64>,
}

/// One STATS section: its name ("" for the broker) and its counters.
pub type StatsSection = (String, Vec<(String, u64)>);

/// A reply, owned (for pipelined `recv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedReply {
    Hello {
        version: u16,
        limits: DecodeLimits,
        map_epoch: u64,
    },
    Pong,
    Produced {
        first_id: u64,
        count: u32,
    },
    /// A PRODUCE reply naming duplicates (version 4): (index in the batch,
    /// the original message's id) for each.
    Deduplicated {
        first_id: u64,
        count: u32,
        duplicates: Vec<(u32, u64)>,
    },
    Messages {
        topic: String,
        messages: Vec<Delivered>,
    },
    Ids(IdsResult),
    Stats(Vec<StatsSection>),
    Created(bool),
    Count(u64),
    Topics(Vec<(String, TopicSettings)>),
    GroupCreated {
        created: bool,
        cursor: u64,
    },
    Groups(Vec<GroupEntry>),
    Cursor(u64),
    /// SUBSCRIBE: the subscription's id.
    Subscribed(u32),
    /// CREDIT: the group's messages in flight to this connection.
    Credited(u32),
    /// CANCEL's and RESCHEDULE's time.
    Due(u64),
    /// LOOKUP's and PEEK's messages.
    Inspected(Vec<Inspection>),
    AckProduced(AckProduced),
}

/// What an ACK_PRODUCE did (version 3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckProduced {
    /// How many ids were acked: all of them, or none.
    pub done: u32,
    /// The ids not in flight to this connection: then nothing was done.
    pub failed: Vec<u64>,
    /// Each output's first id and count, in the order given.
    pub outputs: Vec<(u64, u32)>,
}

/// A message a push subscription delivered (version 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The subscription's id, as SUBSCRIBE returned it.
    pub subscription: u32,
    pub topic: String,
    pub message: Delivered,
}
