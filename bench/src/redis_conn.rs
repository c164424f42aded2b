//! Redis Streams over RESP2, hand-written: XADD to produce; XREADGROUP
//! (consumer group `g`, BLOCK for the long poll) to fetch; XACK to
//! acknowledge. Every message is one stream entry with one field, `d`.
//!
//! The parser is specific to the replies these commands have, so it needs
//! no general (recursive) RESP value type: a cursor walks the known shape
//! and says "incomplete" when the reply has not all arrived.

use std::io::Write;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;

use crate::conn::{Consumer, Producer, WireReplies};
use crate::wire::Wire;

/// The consumer group every bench consumer joins.
/// The consumer group of the workloads with one group.
pub const GROUP: &str = "g";
/// The one field of each entry.
const FIELD: &[u8] = b"d";

/// Appends one command in RESP's array-of-bulk-strings form.
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A cursor over received bytes. Each read returns Ok(None) when the
/// reply is not complete yet, and Err for an error reply or bad bytes.
struct Cur<'a> {
    b: &'a [u8],
    pos: usize,
}

/// Returns Ok(None) from the enclosing function when input is incomplete.
macro_rules! need {
    ($e:expr) => {
        match $e? {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

impl<'a> Cur<'a> {
    /// One header line: its type byte and the rest, CRLF excluded.
    fn header(&mut self) -> Result<Option<(u8, &'a [u8])>, String> {
        let rest = &self.b[self.pos..];
        let Some(nl) = rest.iter().position(|&c| c == b'\n') else { return Ok(None) };
        if nl < 2 || rest[nl - 1] != b'\r' {
            return Err(format!("redis: bad reply line {:?}", String::from_utf8_lossy(&rest[..nl])));
        }
        self.pos += nl + 1;
        let line = &rest[1..nl - 1];
        if rest[0] == b'-' {
            return Err(format!("redis: {}", String::from_utf8_lossy(line)));
        }
        Ok(Some((rest[0], line)))
    }

    fn number(line: &[u8]) -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("redis: bad number {:?}", String::from_utf8_lossy(line)))
    }

    /// An array header: its length, -1 for a null array.
    fn array(&mut self) -> Result<Option<i64>, String> {
        let (t, line) = need!(self.header());
        if t != b'*' {
            return Err(format!("redis: expected an array, got {:?}", t as char));
        }
        Self::number(line).map(Some)
    }

    /// A bulk string as a range of the buffer (None inside for a null).
    fn bulk(&mut self) -> Result<Option<Option<Range<usize>>>, String> {
        let (t, line) = need!(self.header());
        if t != b'$' {
            return Err(format!("redis: expected a bulk string, got {:?}", t as char));
        }
        let n = Self::number(line)?;
        if n < 0 {
            return Ok(Some(None));
        }
        let n = n as usize;
        if self.b.len() - self.pos < n + 2 {
            return Ok(None);
        }
        let r = self.pos..self.pos + n;
        self.pos += n + 2;
        Ok(Some(Some(r)))
    }

    /// An integer reply.
    fn int(&mut self) -> Result<Option<i64>, String> {
        let (t, line) = need!(self.header());
        if t != b':' {
            return Err(format!("redis: expected an integer, got {:?}", t as char));
        }
        Self::number(line).map(Some)
    }

    /// A status reply (`+OK`).
    fn status(&mut self) -> Result<Option<&'a [u8]>, String> {
        let (t, line) = need!(self.header());
        if t != b'+' {
            return Err(format!("redis: expected a status, got {:?}", t as char));
        }
        Ok(Some(line))
    }
}

/// Parses one XREADGROUP reply: Ok(Some(consumed)) with each entry's id
/// and payload ranges in `entries`, or Ok(None) if incomplete.
fn parse_read(b: &[u8], entries: &mut Vec<(Range<usize>, Range<usize>)>) -> Result<Option<usize>, String> {
    entries.clear();
    let mut c = Cur { b, pos: 0 };
    let streams = need!(c.array());
    for _ in 0..streams.max(0) {
        if need!(c.array()) != 2 {
            return Err("redis: a stream in XREADGROUP's reply is not [name, entries]".into());
        }
        need!(c.bulk());
        let n = need!(c.array());
        for _ in 0..n.max(0) {
            if need!(c.array()) != 2 {
                return Err("redis: an entry is not [id, fields]".into());
            }
            let id = need!(c.bulk()).ok_or("redis: an entry has a null id")?;
            let fields = need!(c.array());
            let mut payload = None;
            for i in 0..fields.max(0) {
                let v = need!(c.bulk());
                if i == 1 {
                    payload = v;
                }
            }
            entries.push((id, payload.ok_or("redis: an entry has no payload (deleted?)")?));
        }
    }
    Ok(Some(c.pos))
}

/// Runs `f` on the input until it finds a whole reply, reading as needed.
fn reply<T>(w: &mut Wire, f: impl FnMut(&mut Cur<'_>) -> Result<Option<T>, String>) -> Result<T, String> {
    reply_or_not(w, true, f)?.ok_or_else(|| "redis: no reply".into())
}

/// `reply`, or with `block` false, only what has arrived: Ok(None) if the
/// whole reply is not there yet.
fn reply_or_not<T>(
    w: &mut Wire,
    block: bool,
    mut f: impl FnMut(&mut Cur<'_>) -> Result<Option<T>, String>,
) -> Result<Option<T>, String> {
    loop {
        let mut c = Cur { b: w.input(), pos: 0 };
        if let Some(v) = f(&mut c)? {
            let n = c.pos;
            w.consume(n);
            return Ok(Some(v));
        }
        if block {
            w.fill()?;
        } else if !w.fill_now()? {
            return Ok(None);
        }
    }
}

pub struct RedisProducer {
    wire: Wire,
    topic: Vec<u8>,
    in_flight: usize,
}

impl RedisProducer {
    pub fn connect(addr: SocketAddr, topic: &str) -> Result<RedisProducer, String> {
        Ok(RedisProducer { wire: Wire::connect(addr, "redis")?, topic: topic.as_bytes().to_vec(), in_flight: 0 })
    }
}

impl WireReplies for RedisProducer {
    fn wire(&mut self) -> &mut Wire {
        &mut self.wire
    }
    fn pending(&self) -> usize {
        self.in_flight
    }
    /// One XADD reply from the buffered input, if it is all there.
    fn parse_one(&mut self) -> Result<Option<u32>, String> {
        let mut c = Cur { b: self.wire.input(), pos: 0 };
        match c.bulk()? {
            None => Ok(None),
            Some(None) => Err("redis: XADD returned null".into()),
            Some(Some(_)) => {
                let n = c.pos;
                self.wire.consume(n);
                self.in_flight -= 1;
                Ok(Some(1))
            }
        }
    }
}

impl Producer for RedisProducer {
    fn queue(&mut self, payload: &[u8]) {
        command(&mut self.wire.out, &[b"XADD", &self.topic, b"*", FIELD, payload]);
        self.in_flight += 1;
    }
    fn flush(&mut self) -> Result<(), String> {
        self.wire.flush()
    }
    fn recv(&mut self) -> Result<u32, String> {
        self.recv_next()
    }
    fn recv_ready(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String> {
        self.recv_arrived(on_reply)
    }
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn fd(&self) -> RawFd {
        self.wire.fd()
    }
}

pub struct RedisConsumer {
    wire: Wire,
    topic: Vec<u8>,
    group: Vec<u8>,
    name: Vec<u8>,
    /// Ids delivered by the last `next`, back to back; `ends` splits them.
    ids: Vec<u8>,
    ends: Vec<usize>,
    entries: Vec<(Range<usize>, Range<usize>)>,
    /// Busy polling: ids in the XACK sent and not yet answered (0: none),
    /// and whether an XREADGROUP is outstanding.
    acks_out: usize,
    read_out: bool,
}

impl RedisConsumer {
    pub fn connect(addr: SocketAddr, topic: &str, group: &str, name: &str) -> Result<RedisConsumer, String> {
        Ok(RedisConsumer {
            wire: Wire::connect(addr, "redis")?,
            topic: topic.as_bytes().to_vec(),
            group: group.as_bytes().to_vec(),
            name: name.as_bytes().to_vec(),
            ids: Vec::new(),
            ends: Vec::new(),
            entries: Vec::new(),
            acks_out: 0,
            read_out: false,
        })
    }

    /// Queues an XACK of the pending ids; returns how many.
    fn send_ack(&mut self) -> usize {
        let n = self.ends.len();
        if n == 0 {
            return 0;
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(3 + n);
        args.extend([b"XACK".as_slice(), &self.topic, &self.group]);
        let mut start = 0;
        for &end in &self.ends {
            args.push(&self.ids[start..end]);
            start = end;
        }
        command(&mut self.wire.out, &args);
        n
    }

    /// Writes an XACK of the pending ids (if any) and an XREADGROUP in one
    /// write; returns how many ids the XACK holds (it is answered first).
    fn send_ack_read(&mut self, max: u32, wait_ms: u32) -> Result<usize, String> {
        let acks = self.send_ack();
        let count = max.to_string();
        let block = wait_ms.to_string();
        let mut args: Vec<&[u8]> = vec![b"XREADGROUP", b"GROUP", &self.group, &self.name, b"COUNT", count.as_bytes()];
        if wait_ms > 0 {
            args.extend([b"BLOCK".as_slice(), block.as_bytes()]);
        }
        args.extend([b"STREAMS".as_slice(), &self.topic, b">"]);
        command(&mut self.wire.out, &args);
        self.wire.flush()?;
        Ok(acks)
    }

    fn recv_ack(&mut self, sent: usize) -> Result<(), String> {
        let acked = reply(&mut self.wire, |c| c.int())?;
        self.acked(acked, sent)
    }

    fn acked(&mut self, acked: i64, sent: usize) -> Result<(), String> {
        if acked != sent as i64 {
            return Err(format!("redis XACK acknowledged {acked} of {sent} ids"));
        }
        self.ids.clear();
        self.ends.clear();
        Ok(())
    }

    /// Takes one XREADGROUP reply (with `block` false, only if it has all
    /// arrived: None if not), handing each payload to `on_msg`.
    fn take_read(&mut self, block: bool, on_msg: &mut dyn FnMut(&[u8])) -> Result<Option<usize>, String> {
        loop {
            if let Some(n) = parse_read(self.wire.input(), &mut self.entries)? {
                let input = self.wire.input();
                for (id, payload) in &self.entries {
                    on_msg(&input[payload.clone()]);
                    self.ids.extend_from_slice(&input[id.clone()]);
                    self.ends.push(self.ids.len());
                }
                let got = self.entries.len();
                self.wire.consume(n);
                return Ok(Some(got));
            }
            if block {
                self.wire.fill()?;
            } else if !self.wire.fill_now()? {
                return Ok(None);
            }
        }
    }

    /// Busy polling: takes the outstanding XACK's reply and then the
    /// XREADGROUP's, as far as they have arrived (with `block`, waiting).
    /// Returns the messages delivered, None if the read is outstanding.
    fn take_polled(&mut self, block: bool, on_msg: &mut dyn FnMut(&[u8])) -> Result<Option<usize>, String> {
        if self.acks_out > 0 {
            let Some(acked) = reply_or_not(&mut self.wire, block, |c| c.int())? else { return Ok(None) };
            let sent = std::mem::take(&mut self.acks_out);
            self.acked(acked, sent)?;
        }
        let got = self.take_read(block, on_msg)?;
        if got.is_some() {
            self.read_out = false;
        }
        Ok(got)
    }
}

impl Consumer for RedisConsumer {
    fn next(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let acks = self.send_ack_read(max, wait_ms)?;
        if acks > 0 {
            self.recv_ack(acks)?;
        }
        Ok(self.take_read(true, on_msg)?.unwrap_or(0))
    }

    fn ack_pending(&mut self) -> Result<(), String> {
        let n = self.send_ack();
        if n > 0 {
            self.wire.flush()?;
            self.recv_ack(n)?;
        }
        Ok(())
    }

    fn poll(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let got = if self.read_out { self.take_polled(false, on_msg)? } else { Some(0) };
        match got {
            None => Ok(0),
            Some(n) => {
                // Answered (or none sent yet): acknowledge and read again.
                self.acks_out = self.send_ack_read(max, wait_ms)?;
                self.read_out = true;
                Ok(n)
            }
        }
    }

    fn end_poll(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let n = if self.read_out { self.take_polled(true, on_msg)?.unwrap_or(0) } else { 0 };
        self.ack_pending()?;
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.wire.fd()
    }
}

/// Creates `topic` and its consumer group `group`, reading from the
/// beginning.
pub fn create_group(addr: SocketAddr, topic: &str, group: &str) -> Result<(), String> {
    let mut w = Wire::connect(addr, "redis")?;
    command(&mut w.out, &[b"XGROUP", b"CREATE", topic.as_bytes(), group.as_bytes(), b"0", b"MKSTREAM"]);
    w.flush()?;
    match reply(&mut w, |c| c.status().map(|s| s.map(|_| ()))) {
        Ok(_) => Ok(()),
        Err(e) if e.contains("BUSYGROUP") => Ok(()),
        Err(e) => Err(format!("XGROUP CREATE {topic}: {e}")),
    }
}

/// Deletes the stream `topic` (acknowledged entries stay in a stream
/// until deleted).
pub fn delete_key(addr: SocketAddr, topic: &str) -> Result<(), String> {
    let mut w = Wire::connect(addr, "redis")?;
    command(&mut w.out, &[b"DEL", topic.as_bytes()]);
    w.flush()?;
    reply(&mut w, |c| c.int()).map(|_| ()).map_err(|e| format!("DEL {topic}: {e}"))
}

/// Sends one command and returns its reply as text: a status, an integer
/// or a bulk string (INFO, BGREWRITEAOF). An error reply is an Err.
pub fn command_text(addr: SocketAddr, args: &[&[u8]]) -> Result<String, String> {
    let mut w = Wire::connect(addr, "redis")?;
    command(&mut w.out, args);
    w.flush()?;
    let what = String::from_utf8_lossy(args.first().copied().unwrap_or(b"")).into_owned();
    let text = reply(&mut w, |c| {
        let start = c.pos;
        let Some((t, line)) = c.header()? else { return Ok(None) };
        match t {
            b'+' | b':' => Ok(Some(String::from_utf8_lossy(line).into_owned())),
            b'$' => {
                c.pos = start;
                let Some(r) = c.bulk()? else { return Ok(None) };
                Ok(Some(r.map_or(String::new(), |r| String::from_utf8_lossy(&c.b[r]).into_owned())))
            }
            other => Err(format!("redis: unexpected reply type {:?}", other as char)),
        }
    });
    text.map_err(|e| format!("{what}: {e}"))
}

/// One `key:value` field of an INFO reply, as a number.
pub fn info_field(info: &str, key: &str) -> Option<f64> {
    info.lines().find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':')?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_reply(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = format!("*1\r\n*2\r\n$1\r\ns\r\n*{}\r\n", entries.len()).into_bytes();
        for (id, p) in entries {
            b.extend(format!("*2\r\n${}\r\n{id}\r\n*2\r\n$1\r\nd\r\n${}\r\n", id.len(), p.len()).as_bytes());
            b.extend_from_slice(p);
            b.extend_from_slice(b"\r\n");
        }
        b
    }

    #[test]
    fn xreadgroup_reply_parses_whole_and_is_incomplete_at_every_prefix() {
        let b = read_reply(&[("1-0", b"hello"), ("1-1", b"")]);
        let mut e = Vec::new();
        assert_eq!(parse_read(&b, &mut e), Ok(Some(b.len())));
        assert_eq!(&b[e[0].0.clone()], b"1-0");
        assert_eq!(&b[e[0].1.clone()], b"hello");
        assert_eq!(&b[e[1].1.clone()], b"");
        for cut in 0..b.len() {
            assert_eq!(parse_read(&b[..cut], &mut e), Ok(None), "prefix {cut}");
        }
    }

    #[test]
    fn null_array_is_an_empty_read_and_errors_are_errors() {
        let mut e = Vec::new();
        assert_eq!(parse_read(b"*-1\r\n", &mut e), Ok(Some(5)));
        assert!(e.is_empty());
        assert!(parse_read(b"-NOGROUP no such group\r\n", &mut e).unwrap_err().contains("NOGROUP"));
    }

    #[test]
    fn info_fields_are_found_by_exact_key() {
        let info = "# Persistence\r\naof_rewrites:2\r\naof_rewrite_in_progress:0\r\nlatest_fork_usec:512\r\n";
        assert_eq!(info_field(info, "aof_rewrites"), Some(2.0));
        assert_eq!(info_field(info, "latest_fork_usec"), Some(512.0));
        assert_eq!(info_field(info, "aof_rewrite"), None);
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        command(&mut out, &[b"XADD", b"t", b"*", b"d", b"ab"]);
        assert_eq!(out, b"*5\r\n$4\r\nXADD\r\n$1\r\nt\r\n$1\r\n*\r\n$1\r\nd\r\n$2\r\nab\r\n");
    }
}
