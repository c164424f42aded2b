//! An idempotent producer (protocol version 4): a `Client` that gives each
//! message a dedup id — a random producer id and a sequence number, as
//! Kafka's idempotent producer numbers its batches — and, when the
//! connection breaks or the broker answers STORAGE, reconnects, sends
//! HELLO and sends the same batch again with the same ids. The broker
//! answers the messages it had stored as duplicates, with their ids, and
//! stores the others (docs/protocol.md, "Retrying a PRODUCE"), so a batch
//! is stored once however often it is sent, within its topic's dedup
//! window.
//!
//! It speaks only the wire protocol, as `Client` does.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::client::{Client, Error, OwnedReply, ProduceMessage, Result};
use crate::codec::{self, ErrorCode};

/// How an `IdempotentProducer` retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProduceOptions {
    /// Tries of one batch after the first, reconnecting as needed, before
    /// its last error is returned. Each waits `retry_backoff_ms`, doubled
    /// each time up to 16 times it.
    pub retries_max: u32,
    /// Wait before the first retry, ms.
    pub retry_backoff_ms: u64,
}

impl Default for ProduceOptions {
    /// 10 retries from 50 ms: some 25 s in all, within the default dedup
    /// window (2 minutes) with room to spare.
    fn default() -> Self {
        ProduceOptions { retries_max: 10, retry_backoff_ms: 50 }
    }
}

/// Bytes of an automatic dedup id: the producer id and the sequence number,
/// each a little-endian u64.
pub const AUTO_DEDUP_ID_BYTES: usize = 16;

/// A producer whose batches are stored once, retried as `ProduceOptions`
/// say.
pub struct IdempotentProducer {
    /// Where the broker listens, for reconnecting.
    addr: SocketAddr,
    /// The token HELLO carries.
    token: Vec<u8>,
    options: ProduceOptions,
    /// The connection; None after it broke, until the next try.
    client: Option<Client>,
    /// Random at start: no two producers share their ids.
    producer_id: u64,
    /// The next message's sequence number.
    seq: u64,
}

impl IdempotentProducer {
    /// Connects to the broker at `addr`, which must speak version 4.
    pub fn connect(addr: impl ToSocketAddrs, token: &[u8], options: ProduceOptions) -> Result<IdempotentProducer> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| Error::Invalid("no address to connect to".into()))?;
        let mut p = IdempotentProducer { addr, token: token.to_vec(), options, client: None, producer_id: 0, seq: 0 };
        p.producer_id = random_u64();
        p.client()?;
        Ok(p)
    }

    /// The producer id its dedup ids start with.
    pub fn producer_id(&self) -> u64 {
        self.producer_id
    }

    /// The connection, opened (with HELLO) if there is none.
    fn client(&mut self) -> Result<&mut Client> {
        if self.client.is_none() {
            let c = Client::connect_with(self.addr, &self.token)?;
            if c.version < codec::V4 {
                return Err(Error::Version { needed: codec::V4, version: c.version });
            }
            self.client = Some(c);
        }
        self.client.as_mut().ok_or_else(|| Error::Invalid("no connection".into()))
    }

    /// Produces `payloads` as one batch, each with a dedup id of its own;
    /// returns each message's id (a duplicate's is the original's).
    pub fn produce<P: AsRef<[u8]>>(&mut self, topic: &str, payloads: &[P]) -> Result<Vec<u64>> {
        let messages: Vec<ProduceMessage<'_>> = payloads.iter().map(|p| ProduceMessage::new(p.as_ref())).collect();
        self.produce_messages(topic, messages)
    }

    /// Produces `messages` as one batch; each one without a dedup id gets
    /// the next automatic one. Returns each message's id.
    pub fn produce_messages(&mut self, topic: &str, messages: Vec<ProduceMessage<'_>>) -> Result<Vec<u64>> {
        let messages: Vec<ProduceMessage<'_>> = messages
            .into_iter()
            .map(|m| {
                if m.has_dedup_id() {
                    return m;
                }
                let mut id = [0u8; AUTO_DEDUP_ID_BYTES];
                id[..8].copy_from_slice(&self.producer_id.to_le_bytes());
                id[8..].copy_from_slice(&self.seq.to_le_bytes());
                self.seq += 1;
                m.dedup_id(&id)
            })
            .collect();
        let mut backoff_ms = self.options.retry_backoff_ms;
        let mut tries = 0;
        loop {
            match self.try_once(topic, &messages) {
                Ok(ids) => return Ok(ids),
                Err(e) if tries < self.options.retries_max && retryable(&e) => {
                    tries += 1;
                    // A broken connection is not used again.
                    if matches!(e, Error::Io(_) | Error::Protocol(_)) {
                        self.client = None;
                    }
                    std::thread::sleep(Duration::from_millis(backoff_ms));
                    backoff_ms = (backoff_ms * 2).min(self.options.retry_backoff_ms * 16);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One try: sends the batch and waits for its reply.
    fn try_once(&mut self, topic: &str, messages: &[ProduceMessage<'_>]) -> Result<Vec<u64>> {
        let c = self.client()?;
        c.send_produce_messages(topic, messages)?;
        let reply = c.recv()?;
        message_ids(messages.len(), &reply).ok_or_else(|| Error::Protocol(format!("unexpected reply {reply:?}")))
    }
}

/// Whether a try that failed with `e` may be tried again with the same
/// dedup ids: a broken connection (the batch may or may not be stored),
/// or an error that stored nothing and may pass (STORAGE, SHUTTING_DOWN,
/// BUSY, DEDUP_FULL).
fn retryable(e: &Error) -> bool {
    match e {
        Error::Io(_) | Error::Protocol(_) => true,
        Error::Broker { .. } => matches!(
            e.code(),
            Some(ErrorCode::Storage | ErrorCode::ShuttingDown | ErrorCode::Busy | ErrorCode::DedupFull)
        ),
        Error::Version { .. } | Error::Invalid(_) => false,
    }
}

/// Each message's id from the reply to a PRODUCE of `count` messages: a
/// duplicate's is the one its entry names, the others' are consecutive
/// from `first_id` in batch order. None for a reply that does not fit.
pub fn message_ids(count: usize, reply: &OwnedReply) -> Option<Vec<u64>> {
    let (first_id, stored, duplicates) = match reply {
        OwnedReply::Produced { first_id, count } => (*first_id, *count, &[][..]),
        OwnedReply::Deduplicated { first_id, count, duplicates } => (*first_id, *count, &duplicates[..]),
        _ => return None,
    };
    if stored as usize + duplicates.len() != count {
        return None;
    }
    let mut ids = Vec::with_capacity(count);
    let (mut next, mut dups) = (first_id, duplicates.iter().peekable());
    for i in 0..count as u32 {
        match dups.next_if(|d| d.0 == i) {
            Some(&(_, id)) => ids.push(id),
            None => {
                ids.push(next);
                next += 1;
            }
        }
    }
    (dups.next().is_none()).then_some(ids)
}

/// A random u64 from the standard library's keyed hasher (seeded by the
/// operating system), the clock and the process id: no two producers of
/// one broker should ever share a producer id.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_interleave_stored_and_duplicate_messages() {
        let plain = OwnedReply::Produced { first_id: 7, count: 3 };
        assert_eq!(message_ids(3, &plain), Some(vec![7, 8, 9]));
        let mixed = OwnedReply::Deduplicated { first_id: 10, count: 2, duplicates: vec![(0, 3), (2, 4)] };
        assert_eq!(message_ids(4, &mixed), Some(vec![3, 10, 4, 11]));
        let all = OwnedReply::Deduplicated { first_id: 0, count: 0, duplicates: vec![(0, 1), (1, 2)] };
        assert_eq!(message_ids(2, &all), Some(vec![1, 2]));
        assert_eq!(message_ids(3, &mixed), None, "counts that do not add up");
        let out_of_range = OwnedReply::Deduplicated { first_id: 10, count: 1, duplicates: vec![(5, 3)] };
        assert_eq!(message_ids(2, &out_of_range), None);
    }

    #[test]
    fn producer_ids_differ() {
        assert_ne!(random_u64(), random_u64());
    }
}
