//! Delivery verification: every message carries its producer's number and
//! its index in that producer's stream, so the bench can check that each
//! acknowledged produce was consumed at least once.
//!
//! A payload starts with two little-endian u64s: the sequence number
//! (producer << 40 | index) and a timestamp in `latency::now_ns` time (the
//! intended send time in open-loop runs, the queueing time otherwise).

/// Bytes of the header every payload starts with.
pub const HEADER_BYTES: usize = 16;
/// Bits of a sequence number that hold the index.
const INDEX_BITS: u32 = 40;

pub fn seq(producer: u32, index: u64) -> u64 {
    debug_assert!(index < 1 << INDEX_BITS);
    (u64::from(producer) << INDEX_BITS) | index
}

/// Writes the header into the start of `payload` (at least HEADER_BYTES).
pub fn stamp(payload: &mut [u8], seq: u64, ns: u64) {
    payload[..8].copy_from_slice(&seq.to_le_bytes());
    payload[8..16].copy_from_slice(&ns.to_le_bytes());
}

/// The (sequence, timestamp) a payload carries, if it is long enough.
pub fn read(payload: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let ns = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((seq, ns))
}

/// What a delivery check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verify {
    /// Messages whose produce was acknowledged.
    pub expected: u64,
    /// Of those, how many were consumed at least once.
    pub delivered: u64,
    pub missing: u64,
    /// Deliveries beyond the first (at-least-once allows them).
    pub duplicates: u64,
    /// Deliveries of messages whose produce was never acknowledged (sent
    /// when a run was cut short), or that no producer sent.
    pub unacknowledged: u64,
    /// The first few missing messages, as (producer, index).
    pub first_missing: Vec<(u32, u64)>,
    /// The check stopped at its time limit, not because nothing more came
    /// (a slow durable peer): missing messages may only be late.
    pub cut_short: bool,
}

impl Verify {
    pub fn ok(&self) -> bool {
        self.missing == 0
    }

    /// The checks of several consumer groups as one: every group must
    /// have had every message it was owed.
    pub fn add(&mut self, other: Verify) {
        self.expected += other.expected;
        self.delivered += other.delivered;
        self.missing += other.missing;
        self.duplicates += other.duplicates;
        self.unacknowledged += other.unacknowledged;
        let room = 10usize.saturating_sub(self.first_missing.len());
        self.first_missing.extend(other.first_missing.into_iter().take(room));
        self.cut_short |= other.cut_short;
    }
}

/// Seen messages, one bit each, per producer.
pub struct Seen {
    /// Acknowledged produces per producer: indexes below are expected.
    acked: Vec<u64>,
    bits: Vec<Vec<u64>>,
    duplicates: u64,
    unacknowledged: u64,
    delivered: u64,
}

impl Seen {
    /// `acked[p]` = produces of producer p that were acknowledged.
    pub fn new(acked: &[u64]) -> Seen {
        Seen {
            acked: acked.to_vec(),
            bits: acked.iter().map(|&n| vec![0u64; n.div_ceil(64) as usize]).collect(),
            duplicates: 0,
            unacknowledged: 0,
            delivered: 0,
        }
    }

    pub fn expected(&self) -> u64 {
        self.acked.iter().sum()
    }

    /// Records one delivery.
    pub fn add(&mut self, seq: u64) {
        let p = (seq >> INDEX_BITS) as usize;
        let i = seq & ((1 << INDEX_BITS) - 1);
        match self.bits.get_mut(p) {
            Some(words) if i < self.acked[p] => {
                let (w, b) = ((i / 64) as usize, i % 64);
                if words[w] & (1 << b) != 0 {
                    self.duplicates += 1;
                } else {
                    words[w] |= 1 << b;
                    self.delivered += 1;
                }
            }
            _ => self.unacknowledged += 1,
        }
    }

    pub fn complete(&self) -> bool {
        self.delivered == self.expected()
    }

    pub fn verify(&self) -> Verify {
        let expected = self.expected();
        let mut first_missing = Vec::new();
        if self.delivered < expected {
            'find: for (p, words) in self.bits.iter().enumerate() {
                for i in 0..self.acked[p] {
                    if words[(i / 64) as usize] & (1 << (i % 64)) == 0 {
                        first_missing.push((p as u32, i));
                        if first_missing.len() == 10 {
                            break 'find;
                        }
                    }
                }
            }
        }
        Verify {
            expected,
            delivered: self.delivered,
            missing: expected - self.delivered,
            duplicates: self.duplicates,
            unacknowledged: self.unacknowledged,
            first_missing,
            cut_short: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_missing_duplicate_and_unacknowledged_deliveries() {
        let mut s = Seen::new(&[3, 2]);
        for q in [seq(0, 0), seq(0, 2), seq(0, 2), seq(1, 0), seq(1, 1), seq(1, 5), seq(9, 0)] {
            s.add(q);
        }
        let v = s.verify();
        assert_eq!(v.expected, 5);
        assert_eq!(v.delivered, 4);
        assert_eq!(v.missing, 1);
        assert_eq!(v.first_missing, vec![(0, 1)]);
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.unacknowledged, 2);
        s.add(seq(0, 1));
        assert!(s.complete() && s.verify().ok());
    }

    #[test]
    fn several_groups_checks_add_up_and_any_missing_fails_them() {
        let mut whole = Seen::new(&[2]);
        whole.add(seq(0, 0));
        whole.add(seq(0, 1));
        let mut short = Seen::new(&[2]);
        short.add(seq(0, 1));
        short.add(seq(0, 1));
        let mut v = whole.verify();
        assert!(v.ok());
        v.add(short.verify());
        assert_eq!((v.expected, v.delivered, v.missing, v.duplicates), (4, 3, 1, 1));
        assert_eq!(v.first_missing, vec![(0, 0)]);
        assert!(!v.ok());
    }

    #[test]
    fn headers_round_trip() {
        let mut p = [0u8; 20];
        stamp(&mut p, seq(3, 77), 123_456);
        assert_eq!(read(&p), Some((seq(3, 77), 123_456)));
        assert_eq!(read(&p[..15]), None);
    }
}
