//! What a workload asks of a broker connection, whichever broker it is:
//! a `Producer` that pipelines produce requests, and a `Consumer` that
//! fetches, hands each payload over, and acknowledges what it fetched.
//!
//! Each broker speaks its own protocol: runnel (and the echo floor, which
//! speaks runnel's) through `runnel::client`, Redis Streams through RESP
//! (XADD; XREADGROUP + XACK) and beanstalkd through its text protocol
//! (put; reserve-with-timeout + delete). The
//! workloads are written once against these two traits, so every broker
//! gets the same load from the same loop.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::server::Kind;
use crate::wire::Wire;
use crate::{beanstalk_conn, push_conn, redis_conn, runnel_conn};

/// How long any blocking read may wait before the bench gives up on a
/// broker (a stuck broker must fail the run, never hang it).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a write may block (a broker that stops reading must not hang
/// an open-loop sender).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The reply side of a producer whose replies are parsed one at a time off
/// its `Wire` (the Redis and beanstalkd clients): `Producer::recv` and
/// `recv_ready` are these two loops.
pub trait WireReplies {
    fn wire(&mut self) -> &mut Wire;
    /// The next reply if it is whole in the buffer, consumed: how many
    /// messages it acknowledged.
    fn parse_one(&mut self) -> Result<Option<u32>, String>;
    /// Requests sent and not yet answered.
    fn pending(&self) -> usize;

    /// Waits for the next reply.
    fn recv_next(&mut self) -> Result<u32, String> {
        loop {
            if let Some(n) = self.parse_one()? {
                return Ok(n);
            }
            self.wire().fill()?;
        }
    }

    /// Takes every reply that has already arrived, without waiting.
    fn recv_arrived(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String> {
        while self.pending() > 0 {
            match self.parse_one()? {
                Some(n) => on_reply(n),
                None if self.wire().fill_now()? => {}
                None => break,
            }
        }
        Ok(())
    }
}

/// One producing connection. Requests are queued, written by `flush`, and
/// answered in order.
pub trait Producer: Send {
    /// Queues one message as its own produce request.
    fn queue(&mut self, payload: &[u8]);
    /// Queues a batch as one request. Only runnel has batched produce;
    /// the others queue one request per message (`batch_native` says which).
    fn queue_batch(&mut self, payloads: &[&[u8]]) {
        for p in payloads {
            self.queue(p);
        }
    }
    /// Whether `queue_batch` is one request.
    fn batch_native(&self) -> bool {
        false
    }
    /// Writes every queued request.
    fn flush(&mut self) -> Result<(), String>;
    /// Waits for the next reply; returns how many messages it acknowledged.
    fn recv(&mut self) -> Result<u32, String>;
    /// Takes every reply that has already arrived, without waiting, and
    /// calls `on_reply` with each one's acknowledged message count.
    fn recv_ready(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String>;
    /// Requests sent and not yet answered.
    fn in_flight(&self) -> usize;
    /// The socket, to wait on many producers at once.
    fn fd(&self) -> RawFd;
}

/// One consuming connection.
pub trait Consumer: Send {
    /// Acknowledges every message the previous call delivered, then fetches
    /// up to `max` messages, waiting up to `wait_ms` for the first. Calls
    /// `on_msg` with each payload and returns how many there were.
    fn next(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String>;
    /// Acknowledges what the last `next` delivered.
    fn ack_pending(&mut self) -> Result<(), String>;

    /// Busy polling, for a client thread that never sleeps (W3B); not to be
    /// mixed with `next`. Keeps one fetch outstanding and never waits: the
    /// first call only sends it (a long poll of up to `wait_ms` at the
    /// broker); later calls take whatever replies have arrived, and once the
    /// fetch is answered, call `on_msg` with each payload, then acknowledge
    /// them and send the next fetch in one write. Returns how many messages
    /// were delivered (usually 0). Every complete reply that has arrived is
    /// taken, so between calls a caller may wait for `fd` to be readable.
    fn poll(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String>;
    /// Ends busy polling: waits (blocking) for the outstanding fetch, hands
    /// its messages to `on_msg`, and acknowledges everything delivered.
    /// Returns how many messages that last fetch delivered.
    fn end_poll(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String>;
    /// The socket, to see whether a reply has arrived.
    fn fd(&self) -> RawFd;
}

/// beanstalkd's stand-in for consumer group `group` of `topic`: a tube.
fn fanout_tube(topic: &str, group: &str) -> String {
    format!("{topic}-{group}")
}

/// A running broker to connect to.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub kind: Kind,
    pub addr: SocketAddr,
}

/// The broker's own counters of its commit log (runnel's STATS `fsyncs`,
/// `log_commits` and `produces_committed`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncCounters {
    /// fdatasyncs of the log.
    pub fsyncs: u64,
    /// Turns whose records were written (one write each, synced or not).
    pub log_commits: u64,
    /// PRODUCE requests answered after their commit.
    pub produces_committed: u64,
}

impl Target {
    pub fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(match self.kind {
            Kind::Runnel | Kind::Floor => Box::new(runnel_conn::RunnelProducer::connect(self.addr, topic)?),
            Kind::Redis => Box::new(redis_conn::RedisProducer::connect(self.addr, topic)?),
            Kind::Beanstalkd => Box::new(beanstalk_conn::BeanstalkProducer::connect(self.addr, topic)?),
        })
    }

    /// A producer whose messages are delivered `delay_ms` after the broker
    /// receives them (W7): runnel's `delay_ms` property, beanstalkd's `put`
    /// delay (whole seconds, so `delay_ms` must be whole seconds). Redis
    /// Streams (and the floor) have no scheduled delivery.
    pub fn delayed_producer(&self, topic: &str, delay_ms: u64) -> Result<Box<dyn Producer>, String> {
        match self.kind {
            Kind::Runnel => Ok(Box::new(runnel_conn::RunnelProducer::delayed(self.addr, topic, delay_ms)?)),
            Kind::Beanstalkd if delay_ms.is_multiple_of(1000) => {
                Ok(Box::new(beanstalk_conn::BeanstalkProducer::delayed(self.addr, topic, delay_ms / 1000)?))
            }
            other => Err(format!("{} has no scheduled delivery of {delay_ms} ms", other.name())),
        }
    }

    /// A consumer; `name` tells consumers of one group apart (Redis).
    pub fn consumer(&self, topic: &str, name: &str) -> Result<Box<dyn Consumer>, String> {
        Ok(match self.kind {
            Kind::Runnel | Kind::Floor => Box::new(runnel_conn::RunnelConsumer::connect(self.addr, topic, "")?),
            Kind::Redis => Box::new(redis_conn::RedisConsumer::connect(self.addr, topic, redis_conn::GROUP, name)?),
            Kind::Beanstalkd => Box::new(beanstalk_conn::BeanstalkConsumer::connect(self.addr, topic)?),
        })
    }

    /// A push subscriber of `topic`'s default group with `credit` (runnel
    /// only: the floor and the peers have no push subscriptions).
    pub fn push_consumer(&self, topic: &str, credit: u32) -> Result<Box<dyn Consumer>, String> {
        match self.kind {
            Kind::Runnel => Ok(Box::new(push_conn::PushConsumer::connect(self.addr, topic, credit)?)),
            other => Err(format!("{} has no push subscriptions", other.name())),
        }
    }

    /// Makes the consumer groups of a fan-out (W6) before the first
    /// produce, each `(name, tag filter)` reading from the start of
    /// `topic`: runnel's groups (the filter "" for every message), Redis
    /// Streams' groups (no filters); beanstalkd has no groups, its tubes
    /// (`fanout_tube`) come with their first put.
    pub fn prepare_groups(&self, topic: &str, groups: &[(String, String)]) -> Result<(), String> {
        match self.kind {
            Kind::Runnel => runnel_conn::create_groups(self.addr, topic, groups),
            Kind::Redis => groups.iter().try_for_each(|(g, _)| redis_conn::create_group(self.addr, topic, g)),
            Kind::Beanstalkd => Ok(()),
            Kind::Floor => Err("the echo floor has no consumer groups".into()),
        }
    }

    /// Spreads the groups of a backlog of `msgs` messages (W5): group i to
    /// message i * msgs / groups (runnel's RESET_GROUP; the ids of a new
    /// topic start at 1). A Redis group's position is one id, which costs
    /// the same memory wherever it is: Redis's stay at the start.
    pub fn spread_groups(&self, topic: &str, groups: &[(String, String)], msgs: u64) -> Result<(), String> {
        match self.kind {
            Kind::Runnel => runnel_conn::spread_groups(self.addr, topic, groups, msgs),
            _ => Ok(()),
        }
    }

    /// The producer of a fan-out to `groups`: one produce per message
    /// (runnel tagging each with one of `tags` tags if `tags` > 0), except
    /// beanstalkd's, which puts each message into every group's tube.
    pub fn fanout_producer(
        &self,
        topic: &str,
        groups: &[(String, String)],
        tags: u32,
    ) -> Result<Box<dyn Producer>, String> {
        Ok(match self.kind {
            Kind::Runnel if tags > 0 => Box::new(runnel_conn::RunnelProducer::tagged(self.addr, topic, tags)?),
            Kind::Beanstalkd => {
                let tubes: Vec<String> = groups.iter().map(|(g, _)| fanout_tube(topic, g)).collect();
                Box::new(beanstalk_conn::FanoutProducer::connect(self.addr, &tubes)?)
            }
            _ if tags > 0 => return Err(format!("{:?} has no tag filters", self.kind)),
            _ => self.producer(topic)?,
        })
    }

    /// A consumer of `group` in a fan-out; `name` tells the group's
    /// consumers apart (Redis).
    pub fn group_consumer(&self, topic: &str, group: &str, name: &str) -> Result<Box<dyn Consumer>, String> {
        Ok(match self.kind {
            Kind::Runnel | Kind::Floor => Box::new(runnel_conn::RunnelConsumer::connect(self.addr, topic, group)?),
            Kind::Redis => Box::new(redis_conn::RedisConsumer::connect(self.addr, topic, group, name)?),
            Kind::Beanstalkd => {
                Box::new(beanstalk_conn::BeanstalkConsumer::connect(self.addr, &fanout_tube(topic, group))?)
            }
        })
    }

    /// Makes `topic` ready before the first produce (Redis: the stream and
    /// its consumer group; runnel, the floor and beanstalkd create topics
    /// and tubes on first use).
    pub fn prepare(&self, topic: &str) -> Result<(), String> {
        match self.kind {
            Kind::Redis => redis_conn::create_group(self.addr, topic, redis_conn::GROUP),
            Kind::Runnel | Kind::Beanstalkd | Kind::Floor => Ok(()),
        }
    }

    /// Frees what `topic` still holds after a run (Redis keeps acknowledged
    /// entries in the stream until they are deleted; the floor forgets a
    /// message when it hands it out).
    pub fn cleanup(&self, topic: &str) -> Result<(), String> {
        match self.kind {
            Kind::Redis => redis_conn::delete_key(self.addr, topic),
            Kind::Runnel => runnel_conn::delete_topic(self.addr, topic),
            Kind::Beanstalkd | Kind::Floor => Ok(()),
        }
    }

    /// The broker's sync counters, where it reports them (runnel only).
    pub fn sync_counters(&self) -> Result<Option<SyncCounters>, String> {
        match self.kind {
            Kind::Runnel => runnel_conn::sync_counters(self.addr).map(Some),
            Kind::Redis | Kind::Beanstalkd | Kind::Floor => Ok(None),
        }
    }
}
