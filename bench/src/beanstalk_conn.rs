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

use crate::conn::{Consumer, Producer};
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
fn reply<T>(w: &mut Wire, mut f: impl FnMut(&Reply, &[u8]) -> T) -> Result<T, String> {
    loop {
        if let Some((r, n)) = parse(w.input())? {
            let v = f(&r, w.input());
            w.consume(n);
            return Ok(v);
        }
        w.fill()?;
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
}

impl BeanstalkProducer {
    pub fn connect(addr: SocketAddr, tube: &str) -> Result<BeanstalkProducer, String> {
        let mut wire = Wire::connect(addr, "beanstalkd")?;
        setup(&mut wire, &format!("use {tube}\r\n"))?;
        Ok(BeanstalkProducer { wire, in_flight: 0 })
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
        let _ = write!(self.wire.out, "put {PRIORITY} 0 {TTR_SECS} {}\r\n", payload.len());
        self.wire.out.extend_from_slice(payload);
        self.wire.out.extend_from_slice(b"\r\n");
        self.in_flight += 1;
    }
    fn flush(&mut self) -> Result<(), String> {
        self.wire.flush()
    }
    fn recv(&mut self) -> Result<u32, String> {
        loop {
            if let Some(n) = self.parse_one()? {
                return Ok(n);
            }
            self.wire.fill()?;
        }
    }
    fn recv_ready(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String> {
        while self.in_flight > 0 {
            match self.parse_one()? {
                Some(n) => on_reply(n),
                None if self.wire.fill_now()? => {}
                None => break,
            }
        }
        Ok(())
    }
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn fd(&self) -> RawFd {
        self.wire.fd()
    }
}

pub struct BeanstalkConsumer {
    wire: Wire,
    /// Jobs reserved by the last `next`, deleted by the following one.
    pending: Vec<u64>,
    /// Extra reserves to pipeline after the first job of the next round.
    extra: u32,
}

impl BeanstalkConsumer {
    pub fn connect(addr: SocketAddr, tube: &str) -> Result<BeanstalkConsumer, String> {
        let mut wire = Wire::connect(addr, "beanstalkd")?;
        setup(&mut wire, &format!("watch {tube}\r\n"))?;
        setup(&mut wire, "ignore default\r\n")?;
        Ok(BeanstalkConsumer { wire, pending: Vec::new(), extra: EXTRA_RESERVES_START })
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
        let pending = &mut self.pending;
        reply(&mut self.wire, |r, input| match r {
            Reply::Reserved { id, body } => {
                on_msg(&input[body.clone()]);
                pending.push(*id);
                Ok(true)
            }
            Reply::TimedOut | Reply::DeadlineSoon => Ok(false),
            other => Err(format!("beanstalkd: unexpected reply to reserve: {other:?}")),
        })?
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
        // Ask for twice as many next time if all were there, else for what
        // was there and one more.
        self.extra = if got == extra { (extra * 2).min(max.saturating_sub(1)).max(1) } else { got + 1 };
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
}
