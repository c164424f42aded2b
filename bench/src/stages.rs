//! runnel's own consumer features, measured against its plain path in the
//! same run (the peers have neither):
//!
//! - W8 ordered by key: a backlog of `W8_MSGS` keyed messages drained by
//!   `W8_CONSUMERS` fetching consumers of one group, unordered and ordered
//!   by key with 1, 100 and 10,000 keys. An ordered group has at most one
//!   message of a key outstanding, so with 1 key the four consumers take
//!   turns and each message costs a FETCH and an ACK round trip; with many
//!   keys they proceed in parallel. Each consumer stamps every delivery
//!   with the bench's shared clock, and the row says whether every key's
//!   messages arrived in produce order.
//! - W9 a consume-transform-produce pipeline of two stages: a backlog in
//!   `w9-in`, `W9_WORKERS` stage-one workers each fetching a batch and
//!   forwarding it to `w9-out` — with one ACK_PRODUCE (acknowledge and
//!   produce, atomically) or as a PRODUCE, its reply, then an ACK — and one
//!   stage-two consumer of `w9-out`. Throughput is messages through both
//!   stages per second.
//!
//! Both drain a backlog made before the clock starts: what is measured is
//! the consumers' side, which is what ordering and the atomic frame change.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use runnel::client::{Client, Fetch, ProduceMessage};
use runnel::codec::{GroupSettings, Start, TopicSettings};

use crate::latency::now_ns;
use crate::tracker::{self, Seen};
use crate::workload::{Ctx, RunResult};

/// W8: consumers of the group, and most messages per FETCH.
pub const W8_CONSUMERS: usize = 4;
const W8_FETCH_MAX: u32 = 64;
/// W9: stage-one workers, and most messages per FETCH (and so per
/// forwarded batch).
pub const W9_WORKERS: usize = 2;
const W9_FETCH_MAX: u32 = 64;
/// Message size of W8 and W9.
const SIZE: usize = 128;
/// Prefill: messages per PRODUCE.
const FILL_BATCH: usize = 1000;
/// Long-poll wait of the consumers, ms.
const WAIT_MS: u32 = 100;
/// A drain stops after this many times W4's run time (20 s in a full
/// run) even if the backlog is not through (the row says so): W8 with one
/// key drains some 12,000 messages a second.
const DEADLINE_W4_TIMES: u32 = 10;
/// The group W8's consumers share.
const W8_GROUP: &str = "o";

fn connect(addr: SocketAddr) -> Result<Client, String> {
    let c = Client::connect(addr).map_err(|e| format!("runnel at {addr}: {e}"))?;
    if c.version < runnel::codec::V4 {
        return Err(format!("runnel at {addr} speaks protocol version {}: no ordered groups", c.version));
    }
    Ok(c)
}

/// The key of the message with sequence number `seq`, of `keys` keys.
fn key_of(seq: u64, keys: u32) -> String {
    format!("k{}", seq % u64::from(keys))
}

/// Produces `n` stamped messages to `topic` in batches (keyed by
/// `key_of` if `keys` > 0) and returns their sequence numbers' count.
fn fill(addr: SocketAddr, topic: &str, n: u64, keys: u32) -> Result<u64, String> {
    let mut c = connect(addr)?;
    let mut payloads: Vec<Vec<u8>> = Vec::with_capacity(FILL_BATCH);
    let mut next = 0u64;
    while next < n {
        payloads.clear();
        let upto = (next + FILL_BATCH as u64).min(n);
        for i in next..upto {
            let mut p = vec![b'x'; SIZE];
            tracker::stamp(&mut p, tracker::seq(0, i), now_ns());
            payloads.push(p);
        }
        let keys_text: Vec<String> =
            (next..upto).map(|i| if keys > 0 { key_of(i, keys) } else { String::new() }).collect();
        let msgs: Vec<ProduceMessage<'_>> = payloads
            .iter()
            .zip(&keys_text)
            .map(|(p, k)| if k.is_empty() { ProduceMessage::new(p) } else { ProduceMessage::new(p).key(k.as_bytes()) })
            .collect();
        c.produce_messages(topic, &msgs).map_err(|e| format!("runnel PRODUCE to {topic}: {e}"))?;
        next = upto;
    }
    Ok(n)
}

/// What a draining consumer brings back: each delivery's sequence number
/// and the time it arrived (`now_ns`).
#[derive(Default)]
struct Drained {
    got: Vec<(u64, u64)>,
}

/// Fetches from `group` of `topic` and acknowledges, until `total` (shared
/// by the consumers) reaches `want` or `deadline` passes.
fn drain_group(
    mut c: Client,
    topic: &str,
    group: &str,
    total: &AtomicU64,
    want: u64,
    deadline: Instant,
) -> Result<Drained, String> {
    let mut out = Drained::default();
    let f = Fetch { max_messages: W8_FETCH_MAX, wait_ms: WAIT_MS, ..Fetch::default() };
    while total.load(Ordering::Acquire) < want && Instant::now() < deadline {
        let batch = c.fetch_group(topic, group, f).map_err(|e| format!("runnel FETCH {topic}/{group}: {e}"))?;
        let now = now_ns();
        for m in &batch {
            if let Some((seq, _)) = tracker::read(&m.payload) {
                out.got.push((seq, now));
            }
        }
        let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
        if !ids.is_empty() {
            let r = c.ack_group(topic, group, &ids).map_err(|e| format!("runnel ACK {topic}/{group}: {e}"))?;
            if !r.failed.is_empty() {
                return Err(format!("runnel ACK {topic}/{group}: {} ids not in flight", r.failed.len()));
            }
            total.fetch_add(ids.len() as u64, Ordering::AcqRel);
        }
    }
    Ok(out)
}

/// Keys whose deliveries, ordered by arrival time, are not in produce
/// (sequence) order.
fn keys_out_of_order(got: &[(u64, u64)], keys: u32) -> u64 {
    let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for &(seq, at) in got {
        by_key.entry(seq % u64::from(keys)).or_default().push((at, seq));
    }
    let mut bad = 0;
    for v in by_key.values_mut() {
        v.sort_unstable();
        if v.windows(2).any(|w| w[0].1 > w[1].1) {
            bad += 1;
        }
    }
    bad
}

/// W8: drains a backlog of `msgs` messages with `W8_CONSUMERS` consumers
/// of one group, ordered by key over `keys` keys (0: an unordered group,
/// unkeyed messages).
pub fn w8(ctx: &Ctx<'_>, keys: u32, msgs: u64) -> Result<RunResult, String> {
    let addr = ctx.target.addr;
    let topic = format!("w8-{keys}");
    let mut admin = connect(addr)?;
    admin.create_topic(&topic, TopicSettings::default()).map_err(|e| format!("runnel CREATE_TOPIC: {e}"))?;
    let settings = GroupSettings { ordered: keys > 0, ..GroupSettings::default() };
    admin.create_group(&topic, W8_GROUP, settings, Start::Earliest).map_err(|e| format!("runnel CREATE_GROUP: {e}"))?;
    fill(addr, &topic, msgs, keys)?;
    let total = Arc::new(AtomicU64::new(0));
    let clients: Vec<Client> = (0..W8_CONSUMERS).map(|_| connect(addr)).collect::<Result<_, _>>()?;
    let cpu = ctx.server.cpu_seconds().ok();
    let t0 = Instant::now();
    let deadline = t0 + ctx.scale.w4_time * DEADLINE_W4_TIMES;
    let mut handles = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (total, topic) = (total.clone(), topic.clone());
        let h = thread::Builder::new()
            .name(format!("w8-c{i}"))
            .spawn(move || drain_group(c, &topic, W8_GROUP, &total, msgs, deadline))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        handles.push(h);
    }
    let mut got = Vec::new();
    for h in handles {
        got.append(&mut h.join().map_err(|_| "a W8 consumer panicked".to_string())??.got);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let mut r = RunResult::new(ctx, SIZE, "");
    finish_row(ctx, &mut r, &got, seconds, cpu);
    if keys > 0 {
        let bad = keys_out_of_order(&got, keys);
        r.extra.push(("keys_out_of_order".into(), bad as f64));
        r.notes.push(if bad == 0 {
            "every key's messages arrived in produce order".into()
        } else {
            format!("{bad} keys' messages arrived out of produce order")
        });
    }
    if got.len() as u64 >= msgs {
        verify_all(&mut r, &got, msgs);
    } else {
        r.notes.push(format!("cut at {:.0} s: {} of {msgs} delivered", seconds, got.len()));
    }
    admin.delete_topic(&topic).map_err(|e| format!("runnel DELETE_TOPIC: {e}"))?;
    Ok(r)
}

/// The row's rate and CPU from what was delivered in `seconds`.
fn finish_row(ctx: &Ctx<'_>, r: &mut RunResult, got: &[(u64, u64)], seconds: f64, cpu_start: Option<f64>) {
    r.seconds = seconds;
    r.messages = got.len() as u64;
    r.cpu_seconds = cpu_start.and_then(|s| Some(ctx.server.cpu_seconds().ok()? - s));
}

/// Checks that every one of the backlog's `msgs` messages came.
fn verify_all(r: &mut RunResult, got: &[(u64, u64)], msgs: u64) {
    let mut seen = Seen::new(&[msgs]);
    got.iter().for_each(|&(seq, _)| seen.add(seq));
    r.verify = Some(seen.verify());
}

/// One stage-one worker of W9: fetches from `w9-in` and forwards each
/// batch to `w9-out`, atomically (ACK_PRODUCE) or as PRODUCE then ACK,
/// until `forwarded` reaches `want` or `deadline` passes.
fn forward(mut c: Client, atomic: bool, forwarded: &AtomicU64, want: u64, deadline: Instant) -> Result<(), String> {
    let f = Fetch { max_messages: W9_FETCH_MAX, wait_ms: WAIT_MS, ..Fetch::default() };
    while forwarded.load(Ordering::Acquire) < want && Instant::now() < deadline {
        let batch = c.fetch(W9_IN, f).map_err(|e| format!("runnel FETCH {W9_IN}: {e}"))?;
        if batch.is_empty() {
            continue;
        }
        let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
        let out: Vec<ProduceMessage<'_>> = batch.iter().map(|m| ProduceMessage::new(&m.payload)).collect();
        if atomic {
            let r =
                c.ack_produce((W9_IN, ""), &ids, &[(W9_OUT, &out)]).map_err(|e| format!("runnel ACK_PRODUCE: {e}"))?;
            if !r.failed.is_empty() {
                return Err(format!("runnel ACK_PRODUCE: {} ids not in flight", r.failed.len()));
            }
        } else {
            c.produce_messages(W9_OUT, &out).map_err(|e| format!("runnel PRODUCE to {W9_OUT}: {e}"))?;
            let r = c.ack(W9_IN, &ids).map_err(|e| format!("runnel ACK {W9_IN}: {e}"))?;
            if !r.failed.is_empty() {
                return Err(format!("runnel ACK {W9_IN}: {} ids not in flight", r.failed.len()));
            }
        }
        forwarded.fetch_add(ids.len() as u64, Ordering::AcqRel);
    }
    Ok(())
}

const W9_IN: &str = "w9-in";
const W9_OUT: &str = "w9-out";

/// W9: a backlog of `msgs` messages through two stages, the first
/// forwarding with ACK_PRODUCE (`atomic`) or PRODUCE + ACK.
pub fn w9(ctx: &Ctx<'_>, atomic: bool, msgs: u64) -> Result<RunResult, String> {
    let addr = ctx.target.addr;
    fill(addr, W9_IN, msgs, 0)?;
    let forwarded = Arc::new(AtomicU64::new(0));
    let stage2_total = Arc::new(AtomicU64::new(0));
    let workers: Vec<Client> = (0..W9_WORKERS).map(|_| connect(addr)).collect::<Result<_, _>>()?;
    let stage2 = connect(addr)?;
    let cpu = ctx.server.cpu_seconds().ok();
    let t0 = Instant::now();
    let deadline = t0 + ctx.scale.w4_time * DEADLINE_W4_TIMES;
    let mut handles = Vec::new();
    for (i, c) in workers.into_iter().enumerate() {
        let fw = forwarded.clone();
        let h = thread::Builder::new()
            .name(format!("w9-s1-{i}"))
            .spawn(move || forward(c, atomic, &fw, msgs, deadline))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        handles.push(h);
    }
    let total = stage2_total.clone();
    let last = thread::Builder::new()
        .name("w9-s2".into())
        .spawn(move || drain_group(stage2, W9_OUT, "", &total, msgs, deadline))
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    for h in handles {
        h.join().map_err(|_| "a W9 worker panicked".to_string())??;
    }
    let got = last.join().map_err(|_| "the W9 stage-two consumer panicked".to_string())??.got;
    let seconds = t0.elapsed().as_secs_f64();
    let mut r = RunResult::new(ctx, SIZE, "");
    finish_row(ctx, &mut r, &got, seconds, cpu);
    if got.len() as u64 >= msgs {
        verify_all(&mut r, &got, msgs);
    } else {
        r.notes.push(format!("cut at {:.0} s: {} of {msgs} through both stages", seconds, got.len()));
    }
    let mut admin = connect(addr)?;
    for t in [W9_IN, W9_OUT] {
        admin.delete_topic(t).map_err(|e| format!("runnel DELETE_TOPIC {t}: {e}"))?;
    }
    Ok(r)
}
