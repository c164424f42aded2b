//! The five workloads. Each configuration runs against a fresh server (so
//! one run's leftovers, backlog or memory cannot colour the next) and ends
//! by draining its topic, checking that every acknowledged produce was
//! consumed at least once.
//!
//! - W1 produce throughput: one connection, pipeline depth 1/16/32/256 (and
//!   runnel's batched PRODUCE), 16 B to 16 KiB messages, closed loop.
//! - W2 fan-in: 1/16/256 connections at depth 1, driven by one epoll loop.
//! - W3 end-to-end latency, open loop at fixed rates, measured from each
//!   message's intended send time (no coordinated omission); runnel with a
//!   long-polling consumer and with a push subscriber (`Consume`).
//! - W4 work queue: producers and consumers on one topic at once (runnel's
//!   consumers fetching, and pushed to).
//! - W5 backlog: fill a topic with small messages, then drain it.
//! - W6 fan-out: one producer (16 and 256 produces in flight), 1/4/16
//!   consumer groups of two consumers each, durable; every group gets
//!   every message (and runnel with 16 groups each filtering one of 16
//!   tags).
//! - W3C: W3 at 10k msgs/s, durable, while the broker rewrites its log:
//!   runnel compacting (1 MiB segments, a backlog of unacknowledged
//!   messages spread over old segments), Redis running BGREWRITEAOF.
//! - W3S: W3 for runnel with `--fsync never` and `--spin-us` 0, 50 and 200.
//! - W3B: W3 memory-only with a busy-polling client: one thread for both
//!   connections that never sleeps (its core 100% busy by design); runnel
//!   also with `--spin-us 200`, so both sides busy-poll, and with a push
//!   subscriber.
//! - W7 scheduled delivery: W3's open loop at 1k and 10k msgs/s, each
//!   message scheduled 1 s ahead (runnel's `delay_ms`, beanstalkd's `put`
//!   delay; Redis Streams has none), so as many fall due per second; the
//!   latency is the lateness, delivery time minus due time.
//! - W11: a PING probe beside loads that can hold the loop (`stalls`).
//! - R1: recovery: fill a durable runnel with a large log, restart it
//!   (page cache warm, then dropped), time until it answers a PING.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::conn::{Consumer, Producer, Target};
use crate::latency::{Latency, Samples, now_ns};
use crate::metrics;
use crate::replay;
use crate::runnel_conn;
use crate::server::{Durability, Kind, Server};
use crate::stages;
use crate::stalls;
use crate::sys;
use crate::tracker::{self, Seen, Verify};

/// How big each workload is: the full comparison, or `--quick`.
#[derive(Clone, Debug)]
pub struct Scale {
    /// W1: time per configuration, and caps on messages and payload bytes
    /// (so a fast broker does not fill memory with 16 KiB messages).
    pub w1_time: Duration,
    pub w1_msgs_max: u64,
    pub w1_bytes_max: u64,
    pub w2_time: Duration,
    /// W3: time per rate, and the start of each run left out of the
    /// percentiles (connection set-up, topic creation).
    pub w3_time: Duration,
    pub w3_warmup: Duration,
    pub w4_time: Duration,
    pub w5_msgs: u64,
    /// W8 and W9: the backlog drained.
    pub w8_msgs: u64,
    /// 4 KiB write + fdatasync rounds of the disk probe.
    pub fsync_probe_rounds: usize,
    /// A drain gives up after this long with nothing delivered.
    pub drain_idle: Duration,
    /// W3: a broker further than this behind the send schedule cannot
    /// sustain the rate; the run stops sending and says so.
    pub w3_lag_max: Duration,
    /// W3: how long to wait for the last acknowledgements after sending.
    pub w3_tail_max: Duration,
    /// W5: filling stops after this long even if short of `w5_msgs` (a
    /// slow broker would otherwise take most of the run; the row says so).
    pub w5_fill_time_max: Duration,
    /// Time a run may spend consuming after producing stopped, for runnel
    /// (whose every message must be checked) and for the peers (whose
    /// check is informative and is cut short on a slow durable peer).
    pub runnel_consume_max: Duration,
    pub peer_consume_max: Duration,
    /// W3C: unacknowledged messages left in old segments before the run
    /// (each with `W3C_CHURN_PER_IDLE` acknowledged ones around it).
    pub w3c_idle_msgs: u64,
    /// R1: bytes of 1 KiB messages to fill the log with, and how long the
    /// fill may take.
    pub r1_log_bytes: u64,
    pub r1_fill_time_max: Duration,
    /// Push consumers' credit: the most messages each holds unacknowledged
    /// (`--push-credit`; FETCH_MAX by default, what one fetch may bring).
    pub push_credit: u32,
    /// W1's runnel producers give every message a dedup id (`--dedup`).
    pub dedup: bool,
    /// W11: the loads beside the PING probe.
    pub w11: stalls::Sizes,
}

impl Scale {
    pub fn new(quick: bool) -> Scale {
        if quick {
            Scale {
                w1_time: Duration::from_millis(50),
                w1_msgs_max: 50_000,
                w1_bytes_max: 8 << 20,
                w2_time: Duration::from_millis(100),
                w3_time: Duration::from_millis(200),
                w3_warmup: Duration::from_millis(20),
                w4_time: Duration::from_millis(150),
                w5_msgs: 100_000,
                w8_msgs: 5_000,
                fsync_probe_rounds: 50,
                drain_idle: Duration::from_secs(3),
                w3_lag_max: Duration::from_millis(200),
                w3_tail_max: Duration::from_millis(500),
                w5_fill_time_max: Duration::from_secs(5),
                runnel_consume_max: Duration::from_secs(30),
                peer_consume_max: Duration::from_secs(1),
                w3c_idle_msgs: 2_000,
                r1_log_bytes: 16 << 20,
                r1_fill_time_max: Duration::from_secs(10),
                push_credit: FETCH_MAX,
                dedup: false,
                w11: stalls::Sizes::new(quick),
            }
        } else {
            Scale {
                w1_time: Duration::from_secs(1),
                w1_msgs_max: 3_000_000,
                w1_bytes_max: 512 << 20,
                w2_time: Duration::from_secs(2),
                w3_time: Duration::from_secs(3),
                w3_warmup: Duration::from_millis(300),
                w4_time: Duration::from_secs(2),
                w5_msgs: 10_000_000,
                w8_msgs: 200_000,
                fsync_probe_rounds: 2000,
                drain_idle: Duration::from_secs(5),
                w3_lag_max: Duration::from_secs(1),
                w3_tail_max: Duration::from_secs(3),
                w5_fill_time_max: Duration::from_secs(60),
                runnel_consume_max: Duration::from_secs(120),
                peer_consume_max: Duration::from_secs(10),
                w3c_idle_msgs: 20_000,
                r1_log_bytes: 1 << 30,
                r1_fill_time_max: Duration::from_secs(120),
                push_credit: FETCH_MAX,
                dedup: false,
                w11: stalls::Sizes::new(quick),
            }
        }
    }
}

/// W1's ways of producing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Produce {
    /// One message per request, up to this many requests in flight.
    Depth(usize),
    /// runnel's batched PRODUCE: this many messages per request (fewer for
    /// large messages, see `batch_len`), 4 requests in flight.
    Batch(usize),
}

/// How the consumers of W3, W3B and W4 get their messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consume {
    /// FETCH with a long poll (every broker's way: XREADGROUP BLOCK,
    /// reserve-with-timeout).
    Fetch,
    /// runnel's push subscription: SUBSCRIBE once with a credit, the broker
    /// pushes each message as it becomes visible (`push_conn`).
    Push,
}

/// One configuration of one workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Config {
    W1 {
        size: usize,
        produce: Produce,
    },
    W2 {
        conns: usize,
    },
    W3 {
        rate: u64,
        consume: Consume,
    },
    W4 {
        producers: usize,
        consumers: usize,
        consume: Consume,
    },
    /// W5 with `groups` consumer groups at different positions (0: none,
    /// consumed as one queue).
    W5 {
        groups: usize,
    },
    /// Fan-out to `groups` consumer groups, the producer keeping `depth`
    /// produces in flight; with `tagged`, each group filters one of
    /// `groups` tags and each message has one of them.
    W6 {
        groups: usize,
        tagged: bool,
        depth: usize,
    },
    /// W3 while the log is rewritten: runnel compacting, Redis running
    /// BGREWRITEAOF.
    W3Compact {
        rate: u64,
    },
    /// W3 with runnel's `--spin-us` (0: the plain loop, side by side).
    W3Spin {
        rate: u64,
        spin_us: u32,
    },
    /// W3 with a busy-polling client (one thread, never sleeping), and
    /// runnel's `--spin-us` (0 for every broker; more for runnel only).
    W3Busy {
        rate: u64,
        spin_us: u32,
        consume: Consume,
    },
    /// W3 with every message scheduled `W7_DELAY_MS` ahead: `rate` fall
    /// due per second.
    W7 {
        rate: u64,
    },
    /// A backlog drained by `stages::W8_CONSUMERS` consumers of one group,
    /// ordered by key over `keys` keys (0: unordered, unkeyed).
    W8 {
        keys: u32,
    },
    /// A two-stage pipeline, stage one forwarding with ACK_PRODUCE
    /// (`atomic`) or with PRODUCE then ACK.
    W9 {
        atomic: bool,
    },
    /// W3 at `replay::W10_RATE` while a group replays a retained topic
    /// from the log files.
    W10,
    /// A PING probe beside a load that can hold the loop.
    W11 {
        load: stalls::Load,
    },
    /// Recovery of a durable log of `log_bytes` after a restart.
    R1 {
        log_bytes: u64,
    },
}

/// Message size of W2, W3 and W4.
const SIZE: usize = 128;
/// Message size of W5 (the "small 100-byte messages").
const W5_SIZE: usize = 100;
/// W1 batched PRODUCE: messages per batch, bytes per batch, batches in
/// flight.
const BATCH_MSGS: usize = 4096;
const BATCH_BYTES: usize = 1 << 20;
const BATCH_DEPTH: usize = 4;
/// Consumers: most messages per fetch, and the long-poll wait.
const FETCH_MAX: u32 = 1024;
const DRAIN_FETCH_MAX: u32 = 1000;
const WAIT_MS: u32 = 100;
/// W6: consumers per group, and the producer's pipeline depths. At 16 in
/// flight a durable producer waits on every sync, so both brokers are
/// bound by the disk's sync time and the rate says little about fan-out;
/// at 256 the brokers' own work of serving every group decides it.
const W6_CONSUMERS_PER_GROUP: usize = 2;
const W6_DEPTH: usize = 16;
const W6_DEPTH_DEEP: usize = 256;
/// W3C: runnel's segment size, small so that compaction runs all the time.
const W3C_SEGMENT_BYTES: u64 = 1 << 20;
/// W3C: acknowledged messages produced around each unacknowledged one, in
/// this many rounds, so the backlog is spread over many segments.
const W3C_CHURN_PER_IDLE: u64 = 10;
const W3C_ROUNDS: u64 = 20;
/// R1: message size.
const R1_SIZE: usize = 1024;
/// W3B: runnel's `--spin-us` beside the plain loop, so the server
/// busy-polls too (200 µs covers the 100 µs between messages at 10k/s).
const W3B_SPIN_US: u32 = 200;
/// W7: how far ahead each message is scheduled; whole seconds, the
/// unit of beanstalkd's `put` delay.
const W7_DELAY_MS: u64 = 1_000;
/// All the workload ids, in the order they run.
pub const WORKLOADS: [&str; 15] =
    ["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W3C", "W3S", "W3B", "R1"];

impl Config {
    pub fn workload(&self) -> &'static str {
        match self {
            Config::W1 { .. } => "W1",
            Config::W2 { .. } => "W2",
            Config::W3 { .. } => "W3",
            Config::W4 { .. } => "W4",
            Config::W5 { .. } => "W5",
            Config::W6 { .. } => "W6",
            Config::W7 { .. } => "W7",
            Config::W8 { .. } => "W8",
            Config::W9 { .. } => "W9",
            Config::W10 => "W10",
            Config::W11 { .. } => "W11",
            Config::W3Compact { .. } => "W3C",
            Config::W3Spin { .. } => "W3S",
            Config::W3Busy { .. } => "W3B",
            Config::R1 { .. } => "R1",
        }
    }

    /// The configurations of `workload`, for every broker (see
    /// `applies_to` for the ones only runnel runs).
    pub fn all(workload: &str, scale: &Scale) -> Vec<Config> {
        match workload {
            "W1" => {
                let mut v = Vec::new();
                for size in [16, 128, 1024, 16 << 10] {
                    for d in [1, 16, 32, 256] {
                        v.push(Config::W1 { size, produce: Produce::Depth(d) });
                    }
                    v.push(Config::W1 { size, produce: Produce::Batch(batch_len(size)) });
                }
                v
            }
            "W2" => [1, 16, 256].map(|conns| Config::W2 { conns }).to_vec(),
            "W3" => {
                let mut v = Vec::new();
                for rate in [1_000, 10_000, 100_000] {
                    for consume in [Consume::Fetch, Consume::Push] {
                        v.push(Config::W3 { rate, consume });
                    }
                }
                v
            }
            "W4" => [Consume::Fetch, Consume::Push]
                .map(|consume| Config::W4 { producers: 4, consumers: 4, consume })
                .to_vec(),
            "W5" => [0, 1, 4, 16].map(|groups| Config::W5 { groups }).to_vec(),
            "W6" => {
                let mut v = Vec::new();
                for depth in [W6_DEPTH, W6_DEPTH_DEEP] {
                    v.extend([1, 4, 16].map(|groups| Config::W6 { groups, tagged: false, depth }));
                    v.push(Config::W6 { groups: 16, tagged: true, depth });
                }
                v
            }
            "W7" => [1_000, 10_000].map(|rate| Config::W7 { rate }).to_vec(),
            "W8" => [0, 1, 100, 10_000].map(|keys| Config::W8 { keys }).to_vec(),
            "W9" => [false, true].map(|atomic| Config::W9 { atomic }).to_vec(),
            "W10" => vec![Config::W10],
            "W11" => stalls::Load::ALL.map(|load| Config::W11 { load }).to_vec(),
            "W3C" => vec![Config::W3Compact { rate: 10_000 }],
            "W3S" => {
                let mut v = Vec::new();
                for rate in [1_000, 10_000] {
                    for spin_us in [0, 50, 200] {
                        v.push(Config::W3Spin { rate, spin_us });
                    }
                }
                v
            }
            "W3B" => {
                let mut v = Vec::new();
                for rate in [1_000, 10_000] {
                    for spin_us in [0, W3B_SPIN_US] {
                        v.push(Config::W3Busy { rate, spin_us, consume: Consume::Fetch });
                    }
                    v.push(Config::W3Busy { rate, spin_us: 0, consume: Consume::Push });
                }
                v
            }
            "R1" => vec![Config::R1 { log_bytes: scale.r1_log_bytes }],
            _ => Vec::new(),
        }
    }

    /// Whether `kind` runs this configuration (batched produce is runnel's).
    /// The echo floor runs what measures the path of a message through a
    /// server (W1, W2, W3, W3B, W4); not W5 (memory of a backlog), W3C (a
    /// log rewrite), W3S (runnel's flag) or R1 (recovery), which measure
    /// what the floor leaves out.
    pub fn applies_to(&self, kind: Kind) -> bool {
        // Push subscriptions are runnel's (the floor speaks version 1).
        if self.consume() == Some(Consume::Push) {
            return kind == Kind::Runnel;
        }
        match self {
            Config::W1 { produce: Produce::Batch(_), .. } => kind.speaks_runnel(),
            // Ordered groups and ACK_PRODUCE are runnel's.
            Config::W3Spin { .. }
            | Config::R1 { .. }
            | Config::W8 { .. }
            | Config::W9 { .. }
            | Config::W10
            | Config::W11 { .. } => kind == Kind::Runnel,
            // With groups: runnel's and Redis Streams' (beanstalkd has none).
            Config::W5 { groups } => kind != Kind::Floor && (*groups == 0 || kind != Kind::Beanstalkd),
            // Only runnel filters by tag; the floor has no groups.
            Config::W6 { tagged, .. } => kind != Kind::Floor && (!tagged || kind == Kind::Runnel),
            // Redis Streams has no scheduled delivery, the floor no queue.
            Config::W7 { .. } => matches!(kind, Kind::Runnel | Kind::Beanstalkd),
            // beanstalkd has no log rewrite to compare with, the floor no log.
            Config::W3Compact { .. } => matches!(kind, Kind::Runnel | Kind::Redis),
            // `--spin-us` is runnel's; every broker runs the plain loop.
            Config::W3Busy { spin_us, .. } => *spin_us == 0 || kind == Kind::Runnel,
            _ => true,
        }
    }

    /// How this configuration's consumers get messages, where it has a
    /// choice (W3, W3B, W4).
    pub fn consume(&self) -> Option<Consume> {
        match *self {
            Config::W3 { consume, .. } | Config::W3Busy { consume, .. } | Config::W4 { consume, .. } => Some(consume),
            _ => None,
        }
    }

    /// How far ahead this configuration schedules each message (W7), ms.
    pub fn delay_ms(&self) -> u64 {
        match self {
            Config::W7 { .. } => W7_DELAY_MS,
            _ => 0,
        }
    }

    /// The same configuration with fetching consumers.
    pub fn fetching(&self) -> Config {
        match *self {
            Config::W3 { rate, .. } => Config::W3 { rate, consume: Consume::Fetch },
            Config::W3Busy { rate, spin_us, .. } => Config::W3Busy { rate, spin_us, consume: Consume::Fetch },
            Config::W4 { producers, consumers, .. } => Config::W4 { producers, consumers, consume: Consume::Fetch },
            c => c,
        }
    }

    /// What the broker column adds to `kind`'s name: runnel's rows of W3,
    /// W3B and W4 say which consumer they ran ("push" or "fetch").
    pub fn consumer_label(&self, kind: Kind) -> Option<&'static str> {
        match (kind, self.consume()?) {
            (Kind::Runnel, Consume::Fetch) => Some("fetch"),
            (Kind::Runnel, Consume::Push) => Some("push"),
            _ => None,
        }
    }

    /// W5 compares memory and drain rate, not durability: it runs memory
    /// only (a durable beanstalkd does one fsync per put, so 10M puts would
    /// take hours), as W3B, which measures the loop with a client that never
    /// sleeps.
    pub fn durabilities(&self) -> &'static [Durability] {
        match self {
            // W3S measures runnel's spin on the path that writes its log;
            // W11 the loop's own work, with no fdatasync in its turns.
            Config::W3Spin { .. } | Config::W11 { .. } => &[Durability::Unsynced],
            Config::W5 { .. } | Config::W3Busy { .. } => &[Durability::Memory],
            Config::W3Compact { .. } | Config::R1 { .. } | Config::W6 { .. } | Config::W10 => &[Durability::Durable],
            // Durable (every fetch round trip waits for the sync of the acks
            // before it) and not (the broker's own cost).
            Config::W8 { .. } | Config::W9 { .. } => &[Durability::Durable, Durability::Unsynced],
            _ => &Durability::ALL,
        }
    }

    /// Extra server flags this configuration needs.
    pub fn server_args(&self, kind: Kind, scale: &Scale) -> Vec<String> {
        match (self, kind) {
            // The backlog is larger than runnel's default depth limits.
            (Config::W5 { .. }, Kind::Runnel) => vec![
                "--topic-messages-max".into(),
                (scale.w5_msgs * 2).to_string(),
                "--topic-bytes-max".into(),
                (scale.w5_msgs * W5_SIZE as u64 * 2).max(1 << 30).to_string(),
            ],
            // `/metrics`: W10 reads the loop's turn times, W3 each turn's
            // write + fdatasync.
            (Config::W10 | Config::W3 { .. }, Kind::Runnel) => metrics::args(),
            (Config::W11 { load }, Kind::Runnel) => stalls::server_args(*load, &scale.w11),
            (Config::W3Compact { .. }, Kind::Runnel) => {
                vec!["--segment-bytes-max".into(), W3C_SEGMENT_BYTES.to_string()]
            }
            (Config::W3Spin { spin_us, .. } | Config::W3Busy { spin_us, .. }, Kind::Runnel) if *spin_us > 0 => {
                vec!["--spin-us".into(), spin_us.to_string()]
            }
            // The whole log stays queued, above the default depth limits.
            (Config::R1 { log_bytes }, Kind::Runnel) => vec![
                "--topic-messages-max".into(),
                (log_bytes / R1_SIZE as u64 * 2).to_string(),
                "--topic-bytes-max".into(),
                (log_bytes * 2).max(1 << 30).to_string(),
            ],
            _ => Vec::new(),
        }
    }

    /// Words for the table's config column.
    pub fn label(&self) -> String {
        match *self {
            Config::W1 { size, produce: Produce::Depth(d) } => format!("{} B, depth {d}", size_label(size)),
            Config::W1 { size, produce: Produce::Batch(b) } => {
                format!("{} B, batch {b} x{BATCH_DEPTH}", size_label(size))
            }
            Config::W2 { conns } => format!("{conns} conn{}, depth 1, {SIZE} B", if conns == 1 { "" } else { "s" }),
            Config::W3 { rate, .. } => format!("{} msgs/s open loop, {SIZE} B", rate_label(rate)),
            Config::W7 { rate } => format!(
                "{} due/s, each scheduled {} s ahead at send, open loop, {SIZE} B",
                rate_label(rate),
                W7_DELAY_MS / 1000
            ),
            Config::W4 { producers, consumers, .. } => {
                format!("{producers} producers (depth 16) + {consumers} consumers, {SIZE} B")
            }
            Config::W5 { groups: 0 } => format!("{W5_SIZE} B"),
            Config::W5 { groups: 1 } => format!("{W5_SIZE} B, 1 consumer group"),
            Config::W5 { groups } => format!("{W5_SIZE} B, {groups} consumer groups at different positions"),
            Config::W6 { groups, tagged: false, depth } => format!(
                "{groups} group{} x {W6_CONSUMERS_PER_GROUP} consumers, 1 producer (depth {depth}), {SIZE} B",
                if groups == 1 { "" } else { "s" }
            ),
            Config::W6 { groups, tagged: true, depth } => format!(
                "{groups} groups x {W6_CONSUMERS_PER_GROUP} consumers, each group filtering 1 of {groups} tags, 1 producer (depth {depth}), {SIZE} B"
            ),
            Config::W3Compact { rate } => format!(
                "{} msgs/s open loop, {SIZE} B, log rewritten during the run (runnel: compaction, Redis: BGREWRITEAOF)",
                rate_label(rate)
            ),
            Config::W3Spin { rate, spin_us: 0 } => format!("{} msgs/s open loop, {SIZE} B, no spin", rate_label(rate)),
            Config::W3Spin { rate, spin_us } => {
                format!("{} msgs/s open loop, {SIZE} B, --spin-us {spin_us}", rate_label(rate))
            }
            Config::W3Busy { rate, spin_us: 0, .. } => format!(
                "{} msgs/s open loop, {SIZE} B, busy-polling client (1 thread, its core 100% busy)",
                rate_label(rate)
            ),
            Config::W3Busy { rate, spin_us, .. } => format!(
                "{} msgs/s open loop, {SIZE} B, busy-polling client (1 thread, its core 100% busy) + server --spin-us {spin_us}",
                rate_label(rate)
            ),
            Config::W8 { keys: 0 } => {
                format!("backlog drained by {} consumers of one group, unordered, {SIZE} B", stages::W8_CONSUMERS)
            }
            Config::W8 { keys } => format!(
                "backlog drained by {} consumers of one group ordered by key, {keys} key{}, {SIZE} B",
                stages::W8_CONSUMERS,
                if keys == 1 { "" } else { "s" }
            ),
            Config::W9 { atomic } => format!(
                "backlog through 2 stages ({} forwarding workers, 1 consumer), forwarded with {}, {SIZE} B",
                stages::W9_WORKERS,
                if atomic { "ACK_PRODUCE" } else { "PRODUCE, then ACK" }
            ),
            Config::W10 => format!(
                "{} msgs/s open loop, {SIZE} B, while a new group replays a retained topic (1 GiB; 16 MiB with --quick) from the log files",
                rate_label(replay::W10_RATE)
            ),
            Config::W11 { load } => stalls::label(load),
            Config::R1 { log_bytes } => {
                format!("{} MiB log of {} B messages", log_bytes >> 20, size_label(R1_SIZE))
            }
        }
    }

    /// Which plot this configuration's latency curve goes to, if any.
    pub fn plot(&self) -> Option<(String, String)> {
        match *self {
            Config::W1 { size: 128, produce: Produce::Depth(1) } => {
                Some(("w1".into(), "W1: produce round trip, 128 B, 1 connection, depth 1".into()))
            }
            Config::W2 { conns: 256 } => {
                Some(("w2".into(), "W2: produce round trip, 256 connections at depth 1, 128 B".into()))
            }
            Config::W7 { rate } => Some((
                format!("w7-{}", rate_label(rate)),
                format!("W7: lateness of scheduled delivery, {} due/s", rate_label(rate)),
            )),
            Config::W3 { rate, .. } => Some((
                format!("w3-{}", rate_label(rate)),
                format!("W3: end to end from intended send, {} msgs/s open loop", rate_label(rate)),
            )),
            Config::W4 { .. } => Some(("w4".into(), "W4: work queue, end to end from send".into())),
            Config::W5 { groups: 0 } => {
                Some(("w5".into(), "W5: produce round trip while filling the backlog (depth 256)".into()))
            }
            Config::W3Compact { rate } => Some((
                "w3-rewrite".into(),
                format!(
                    "W3C: end to end, {} msgs/s, durable, runnel compacting / Redis BGREWRITEAOF",
                    rate_label(rate)
                ),
            )),
            Config::W3Busy { rate, .. } => Some((
                format!("w3b-{}", rate_label(rate)),
                format!(
                    "W3B: end to end from intended send, {} msgs/s, memory only, busy-polling client",
                    rate_label(rate)
                ),
            )),
            _ => None,
        }
    }

    /// What tells this configuration's line apart from the other lines of
    /// its plot of the same broker: the line's label is the broker and this
    /// (instead of the durability, which is then the title's).
    pub fn plot_variant(&self) -> Option<String> {
        match *self {
            Config::W3Busy { spin_us, .. } if spin_us > 0 => Some(format!("--spin-us {spin_us}")),
            Config::W3Busy { consume: Consume::Push, .. } => Some("push".into()),
            _ => None,
        }
    }
}

fn size_label(size: usize) -> String {
    if size >= 1024 { format!("{} Ki", size / 1024) } else { size.to_string() }
}

fn rate_label(rate: u64) -> String {
    if rate >= 1000 { format!("{}k", rate / 1000) } else { rate.to_string() }
}

/// Messages per batched PRODUCE for `size`-byte messages.
fn batch_len(size: usize) -> usize {
    (BATCH_BYTES / size).clamp(1, BATCH_MSGS)
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub config: Config,
    /// Position of the configuration in its workload, for ordering rows.
    pub order: usize,
    pub broker: Kind,
    pub durability: Durability,
    /// The cores the server could run on.
    pub server_cores: String,
    /// Messages the measured rate counts.
    pub messages: u64,
    /// Payload bytes of each message.
    pub size: usize,
    pub seconds: f64,
    /// Server CPU seconds (user + system) over `seconds`, if readable.
    pub cpu_seconds: Option<f64>,
    pub latency: Option<Latency>,
    /// Named figures particular to the workload (fsyncs per second, RSS).
    pub extra: Vec<(String, f64)>,
    pub notes: Vec<String>,
    pub verify: Option<Verify>,
    /// The phase, for workloads with more than one row (W5 fill, drain).
    pub phase: &'static str,
}

impl RunResult {
    pub fn new(ctx: &Ctx<'_>, size: usize, phase: &'static str) -> RunResult {
        RunResult {
            config: ctx.config,
            order: ctx.order,
            broker: ctx.server.kind,
            durability: ctx.server.durability,
            server_cores: ctx.server.cores.clone(),
            messages: 0,
            size,
            seconds: 0.0,
            cpu_seconds: None,
            latency: None,
            extra: Vec::new(),
            notes: Vec::new(),
            verify: None,
            phase,
        }
    }

    pub fn msgs_per_s(&self) -> f64 {
        if self.seconds > 0.0 { self.messages as f64 / self.seconds } else { 0.0 }
    }
    pub fn mb_per_s(&self) -> f64 {
        self.msgs_per_s() * self.size as f64 / 1e6
    }
    pub fn cpu_s_per_million(&self) -> Option<f64> {
        let cpu = self.cpu_seconds?;
        (self.messages > 0).then(|| cpu * 1e6 / self.messages as f64)
    }
    pub fn extra(&self, key: &str) -> Option<f64> {
        self.extra.iter().find(|e| e.0 == key).map(|e| e.1)
    }
}

/// What a configuration runs against.
pub struct Ctx<'a> {
    pub server: &'a Server,
    pub target: Target,
    pub config: Config,
    pub order: usize,
    pub scale: &'a Scale,
}

impl Ctx<'_> {
    /// A consumer of `topic` as this configuration asks: a push subscriber
    /// with the run's credit, or the broker's fetching consumer.
    fn consumer(&self, topic: &str, name: &str) -> Result<Box<dyn Consumer>, String> {
        match self.config.consume() {
            Some(Consume::Push) => self.target.push_consumer(topic, self.scale.push_credit),
            _ => self.target.consumer(topic, name),
        }
    }

    /// How long this broker's consumers may run after producing stopped.
    fn consume_max(&self) -> Duration {
        if self.server.kind.is_ours() { self.scale.runnel_consume_max } else { self.scale.peer_consume_max }
    }
}

/// Runs one configuration.
pub fn run(ctx: &Ctx<'_>) -> Result<Vec<RunResult>, String> {
    match ctx.config {
        Config::W1 { size, produce } => w1(ctx, size, produce).map(|r| vec![r]),
        Config::W2 { conns } => w2(ctx, conns).map(|r| vec![r]),
        Config::W3 { rate, .. } if ctx.server.kind == Kind::Runnel && ctx.server.durability == Durability::Durable => {
            w3_with_syncs(ctx, rate).map(|r| vec![r])
        }
        Config::W3 { rate, .. } | Config::W3Spin { rate, .. } => {
            w3(ctx, rate, &format!("w3-{rate}"), &mut |_| Ok(())).map(|r| vec![r])
        }
        Config::W7 { rate } => w3(ctx, rate, &format!("w7-{rate}"), &mut |_| Ok(())).map(|r| vec![r]),
        Config::W4 { producers, consumers, .. } => w4(ctx, producers, consumers).map(|r| vec![r]),
        Config::W5 { groups } => w5(ctx, groups),
        Config::W6 { groups, tagged, depth } => w6(ctx, groups, tagged, depth).map(|r| vec![r]),
        Config::W3Compact { rate } => w3c(ctx, rate).map(|r| vec![r]),
        Config::W3Busy { rate, .. } => w3b(ctx, rate).map(|r| vec![r]),
        Config::W8 { keys } => stages::w8(ctx, keys, ctx.scale.w8_msgs).map(|r| vec![r]),
        Config::W9 { atomic } => stages::w9(ctx, atomic, ctx.scale.w8_msgs).map(|r| vec![r]),
        Config::W10 => replay::w10(ctx, &|at| {
            w3(ctx, replay::W10_RATE, "w10-live", &mut |point| at(matches!(point, W3Point::Start(_))))
        })
        .map(|r| vec![r]),
        Config::W11 { load } => stalls::w11(ctx, load).map(|r| vec![r]),
        Config::R1 { .. } => Err("R1 restarts its server: run it with `recovery`".into()),
    }
}

/// W3 on durable runnel, with runnel's own write + fdatasync of each turn
/// over the sending window (its `/metrics` histogram): the disk as the
/// broker met it during the row, beside the probe's before the workload.
fn w3_with_syncs(ctx: &Ctx<'_>, rate: u64) -> Result<RunResult, String> {
    let mut before = Vec::new();
    let mut window = None;
    let mut r = w3(ctx, rate, &format!("w3-{rate}"), &mut |point| {
        match point {
            W3Point::Start(_) => before = metrics::histogram(metrics::FSYNCS)?,
            W3Point::End => window = Some(metrics::between(&before, &metrics::histogram(metrics::FSYNCS)?)),
        }
        Ok(())
    })?;
    if let Some(w) = window {
        r.extra.push(("fsyncs".into(), w.count as f64));
        r.extra.push(("fsync_p99_bucket_s".into(), w.p99_s));
        r.extra.push(("fsync_max_bucket_s".into(), w.max_s));
        r.extra.push(("fsyncs_over_10ms".into(), w.over as f64));
        r.notes.push(format!(
            "runnel's write + fdatasync of each turn while sending: {} syncs, p99 ≤ {}, longest ≤ {}, {} over {} (histogram buckets)",
            w.count,
            metrics::seconds_label(w.p99_s),
            metrics::seconds_label(w.max_s),
            w.over,
            metrics::seconds_label(metrics::OVER_S),
        ));
    }
    Ok(r)
}

/// Server CPU seconds between `start` and a later reading.
struct CpuMeter<'a> {
    server: &'a Server,
    start: Option<f64>,
}

impl<'a> CpuMeter<'a> {
    fn start(server: &'a Server) -> CpuMeter<'a> {
        CpuMeter { server, start: server.cpu_seconds().ok() }
    }
    fn read(&self) -> Option<f64> {
        Some(self.server.cpu_seconds().ok()? - self.start?)
    }
}

// ---------------------------------------------------------------------------
// Producing in a closed loop (W1, W4, W5).
// ---------------------------------------------------------------------------

/// A closed-loop producer's parameters.
struct Closed {
    /// Producer number in sequence numbers.
    producer: u32,
    size: usize,
    /// Most requests in flight; more are sent once half are answered.
    depth: usize,
    /// Messages per request (more than 1 only with batched produce).
    batch: usize,
    deadline: Instant,
    msgs_max: u64,
}

/// Produces until the deadline or the message cap, keeping between
/// depth/2 and depth requests in flight (one write per refill), and waits
/// for every reply. Records each request's round trip; returns the
/// messages acknowledged.
fn closed_loop(p: &mut dyn Producer, c: &Closed, lat: &mut Samples) -> Result<u64, String> {
    assert!(c.batch == 1 || p.batch_native(), "batched produce on a broker without it");
    assert!(c.size >= tracker::HEADER_BYTES && c.depth >= 1);
    let mut buf = vec![b'x'; c.size * c.batch];
    let mut sent_at: VecDeque<u64> = VecDeque::with_capacity(c.depth);
    let (mut sent, mut acked) = (0u64, 0u64);
    let low_water = c.depth / 2;
    loop {
        let more = sent < c.msgs_max && Instant::now() < c.deadline;
        if more {
            while p.in_flight() < c.depth && sent < c.msgs_max {
                let n = (c.batch as u64).min(c.msgs_max - sent) as usize;
                let now = now_ns();
                if c.batch == 1 {
                    tracker::stamp(&mut buf, tracker::seq(c.producer, sent), now);
                    p.queue(&buf[..c.size]);
                } else {
                    for (j, m) in buf.chunks_mut(c.size).take(n).enumerate() {
                        tracker::stamp(m, tracker::seq(c.producer, sent + j as u64), now);
                    }
                    let msgs: Vec<&[u8]> = buf.chunks(c.size).take(n).collect();
                    p.queue_batch(&msgs);
                }
                sent_at.push_back(now);
                sent += n as u64;
            }
            p.flush()?;
        } else if p.in_flight() == 0 {
            return Ok(acked);
        }
        let target = if more { low_water } else { 0 };
        while p.in_flight() > target {
            acked += u64::from(p.recv()?);
            let t = sent_at.pop_front().unwrap_or(0);
            lat.push(now_ns().saturating_sub(t));
        }
    }
}

// ---------------------------------------------------------------------------
// Consuming and checking delivery.
// ---------------------------------------------------------------------------

/// Consumes `topic` until every expected message in `seen` was delivered,
/// nothing came for `idle`, or `deadline` passed. Returns (deliveries,
/// seconds).
fn drain(
    target: &Target,
    topic: &str,
    seen: &mut Seen,
    idle: Duration,
    deadline: Instant,
) -> Result<(u64, f64), String> {
    drain_with(target.consumer(topic, "drain")?, seen, idle, deadline)
}

/// `drain` with the consumer `c`.
fn drain_with(
    mut c: Box<dyn Consumer>,
    seen: &mut Seen,
    idle: Duration,
    deadline: Instant,
) -> Result<(u64, f64), String> {
    let started = Instant::now();
    let mut last = Instant::now();
    let mut got = 0u64;
    while !seen.complete() && Instant::now() < deadline {
        let n = c.next(DRAIN_FETCH_MAX, WAIT_MS, &mut |payload| {
            if let Some((seq, _)) = tracker::read(payload) {
                seen.add(seq);
            }
        })?;
        got += n as u64;
        if n > 0 {
            last = Instant::now();
        } else if last.elapsed() > idle {
            break;
        }
    }
    c.ack_pending()?;
    Ok((got, started.elapsed().as_secs_f64()))
}

/// Drains whatever the run left and returns the delivery check. A peer's
/// check may be cut short by `peer_consume_max` (then it says so).
fn finish(ctx: &Ctx<'_>, topic: &str, mut seen: Seen) -> Result<Verify, String> {
    let deadline = Instant::now() + ctx.consume_max();
    if !seen.complete() {
        drain(&ctx.target, topic, &mut seen, ctx.scale.drain_idle, deadline)?;
    }
    let mut v = seen.verify();
    v.cut_short = !v.ok() && Instant::now() >= deadline;
    // A peer's leftovers die with its server; runnel's topic is deleted so
    // its log records are exercised the way a user's would be.
    if v.ok() || ctx.server.kind == Kind::Runnel {
        ctx.target.cleanup(topic)?;
    }
    Ok(v)
}

/// A consumer thread's loop: consume until told the producers are done
/// and `expected` deliveries arrived (or nothing came for `idle` after
/// that, or the time after `done` passed `consume_max`). Each delivery's
/// latency from the time in its header is recorded if that time is at or
/// after `from_ns`; `window_end_ns` bounds the deliveries counted as "in
/// the window".
struct ConsumerRun {
    done: Arc<AtomicBool>,
    expected: Arc<AtomicU64>,
    delivered: Arc<AtomicU64>,
    from_ns: u64,
    /// Subtracted from each latency: the time a message was scheduled
    /// ahead (W7), so what is recorded is its lateness.
    offset_ns: u64,
    window_end_ns: Arc<AtomicU64>,
    idle: Duration,
    consume_max: Duration,
}

/// What a consumer thread brings back.
#[derive(Default)]
struct Consumed {
    lat: Samples,
    seqs: Vec<u64>,
    in_window: u64,
}

impl ConsumerRun {
    fn run(self, mut c: Box<dyn Consumer>) -> Result<Consumed, String> {
        let mut out = Consumed::default();
        let mut last = Instant::now();
        let mut done_at: Option<Instant> = None;
        loop {
            let window_end = self.window_end_ns.load(Ordering::Relaxed);
            let n = c.next(FETCH_MAX, WAIT_MS, &mut |payload| {
                let now = now_ns();
                if let Some((seq, t)) = tracker::read(payload) {
                    out.seqs.push(seq);
                    if t >= self.from_ns {
                        out.lat.push(now.saturating_sub(t).saturating_sub(self.offset_ns));
                    }
                }
                if now <= window_end {
                    out.in_window += 1;
                }
            })?;
            let total = self.delivered.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
            if n > 0 {
                last = Instant::now();
            }
            if self.done.load(Ordering::Acquire) {
                let since = *done_at.get_or_insert_with(Instant::now);
                if total >= self.expected.load(Ordering::Acquire)
                    || (n == 0 && last.elapsed() > self.idle)
                    || since.elapsed() > self.consume_max
                {
                    break;
                }
            }
        }
        c.ack_pending()?;
        Ok(out)
    }
}

fn join<T>(h: thread::JoinHandle<Result<T, String>>, what: &str) -> Result<T, String> {
    h.join().map_err(|_| format!("the {what} thread panicked"))?
}

// ---------------------------------------------------------------------------
// The workloads.
// ---------------------------------------------------------------------------

fn w1(ctx: &Ctx<'_>, size: usize, produce: Produce) -> Result<RunResult, String> {
    let s = ctx.scale;
    let topic = format!("w1-{size}");
    ctx.target.prepare(&topic)?;
    let mut p = if s.dedup { ctx.target.dedup_producer(&topic)? } else { ctx.target.producer(&topic)? };
    let (depth, batch) = match produce {
        Produce::Depth(d) => (d, 1),
        Produce::Batch(b) => (BATCH_DEPTH, b),
    };
    let closed = Closed {
        producer: 0,
        size,
        depth,
        batch,
        deadline: Instant::now() + s.w1_time,
        msgs_max: s.w1_msgs_max.min(s.w1_bytes_max / size as u64),
    };
    let mut lat = Samples::default();
    let cpu = CpuMeter::start(ctx.server);
    let t0 = Instant::now();
    let acked = closed_loop(p.as_mut(), &closed, &mut lat)?;
    let mut r = RunResult::new(ctx, size, "");
    r.seconds = t0.elapsed().as_secs_f64();
    r.cpu_seconds = cpu.read();
    r.messages = acked;
    r.latency = lat.summarize(if batch > 1 { "batch request round trip" } else { "request round trip" });
    drop(p);
    r.verify = Some(finish(ctx, &topic, Seen::new(&[acked]))?);
    Ok(r)
}

fn w2(ctx: &Ctx<'_>, conns: usize) -> Result<RunResult, String> {
    let topic = format!("w2-{conns}");
    ctx.target.prepare(&topic)?;
    let mut prods: Vec<Box<dyn Producer>> = Vec::with_capacity(conns);
    let mut epoll = sys::Epoll::new(conns).map_err(|e| format!("epoll: {e}"))?;
    for i in 0..conns {
        let p = ctx.target.producer(&topic)?;
        epoll.add(p.fd(), i as u64).map_err(|e| format!("epoll: {e}"))?;
        prods.push(p);
    }
    let mut buf = vec![b'x'; SIZE];
    let mut sent = vec![0u64; conns];
    let mut acked = vec![0u64; conns];
    let mut sent_at = vec![0u64; conns];
    let mut lat = Samples::default();
    let counters0 = ctx.target.sync_counters()?;
    let cpu = CpuMeter::start(ctx.server);
    let t0 = Instant::now();
    let deadline = t0 + ctx.scale.w2_time;
    let mut in_flight = 0usize;
    let mut send = |i: usize, p: &mut dyn Producer, sent: &mut [u64], sent_at: &mut [u64]| -> Result<(), String> {
        let now = now_ns();
        tracker::stamp(&mut buf, tracker::seq(i as u32, sent[i]), now);
        p.queue(&buf);
        p.flush()?;
        sent[i] += 1;
        sent_at[i] = now;
        Ok(())
    };
    for (i, p) in prods.iter_mut().enumerate() {
        send(i, p.as_mut(), &mut sent, &mut sent_at)?;
        in_flight += 1;
    }
    let mut ready = Vec::with_capacity(conns);
    while in_flight > 0 {
        epoll.wait(1000, &mut ready).map_err(|e| format!("epoll: {e}"))?;
        for &token in &ready {
            let i = token as usize;
            let p = prods[i].as_mut();
            if p.in_flight() == 0 {
                continue;
            }
            acked[i] += u64::from(p.recv()?);
            in_flight -= 1;
            lat.push(now_ns().saturating_sub(sent_at[i]));
            if Instant::now() < deadline {
                send(i, p, &mut sent, &mut sent_at)?;
                in_flight += 1;
            }
        }
    }
    let mut r = RunResult::new(ctx, SIZE, "");
    r.seconds = t0.elapsed().as_secs_f64();
    r.cpu_seconds = cpu.read();
    r.messages = acked.iter().sum();
    r.latency = lat.summarize("request round trip");
    if let (Some(a), Some(b)) = (counters0, ctx.target.sync_counters()?) {
        let fsyncs = (b.fsyncs - a.fsyncs) as f64;
        let commits = (b.log_commits - a.log_commits) as f64;
        let produces = (b.produces_committed - a.produces_committed) as f64;
        r.extra.push(("fsyncs_per_s".into(), fsyncs / r.seconds));
        r.extra.push(("log_writes_per_s".into(), commits / r.seconds));
        if fsyncs > 0.0 {
            r.extra.push(("produces_per_fsync".into(), produces / fsyncs));
        }
        if commits > 0.0 {
            r.extra.push(("produces_per_log_write".into(), produces / commits));
        }
    }
    drop(prods);
    r.verify = Some(finish(ctx, &topic, Seen::new(&acked))?);
    Ok(r)
}

/// Where a W3 run is, for what runs beside it (W3C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum W3Point {
    /// Set-up is done; sending starts at the given `now_ns` time.
    Start(u64),
    /// Sending has stopped (the tail is not waited for yet).
    End,
}

/// The open-loop send schedule of W3 and W3B: message `k` is due at
/// `start + k × interval` and stamped with that intended time, so a stall
/// of the broker or the sender is charged in full (no coordinated
/// omission); the produce acknowledgements are timed from it too.
struct Schedule {
    start_ns: u64,
    interval_ns: u64,
    end_ns: u64,
    /// Samples before this are warm-up, left out of the percentiles.
    warm_ns: u64,
    /// Messages sent so far (the next one's index).
    next: u64,
    /// Intended send times of the produces not yet acknowledged.
    intended: VecDeque<u64>,
    ack_lat: Samples,
    /// Messages acknowledged.
    acked: u64,
    buf: Vec<u8>,
}

impl Schedule {
    fn new(rate: u64, s: &Scale) -> Schedule {
        // Start a little ahead so set-up is not charged to the first message.
        let start_ns = now_ns() + 5_000_000;
        Schedule {
            start_ns,
            interval_ns: 1_000_000_000 / rate,
            end_ns: start_ns + s.w3_time.as_nanos() as u64,
            warm_ns: start_ns + s.w3_warmup.as_nanos() as u64,
            next: 0,
            intended: VecDeque::new(),
            ack_lat: Samples::default(),
            acked: 0,
            buf: vec![b'x'; SIZE],
        }
    }

    /// When the next message is due.
    fn next_due_ns(&self) -> u64 {
        self.start_ns + self.next * self.interval_ns
    }

    /// Whether sending time is over at `now`.
    fn over(&self, now: u64) -> bool {
        now >= self.end_ns
    }

    /// Queues every message due by `now` (all that a late wake-up owes)
    /// and writes them with one flush.
    fn send_due(&mut self, now: u64, p: &mut dyn Producer) -> Result<(), String> {
        let mut queued = false;
        while self.next_due_ns() <= now && self.next_due_ns() < self.end_ns {
            let t = self.next_due_ns();
            tracker::stamp(&mut self.buf, tracker::seq(0, self.next), t);
            p.queue(&self.buf);
            self.intended.push_back(t);
            self.next += 1;
            queued = true;
        }
        if queued { p.flush() } else { Ok(()) }
    }

    /// A produce reply acknowledging `n` messages arrived.
    fn on_ack(&mut self, n: u32) {
        self.acked += u64::from(n);
        if let Some(t) = self.intended.pop_front()
            && t >= self.warm_ns
        {
            self.ack_lat.push(now_ns().saturating_sub(t));
        }
    }

    /// The **saturated** note, once the oldest unacknowledged produce is
    /// more than `lag_max` old.
    fn saturated(&self, lag_max: Duration) -> Option<String> {
        let lag = now_ns().saturating_sub(*self.intended.front()?);
        (lag > lag_max.as_nanos() as u64).then(|| {
            format!(
                "**saturated**: {:.1} s in, the oldest unacknowledged produce was {:.1} s old; stopped sending",
                now_ns().saturating_sub(self.start_ns) as f64 / 1e9,
                lag as f64 / 1e9
            )
        })
    }

    /// Seconds of sending, if it stopped at `now`.
    fn sent_secs(&self, now: u64) -> f64 {
        (now.min(self.end_ns).saturating_sub(self.start_ns)) as f64 / 1e9
    }

    /// The produce-acknowledged percentiles and the offered rate, into `r`.
    fn report(self, rate: u64, r: &mut RunResult) {
        if let Some(a) = self.ack_lat.summarize("produce acknowledged, from intended send time") {
            r.extra.push(("produce_ack_p50_us".into(), a.p50_ns as f64 / 1e3));
            r.extra.push(("produce_ack_p99_us".into(), a.p99_ns as f64 / 1e3));
        }
        r.extra.push(("offered_msgs_per_s".into(), rate as f64));
    }
}

fn w3(
    ctx: &Ctx<'_>,
    rate: u64,
    topic: &str,
    at: &mut dyn FnMut(W3Point) -> Result<(), String>,
) -> Result<RunResult, String> {
    let s = ctx.scale;
    let topic = topic.to_string();
    ctx.target.prepare(&topic)?;
    let delay_ms = ctx.config.delay_ms();
    let mut p = match delay_ms {
        0 => ctx.target.producer(&topic)?,
        ms => ctx.target.delayed_producer(&topic, ms)?,
    };
    let consumer = ctx.consumer(&topic, "c0")?;
    let mut sched = Schedule::new(rate, s);
    let done = Arc::new(AtomicBool::new(false));
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let delivered = Arc::new(AtomicU64::new(0));
    let run = ConsumerRun {
        done: done.clone(),
        expected: expected.clone(),
        delivered: delivered.clone(),
        from_ns: sched.warm_ns,
        offset_ns: delay_ms * 1_000_000,
        window_end_ns: Arc::new(AtomicU64::new(u64::MAX)),
        // A scheduled message arrives `delay_ms` after its produce.
        idle: s.drain_idle + Duration::from_millis(delay_ms),
        consume_max: ctx.consume_max() + Duration::from_millis(delay_ms),
    };
    let consumer = thread::Builder::new()
        .name("w3-consumer".into())
        .spawn(move || run.run(consumer))
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    sys::set_timer_slack_ns(1_000);
    at(W3Point::Start(sched.start_ns))?;
    let cpu = CpuMeter::start(ctx.server);
    let mut saturated: Option<String> = None;
    let producing: Result<(), String> = (|| {
        loop {
            let now = now_ns();
            if sched.over(now) {
                return Ok(());
            }
            sched.send_due(now, p.as_mut())?;
            p.recv_ready(&mut |n| sched.on_ack(n))?;
            saturated = sched.saturated(s.w3_lag_max);
            if saturated.is_some() {
                return Ok(());
            }
            let wait = sched.next_due_ns().saturating_sub(now_ns());
            if wait > 0 {
                sys::wait_readable(p.fd(), Duration::from_nanos(wait)).map_err(|e| format!("ppoll: {e}"))?;
            }
        }
    })();
    let sent_secs = sched.sent_secs(now_ns());
    let aside = at(W3Point::End);
    // How far the consumer was behind when sending stopped (W7: beyond
    // the messages not yet due, a second's worth by design).
    let not_due = rate * delay_ms / 1000;
    let behind = sched.acked.saturating_sub(delivered.load(Ordering::Relaxed)).saturating_sub(not_due);
    // The tail: the last acknowledgements, within a bound.
    let tail_end = Instant::now() + s.w3_tail_max;
    let mut tail: Result<(), String> = producing;
    while tail.is_ok() && p.in_flight() > 0 && Instant::now() < tail_end {
        tail = sys::wait_readable(p.fd(), Duration::from_millis(100))
            .map_err(|e| format!("ppoll: {e}"))
            .and_then(|_| p.recv_ready(&mut |n| sched.on_ack(n)));
    }
    let abandoned = p.in_flight();
    if abandoned > 0 && saturated.is_none() {
        saturated = Some(format!(
            "**saturated**: {abandoned} produces unacknowledged {:.1} s after sending stopped",
            s.w3_tail_max.as_secs_f64()
        ));
    }
    drop(p);
    expected.store(sched.acked, Ordering::Release);
    done.store(true, Ordering::Release);
    let consumed = join(consumer, "consumer");
    tail?;
    aside?;
    let consumed = consumed?;
    let acked = sched.acked;
    let mut r = RunResult::new(ctx, SIZE, "");
    r.cpu_seconds = cpu.read();
    r.seconds = sent_secs;
    r.messages = acked;
    r.latency = consumed.lat.summarize(if delay_ms > 0 {
        "lateness: delivery minus due time (intended send + the delay; open loop)"
    } else {
        "end to end from intended send time (open loop)"
    });
    sched.report(rate, &mut r);
    if let Some(sat) = saturated {
        r.notes.push(sat);
    }
    if abandoned > 0 {
        r.notes.push(format!("{abandoned} unacknowledged produces not counted"));
    }
    let behind_s = behind as f64 / rate as f64;
    if behind_s > s.w3_lag_max.as_secs_f64() {
        r.notes.push(format!(
            "**consumer saturated**: {behind} acknowledged messages ({behind_s:.1} s of sending) not yet consumed when sending stopped"
        ));
    }
    let mut seen = Seen::new(&[acked]);
    for q in &consumed.seqs {
        seen.add(*q);
    }
    r.verify = Some(finish(ctx, &topic, seen)?);
    Ok(r)
}

/// When W3B stopped sending.
#[derive(Clone, Copy)]
struct Stopped {
    at: Instant,
    /// Seconds of the send schedule that ran.
    sent_secs: f64,
    /// Acknowledged messages not yet consumed then.
    behind: u64,
}

/// W3 with a busy-polling client: ONE thread drives both connections and
/// never sleeps (two spinning threads on the one client core would take
/// turns). Each turn it reads the clock, sends every message that is due,
/// stamped with its intended send time as in `w3` (so latency is still
/// measured from the schedule: no coordinated omission), checks both
/// sockets with one zero-timeout `poll`, takes the produce replies and the
/// consumer's deliveries that have arrived (non-blocking reads), and
/// acknowledges and fetches again in one write. The consumer keeps one long
/// poll outstanding at the broker, as in `w3`; only the waiting moved from
/// the kernel to the client's loop. The client core is 100% busy by design:
/// its CPU time is measured and reported beside the server's.
fn w3b(ctx: &Ctx<'_>, rate: u64) -> Result<RunResult, String> {
    let s = ctx.scale;
    let topic = format!("w3b-{rate}");
    ctx.target.prepare(&topic)?;
    let mut p = ctx.target.producer(&topic)?;
    let mut c = ctx.consumer(&topic, "c0")?;
    let mut sched = Schedule::new(rate, s);
    let warm_ns = sched.warm_ns;
    let mut lat = Samples::default();
    let mut seqs: Vec<u64> = Vec::new();
    let mut on_msg = |payload: &[u8]| {
        let now = now_ns();
        if let Some((seq, t)) = tracker::read(payload) {
            seqs.push(seq);
            if t >= warm_ns {
                lat.push(now.saturating_sub(t));
            }
        }
    };
    let cpu = CpuMeter::start(ctx.server);
    let client_cpu_start = sys::thread_cpu_seconds().ok();
    let preempted_start = sys::thread_preemptions().ok();
    let machine_start = sys::machine_busy_seconds().ok();
    let loop_start = Instant::now();
    // The first fetch goes out now and waits at the broker.
    c.poll(FETCH_MAX, WAIT_MS, &mut on_msg)?;
    let (mut delivered, mut turns) = (0u64, 0u64);
    let mut saturated: Option<String> = None;
    let mut stopped: Option<Stopped> = None;
    // When the last acknowledgement came (or the tail's bound passed).
    let mut acks_done: Option<Instant> = None;
    let mut last_delivery = Instant::now();
    let st = loop {
        turns += 1;
        let now = now_ns();
        if stopped.is_none() {
            if sched.over(now) || saturated.is_some() {
                stopped = Some(Stopped {
                    at: Instant::now(),
                    sent_secs: sched.sent_secs(now),
                    behind: sched.acked.saturating_sub(delivered),
                });
            } else {
                sched.send_due(now, p.as_mut())?;
            }
        }
        let [produced, fetched] = sys::readable_now([p.fd(), c.fd()]).map_err(|e| format!("poll: {e}"))?;
        if produced {
            p.recv_ready(&mut |n| sched.on_ack(n))?;
        }
        if fetched {
            let n = c.poll(FETCH_MAX, WAIT_MS, &mut on_msg)?;
            if n > 0 {
                delivered += n as u64;
                last_delivery = Instant::now();
            }
        }
        match stopped {
            None => saturated = sched.saturated(s.w3_lag_max),
            Some(st) => {
                // The tail: the last acknowledgements, within a bound; then
                // the consumer until it has them all, as `ConsumerRun`.
                if acks_done.is_none() && (p.in_flight() == 0 || st.at.elapsed() >= s.w3_tail_max) {
                    acks_done = Some(Instant::now());
                }
                if let Some(since) = acks_done
                    && (delivered >= sched.acked
                        || last_delivery.elapsed() > s.drain_idle
                        || since.elapsed() > ctx.consume_max())
                {
                    break st;
                }
            }
        }
    };
    let loop_secs = loop_start.elapsed().as_secs_f64();
    let client_cpu = match (client_cpu_start, sys::thread_cpu_seconds().ok()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let preempted = match (preempted_start, sys::thread_preemptions().ok()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let server_cpu = cpu.read();
    // What else ran on the machine meanwhile (other processes, kernel
    // threads, the hypervisor's steal): the busy loop and the server taken
    // away.
    let others = match (machine_start, sys::machine_busy_seconds().ok(), client_cpu, server_cpu) {
        (Some(a), Some(b), Some(cc), Some(sc)) => Some((b - a - cc - sc).max(0.0)),
        _ => None,
    };
    let abandoned = p.in_flight();
    if abandoned > 0 && saturated.is_none() {
        saturated = Some(format!(
            "**saturated**: {abandoned} produces unacknowledged {:.1} s after sending stopped",
            s.w3_tail_max.as_secs_f64()
        ));
    }
    drop(p);
    // The fetch still outstanding at the broker: its messages count too.
    c.end_poll(&mut on_msg)?;
    drop(c);
    let acked = sched.acked;
    let mut r = RunResult::new(ctx, SIZE, "");
    r.cpu_seconds = server_cpu;
    r.seconds = st.sent_secs;
    r.messages = acked;
    r.latency = lat.summarize("end to end from intended send time (open loop)");
    sched.report(rate, &mut r);
    // The busy loop's own cost: CPU of the client thread over the loop's
    // wall time (about 1 by design), per message, and a turn's length.
    if let Some(cc) = client_cpu {
        r.extra.push(("client_cpu_busy".into(), cc / loop_secs));
        r.extra.push(("client_cpu_s_per_million".into(), cc * 1e6 / acked.max(1) as f64));
    }
    if let Some(sc) = server_cpu {
        r.extra.push(("server_cpu_busy".into(), sc / loop_secs));
    }
    r.extra.push(("client_turn_ns".into(), loop_secs * 1e9 / turns.max(1) as f64));
    if let Some(o) = others {
        r.extra.push(("other_cpu_busy".into(), o / loop_secs));
    }
    if let Some(n) = preempted {
        r.extra.push(("client_preemptions".into(), n as f64));
    }
    if let Some(sat) = saturated {
        r.notes.push(sat);
    }
    if abandoned > 0 {
        r.notes.push(format!("{abandoned} unacknowledged produces not counted"));
    }
    let behind_s = st.behind as f64 / rate as f64;
    if behind_s > s.w3_lag_max.as_secs_f64() {
        r.notes.push(format!(
            "**consumer saturated**: {} acknowledged messages ({behind_s:.1} s of sending) not yet consumed when sending stopped",
            st.behind
        ));
    }
    let mut seen = Seen::new(&[acked]);
    for q in &seqs {
        seen.add(*q);
    }
    r.verify = Some(finish(ctx, &topic, seen)?);
    Ok(r)
}

fn w4(ctx: &Ctx<'_>, producers: usize, consumers: usize) -> Result<RunResult, String> {
    let topic = "w4".to_string();
    ctx.target.prepare(&topic)?;
    let done = Arc::new(AtomicBool::new(false));
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let delivered = Arc::new(AtomicU64::new(0));
    let window_end_ns = Arc::new(AtomicU64::new(u64::MAX));
    let mut chandles = Vec::new();
    for i in 0..consumers {
        let c = ctx.consumer(&topic, &format!("c{i}"))?;
        let run = ConsumerRun {
            done: done.clone(),
            expected: expected.clone(),
            delivered: delivered.clone(),
            from_ns: 0,
            offset_ns: 0,
            window_end_ns: window_end_ns.clone(),
            idle: ctx.scale.drain_idle,
            consume_max: ctx.consume_max(),
        };
        chandles.push(
            thread::Builder::new()
                .name(format!("w4-consumer-{i}"))
                .spawn(move || run.run(c))
                .map_err(|e| format!("cannot start a thread: {e}"))?,
        );
    }
    let mut prods = Vec::new();
    for _ in 0..producers {
        prods.push(ctx.target.producer(&topic)?);
    }
    let cpu = CpuMeter::start(ctx.server);
    let t0 = Instant::now();
    let deadline = t0 + ctx.scale.w4_time;
    window_end_ns.store(now_ns() + ctx.scale.w4_time.as_nanos() as u64, Ordering::Relaxed);
    let mut phandles = Vec::new();
    for (i, mut p) in prods.into_iter().enumerate() {
        let closed = Closed { producer: i as u32, size: SIZE, depth: 16, batch: 1, deadline, msgs_max: u64::MAX };
        phandles.push(
            thread::Builder::new()
                .name(format!("w4-producer-{i}"))
                .spawn(move || {
                    let mut lat = Samples::default();
                    closed_loop(p.as_mut(), &closed, &mut lat)
                })
                .map_err(|e| format!("cannot start a thread: {e}"))?,
        );
    }
    let mut acked = Vec::new();
    let mut first_err = None;
    for h in phandles {
        match join(h, "producer") {
            Ok(n) => acked.push(n),
            Err(e) => {
                acked.push(0);
                first_err.get_or_insert(e);
            }
        }
    }
    let window = t0.elapsed().as_secs_f64();
    expected.store(acked.iter().sum(), Ordering::Release);
    done.store(true, Ordering::Release);
    let mut lat = Samples::default();
    let mut seen = Seen::new(&acked);
    let mut in_window = 0;
    for h in chandles {
        match join(h, "consumer") {
            Ok(mut c) => {
                lat.append(&mut c.lat);
                in_window += c.in_window;
                for q in c.seqs {
                    seen.add(q);
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let mut r = RunResult::new(ctx, SIZE, "");
    r.cpu_seconds = cpu.read();
    let total: u64 = acked.iter().sum();
    let all_secs = t0.elapsed().as_secs_f64();
    // The rate is what the consumers finished within the produce window;
    // CPU is per message over the whole run, the catch-up included.
    r.seconds = window;
    r.messages = in_window;
    r.cpu_seconds = r.cpu_seconds.map(|c| c * in_window as f64 / total.max(1) as f64);
    r.latency = lat.summarize("end to end from send (closed loop)");
    r.extra.push(("produced_msgs_per_s".into(), total as f64 / window));
    r.extra.push(("catch_up_s".into(), all_secs - window));
    r.verify = Some(finish(ctx, &topic, seen)?);
    Ok(r)
}

/// W6: one producer with `depth` produces in flight, `groups` consumer
/// groups of two consumers each, for W4's time. The rate is deliveries (to every group) within the produce
/// window; server CPU is per delivery over the whole run. Each group must
/// get every acknowledged produce; with `tagged`, each message goes to the
/// one group whose tag it has, so the groups together must get each once.
fn w6(ctx: &Ctx<'_>, groups: usize, tagged: bool, depth: usize) -> Result<RunResult, String> {
    let topic = format!("w6-{groups}{}-d{depth}", if tagged { "-tagged" } else { "" });
    let tags = if tagged { groups as u32 } else { 0 };
    let names: Vec<(String, String)> = (0..groups)
        .map(|g| (format!("g{g}"), if tagged { runnel_conn::tag_of(g as u64, tags) } else { String::new() }))
        .collect();
    ctx.target.prepare_groups(&topic, &names)?;
    // The consumers of a share stop once it has every produce: a group's
    // own, or with tags one share for all groups.
    let shares = if tagged { 1 } else { groups };
    let done = Arc::new(AtomicBool::new(false));
    let expected: Vec<_> = (0..shares).map(|_| Arc::new(AtomicU64::new(u64::MAX))).collect();
    let delivered: Vec<_> = (0..shares).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let window_end_ns = Arc::new(AtomicU64::new(u64::MAX));
    let mut chandles = Vec::new();
    for (g, (group, _)) in names.iter().enumerate() {
        let share = if tagged { 0 } else { g };
        for i in 0..W6_CONSUMERS_PER_GROUP {
            let c = ctx.target.group_consumer(&topic, group, &format!("c{i}"))?;
            let run = ConsumerRun {
                done: done.clone(),
                expected: expected[share].clone(),
                delivered: delivered[share].clone(),
                from_ns: 0,
                offset_ns: 0,
                window_end_ns: window_end_ns.clone(),
                idle: ctx.scale.drain_idle,
                consume_max: ctx.consume_max(),
            };
            let h = thread::Builder::new()
                .name(format!("w6-{group}-{i}"))
                .spawn(move || run.run(c))
                .map_err(|e| format!("cannot start a thread: {e}"))?;
            chandles.push((share, h));
        }
    }
    let mut p = ctx.target.fanout_producer(&topic, &names, tags)?;
    let cpu = CpuMeter::start(ctx.server);
    let t0 = Instant::now();
    window_end_ns.store(now_ns() + ctx.scale.w4_time.as_nanos() as u64, Ordering::Relaxed);
    let closed =
        Closed { producer: 0, size: SIZE, depth, batch: 1, deadline: t0 + ctx.scale.w4_time, msgs_max: u64::MAX };
    let produced = closed_loop(p.as_mut(), &closed, &mut Samples::default());
    let window = t0.elapsed().as_secs_f64();
    // A failed producer still stops the consumers: they are owed nothing.
    let acked = *produced.as_ref().unwrap_or(&0);
    expected.iter().for_each(|e| e.store(acked, Ordering::Release));
    done.store(true, Ordering::Release);
    let mut seen: Vec<Seen> = (0..shares).map(|_| Seen::new(&[acked])).collect();
    let mut lat = Samples::default();
    let mut in_window = 0;
    let mut first_err = produced.err();
    for (share, h) in chandles {
        match join(h, "consumer") {
            Ok(mut c) => {
                lat.append(&mut c.lat);
                in_window += c.in_window;
                c.seqs.iter().for_each(|&q| seen[share].add(q));
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let deliveries: u64 = delivered.iter().map(|d| d.load(Ordering::Relaxed)).sum();
    let mut r = RunResult::new(ctx, SIZE, "");
    r.seconds = window;
    r.messages = in_window;
    r.cpu_seconds = cpu.read().map(|c| c * in_window as f64 / deliveries.max(1) as f64);
    r.latency = lat.summarize("end to end from send (closed loop)");
    r.extra.push(("produced_msgs_per_s".into(), acked as f64 / window));
    if ctx.server.kind == Kind::Beanstalkd {
        r.notes.push(
            "one tube per group (beanstalkd has no groups): the producer puts each message into every tube".into(),
        );
    }
    r.verify = Some(fanout_verify(ctx, &topic, &names, seen)?);
    Ok(r)
}

/// W6's delivery check, every group's (or with tags the groups' together)
/// as one; a group short of messages at the end is drained first.
fn fanout_verify(ctx: &Ctx<'_>, topic: &str, names: &[(String, String)], seen: Vec<Seen>) -> Result<Verify, String> {
    let deadline = Instant::now() + ctx.consume_max();
    let mut all: Option<Verify> = None;
    for (mut s, (group, _)) in seen.into_iter().zip(names) {
        if !s.complete() {
            let c = ctx.target.group_consumer(topic, group, "drain")?;
            drain_with(c, &mut s, ctx.scale.drain_idle, deadline)?;
        }
        let mut v = s.verify();
        v.cut_short = !v.ok() && Instant::now() >= deadline;
        match &mut all {
            Some(a) => a.add(v),
            None => all = Some(v),
        }
    }
    let v = all.unwrap_or_default();
    if v.ok() || ctx.server.kind == Kind::Runnel {
        ctx.target.cleanup(topic)?;
    }
    Ok(v)
}

/// W5: fills a topic with `scale.w5_msgs` messages and drains it. With
/// `groups`, they are made before the fill, all from the start; after it,
/// group i moves to message i/`groups` of the backlog (runnel: RESET_GROUP;
/// a Redis group's position is one id whatever it is, so its groups stay
/// at the start), RSS is read, and group 0 drains it all.
fn w5(ctx: &Ctx<'_>, groups: usize) -> Result<Vec<RunResult>, String> {
    let n = ctx.scale.w5_msgs;
    let topic = format!("w5-{groups}");
    let names: Vec<(String, String)> = (0..groups).map(|g| (format!("g{g}"), String::new())).collect();
    if groups == 0 {
        ctx.target.prepare(&topic)?;
    } else {
        ctx.target.prepare_groups(&topic, &names)?;
    }
    let (rss_before, _) = ctx.server.rss()?;
    let mut p = ctx.target.producer(&topic)?;
    let closed = Closed {
        producer: 0,
        size: W5_SIZE,
        depth: 256,
        batch: 1,
        deadline: Instant::now() + ctx.scale.w5_fill_time_max,
        msgs_max: n,
    };
    let mut lat = Samples::default();
    let cpu = CpuMeter::start(ctx.server);
    let t0 = Instant::now();
    let acked = closed_loop(p.as_mut(), &closed, &mut lat)?;
    drop(p);
    let mut fill = RunResult::new(ctx, W5_SIZE, "fill");
    fill.seconds = t0.elapsed().as_secs_f64();
    fill.cpu_seconds = cpu.read();
    fill.messages = acked;
    fill.latency = lat.summarize("request round trip while filling (depth 256)");
    ctx.target.spread_groups(&topic, &names, acked)?;
    let (rss_full, _) = ctx.server.rss()?;
    let cpu = CpuMeter::start(ctx.server);
    let mut seen = Seen::new(&[acked]);
    let deadline = Instant::now() + ctx.consume_max().max(ctx.scale.w5_fill_time_max);
    let drainer = match names.first() {
        Some((g0, _)) => ctx.target.group_consumer(&topic, g0, "drain")?,
        None => ctx.target.consumer(&topic, "drain")?,
    };
    let (got, secs) = drain_with(drainer, &mut seen, ctx.scale.drain_idle, deadline)?;
    let mut drained = RunResult::new(ctx, W5_SIZE, "drain");
    drained.seconds = secs;
    drained.cpu_seconds = cpu.read();
    drained.messages = got;
    let (rss_end, peak) = ctx.server.rss()?;
    let mut v = seen.verify();
    v.cut_short = !v.ok() && Instant::now() >= deadline;
    if v.ok() || ctx.server.kind == Kind::Runnel {
        ctx.target.cleanup(&topic)?;
    }
    drained.verify = Some(v);
    if acked < n {
        fill.notes.push(format!(
            "fill stopped after {:.0} s with {acked} of {n} messages",
            ctx.scale.w5_fill_time_max.as_secs_f64()
        ));
    }
    for r in [&mut fill, &mut drained] {
        r.extra.push(("rss_before_bytes".into(), rss_before as f64));
        r.extra.push(("rss_full_bytes".into(), rss_full as f64));
        r.extra.push(("rss_after_drain_bytes".into(), rss_end as f64));
        r.extra.push(("peak_rss_bytes".into(), peak as f64));
        r.extra.push((
            "rss_per_queued_msg_bytes".into(),
            rss_full.saturating_sub(rss_before) as f64 / acked.max(1) as f64,
        ));
    }
    Ok(vec![fill, drained])
}

// ---------------------------------------------------------------------------
// W3C: end-to-end latency while the log is rewritten.
// ---------------------------------------------------------------------------

/// Leaves `scale.w3c_idle_msgs` unacknowledged messages of 100 B in
/// `idle`, spread over the log: in each of `W3C_ROUNDS` rounds, a share of
/// them, then `W3C_CHURN_PER_IDLE` times as many 128 B messages to `churn`,
/// all consumed and acknowledged. Returns the idle messages acknowledged
/// per round (their producer numbers).
fn w3c_backlog(ctx: &Ctx<'_>, idle: &str, churn: &str) -> Result<Vec<u64>, String> {
    ctx.target.prepare(idle)?;
    ctx.target.prepare(churn)?;
    let per_round = ctx.scale.w3c_idle_msgs / W3C_ROUNDS;
    let deadline = Instant::now() + ctx.consume_max();
    let mut idle_acked = Vec::new();
    let mut churn_acked = Vec::new();
    for round in 0..W3C_ROUNDS as u32 {
        let mut lat = Samples::default();
        for (topic, size, n, acked) in [
            (idle, W5_SIZE, per_round, &mut idle_acked),
            (churn, SIZE, per_round * W3C_CHURN_PER_IDLE, &mut churn_acked),
        ] {
            let mut p = ctx.target.producer(topic)?;
            let c = Closed { producer: round, size, depth: 64, batch: 1, deadline, msgs_max: n };
            acked.push(closed_loop(p.as_mut(), &c, &mut lat)?);
        }
        // Acknowledge this round's churn before the next, so every segment
        // mixes dead messages with a few live ones.
        let mut seen = Seen::new(&churn_acked);
        for (p, &n) in churn_acked.iter().enumerate().take(round as usize) {
            for i in 0..n {
                seen.add(tracker::seq(p as u32, i));
            }
        }
        drain(&ctx.target, churn, &mut seen, ctx.scale.drain_idle, deadline)?;
        let v = seen.verify();
        if !v.ok() {
            return Err(format!("W3C backlog: {} of {} churn messages not delivered", v.missing, v.expected));
        }
    }
    ctx.target.cleanup(churn)?;
    Ok(idle_acked)
}

fn w3c(ctx: &Ctx<'_>, rate: u64) -> Result<RunResult, String> {
    let (idle, churn) = ("w3c-idle", "w3c-churn");
    let idle_acked = w3c_backlog(ctx, idle, churn)?;
    let addr = ctx.target.addr;
    let mut r = match ctx.server.kind {
        Kind::Runnel => {
            let mut marks: Vec<Vec<(String, u64)>> = Vec::new();
            let mut r = w3(ctx, rate, &format!("w3c-{rate}"), &mut |_| {
                marks.push(crate::runnel_conn::broker_stats(addr)?);
                Ok(())
            })?;
            let [a, b] = &marks[..] else { return Err("W3C: STATS not read at start and end".into()) };
            let get = crate::runnel_conn::stat;
            for key in ["compactions", "log_segments", "log_bytes"] {
                r.extra.push((format!("{key}_at_start"), get(a, key)? as f64));
                r.extra.push((format!("{key}_at_end"), get(b, key)? as f64));
            }
            r
        }
        Kind::Redis => {
            // BGREWRITEAOF at 1/3 and 2/3 of the sending time (1 s and 2 s).
            let mut rewriter: Option<thread::JoinHandle<Result<Vec<String>, String>>> = None;
            let every = ctx.scale.w3_time / 3;
            let mut r = w3(ctx, rate, &format!("w3c-{rate}"), &mut |point| {
                match point {
                    W3Point::Start(start_ns) => {
                        let h = thread::Builder::new()
                            .name("w3c-bgrewriteaof".into())
                            .spawn(move || {
                                let mut replies = Vec::new();
                                let end_ns = start_ns + 3 * every.as_nanos() as u64;
                                for k in 1..=2u64 {
                                    let due = start_ns + k * every.as_nanos() as u64;
                                    thread::sleep(Duration::from_nanos(due.saturating_sub(now_ns())));
                                    // At the quick scale the first rewrite may
                                    // still run: start the second when it ends.
                                    loop {
                                        match crate::redis_conn::command_text(addr, &[b"BGREWRITEAOF"]) {
                                            Ok(reply) => {
                                                replies.push(reply);
                                                break;
                                            }
                                            Err(e) if e.contains("already in progress") => {
                                                if now_ns() >= end_ns {
                                                    replies.push("not started: the previous one ran to the end".into());
                                                    break;
                                                }
                                                thread::sleep(Duration::from_millis(10));
                                            }
                                            Err(e) => return Err(e),
                                        }
                                    }
                                }
                                Ok(replies)
                            })
                            .map_err(|e| format!("cannot start a thread: {e}"))?;
                        rewriter = Some(h);
                    }
                    W3Point::End => {
                        if let Some(h) = rewriter.take() {
                            join(h, "BGREWRITEAOF")?;
                        }
                    }
                }
                Ok(())
            })?;
            let info = crate::redis_conn::command_text(addr, &[b"INFO", b"all"])?;
            for key in ["aof_rewrites", "latest_fork_usec", "aof_last_rewrite_time_sec"] {
                if let Some(v) = crate::redis_conn::info_field(&info, key) {
                    r.extra.push((key.into(), v));
                }
            }
            r
        }
        Kind::Beanstalkd | Kind::Floor => return Err(format!("W3C has no {} run", ctx.server.kind.name())),
    };
    // The backlog must have survived every rewrite.
    let mut seen = Seen::new(&idle_acked);
    let deadline = Instant::now() + ctx.consume_max();
    drain(&ctx.target, idle, &mut seen, ctx.scale.drain_idle, deadline)?;
    let v = seen.verify();
    r.extra.push(("backlog_msgs".into(), v.expected as f64));
    if !v.ok() {
        r.notes.push(format!("**{} of {} backlog messages MISSING after the rewrites**", v.missing, v.expected));
        r.verify = Some(v);
    } else {
        ctx.target.cleanup(idle)?;
    }
    Ok(r)
}

// ---------------------------------------------------------------------------
// R1: recovery of a large log.
// ---------------------------------------------------------------------------

/// Fills a durable runnel with `log_bytes` of 1 KiB messages (batched,
/// none acknowledged, so nothing is compacted away), then restarts it
/// twice on the same data: once with the log in the page cache, once after
/// dropping the page cache of its files. Each row is one restart: the time
/// from spawn until it answers a PING, its own `recovery_ms`, and what
/// STATS says of the log. After the last, every message must be delivered.
pub fn recovery(
    server: &mut Server,
    target: Target,
    config: Config,
    order: usize,
    scale: &Scale,
) -> Result<Vec<RunResult>, String> {
    let Config::R1 { log_bytes } = config else { return Err("recovery runs R1 only".into()) };
    if server.kind != Kind::Runnel {
        return Err("R1 is runnel's only".into());
    }
    let topic = "r1";
    let mut p = target.producer(topic)?;
    let closed = Closed {
        producer: 0,
        size: R1_SIZE,
        depth: BATCH_DEPTH,
        batch: batch_len(R1_SIZE),
        deadline: Instant::now() + scale.r1_fill_time_max,
        msgs_max: log_bytes / R1_SIZE as u64,
    };
    let t0 = Instant::now();
    let acked = closed_loop(p.as_mut(), &closed, &mut Samples::default())?;
    let fill_s = t0.elapsed().as_secs_f64();
    drop(p);
    let mut rows = Vec::new();
    for (phase, cold) in [("warm restart", false), ("cold restart", true)] {
        let (stop, ready) = server.restart(|data| if cold { drop_cache_under(data) } else { Ok(()) })?;
        let cpu = server.cpu_seconds().ok();
        let stats = crate::runnel_conn::broker_stats(target.addr)?;
        let get = |k: &str| crate::runnel_conn::stat(&stats, k).map(|v| v as f64);
        let ctx = Ctx { server: &*server, target, config, order, scale };
        let mut r = RunResult::new(&ctx, R1_SIZE, phase);
        r.seconds = ready.as_secs_f64();
        r.messages = acked;
        r.cpu_seconds = cpu;
        r.extra.push(("ready_ms".into(), ready.as_secs_f64() * 1e3));
        r.extra.push(("stop_ms".into(), stop.as_secs_f64() * 1e3));
        for key in ["recovery_ms", "log_bytes", "log_segments", "recovered_records"] {
            r.extra.push((key.into(), get(key)?));
        }
        r.extra.push(("fill_msgs_per_s".into(), acked as f64 / fill_s));
        if acked < closed.msgs_max {
            r.notes.push(format!("fill stopped after {fill_s:.0} s with {acked} of {} messages", closed.msgs_max));
        }
        rows.push(r);
    }
    let ctx = Ctx { server: &*server, target, config, order, scale };
    let v = finish(&ctx, topic, Seen::new(&[acked]))?;
    if let Some(last) = rows.last_mut() {
        last.verify = Some(v);
    }
    Ok(rows)
}

/// Syncs, then drops the page cache of every file under `dir`, so a
/// restart reads its log from the disk.
pub(crate) fn drop_cache_under(dir: &std::path::Path) -> Result<(), String> {
    sys::sync_all();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("cannot list {}: {e}", d.display()))?;
        for e in entries {
            let path = e.map_err(|e| format!("cannot list {}: {e}", d.display()))?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                sys::drop_page_cache(&path).map_err(|e| format!("fadvise {}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_floor_runs_each_configuration_of_a_message_path_once() {
        let scale = Scale::new(true);
        let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
        for w in WORKLOADS {
            for c in Config::all(w, &scale) {
                for &d in c.durabilities() {
                    if c.applies_to(Kind::Floor) && Kind::Floor.runs_with(d) {
                        *runs.entry(w).or_default() += 1;
                    }
                }
            }
        }
        let want: BTreeMap<&str, usize> = [("W1", 20), ("W2", 3), ("W3", 3), ("W3B", 2), ("W4", 1)].into();
        assert_eq!(runs, want);
    }
}
