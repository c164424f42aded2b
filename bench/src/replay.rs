//! W10, replay from the log files (runnel only): a topic retaining what
//! its groups are done with (`retention_bytes`), filled with
//! `Scale::r1_log_bytes` of 16 KiB messages that its group acknowledges as
//! they come, the page cache dropped; then W3 at 1k msgs/s on another
//! topic while a new group of the retaining topic replays it from the
//! earliest message the files hold. What the row shows is the W3 pair's
//! latency during the replay, the loop's turn times over the same window
//! (from runnel's `/metrics` histogram, as bucket bounds), and how fast the
//! replay read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use runnel::client::{Client, Fetch};
use runnel::codec::{GroupSettings, Start, TopicOptions, TopicSettings};

use crate::metrics;
use crate::workload::{Ctx, RunResult};

/// Message size of the replayed topic.
const SIZE: usize = 16 << 10;
/// Messages per PRODUCE while filling (1 MiB), and bytes produced between
/// drains of the filling group (its backlog stays under the topic limits).
const FILL_BATCH: usize = 64;
const FILL_DRAIN_BYTES: u64 = 64 << 20;
/// The retaining topic, its filling group and its replaying group.
const TOPIC: &str = "w10";
const FILLER: &str = "g0";
const REPLAYER: &str = "replay";
/// The W3 pair's rate beside the replay, msgs/s.
pub const W10_RATE: u64 = 1_000;

fn connect(addr: SocketAddr) -> Result<Client, String> {
    let c = Client::connect(addr).map_err(|e| format!("runnel at {addr}: {e}"))?;
    if c.version < runnel::codec::V4 {
        return Err(format!("runnel at {addr} speaks protocol version {}: no retention", c.version));
    }
    Ok(c)
}

/// Fills the retaining topic with `bytes` of messages, its group `g0`
/// acknowledging them as they come.
fn fill(addr: SocketAddr, bytes: u64) -> Result<u64, String> {
    let mut c = connect(addr)?;
    let options = TopicOptions { retention_bytes: Some(bytes * 2), ..TopicOptions::default() };
    c.create_topic_with(TOPIC, TopicSettings::default(), options).map_err(|e| format!("CREATE_TOPIC: {e}"))?;
    c.create_group(TOPIC, FILLER, GroupSettings::default(), Start::Earliest)
        .map_err(|e| format!("CREATE_GROUP: {e}"))?;
    let payloads = vec![vec![b'r'; SIZE]; FILL_BATCH];
    let (mut produced, mut since_drain) = (0u64, 0u64);
    while produced * (SIZE as u64) < bytes {
        c.produce_batch(TOPIC, &payloads).map_err(|e| format!("PRODUCE: {e}"))?;
        produced += FILL_BATCH as u64;
        since_drain += (FILL_BATCH * SIZE) as u64;
        if since_drain >= FILL_DRAIN_BYTES || produced * (SIZE as u64) >= bytes {
            drain(&mut c, FILLER, None, &AtomicBool::new(false))?;
            since_drain = 0;
        }
    }
    Ok(produced)
}

/// Fetches and acknowledges `group`'s messages until none is left (or
/// `stop`); counts them into `got`.
fn drain(c: &mut Client, group: &str, got: Option<&AtomicU64>, stop: &AtomicBool) -> Result<(), String> {
    let f = Fetch { max_messages: 256, wait_ms: 100, ..Fetch::default() };
    let mut empty = 0;
    while !stop.load(Ordering::Acquire) && empty < 20 {
        let batch = c.fetch_group(TOPIC, group, f).map_err(|e| format!("FETCH {TOPIC}/{group}: {e}"))?;
        if batch.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
        c.ack_group(TOPIC, group, &ids).map_err(|e| format!("ACK {TOPIC}/{group}: {e}"))?;
        if let Some(g) = got {
            g.fetch_add(ids.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A hook told when the W3 pair starts sending (true) and stops (false).
pub type Hook<'a> = &'a mut dyn FnMut(bool) -> Result<(), String>;

/// W10: the W3 row at `W10_RATE` while a new group replays the filled
/// topic from its start; `w3` runs the pair and calls `at` when sending
/// starts and ends.
pub fn w10(ctx: &Ctx<'_>, w3: &dyn Fn(Hook<'_>) -> Result<RunResult, String>) -> Result<RunResult, String> {
    let addr = ctx.target.addr;
    let filled = fill(addr, ctx.scale.r1_log_bytes)?;
    crate::workload::drop_cache_under(&ctx.server.dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let mut replayer: Option<thread::JoinHandle<Result<(), String>>> = None;
    let (mut before, mut started) = (Vec::new(), Instant::now());
    let mut r = w3(&mut |starting| {
        if starting {
            before = metrics::histogram(metrics::TURNS)?;
            started = Instant::now();
            let mut c = connect(addr)?;
            c.create_group(TOPIC, REPLAYER, GroupSettings::default(), Start::Earliest)
                .map_err(|e| format!("CREATE_GROUP {REPLAYER}: {e}"))?;
            let (stop, got) = (stop.clone(), got.clone());
            let h = thread::Builder::new()
                .name("w10-replay".into())
                .spawn(move || drain(&mut c, REPLAYER, Some(&got), &stop))
                .map_err(|e| format!("cannot start a thread: {e}"))?;
            replayer = Some(h);
        } else {
            stop.store(true, Ordering::Release);
        }
        Ok(())
    })?;
    let window = started.elapsed().as_secs_f64();
    if let Some(h) = replayer {
        h.join().map_err(|_| "the W10 replay thread panicked".to_string())??;
    }
    let turns = metrics::between(&before, &metrics::histogram(metrics::TURNS)?);
    let (p99_s, max_s) = (turns.p99_s, turns.max_s);
    let turns = turns.count;
    let replayed = got.load(Ordering::Relaxed);
    r.extra.push(("replayed_msgs".into(), replayed as f64));
    r.extra.push(("replay_mb_per_s".into(), replayed as f64 * SIZE as f64 / 1e6 / window));
    r.extra.push(("turn_p99_bucket_s".into(), p99_s));
    r.extra.push(("turn_max_bucket_s".into(), max_s));
    r.notes.push(format!(
        "replay of a {} MiB retained topic (cache dropped): {replayed} of {filled} messages of 16 KiB in the {window:.1} s window, {:.0} MB/s; {turns} loop turns, p99 ≤ {} and longest ≤ {} (turn-time histogram buckets)",
        ctx.scale.r1_log_bytes >> 20,
        replayed as f64 * SIZE as f64 / 1e6 / window,
        metrics::seconds_label(p99_s),
        metrics::seconds_label(max_s),
    ));
    Ok(r)
}
