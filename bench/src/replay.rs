//! W10, replay from the log files (runnel only): a topic retaining what
//! its groups are done with (`retention_bytes`), filled with
//! `Scale::r1_log_bytes` of 16 KiB messages that its group acknowledges as
//! they come, the page cache dropped; then W3 at 1k msgs/s on another
//! topic while a new group of the retaining topic replays it from the
//! earliest message the files hold. What the row shows is the W3 pair's
//! latency during the replay, the loop's turn times over the same window
//! (from runnel's `/metrics` histogram, as bucket bounds), and how fast the
//! replay read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use runnel::client::{Client, Fetch};
use runnel::codec::{GroupSettings, Start, TopicOptions, TopicSettings};

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
const HISTOGRAM: &str = "runnel_loop_turn_duration_seconds_bucket{le=\"";

/// The port runnel serves `/metrics` on in W10 (`metrics_args` picks a
/// free one when the server's arguments are made).
static METRICS_PORT: AtomicU16 = AtomicU16::new(0);

/// The flags W10 starts runnel with: `/metrics` on a free local port.
pub fn metrics_args() -> Vec<String> {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port());
    METRICS_PORT.store(port, Ordering::Relaxed);
    vec!["--metrics".into(), format!("127.0.0.1:{port}")]
}

fn connect(addr: SocketAddr) -> Result<Client, String> {
    let c = Client::connect(addr).map_err(|e| format!("runnel at {addr}: {e}"))?;
    if c.version < runnel::codec::V4 {
        return Err(format!("runnel at {addr} speaks protocol version {}: no retention", c.version));
    }
    Ok(c)
}

/// The cumulative counts of the turn-time histogram, by upper bound (s).
fn turn_histogram() -> Result<Vec<(f64, u64)>, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], METRICS_PORT.load(Ordering::Relaxed)));
    let mut s = TcpStream::connect(addr).map_err(|e| format!("runnel /metrics at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| format!("/metrics: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: runnel\r\n\r\n").map_err(|e| format!("/metrics: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| format!("/metrics: {e}"))?;
    let mut out = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix(HISTOGRAM)) {
        let Some((le, count)) = line.split_once("\"} ") else { continue };
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| format!("/metrics: {le:?}"))? };
        out.push((bound, count.trim().parse().map_err(|_| format!("/metrics: {count:?}"))?));
    }
    if out.is_empty() {
        return Err("runnel /metrics has no turn-time histogram".into());
    }
    Ok(out)
}

/// From two readings of the histogram: the turns between them, and the
/// upper bounds of the buckets holding their p99 and their longest.
fn turns_between(before: &[(f64, u64)], after: &[(f64, u64)]) -> (u64, f64, f64) {
    let counts: Vec<(f64, u64)> = after.iter().zip(before).map(|(a, b)| (a.0, a.1.saturating_sub(b.1))).collect();
    let total = counts.last().map_or(0, |c| c.1);
    let p99_at = total - total / 100;
    let p99 = counts.iter().find(|c| c.1 >= p99_at.max(1)).map_or(0.0, |c| c.0);
    let max = counts.iter().find(|c| c.1 >= total).map_or(0.0, |c| c.0);
    (total, p99, max)
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
            before = turn_histogram()?;
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
    let (turns, p99_s, max_s) = turns_between(&before, &turn_histogram()?);
    let replayed = got.load(Ordering::Relaxed);
    r.extra.push(("replayed_msgs".into(), replayed as f64));
    r.extra.push(("replay_mb_per_s".into(), replayed as f64 * SIZE as f64 / 1e6 / window));
    r.extra.push(("turn_p99_bucket_s".into(), p99_s));
    r.extra.push(("turn_max_bucket_s".into(), max_s));
    r.notes.push(format!(
        "replay of a {} MiB retained topic (cache dropped): {replayed} of {filled} messages of 16 KiB in the {window:.1} s window, {:.0} MB/s; {turns} loop turns, p99 ≤ {} and longest ≤ {} (turn-time histogram buckets)",
        ctx.scale.r1_log_bytes >> 20,
        replayed as f64 * SIZE as f64 / 1e6 / window,
        seconds_label(p99_s),
        seconds_label(max_s),
    ));
    Ok(r)
}

fn seconds_label(s: f64) -> String {
    if s.is_infinite() {
        "+Inf".into()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_percentiles_come_from_the_bucket_differences() {
        let before = [(0.0001, 10), (0.001, 20), (0.01, 20), (f64::INFINITY, 20)];
        // 200 turns between the readings: 198 under 100 µs, 1 under 1 ms,
        // 1 under 10 ms.
        let after = [(0.0001, 208), (0.001, 219), (0.01, 220), (f64::INFINITY, 220)];
        let (turns, p99, max) = turns_between(&before, &after);
        assert_eq!(turns, 200);
        assert_eq!(p99, 0.0001);
        assert_eq!(max, 0.01);
    }
}
