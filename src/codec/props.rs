//! Message properties (protocol version 2): a message's tags and headers,
//! kept as one blob of type-length-value entries, as RocketMQ keeps a
//! message's properties map. docs/protocol.md ("Message properties") is the
//! contract.
//!
//! ```text
//! entry: u8 type, u16 len, len bytes of value
//! type 1 tag:    the value is the tag, UTF-8
//! type 2 header: the value is a key (u16 len, UTF-8) then the header's
//!                value, the bytes up to the end of the entry
//! type 3, 4:     a delivery time or delay, u64 ms (version 3)
//! type 5 key:    the message's key, 1 to key_bytes_max bytes (version 4)
//! ```
//!
//! The blob is validated once, when it is decoded (`Props::parse`), so that
//! iterating a `Props` cannot fail and the broker can store, index and send
//! the bytes as they came. A later protocol version adds types (a key, a
//! dedup id, a delivery time); a type the session's version lacks is
//! refused, never skipped, so that a property is never silently lost.

use byteorder::{ByteOrder, LittleEndian};

use super::{ErrorCode, put_u16};

/// Property type: a tag (UTF-8), repeatable.
pub const PROP_TAG: u8 = 1;
/// Property type: a header (a key string, then the value bytes).
pub const PROP_HEADER: u8 = 2;
/// The broker's own entries (a message's log record and queue copy carry
/// them; no client sends or receives them): they come after every client
/// property of the blob, so that what a client is sent is a prefix of it
/// (`Props::public`), and a client's PRODUCE with one is refused, as any
/// type its version lacks.
///
/// Broker entry: a dead letter's origin group (UTF-8 name, not empty),
/// delivered as the FETCH reply's origin group field.
pub const PROP_ORIGIN_GROUP: u8 = 10;
/// Broker entry: a message redriven to one group only (UTF-8 name, not
/// empty): every other group's filter drops it.
pub const PROP_REDRIVEN_TO: u8 = 11;
/// Property type (version 3): deliver the message at this wall-clock time,
/// a `u64` of ms since the Unix epoch on the broker's clock.
pub const PROP_DELIVER_AT: u8 = 3;
/// Property type (version 3): deliver the message this many ms (`u64`)
/// after the broker receives it. The broker stores it as `PROP_DELIVER_AT`.
pub const PROP_DELAY: u8 = 4;
/// Property type (version 4): the message's dedup id, 1 to
/// `dedup_id_bytes_max` opaque bytes. Within its topic's dedup window a
/// second message with the same id is not stored (docs/protocol.md,
/// "Idempotent produce (version 4)").
pub const PROP_DEDUP_ID: u8 = 6;
/// The protocol version that adds dedup ids.
const SINCE_DEDUP: u16 = 4;
/// Property type (version 4): the reason the last NACK of the message
/// gave (UTF-8), which the broker writes into a dead letter's copy
/// (docs/protocol.md, "NACK reasons (version 4)").
pub const PROP_LAST_NACK_REASON: u8 = 7;
/// The protocol version that adds the time properties.
const SINCE_SCHEDULE: u16 = 3;
/// Property type (version 4): the message's key, any bytes, at most one
/// per message. LOOKUP finds a topic's recent messages by it (docs/
/// protocol.md, "Keys and inspection (version 4)"); a later change
/// delivers the messages of one key in order by it.
pub const PROP_KEY: u8 = 5;
/// The protocol version that adds the key property.
const SINCE_KEY: u16 = super::V4;
/// Bytes of a time property's value.
pub const PROP_TIME_BYTES: usize = 8;
/// Bytes of an entry's type and length fields.
pub const PROP_ENTRY_OVERHEAD_BYTES: usize = 1 + 2;

/// The bounds the decoder holds properties to; a copy of the broker's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropsLimits {
    /// Most tags on one message.
    pub tags_per_message_max: u32,
    /// Longest tag, bytes.
    pub tag_bytes_max: u32,
    /// Most bytes of the whole blob, its entries' type and length included.
    pub props_bytes_max: u32,
    /// Longest key, bytes.
    pub key_bytes_max: u32,
}

impl PropsLimits {
    /// Bounds only the wire format sets: for reading what a broker sent.
    pub const ANY: PropsLimits = PropsLimits {
        tags_per_message_max: u32::MAX,
        tag_bytes_max: u32::MAX,
        props_bytes_max: u32::MAX,
        key_bytes_max: u32::MAX,
    };
}

/// Why a properties blob was refused: the error code and a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropsError {
    pub code: ErrorCode,
    pub message: String,
}

fn bad(message: String) -> PropsError {
    PropsError { code: ErrorCode::BadArgument, message }
}

fn malformed(message: &str) -> PropsError {
    PropsError { code: ErrorCode::Malformed, message: message.to_string() }
}

/// One property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prop<'a> {
    Tag(&'a str),
    Header {
        key: &'a str,
        value: &'a [u8],
    },
    /// Deliver at this wall-clock time, ms since the Unix epoch.
    DeliverAt(u64),
    /// Deliver this many ms after the broker receives it.
    Delay(u64),
    /// The message's key (version 4).
    Key(&'a [u8]),
    /// The message's dedup id (version 4).
    DedupId(&'a [u8]),
    /// A dead letter's last NACK reason (version 4).
    LastNackReason(&'a str),
}

/// A validated properties blob (possibly empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Props<'a> {
    /// The entries, back to back, exactly.
    bytes: &'a [u8],
}

/// Whether version `version` of the protocol knows property type `kind`.
pub fn prop_type_known(kind: u8, version: u16) -> bool {
    match kind {
        PROP_TAG | PROP_HEADER => version >= 2,
        PROP_DELIVER_AT | PROP_DELAY => version >= SINCE_SCHEDULE,
        PROP_KEY => version >= SINCE_KEY,
        PROP_DEDUP_ID | PROP_LAST_NACK_REASON => version >= SINCE_DEDUP,
        _ => false,
    }
}

/// Checks a time property's value: exactly a `u64`.
fn time_value(value: &[u8]) -> Result<u64, PropsError> {
    let bytes: [u8; PROP_TIME_BYTES] =
        value.try_into().map_err(|_| malformed("a deliver_at_ms or delay_ms property is not 8 bytes"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Checks a key, the `nth` of its message: 1 to `key_bytes_max` bytes, and
/// the only one.
fn check_key(key: &[u8], nth: u32, key_bytes_max: u32) -> Result<(), PropsError> {
    if nth > 1 {
        return Err(bad("a message has more than one key".into()));
    }
    if key.is_empty() {
        return Err(bad("a key is empty".into()));
    }
    if key.len() > key_bytes_max as usize {
        return Err(bad(format!("a key is {} bytes, more than key_bytes_max ({key_bytes_max})", key.len())));
    }
    Ok(())
}

/// Whether `kind` is one of the broker's own entries.
pub fn is_broker_prop(kind: u8) -> bool {
    matches!(kind, PROP_ORIGIN_GROUP | PROP_REDRIVEN_TO)
}

/// Checks a tag: 1 to `tag_bytes_max` bytes of UTF-8 without `|`,
/// whitespace or control characters, so that every tag can be named in a
/// filter's list (`a || b`).
pub fn check_tag(tag: &[u8], tag_bytes_max: u32) -> Result<&str, String> {
    if tag.is_empty() {
        return Err("a tag is empty".into());
    }
    if tag.len() > tag_bytes_max as usize {
        return Err(format!("a tag is {} bytes, more than tag_bytes_max ({tag_bytes_max})", tag.len()));
    }
    let tag = std::str::from_utf8(tag).map_err(|_| "a tag is not UTF-8".to_string())?;
    if let Some(c) = tag.chars().find(|&c| c == '|' || c.is_whitespace() || c.is_control()) {
        return Err(format!("tag {tag:?} has {c:?}; a tag has no '|', whitespace or control characters"));
    }
    Ok(tag)
}

/// Reads one entry at the start of `rest`: its type, its value, and the
/// bytes it took. `None` when the entry runs past `rest`.
fn entry(rest: &[u8]) -> Option<(u8, &[u8], usize)> {
    let kind = *rest.first()?;
    let len = LittleEndian::read_u16(rest.get(1..3)?) as usize;
    let value = rest.get(PROP_ENTRY_OVERHEAD_BYTES..PROP_ENTRY_OVERHEAD_BYTES + len)?;
    Some((kind, value, PROP_ENTRY_OVERHEAD_BYTES + len))
}

/// Splits a header's value into its key and value. `Err` for a key that
/// runs past the entry (MALFORMED) or is empty or not UTF-8.
fn header(value: &[u8]) -> Result<(&str, &[u8]), PropsError> {
    let len = value.get(..2).map(LittleEndian::read_u16).ok_or_else(|| malformed("a header has no key length"))?;
    let key = value.get(2..2 + len as usize).ok_or_else(|| malformed("a header's key runs past its entry"))?;
    let key = std::str::from_utf8(key).map_err(|_| bad("a header's key is not UTF-8".into()))?;
    if key.is_empty() {
        return Err(bad("a header's key is empty".into()));
    }
    Ok((key, &value[2 + key.len()..]))
}

impl<'a> Props<'a> {
    /// No properties.
    pub const EMPTY: Props<'static> = Props { bytes: &[] };

    /// Validates a blob against the session's `version` and `limits`:
    /// MALFORMED when an entry runs past the blob, BAD_ARGUMENT for a type
    /// the version lacks, a bad tag or header, or a limit passed.
    pub fn parse(bytes: &'a [u8], version: u16, limits: &PropsLimits) -> Result<Props<'a>, PropsError> {
        if bytes.len() > limits.props_bytes_max as usize {
            return Err(bad(format!(
                "properties are {} bytes, more than props_bytes_max ({})",
                bytes.len(),
                limits.props_bytes_max
            )));
        }
        let (mut at, mut tags, mut times, mut keys, mut dedups) = (0, 0u32, 0u32, 0u32, 0u32);
        while at < bytes.len() {
            let (kind, value, n) =
                entry(&bytes[at..]).ok_or_else(|| malformed("a property runs past the properties"))?;
            if !prop_type_known(kind, version) {
                return Err(bad(format!("property type {kind} is not one of protocol version {version}")));
            }
            if kind == PROP_TAG {
                tags += 1;
                if tags > limits.tags_per_message_max {
                    let max = limits.tags_per_message_max;
                    return Err(bad(format!("more than tags_per_message_max ({max}) tags on a message")));
                }
                check_tag(value, limits.tag_bytes_max).map_err(bad)?;
            } else if kind == PROP_HEADER {
                header(value)?;
            } else if kind == PROP_KEY {
                keys += 1;
                check_key(value, keys, limits.key_bytes_max)?;
            } else if kind == PROP_LAST_NACK_REASON {
                std::str::from_utf8(value).map_err(|_| bad("a last_nack_reason is not UTF-8".into()))?;
            } else if kind == PROP_DEDUP_ID {
                dedups += 1;
                if value.is_empty() || dedups > 1 {
                    return Err(bad("a dedup id is empty, or a message has more than one".into()));
                }
            } else {
                time_value(value)?;
                times += 1;
                if times > 1 {
                    return Err(bad("a message has more than one deliver_at_ms or delay_ms property".into()));
                }
            }
            at += n;
        }
        Ok(Props { bytes })
    }

    /// Validates a stored blob (a log record's): the client properties of
    /// the newest version, then the broker's own entries, each a UTF-8
    /// name, and nothing after them. Bounded by the format alone.
    pub fn parse_stored(bytes: &'a [u8], version: u16) -> Result<Props<'a>, PropsError> {
        let public = Props::trusted(bytes).public().bytes.len();
        Props::parse(&bytes[..public], version, &PropsLimits::ANY)?;
        let mut at = public;
        while at < bytes.len() {
            let (kind, value, n) =
                entry(&bytes[at..]).ok_or_else(|| malformed("a property runs past the properties"))?;
            if !is_broker_prop(kind) || value.is_empty() || std::str::from_utf8(value).is_err() {
                return Err(bad(format!("stored property type {kind} is out of place or not a group name")));
            }
            at += n;
        }
        Ok(Props { bytes })
    }

    /// The client properties: the blob up to the broker's own entries
    /// (what a FETCH reply carries).
    pub fn public(&self) -> Props<'a> {
        let mut at = 0;
        while let Some((kind, _, n)) = entry(&self.bytes[at..]) {
            if is_broker_prop(kind) {
                break;
            }
            at += n;
        }
        Props { bytes: &self.bytes[..at] }
    }

    /// The value of the broker's entry `kind` (a group name), if present.
    pub fn broker_entry(&self, kind: u8) -> Option<&'a str> {
        let mut rest = &self.bytes[self.public().bytes.len()..];
        while let Some((k, value, n)) = entry(rest) {
            if k == kind {
                return std::str::from_utf8(value).ok();
            }
            rest = &rest[n..];
        }
        None
    }

    /// A blob `parse` already validated (kept with the batch it came in,
    /// or stored with its message by the queue).
    pub(crate) fn trusted(bytes: &'a [u8]) -> Props<'a> {
        Props { bytes }
    }

    /// The blob, as it came.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Every property, in the order they came.
    pub fn iter(&self) -> PropsIter<'a> {
        PropsIter { rest: self.bytes }
    }

    /// The tags, in order.
    pub fn tags(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.iter().filter_map(|p| match p {
            Prop::Tag(t) => Some(t),
            _ => None,
        })
    }

    /// The headers, in order (a key may repeat).
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.iter().filter_map(|p| match p {
            Prop::Header { key, value } => Some((key, value)),
            _ => None,
        })
    }

    /// The delivery time or delay the message carries (at most one).
    pub fn schedule(&self) -> Option<Prop<'a>> {
        self.iter().find(|p| matches!(p, Prop::DeliverAt(_) | Prop::Delay(_)))
    }

    /// The message's key, if it has one (version 4): at most one, 1 to
    /// `key_bytes_max` bytes, any bytes (`Props::parse` checked).
    pub fn key(&self) -> Option<&'a [u8]> {
        self.iter().find_map(|p| match p {
            Prop::Key(k) => Some(k),
            _ => None,
        })
    }

    /// The message's dedup id (version 4), if it has one.
    pub fn dedup_id(&self) -> Option<&'a [u8]> {
        self.iter().find_map(|p| match p {
            Prop::DedupId(id) => Some(id),
            _ => None,
        })
    }

    /// A dead letter's last NACK reason (property 7), if it has one.
    pub fn last_nack_reason(&self) -> Option<&'a str> {
        self.iter().find_map(|p| match p {
            Prop::LastNackReason(r) => Some(r),
            _ => None,
        })
    }

    /// Where in the blob the value of the time property is, if there is one.
    pub fn schedule_value_at(&self) -> Option<usize> {
        let mut at = 0;
        while let Some((kind, _, n)) = entry(&self.bytes[at..]) {
            if matches!(kind, PROP_DELIVER_AT | PROP_DELAY) {
                return Some(at + PROP_ENTRY_OVERHEAD_BYTES);
            }
            at += n;
        }
        None
    }

    /// Whether every entry is of a type protocol version `version` knows.
    pub fn known_to(&self, version: u16) -> bool {
        let mut at = 0;
        while let Some((kind, _, n)) = entry(&self.bytes[at..]) {
            if !prop_type_known(kind, version) {
                return false;
            }
            at += n;
        }
        true
    }

    /// The value of the first header named `key`.
    pub fn header(&self, key: &str) -> Option<&'a [u8]> {
        self.headers().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// The properties of a validated blob, in order.
pub struct PropsIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for PropsIter<'a> {
    type Item = Prop<'a>;
    fn next(&mut self) -> Option<Prop<'a>> {
        // The blob was validated by `Props::parse`: every entry is whole and
        // of a known type, so the `?`s below end only at the end (or at
        // the broker's own entries, which are not the message's).
        let (kind, value, n) = entry(self.rest)?;
        if is_broker_prop(kind) {
            return None;
        }
        self.rest = &self.rest[n..];
        Some(match kind {
            PROP_TAG => Prop::Tag(std::str::from_utf8(value).ok()?),
            PROP_DELIVER_AT => Prop::DeliverAt(time_value(value).ok()?),
            PROP_DELAY => Prop::Delay(time_value(value).ok()?),
            PROP_KEY => Prop::Key(value),
            PROP_DEDUP_ID => Prop::DedupId(value),
            PROP_LAST_NACK_REASON => Prop::LastNackReason(std::str::from_utf8(value).ok()?),
            _ => {
                let (key, value) = header(value).ok()?;
                Prop::Header { key, value }
            }
        })
    }
}

/// Appends a tag entry to a blob being built. The caller checks the tag
/// (`check_tag`); the decoder refuses a bad one.
pub fn put_tag(out: &mut Vec<u8>, tag: &str) {
    assert!(tag.len() <= usize::from(u16::MAX), "a tag over 65535 bytes");
    out.push(PROP_TAG);
    put_u16(out, tag.len() as u16);
    out.extend_from_slice(tag.as_bytes());
}

/// Appends a header entry to a blob being built.
pub fn put_header(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    assert!(2 + key.len() + value.len() <= usize::from(u16::MAX), "a header over 65535 bytes");
    out.push(PROP_HEADER);
    put_u16(out, (2 + key.len() + value.len()) as u16);
    put_u16(out, key.len() as u16);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
}

/// Appends a key entry to a blob being built. The caller keeps it within
/// `key_bytes_max`; the decoder refuses a longer or empty one.
pub fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    assert!(key.len() <= usize::from(u16::MAX), "a key over 65535 bytes");
    out.push(PROP_KEY);
    put_u16(out, key.len() as u16);
    out.extend_from_slice(key);
}

/// The client properties of `props` with `reason` as their last NACK
/// reason (property 7, replacing any), for a dead letter's copy; None if
/// the blob would pass the 65535 bytes its length field holds.
pub fn with_last_nack_reason(props: &Props<'_>, reason: &str) -> Option<Vec<u8>> {
    let public = props.public().bytes;
    let mut out = Vec::with_capacity(public.len() + PROP_ENTRY_OVERHEAD_BYTES + reason.len());
    let mut at = 0;
    while let Some((kind, _, n)) = entry(&public[at..]) {
        if kind != PROP_LAST_NACK_REASON {
            out.extend_from_slice(&public[at..at + n]);
        }
        at += n;
    }
    if out.len() + PROP_ENTRY_OVERHEAD_BYTES + reason.len() > usize::from(u16::MAX) {
        return None;
    }
    out.push(PROP_LAST_NACK_REASON);
    put_u16(&mut out, reason.len() as u16);
    out.extend_from_slice(reason.as_bytes());
    Some(out)
}

/// Appends one of the broker's own entries (`kind`, a group name) to a
/// blob being built; it must come after the client properties.
pub fn put_broker_entry(out: &mut Vec<u8>, kind: u8, name: &str) {
    assert!(is_broker_prop(kind) && !name.is_empty(), "broker entry {kind} with name {name:?}");
    assert!(name.len() <= usize::from(u16::MAX), "a group name over 65535 bytes");
    out.push(kind);
    put_u16(out, name.len() as u16);
    out.extend_from_slice(name.as_bytes());
}

/// Appends a dedup id entry (version 4). The caller keeps it within
/// `dedup_id_bytes_max`; the broker refuses a longer one.
pub fn put_dedup_id(out: &mut Vec<u8>, id: &[u8]) {
    assert!(!id.is_empty() && id.len() <= usize::from(u16::MAX), "a dedup id of {} bytes", id.len());
    out.push(PROP_DEDUP_ID);
    put_u16(out, id.len() as u16);
    out.extend_from_slice(id);
}

/// Appends a time property entry: `PROP_DELIVER_AT` or `PROP_DELAY`.
pub fn put_time(out: &mut Vec<u8>, kind: u8, ms: u64) {
    assert!(matches!(kind, PROP_DELIVER_AT | PROP_DELAY), "not a time property: {kind}");
    out.push(kind);
    put_u16(out, PROP_TIME_BYTES as u16);
    out.extend_from_slice(&ms.to_le_bytes());
}

/// Appends the entries of `props` that protocol version `version` knows
/// (a later version's time properties are left out for an earlier
/// session), with their u16 length.
pub fn put_props_for(out: &mut Vec<u8>, props: &Props<'_>, version: u16) {
    if props.known_to(version) {
        return put_props(out, props);
    }
    let len_at = out.len();
    put_u16(out, 0);
    let mut at = 0;
    while let Some((kind, _, n)) = entry(&props.bytes[at..]) {
        if prop_type_known(kind, version) {
            out.extend_from_slice(&props.bytes[at..at + n]);
        }
        at += n;
    }
    let len = (out.len() - len_at - 2) as u16;
    out[len_at..len_at + 2].copy_from_slice(&len.to_le_bytes());
}

/// Bytes of the entries of `props` that version `version` knows.
pub fn props_len_for(props: &Props<'_>, version: u16) -> usize {
    let mut at = 0;
    let mut len = 0;
    while let Some((kind, _, n)) = entry(&props.bytes[at..]) {
        if prop_type_known(kind, version) {
            len += n;
        }
        at += n;
    }
    len
}

/// `props` without its time property, as an owned blob (a moved message,
/// or a copy of one whose time has come, carries none).
pub fn without_schedule(props: &Props<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(props.bytes.len());
    let mut at = 0;
    while let Some((kind, _, n)) = entry(&props.bytes[at..]) {
        if !matches!(kind, PROP_DELIVER_AT | PROP_DELAY) {
            out.extend_from_slice(&props.bytes[at..at + n]);
        }
        at += n;
    }
    out
}

/// Appends a blob with its u16 length: the properties field of a message,
/// on the wire (and in the log, which shares this helper, not a layout).
pub fn put_props(out: &mut Vec<u8>, props: &Props<'_>) {
    assert!(props.bytes.len() <= usize::from(u16::MAX), "properties over 65535 bytes");
    put_u16(out, props.bytes.len() as u16);
    out.extend_from_slice(props.bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PropsLimits =
        PropsLimits { tags_per_message_max: 2, tag_bytes_max: 5, props_bytes_max: 64, key_bytes_max: 4 };

    fn blob(tags: &[&str], headers: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for t in tags {
            put_tag(&mut out, t);
        }
        for (k, v) in headers {
            put_header(&mut out, k, v);
        }
        out
    }

    fn refused(bytes: &[u8], limits: &PropsLimits) -> ErrorCode {
        Props::parse(bytes, 2, limits).expect_err("refused").code
    }

    #[test]
    fn tags_and_headers_come_back_in_order() {
        let mut bytes = blob(&["a"], &[("k", b"v1")]);
        put_tag(&mut bytes, "b");
        put_header(&mut bytes, "k", b"");
        let p = Props::parse(&bytes, 2, &LIMITS).expect("valid");
        assert_eq!(p.tags().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(p.headers().collect::<Vec<_>>(), [("k", &b"v1"[..]), ("k", &b""[..])]);
        assert_eq!(p.header("k"), Some(&b"v1"[..]));
        assert_eq!(p.header("x"), None);
        let all: Vec<Prop> = p.iter().collect();
        assert_eq!(all[0], Prop::Tag("a"));
        assert_eq!(all.len(), 4);
        assert_eq!(p.bytes(), &bytes[..]);
        let mut framed = Vec::new();
        put_props(&mut framed, &p);
        assert_eq!((framed[..2].to_vec(), &framed[2..]), ((bytes.len() as u16).to_le_bytes().to_vec(), &bytes[..]));
        assert!(Props::parse(&[], 2, &LIMITS).expect("empty").is_empty());
    }

    #[test]
    fn a_version_without_properties_refuses_every_type() {
        let bytes = blob(&["a"], &[]);
        assert_eq!(Props::parse(&bytes, 1, &LIMITS).expect_err("v1").code, ErrorCode::BadArgument);
        assert!(!prop_type_known(PROP_TAG, 1));
        assert!(prop_type_known(PROP_HEADER, 2));
        assert!(!prop_type_known(3, 2), "a later version's type is refused, not skipped");
        assert!(prop_type_known(PROP_DELIVER_AT, 3) && prop_type_known(PROP_DELAY, 3));
        assert!(!prop_type_known(5, 3));
        assert_eq!(refused(&[3, 0, 0], &LIMITS), ErrorCode::BadArgument);
    }

    #[test]
    fn limits_are_held_at_their_boundaries() {
        assert!(Props::parse(&blob(&["abcde", "x"], &[]), 2, &LIMITS).is_ok());
        assert_eq!(refused(&blob(&["abcdef"], &[]), &LIMITS), ErrorCode::BadArgument, "tag_bytes_max + 1");
        assert_eq!(refused(&blob(&["a", "b", "c"], &[]), &LIMITS), ErrorCode::BadArgument, "one tag too many");
        // A header entry: type, length, key length, key, value.
        let big = [7u8; 59];
        assert!(Props::parse(&blob(&[], &[("k", &big[..58])]), 2, &LIMITS).is_ok(), "64 bytes");
        assert_eq!(refused(&blob(&[], &[("k", &big[..59])]), &LIMITS), ErrorCode::BadArgument, "65 bytes");
    }

    #[test]
    fn the_brokers_own_entries_come_last_are_never_a_clients_and_are_not_sent() {
        let mut bytes = blob(&["a"], &[("k", b"v")]);
        let public_len = bytes.len();
        put_broker_entry(&mut bytes, PROP_ORIGIN_GROUP, "billing");
        put_broker_entry(&mut bytes, PROP_REDRIVEN_TO, "audit");
        let p = Props::parse_stored(&bytes, 2).expect("a stored blob");
        assert_eq!(p.public().bytes(), &bytes[..public_len]);
        assert_eq!(p.tags().collect::<Vec<_>>(), ["a"]);
        assert_eq!(p.headers().count(), 1, "iteration ends at the broker's entries");
        assert_eq!(p.broker_entry(PROP_ORIGIN_GROUP), Some("billing"));
        assert_eq!(p.broker_entry(PROP_REDRIVEN_TO), Some("audit"));
        assert_eq!(Props::parse(&bytes, 2, &PropsLimits::ANY).expect_err("a client's").code, ErrorCode::BadArgument);
        assert_eq!(Props::trusted(&bytes[..public_len]).broker_entry(PROP_ORIGIN_GROUP), None);
        // Out of place (a client property after one) or not a name: damage.
        let mut after = bytes.clone();
        put_tag(&mut after, "b");
        assert!(Props::parse_stored(&after, 2).is_err());
        assert!(Props::parse_stored(&[PROP_ORIGIN_GROUP, 0, 0], 2).is_err());
        assert!(Props::parse_stored(&[PROP_ORIGIN_GROUP, 1, 0, 0xff], 2).is_err());
        assert_eq!(Props::parse_stored(&bytes[..bytes.len() - 1], 2).expect_err("cut").code, ErrorCode::Malformed);
    }

    #[test]
    fn time_properties_are_one_u64_and_left_out_for_earlier_versions() {
        let mut bytes = blob(&["a"], &[]);
        put_time(&mut bytes, PROP_DELAY, 1500);
        let p = Props::parse(&bytes, 3, &LIMITS).expect("valid");
        assert_eq!(p.schedule(), Some(Prop::Delay(1500)));
        assert_eq!(p.tags().collect::<Vec<_>>(), ["a"]);
        let at = p.schedule_value_at().expect("a time");
        assert_eq!(&bytes[at..at + 8], &1500u64.to_le_bytes());
        assert_eq!(Props::parse(&bytes, 2, &LIMITS).expect_err("v2").code, ErrorCode::BadArgument);
        assert!(p.known_to(3) && !p.known_to(2));
        let mut v2 = Vec::new();
        put_props_for(&mut v2, &p, 2);
        assert_eq!(v2[2..], blob(&["a"], &[])[..]);
        assert_eq!(props_len_for(&p, 2) + 2, v2.len());
        assert_eq!(without_schedule(&p), blob(&["a"], &[]));
        let mut two = bytes.clone();
        put_time(&mut two, PROP_DELIVER_AT, 7);
        assert_eq!(Props::parse(&two, 3, &LIMITS).expect_err("two times").code, ErrorCode::BadArgument);
        assert_eq!(Props::parse(&[PROP_DELAY, 1, 0, 0], 3, &LIMITS).expect_err("short").code, ErrorCode::Malformed);
    }

    #[test]
    fn a_key_is_one_short_value_of_version_4() {
        let mut bytes = blob(&["a"], &[]);
        put_key(&mut bytes, b"k\xff7");
        let p = Props::parse(&bytes, 4, &LIMITS).expect("valid");
        assert_eq!(p.key(), Some(&b"k\xff7"[..]), "any bytes");
        assert_eq!(p.iter().nth(1), Some(Prop::Key(b"k\xff7")));
        assert_eq!(p.tags().collect::<Vec<_>>(), ["a"]);
        assert_eq!(Props::parse(&blob(&["a"], &[]), 4, &LIMITS).expect("no key").key(), None);
        assert_eq!(Props::parse(&bytes, 3, &LIMITS).expect_err("v3").code, ErrorCode::BadArgument);
        assert!(p.known_to(4) && !p.known_to(3));
        let mut v3 = Vec::new();
        put_props_for(&mut v3, &p, 3);
        assert_eq!(v3[2..], blob(&["a"], &[])[..], "left out for an earlier session");
        let mut four = Vec::new();
        put_key(&mut four, b"abcd");
        assert!(Props::parse(&four, 4, &LIMITS).is_ok(), "key_bytes_max");
        let mut five = Vec::new();
        put_key(&mut five, b"abcde");
        assert_eq!(Props::parse(&five, 4, &LIMITS).expect_err("long").code, ErrorCode::BadArgument);
        put_key(&mut four, b"x");
        assert_eq!(Props::parse(&four, 4, &LIMITS).expect_err("two").code, ErrorCode::BadArgument);
        assert_eq!(Props::parse(&[PROP_KEY, 0, 0], 4, &LIMITS).expect_err("empty").code, ErrorCode::BadArgument);
    }

    #[test]
    fn bad_entries_are_refused_with_their_code() {
        for tag in ["", "a|b", "a b", "a\tb", "\u{7f}"] {
            assert_eq!(refused(&blob(&[tag], &[]), &PropsLimits::ANY), ErrorCode::BadArgument, "{tag:?}");
        }
        assert_eq!(refused(&[PROP_TAG, 2, 0, 0xff, 0xfe], &LIMITS), ErrorCode::BadArgument, "not UTF-8");
        assert_eq!(refused(&blob(&[], &[("", b"v")]), &LIMITS), ErrorCode::BadArgument, "empty key");
        assert_eq!(refused(&[PROP_HEADER, 2, 0, 0xff, 0xff], &LIMITS), ErrorCode::Malformed, "key past the entry");
        assert_eq!(refused(&[PROP_HEADER, 1, 0, 0], &LIMITS), ErrorCode::Malformed, "no key length");
        let whole = blob(&["ab"], &[("k", b"v")]);
        for cut in 1..whole.len() {
            if cut == 5 {
                continue; // a whole tag entry, then nothing: valid
            }
            assert_eq!(refused(&whole[..cut], &LIMITS), ErrorCode::Malformed, "cut at {cut}");
        }
    }
}
