//! beanstalkd's text protocol (its doc/protocol.txt), hand-written:
//! `use` + `put` to produce; `watch` + `reserve-with-timeout` to fetch and
//! `delete` to acknowledge. beanstalkd has no batch commands, so a consumer
//! pipelines: one reserve that may wait, then, once a job came, more
//! reserves with timeout 0 in one write (as many as the last round
//! suggested were ready), and its deletes ride with the next reserve.

use std::io::Write;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;

use crate::conn::{Consumer, Producer, WireReplies};
use crate::wire::Wire;

/// Priority of every job (beanstalkd's conventional default).
const PRIORITY: u32 = 1024;
/// Time to run: a reserved job not deleted within this returns to ready,
/// like runnel's ack timeout (30 s by default there).
const TTR_SECS: u32 = 60;
/// Extra reserves tried after the first job of a round, at first.
const EXTRA_RESERVES_START: u32 = 16;

/// One reply line (with a job's body for RESERVED).
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Inserted,
    Reserved {
        id: u64,
        body: Range<usize>,
    },
    TimedOut,
    DeadlineSoon,
    Deleted,
    /// USING or WATCHING: the answer to a setup command.
    Setup,
}

/// Parses one reply: Ok(None) if incomplete.
fn parse(b: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let Some(nl) = b.iter().position(|&c| c == b'\n') else { return Ok(None) };
    if nl == 0 || b[nl - 1] != b'\r' {
        return Err(format!("beanstalkd: bad reply line {:?}", String::from_utf8_lossy(&b[..nl])));
    }
    let line = std::str::from_utf8(&b[..nl - 1]).map_err(|_| "beanstalkd: reply is not text".to_string())?;
    let mut words = line.split(' ');
    let word = words.next().unwrap_or("");
    let mut num = || -> Result<u64, String> {
        words.next().and_then(|w| w.parse().ok()).ok_or_else(|| format!("beanstalkd: bad reply {line:?}"))
    };
    let reply = match word {
        "INSERTED" => {
            num()?;
            Reply::Inserted
        }
        "RESERVED" => {
            let id = num()?;
            let bytes = num()? as usize;
            let start = nl + 1;
            if b.len() < start + bytes + 2 {
                return Ok(None);
            }
            return Ok(Some((Reply::Reserved { id, body: start..start + bytes }, start + bytes + 2)));
        }
        "TIMED_OUT" => Reply::TimedOut,
        "DEADLINE_SOON" => Reply::DeadlineSoon,
        "DELETED" => Reply::Deleted,
        "USING" | "WATCHING" => Reply::Setup,
        _ => return Err(format!("beanstalkd: {line}")),
    };
    Ok(Some((reply, nl + 1)))
}

/// Reads one whole reply. Bodies are returned as ranges of `w.input()`
/// before the reply is consumed, so the caller copies what it needs via `f`.
fn reply<T>(w: &mut Wire, f: impl FnMut(&Reply, &[u8]) -> T) -> Result<T, String> {
    reply_or_not(w, true, f)?.ok_or_else(|| "beanstalkd: no reply".into())
}

/// `reply`, or with `block` false, only what has arrived: Ok(None) if the
/// whole reply is not there yet.
fn reply_or_not<T>(w: &mut Wire, block: bool, mut f: impl FnMut(&Reply, &[u8]) -> T) -> Result<Option<T>, String> {
    loop {
        if let Some((r, n)) = parse(w.input())? {
            let v = f(&r, w.input());
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

fn setup(w: &mut Wire, line: &str) -> Result<(), String> {
    w.out.extend_from_slice(line.as_bytes());
    w.flush()?;
    match reply(w, |r, _| matches!(r, Reply::Setup))? {
        true => Ok(()),
        false => Err(format!("beanstalkd: unexpected reply to {}", line.trim_end())),
    }
}

pub struct BeanstalkProducer {
    wire: Wire,
    in_flight: usize,
    /// `put`'s delay: whole seconds before the job is ready (W7).
    delay_secs: u64,
}

impl BeanstalkProducer {
    pub fn connect(addr: SocketAddr, tube: &str) -> Result<BeanstalkProducer, String> {
        let mut wire = Wire::connect(addr, "beanstalkd")?;
        setup(&mut wire, &format!("use {tube}\r\n"))?;
        Ok(BeanstalkProducer { wire, in_flight: 0, delay_secs: 0 })
    }

    /// A producer whose jobs are ready `delay_secs` after their `put`.
    pub fn delayed(addr: SocketAddr, tube: &str, delay_secs: u64) -> Result<BeanstalkProducer, String> {
        Ok(BeanstalkProducer { delay_secs, ..BeanstalkProducer::connect(addr, tube)? })
    }
}

impl BeanstalkProducer {
    /// Replies whole in the input buffer (each put's reply is one line).
    fn whole_replies(&self) -> usize {
        self.wire.input().iter().filter(|&&c| c == b'\n').count().min(self.in_flight)
    }
}

impl WireReplies for BeanstalkProducer {
    fn wire(&mut self) -> &mut Wire {
        &mut self.wire
    }
    fn pending(&self) -> usize {
        self.in_flight
    }
    fn parse_one(&mut self) -> Result<Option<u32>, String> {
        match parse(self.wire.input())? {
            None => Ok(None),
            Some((Reply::Inserted, n)) => {
                self.wire.consume(n);
                self.in_flight -= 1;
                Ok(Some(1))
            }
            Some((r, _)) => Err(format!("beanstalkd: unexpected reply to put: {r:?}")),
        }
    }
}

impl Producer for BeanstalkProducer {
    fn queue(&mut self, payload: &[u8]) {
        // Writing to a Vec cannot fail.
        let _ = write!(self.wire.out, "put {PRIORITY} {} {TTR_SECS} {}\r\n", self.delay_secs, payload.len());
        self.wire.out.extend_from_slice(payload);
        self.wire.out.extend_from_slice(b"\r\n");
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

/// beanstalkd has no consumer groups: the fan-out workaround is one tube
/// per group, and a producer that puts each message into every tube (one
/// connection per tube, written together). A produce counts as acknowledged
/// once every tube has it.
pub struct FanoutProducer {
    tubes: Vec<BeanstalkProducer>,
}

impl FanoutProducer {
    pub fn connect(addr: SocketAddr, tubes: &[String]) -> Result<FanoutProducer, String> {
        let tubes = tubes.iter().map(|t| BeanstalkProducer::connect(addr, t)).collect::<Result<Vec<_>, _>>()?;
        if tubes.is_empty() {
            return Err("a fan-out producer needs a tube".into());
        }
        Ok(FanoutProducer { tubes })
    }
}

impl Producer for FanoutProducer {
    fn queue(&mut self, payload: &[u8]) {
        for t in &mut self.tubes {
            t.queue(payload);
        }
    }
    fn flush(&mut self) -> Result<(), String> {
        self.tubes.iter_mut().try_for_each(|t| t.flush())
    }
    fn recv(&mut self) -> Result<u32, String> {
        let mut n = 0;
        for t in &mut self.tubes {
            n = t.recv()?;
        }
        Ok(n)
    }
    /// Replies that arrived on every tube's connection: the produces all
    /// of them acknowledged (the rest are taken by a later call).
    fn recv_ready(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String> {
        let ready = self.tubes.iter_mut().try_fold(usize::MAX, |least, t| {
            while t.wire.fill_now()? {}
            Ok::<_, String>(least.min(t.whole_replies()))
        })?;
        for _ in 0..ready {
            on_reply(self.recv()?);
        }
        Ok(())
    }
    fn in_flight(&self) -> usize {
        self.tubes[0].in_flight
    }
    fn fd(&self) -> RawFd {
        self.tubes[0].wire.fd()
    }
}

pub struct BeanstalkConsumer {
    wire: Wire,
    /// Jobs reserved by the last `next`, deleted by the following one.
    pending: Vec<u64>,
    /// Extra reserves to pipeline after the first job of the next round.
    extra: u32,
    /// Busy polling: where the round is.
    round: Round,
}

/// Busy polling: a round is `next`'s exchange, one reply at a time: the
/// previous round's deletes and a reserve that may wait, in one write;
/// once that reserve brings a job, `extras` reserves with timeout 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// Nothing outstanding.
    Idle,
    /// `deletes` delete replies, then the first reserve's, to come.
    First { deletes: usize },
    /// `left` of `sent` extra reserves to be answered; `got` brought jobs.
    Extras { sent: u32, left: u32, got: u32 },
}

impl BeanstalkConsumer {
    pub fn connect(addr: SocketAddr, tube: &str) -> Result<BeanstalkConsumer, String> {
        let mut wire = Wire::connect(addr, "beanstalkd")?;
        setup(&mut wire, &format!("watch {tube}\r\n"))?;
        setup(&mut wire, "ignore default\r\n")?;
        Ok(BeanstalkConsumer { wire, pending: Vec::new(), extra: EXTRA_RESERVES_START, round: Round::Idle })
    }

    fn queue_deletes(&mut self) -> usize {
        for id in &self.pending {
            let _ = write!(self.wire.out, "delete {id}\r\n");
        }
        self.pending.len()
    }

    fn recv_deletes(&mut self, n: usize) -> Result<(), String> {
        for _ in 0..n {
            if !reply(&mut self.wire, |r, _| matches!(r, Reply::Deleted))? {
                return Err("beanstalkd: unexpected reply to delete".into());
            }
        }
        self.pending.clear();
        Ok(())
    }

    /// Reads one reserve reply; true if it carried a job.
    fn recv_reserve(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<bool, String> {
        Ok(self.take_reserve(true, on_msg)?.unwrap_or(false))
    }

    /// One reserve reply (with `block` false, only if it has all arrived:
    /// None if not); Some(true) if it carried a job.
    fn take_reserve(&mut self, block: bool, on_msg: &mut dyn FnMut(&[u8])) -> Result<Option<bool>, String> {
        let pending = &mut self.pending;
        let r = reply_or_not(&mut self.wire, block, |r, input| match r {
            Reply::Reserved { id, body } => {
                on_msg(&input[body.clone()]);
                pending.push(*id);
                Ok(true)
            }
            Reply::TimedOut | Reply::DeadlineSoon => Ok(false),
            other => Err(format!("beanstalkd: unexpected reply to reserve: {other:?}")),
        })?;
        r.transpose()
    }

    /// The extra reserves to ask for after a round whose `sent` extras
    /// brought `got` jobs: twice as many if all were there, else what was
    /// there and one more.
    fn next_extra(&mut self, sent: u32, got: u32, max: u32) {
        self.extra = if got == sent { (sent * 2).min(max.saturating_sub(1)).max(1) } else { got + 1 };
    }

    /// Busy polling: takes the replies of the round as far as they have
    /// arrived (with `block`, waiting for them), sending the extra reserves
    /// when the first brings a job. Returns the jobs delivered and whether
    /// the round is over.
    fn advance(&mut self, block: bool, max: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<(usize, bool), String> {
        let mut got = 0;
        loop {
            match self.round {
                Round::Idle => return Ok((got, true)),
                Round::First { deletes } if deletes > 0 => {
                    let Some(deleted) = reply_or_not(&mut self.wire, block, |r, _| matches!(r, Reply::Deleted))? else {
                        return Ok((got, false));
                    };
                    if !deleted {
                        return Err("beanstalkd: unexpected reply to delete".into());
                    }
                    if deletes == 1 {
                        // The round's jobs are not in yet: all of pending was deleted.
                        self.pending.clear();
                    }
                    self.round = Round::First { deletes: deletes - 1 };
                }
                Round::First { .. } => {
                    let Some(job) = self.take_reserve(block, on_msg)? else { return Ok((got, false)) };
                    let extra = self.extra.min(max.saturating_sub(1));
                    if !job || extra == 0 {
                        got += usize::from(job);
                        self.round = Round::Idle;
                        continue;
                    }
                    got += 1;
                    for _ in 0..extra {
                        self.wire.out.extend_from_slice(b"reserve-with-timeout 0\r\n");
                    }
                    self.wire.flush()?;
                    self.round = Round::Extras { sent: extra, left: extra, got: 0 };
                }
                Round::Extras { sent, left, got: extras_got } => {
                    let Some(job) = self.take_reserve(block, on_msg)? else { return Ok((got, false)) };
                    got += usize::from(job);
                    let extras_got = extras_got + u32::from(job);
                    if left == 1 {
                        self.next_extra(sent, extras_got, max);
                        self.round = Round::Idle;
                    } else {
                        self.round = Round::Extras { sent, left: left - 1, got: extras_got };
                    }
                }
            }
        }
    }
}

impl Consumer for BeanstalkConsumer {
    fn next(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let deletes = self.queue_deletes();
        let wait_secs = wait_ms.div_ceil(1000);
        let _ = write!(self.wire.out, "reserve-with-timeout {wait_secs}\r\n");
        self.wire.flush()?;
        self.recv_deletes(deletes)?;
        if !self.recv_reserve(on_msg)? {
            return Ok(0);
        }
        let extra = self.extra.min(max.saturating_sub(1));
        if extra == 0 {
            return Ok(1);
        }
        for _ in 0..extra {
            self.wire.out.extend_from_slice(b"reserve-with-timeout 0\r\n");
        }
        self.wire.flush()?;
        let mut got = 0;
        for _ in 0..extra {
            got += u32::from(self.recv_reserve(on_msg)?);
        }
        self.next_extra(extra, got, max);
        Ok(1 + got as usize)
    }

    fn ack_pending(&mut self) -> Result<(), String> {
        let n = self.queue_deletes();
        if n > 0 {
            self.wire.flush()?;
            self.recv_deletes(n)?;
        }
        Ok(())
    }

    fn poll(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let (got, over) = self.advance(false, max, on_msg)?;
        if over {
            // The round is over (or none was sent yet): its deletes and the
            // next waiting reserve go out in one write.
            let deletes = self.queue_deletes();
            let _ = write!(self.wire.out, "reserve-with-timeout {}\r\n", wait_ms.div_ceil(1000));
            self.wire.flush()?;
            self.round = Round::First { deletes };
        }
        Ok(got)
    }

    fn end_poll(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        // The round ends as `poll` would end it: if its first reserve brings
        // a job, with the extra reserves (timeout 0) after it.
        let (got, _) = self.advance(true, u32::MAX, on_msg)?;
        self.ack_pending()?;
        Ok(got)
    }

    fn fd(&self) -> RawFd {
        self.wire.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_every_prefix_is_incomplete() {
        let b = b"RESERVED 7 5\r\nhello\r\n";
        assert_eq!(parse(b), Ok(Some((Reply::Reserved { id: 7, body: 14..19 }, b.len()))));
        for cut in 0..b.len() {
            assert_eq!(parse(&b[..cut]), Ok(None), "prefix {cut}");
        }
        assert_eq!(parse(b"INSERTED 3\r\n"), Ok(Some((Reply::Inserted, 12))));
        assert_eq!(parse(b"TIMED_OUT\r\nDELETED\r\n"), Ok(Some((Reply::TimedOut, 11))));
        assert!(parse(b"JOB_TOO_BIG\r\n").unwrap_err().contains("JOB_TOO_BIG"));
    }

    /// A beanstalkd stand-in holding three jobs: answers each command line
    /// at once (a reserve with no job left times out at once) and returns
    /// the ids deleted.
    fn fake_server(listener: std::net::TcpListener) -> Result<Vec<u64>, String> {
        use std::io::{BufRead, BufReader};
        let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let mut out = stream.try_clone().map_err(|e| format!("clone: {e}"))?;
        let mut jobs: std::collections::VecDeque<(u64, &str)> = [(7, "one"), (8, "two"), (9, "three")].into();
        let mut deleted = Vec::new();
        for line in BufReader::new(stream).lines() {
            let line = line.map_err(|e| format!("read: {e}"))?;
            let words: Vec<&str> = line.split(' ').collect();
            let reply = match words[..] {
                ["watch" | "ignore", _] => "WATCHING 1\r\n".to_string(),
                ["reserve-with-timeout", _] => match jobs.pop_front() {
                    Some((id, body)) => format!("RESERVED {id} {}\r\n{body}\r\n", body.len()),
                    None => "TIMED_OUT\r\n".into(),
                },
                ["delete", id] => {
                    deleted.push(id.parse().map_err(|_| format!("bad id in {line:?}"))?);
                    "DELETED\r\n".into()
                }
                _ => return Err(format!("unexpected command {line:?}")),
            };
            out.write_all(reply.as_bytes()).map_err(|e| format!("write: {e}"))?;
        }
        Ok(deleted)
    }

    #[test]
    fn busy_polling_delivers_and_deletes_every_job() -> Result<(), String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("local_addr: {e}"))?;
        let server = std::thread::spawn(move || fake_server(listener));
        let mut c = BeanstalkConsumer::connect(addr, "t")?;
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < 3 && std::time::Instant::now() < deadline {
            c.poll(1024, 1000, &mut |p| got.push(p.to_vec()))?;
        }
        c.end_poll(&mut |p| got.push(p.to_vec()))?;
        drop(c);
        let mut deleted = server.join().map_err(|_| "the fake server panicked".to_string())??;
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
        deleted.sort_unstable();
        assert_eq!(deleted, [7, 8, 9]);
        Ok(())
    }
}
