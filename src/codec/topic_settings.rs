//! A topic's extensible settings (protocol version 4): the list that
//! follows CREATE_TOPIC's version-1 fields, and that a Topic record of the
//! commit log carries too. docs/protocol.md ("Idempotent produce (version
//! 4)") is the contract.
//!
//! ```text
//! entry: u8 setting id, u16 len, len bytes of value
//! id 1 dedup_window_ms: u32, the topic's dedup window (0: no dedup)
//! id 2 retention_ms: u64, how long done messages stay replayable (0: off)
//! id 3 retention_bytes: u64, log bytes of the topic kept for replay (0: off)
//! ```
//!
//! One list, type-length-value as message properties are, so that a later
//! setting (retention by age or bytes, ids 2 and 3) is a new id, not a new
//! layout. An id this codec does not know is refused (BAD_ARGUMENT), never
//! skipped, so a setting is never silently lost.

use byteorder::{ByteOrder, LittleEndian};

use super::{BodyError, ErrorCode, malformed, put_u16, put_u32, put_u64};

/// Setting id: the topic's dedup window, a `u32` of ms.
pub const SETTING_DEDUP_WINDOW_MS: u8 = 1;
/// Setting id: the topic's retention by age, a `u64` of ms.
pub const SETTING_RETENTION_MS: u8 = 2;
/// Setting id: the topic's retention by size, a `u64` of bytes.
pub const SETTING_RETENTION_BYTES: u8 = 3;
/// Bytes of an entry's id and length fields.
const ENTRY_OVERHEAD_BYTES: usize = 1 + 2;

/// The settings of a version-4 CREATE_TOPIC (and of a Topic record): each
/// is None when the list does not name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicOptions {
    /// How long a dedup id is remembered after its message is produced, ms;
    /// 0 turns deduplication off for the topic.
    pub dedup_window_ms: Option<u32>,
    /// How long done messages stay replayable after they were written,
    /// ms; 0 turns retention by age off.
    pub retention_ms: Option<u64>,
    /// Log bytes of the topic's messages kept for replay, counted from the
    /// newest; 0 turns retention by size off.
    pub retention_bytes: Option<u64>,
}

impl TopicOptions {
    /// Whether the list names no setting (then it is empty on the wire).
    pub fn is_empty(&self) -> bool {
        self.dedup_window_ms.is_none() && self.retention_ms.is_none() && self.retention_bytes.is_none()
    }
}

fn bad(message: String) -> BodyError {
    BodyError(ErrorCode::BadArgument, message)
}

/// Reads a settings list, `bytes` exactly: MALFORMED when an entry runs
/// past it, BAD_ARGUMENT for an unknown or repeated id or a value of the
/// wrong size. The broker holds the values to its limits
/// (`dedup_window_ms_max`).
pub(super) fn parse(bytes: &[u8]) -> Result<TopicOptions, BodyError> {
    let mut options = TopicOptions::default();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (id, value, n) = entry(rest).ok_or_else(|| malformed("a topic setting runs past the body"))?;
        match id {
            SETTING_DEDUP_WINDOW_MS => {
                let ms = value
                    .try_into()
                    .map(u32::from_le_bytes)
                    .map_err(|_| bad("setting 1 (dedup_window_ms) is not 4 bytes".into()))?;
                if options.dedup_window_ms.replace(ms).is_some() {
                    return Err(bad("setting 1 (dedup_window_ms) is given twice".into()));
                }
            }
            SETTING_RETENTION_MS => once_u64(&mut options.retention_ms, value, "2 (retention_ms)")?,
            SETTING_RETENTION_BYTES => once_u64(&mut options.retention_bytes, value, "3 (retention_bytes)")?,
            other => return Err(bad(format!("unknown topic setting id {other}"))),
        }
        rest = &rest[n..];
    }
    Ok(options)
}

/// Sets `slot` to the `u64` in `value`, which setting `what` names:
/// BAD_ARGUMENT if it is not 8 bytes or was given already.
fn once_u64(slot: &mut Option<u64>, value: &[u8], what: &str) -> Result<(), BodyError> {
    let v = value.try_into().map(u64::from_le_bytes).map_err(|_| bad(format!("setting {what} is not 8 bytes")))?;
    if slot.replace(v).is_some() {
        return Err(bad(format!("setting {what} is given twice")));
    }
    Ok(())
}

/// One entry at the start of `rest`: its id, value and the bytes it took.
fn entry(rest: &[u8]) -> Option<(u8, &[u8], usize)> {
    let id = *rest.first()?;
    let len = LittleEndian::read_u16(rest.get(1..3)?) as usize;
    let value = rest.get(ENTRY_OVERHEAD_BYTES..ENTRY_OVERHEAD_BYTES + len)?;
    Some((id, value, ENTRY_OVERHEAD_BYTES + len))
}

/// Appends the settings `options` names, as list entries (nothing for
/// none).
pub fn put_options(out: &mut Vec<u8>, options: &TopicOptions) {
    if let Some(ms) = options.dedup_window_ms {
        out.push(SETTING_DEDUP_WINDOW_MS);
        put_u16(out, 4);
        put_u32(out, ms);
    }
    for (id, value) in
        [(SETTING_RETENTION_MS, options.retention_ms), (SETTING_RETENTION_BYTES, options.retention_bytes)]
    {
        if let Some(v) = value {
            out.push(id);
            put_u16(out, 8);
            put_u64(out, v);
        }
    }
}

/// Reads a stored settings list (a Topic record's).
pub fn parse_stored(bytes: &[u8]) -> Result<TopicOptions, String> {
    parse(bytes).map_err(|BodyError(_, message)| message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_round_trips_and_empty_is_nothing() {
        for options in [
            TopicOptions::default(),
            TopicOptions { dedup_window_ms: Some(0), ..TopicOptions::default() },
            TopicOptions { dedup_window_ms: Some(120_000), ..TopicOptions::default() },
            TopicOptions { retention_ms: Some(3_600_000), ..TopicOptions::default() },
            TopicOptions { dedup_window_ms: Some(1), retention_ms: Some(0), retention_bytes: Some(1 << 40) },
        ] {
            let mut out = Vec::new();
            put_options(&mut out, &options);
            assert_eq!(out.is_empty(), options.is_empty());
            assert_eq!(parse(&out).ok(), Some(options));
        }
    }

    #[test]
    fn bad_lists_are_refused_with_their_code() {
        let code = |b: &[u8]| parse(b).err().map(|e| e.0);
        assert_eq!(code(&[1, 4, 0, 0xe8, 3, 0, 0]), None, "1000 ms");
        assert_eq!(code(&[1, 2, 0, 1, 0]), Some(ErrorCode::BadArgument), "not 4 bytes");
        assert_eq!(code(&[4, 0, 0]), Some(ErrorCode::BadArgument), "unknown id");
        assert_eq!(code(&[2, 8, 0, 1, 0, 0, 0, 0, 0, 0, 0]), None, "retention 1 ms");
        assert_eq!(code(&[3, 4, 0, 1, 0, 0, 0]), Some(ErrorCode::BadArgument), "retention bytes not 8 bytes");
        assert_eq!(
            code(&[2, 8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 8, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            Some(ErrorCode::BadArgument),
            "twice"
        );
        assert_eq!(code(&[1, 4, 0, 1, 0, 0, 0, 1, 4, 0, 1, 0, 0, 0]), Some(ErrorCode::BadArgument), "twice");
        assert_eq!(code(&[1, 4, 0, 1, 0]), Some(ErrorCode::Malformed), "runs past");
        assert_eq!(code(&[1]), Some(ErrorCode::Malformed), "no length");
    }
}
