//! The Deliver record: which messages a consumer group delivered, so that
//! a restart counts a delivery the consumer may have seen even when the
//! broker died before the message was acked, NACKed or timed out.
//!
//! One record per FETCH reply or pushed batch, with no sync of its own: it
//! is written with the turn's records, before the reply can leave (the
//! reactor's loop order), and each id's delivery count is implied (+1).
//! Ids are delta-encoded, because a batch is mostly consecutive ids: the
//! first in full, then each as a zigzag LEB128 varint of its difference
//! from the one before (a batch that starts with redeliveries may go
//! backwards), so a batch of consecutive ids costs about one byte per id.

use crate::codec;
use crate::log::Log;
use crate::queue::{GroupId, MsgId};
use crate::record::{Record, RecordKind, TopicId};

/// Most bytes one id's varint takes (a u64 in 7-bit groups).
const VARINT_BYTES_MAX: usize = 10;

/// A Deliver record: group `group` of topic `topic` delivered `ids`, each
/// once more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliverRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    /// In delivery order.
    pub ids: &'a [MsgId],
}

impl DeliverRecord<'_> {
    /// Writes version 1: `topic_id u32, group_id u32, count u32, first id
    /// u64`, then `count - 1` zigzag varints, each id minus the one before.
    /// Nothing for no id.
    pub fn append(&self, log: &mut Log) {
        let Some((&first, rest)) = self.ids.split_first() else { return };
        let at = log.begin(RecordKind::Deliver);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        codec::put_u32(b, self.ids.len() as u32);
        codec::put_u64(b, first);
        let mut prev = first;
        for &id in rest {
            put_varint(b, zigzag(id.wrapping_sub(prev) as i64));
            prev = id;
        }
        log.end(at);
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Reads one varint from the start of `b`: its value and length.
fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().take(VARINT_BYTES_MAX).enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Decodes a Deliver record's body after its `topic_id`.
pub(crate) fn decode(topic: TopicId, rest: &[u8]) -> Result<Record<'_>, String> {
    let group = rest.get(..4).ok_or("record body too short")?;
    let group = GroupId(u32::from_le_bytes([group[0], group[1], group[2], group[3]]));
    Ok(Record::Deliver { topic, group, ids: DeliveredIds::decode(&rest[4..])? })
}

/// The ids of a Deliver record, checked whole when decoded (so iterating
/// cannot fail).
#[derive(Clone, Copy, Debug)]
pub struct DeliveredIds<'a> {
    /// The first id.
    first: MsgId,
    /// How many ids.
    count: u32,
    /// The varints after the first.
    deltas: &'a [u8],
}

impl<'a> DeliveredIds<'a> {
    /// Decodes `count u32, first u64, varints` (the rest of the body):
    /// an error unless exactly `count - 1` varints fill it.
    pub fn decode(body: &'a [u8]) -> Result<DeliveredIds<'a>, String> {
        let short = || "record body too short".to_string();
        let count = u32::from_le_bytes(body.get(..4).ok_or_else(short)?.try_into().map_err(|_| short())?);
        let first = u64::from_le_bytes(body.get(4..12).ok_or_else(short)?.try_into().map_err(|_| short())?);
        if count == 0 {
            return Err("a Deliver record with no id".into());
        }
        let ids = DeliveredIds { first, count, deltas: &body[12..] };
        let (mut at, mut n) = (0, 1);
        while at < ids.deltas.len() {
            let (_, len) = read_varint(&ids.deltas[at..]).ok_or("a Deliver record's id delta is cut short")?;
            at += len;
            n += 1;
        }
        if n != count {
            return Err(format!("a Deliver record says {count} ids and holds {n}"));
        }
        Ok(ids)
    }

    pub fn len(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = MsgId> + 'a {
        let (mut prev, mut at, deltas) = (self.first, 0, self.deltas);
        std::iter::once(self.first).chain(std::iter::from_fn(move || {
            let (v, len) = read_varint(&deltas[at..])?;
            at += len;
            prev = prev.wrapping_add(unzigzag(v) as u64);
            Some(prev)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Rng;

    #[test]
    fn zigzag_round_trips_at_the_extremes() {
        for v in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v, "{v}");
        }
        let mut b = Vec::new();
        put_varint(&mut b, u64::MAX);
        assert_eq!(b.len(), VARINT_BYTES_MAX);
        assert_eq!(read_varint(&b), Some((u64::MAX, VARINT_BYTES_MAX)));
        assert_eq!(read_varint(&b[..9]), None, "cut short");
    }

    #[test]
    fn ids_in_any_order_round_trip() {
        let seed = crate::testkit::seed(0xde11_0001);
        println!("seed {seed}");
        let mut rng = Rng::new(seed);
        for _ in 0..200 {
            let n = 1 + rng.below(50) as usize;
            let ids: Vec<MsgId> = (0..n).map(|_| rng.below(u64::MAX)).collect();
            let mut body = Vec::new();
            codec::put_u32(&mut body, ids.len() as u32);
            codec::put_u64(&mut body, ids[0]);
            for w in ids.windows(2) {
                put_varint(&mut body, zigzag(w[1].wrapping_sub(w[0]) as i64));
            }
            let got = DeliveredIds::decode(&body).expect("decodes");
            assert_eq!(got.iter().collect::<Vec<_>>(), ids, "seed {seed}");
            assert!(DeliveredIds::decode(&body[..body.len() - 1]).is_err(), "a cut body is refused");
        }
    }
}
