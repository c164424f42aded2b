//! Crash tests (issue 3): the real `runnel serve` binary as a child process,
//! killed with SIGKILL at random moments and restarted on the same data
//! directory, as beanstalkd's tests kill their server to test binlog replay.
//!
//! A SIGKILL ends the process, not the machine: what the broker had
//! `write`n survives in the page cache, synced or not. So these tests check
//! the broker's order of operations and its replay (an acknowledged produce
//! was written before its reply; recovery rebuilds every topic, ack and id
//! sequence; a torn tail is cut), not that `fdatasync` reached the disk.
//!
//! Kills land at random moments, and every third round one is aimed at a
//! large write in progress, so that some restarts must cut a torn tail
//! (SIGKILL can stop a write between pages); the run prints how many did.
//!
//! A second test runs three consumer groups with different filters on one
//! topic through the kills: each group is owed, after every restart, what
//! it has not acked, and never gets back what it acked.
//!
//! Seeds: `RUNNEL_SEED` replays a run's choices (the thread interleaving
//! and the moments the kills land cannot be replayed); every assertion
//! prints the seed. `RUNNEL_CRASH_ROUNDS` sets the number of kills.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Rng, TempDir};
use runnel::client::{self, Client, Fetch, OwnedReply};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, Ids, Request};

/// Kills per run unless `RUNNEL_CRASH_ROUNDS` says otherwise.
const CRASH_ROUNDS_DEFAULT: u64 = 30;
/// Small segments, so the log rolls many times during a run.
const SEGMENT_BYTES_MAX: &str = "65536";
/// High enough that no message is dead-lettered however often it is left
/// unacked: every message stays in its topic, where the final drain finds it.
const MAX_DELIVERIES: &str = "60000";
/// The topics the crash test uses.
const TOPICS: [&str; 3] = ["crash-a", "crash-b", "crash-c"];
/// How long a client waits for a reply before giving up on the broker.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a broker may take to start accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The broker as a child process.
// ---------------------------------------------------------------------------

/// A `runnel serve` child process.
struct Proc {
    child: Child,
    addr: SocketAddr,
    /// Where its stderr goes (a file, so a chatty broker never blocks on a
    /// full pipe).
    stderr: PathBuf,
}

/// A port nobody listens on right now (it may be taken again before the
/// broker binds it; `spawn_broker` then retries).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

fn read_stderr(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Starts `runnel serve` on `data` with a fresh port, without waiting for
/// it to accept. `logs` holds the stderr files; `tag` names this one.
fn spawn_only(data: &Path, logs: &Path, tag: &str, port: u16) -> Proc {
    spawn_only_with(data, logs, tag, port, &[])
}

/// `spawn_only` with more `runnel serve` arguments (later ones win).
fn spawn_only_with(data: &Path, logs: &Path, tag: &str, port: u16, extra: &[&str]) -> Proc {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let stderr = logs.join(format!("{tag}.stderr"));
    let file = File::create(&stderr).expect("stderr file");
    let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .arg("serve")
        .args(["--listen", &addr.to_string()])
        .arg("--data")
        .arg(data)
        .args(["--segment-bytes-max", SEGMENT_BYTES_MAX, "--max-deliveries", MAX_DELIVERIES])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("spawn runnel serve");
    Proc { child, addr, stderr }
}

/// Starts `runnel serve` on `data` and waits until it says it listens and
/// answers a PING. Retries with another port if the chosen one was taken
/// meanwhile.
fn spawn_broker(data: &Path, logs: &Path, tag: &str, seed: u64) -> Proc {
    spawn_broker_with(data, logs, tag, seed, &[])
}

/// `spawn_broker` with more `runnel serve` arguments (later ones win).
fn spawn_broker_with(data: &Path, logs: &Path, tag: &str, seed: u64, extra: &[&str]) -> Proc {
    for attempt in 0..20 {
        if let Some(p) = start_on(data, logs, (&format!("{tag}-{attempt}"), seed), free_port(), extra) {
            return p;
        }
    }
    panic!("seed {seed}: no free port for broker {tag} after 20 tries");
}

/// Starts `runnel serve` on `port` and waits until it says it listens there
/// and answers a PING; None if the port was taken.
fn start_on(data: &Path, logs: &Path, (tag, seed): (&str, u64), port: u16, extra: &[&str]) -> Option<Proc> {
    let mut p = spawn_only_with(data, logs, tag, port, extra);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = p.child.try_wait().expect("try_wait") {
            let err = read_stderr(&p.stderr);
            if err.contains("cannot listen") {
                return None; // the port was taken: try another
            }
            panic!("seed {seed}: broker {tag} exited with {status} while starting:\n{err}");
        }
        // Another broker may hold the port (taken after `free_port` let it
        // go): it would answer the ping, and the test would then talk to it.
        // Only the child's own word that it listens there makes the answer
        // its own.
        if read_stderr(&p.stderr).contains(&format!("runnel serving on {}", p.addr))
            && let Ok(mut c) = Client::connect(p.addr)
            && c.ping().is_ok()
        {
            return Some(p);
        }
        if Instant::now() > deadline {
            let _ = p.child.kill();
            let _ = p.child.wait();
            panic!("seed {seed}: broker {tag} did not accept within {START_TIMEOUT:?}:\n{}", read_stderr(&p.stderr));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// A port another broker holds is not taken for the spawned one's, though
/// that broker answers the ping: else a crash test would check another
/// broker's queues (an ACK_PRODUCE round then looked acked with no output).
#[test]
fn a_broker_that_could_not_listen_is_not_taken_for_the_one_on_its_port() {
    let (other, _other_dir) = common::Server::start(runnel::broker::Config::default());
    let data = TempDir::new("taken-data");
    let logs = TempDir::new("taken-logs");
    let p = start_on(data.path(), logs.path(), ("taken", 0), other.addr.port(), &[]);
    assert!(p.is_none(), "the spawned broker could not listen on {}, yet was taken as started", other.addr);
    other.stop();
}

impl Proc {
    /// SIGKILL (what `Child::kill` sends on Unix), then reap: once `wait`
    /// returns, the process and its lock on the data directory are gone.
    /// An error if the broker had already exited by itself (with its exit
    /// status and stderr).
    fn kill(mut self) -> Result<(), String> {
        let before = self.child.try_wait().expect("try_wait");
        let _ = self.child.kill();
        self.child.wait().expect("wait for killed broker");
        match before {
            None => Ok(()),
            Some(status) => Err(format!("exited by itself with {status}:\n{}", read_stderr(&self.stderr))),
        }
    }
}

/// A broker a test did not kill (its last round, or a failed assertion)
/// is killed when its handle goes, so no test leaves a broker running.
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `RUNNEL_CRASH_ROUNDS`, or `default`.
fn crash_rounds(default: u64) -> u64 {
    std::env::var("RUNNEL_CRASH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn client(addr: SocketAddr) -> client::Result<Client> {
    let mut c = Client::connect(addr)?;
    c.set_timeout(Some(REPLY_TIMEOUT))?;
    Ok(c)
}

// ---------------------------------------------------------------------------
// Payloads that check themselves.
// ---------------------------------------------------------------------------

/// FNV-1a: seeds a payload's filler from its name.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

/// The payload of the message named `name`: the name, `|`, then filler
/// whose length and bytes follow from the name (0..1500 bytes; 16..64 KiB
/// for names starting `big`). A payload can be checked for damage from
/// itself, and the test keeps only names.
fn payload(name: &str) -> Vec<u8> {
    let mut r = Rng(fnv(name.as_bytes()));
    let len = if name.starts_with("big") { (16 << 10) + r.below(48 << 10) } else { r.below(1500) } as usize;
    let mut p = Vec::with_capacity(name.len() + 1 + len);
    p.extend_from_slice(name.as_bytes());
    p.push(b'|');
    p.extend((0..len).map(|_| b'a' + r.below(26) as u8));
    p
}

/// The name in a payload, if the payload is intact.
fn name_of(p: &[u8]) -> Option<String> {
    let bar = p.iter().position(|&b| b == b'|')?;
    let name = std::str::from_utf8(&p[..bar]).ok()?;
    (payload(name) == p).then(|| name.to_string())
}

// ---------------------------------------------------------------------------
// What the clients saw.
// ---------------------------------------------------------------------------

/// A message delivered to a consumer.
#[derive(Clone, Debug)]
struct Delivery {
    topic: usize,
    id: u64,
    /// The payload's name; None if the payload arrived damaged.
    name: Option<String>,
    /// The broker incarnation (round) that delivered it.
    round: u64,
}

/// Everything one client thread saw in one round.
#[derive(Default)]
struct Journal {
    /// Every payload name sent in a PRODUCE, with its topic.
    sent: Vec<(String, usize)>,
    /// Acknowledged produces: topic, id, name.
    produced: Vec<(usize, u64, String)>,
    /// Produces sent whose reply never came: unknown, maybe durable.
    unknown_produces: u64,
    deliveries: Vec<Delivery>,
    /// (topic, id) of every ACK sent, whether or not a reply came.
    ack_sent: Vec<(usize, u64)>,
    /// ACKs whose reply came and said the ack took effect: topic, id.
    acked: Vec<(usize, u64)>,
}

/// What the test knows at the end of a run.
#[derive(Default)]
struct Record {
    /// Every name sent, and its topic.
    sent: HashMap<String, usize>,
    /// Acknowledged produces: (topic, id) -> name.
    produced: HashMap<(usize, u64), String>,
    unknown_produces: u64,
    deliveries: Vec<Delivery>,
    ack_sent: HashSet<(usize, u64)>,
    /// Answered acks, durable against a SIGKILL: (topic, id) -> the round
    /// they were made in.
    durable_acks: HashMap<(usize, u64), u64>,
    acks_total: u64,
    violations: Vec<String>,
    violations_total: u64,
}

impl Record {
    fn violation(&mut self, v: String) {
        self.violations_total += 1;
        if self.violations.len() < 50 {
            self.violations.push(v);
        }
    }

    /// Adds one round's journals.
    fn merge(&mut self, round: u64, journals: Vec<Journal>) {
        // Every answered ACK is durable against a SIGKILL: the broker sends
        // no reply before the `write` of the records it depends on, and a
        // written record outlives the process in the page cache
        // (src/reactor.rs, "The order of a turn").
        for j in journals {
            for (name, topic) in j.sent {
                if self.sent.insert(name.clone(), topic).is_some() {
                    self.violation(format!("test bug: payload name {name} sent twice"));
                }
            }
            for (topic, id, name) in j.produced {
                if let Some(other) = self.produced.insert((topic, id), name.clone())
                    && other != name
                {
                    self.violation(format!(
                        "id {id} of {} given to two acknowledged produces: {other} and {name} (round {round})",
                        TOPICS[topic]
                    ));
                }
            }
            self.unknown_produces += j.unknown_produces;
            self.deliveries.extend(j.deliveries);
            self.ack_sent.extend(j.ack_sent);
            for (topic, id) in j.acked {
                self.acks_total += 1;
                self.durable_acks.entry((topic, id)).or_insert(round);
            }
        }
    }

    /// The end-of-run checks; adds every violation found.
    fn check(&mut self, final_round: u64) {
        let mut by_key: HashMap<(usize, u64), &str> = HashMap::new();
        let mut by_name: HashMap<&str, (usize, u64)> = HashMap::new();
        let mut delivered: HashSet<(usize, u64)> = HashSet::new();
        let mut drained: HashSet<(usize, u64)> = HashSet::new();
        let mut found = Vec::new();
        for d in &self.deliveries {
            let key = (d.topic, d.id);
            let t = TOPICS[d.topic];
            delivered.insert(key);
            if d.round == final_round {
                drained.insert(key);
            }
            let Some(name) = d.name.as_deref() else {
                found.push(format!("{t}/{} delivered with a damaged payload in round {}", d.id, d.round));
                continue;
            };
            // Never invented: every payload delivered was sent, to this topic.
            match self.sent.get(name) {
                Some(&topic) if topic == d.topic => {}
                Some(&topic) => found.push(format!("{name} sent to {} delivered from {t}", TOPICS[topic])),
                None => found.push(format!("{t}/{} delivered a payload {name} that was never sent", d.id)),
            }
            // Payload intact and matched by id.
            if let Some(want) = self.produced.get(&key)
                && want != name
            {
                found.push(format!(
                    "{t}/{} was acknowledged for {want} but delivered {name} in round {}",
                    d.id, d.round
                ));
            }
            // (3) Ids never repeat: one id, one message, across restarts
            // (this also covers produces that were durable but unanswered).
            if let Some(other) = by_key.insert(key, name)
                && other != name
            {
                found.push(format!("{t}/{} delivered as two messages: {other} and {name}", d.id));
            }
            if let Some(other) = by_name.insert(name, key)
                && other != key
            {
                found.push(format!("{name} stored twice: as {}/{} and as {t}/{}", TOPICS[other.0], other.1, d.id));
            }
            // (2) No message whose ACK was answered comes back after a restart.
            if let Some(&acked_round) = self.durable_acks.get(&key)
                && d.round > acked_round
            {
                found
                    .push(format!("{t}/{} ({name}) acked in round {acked_round} came back in round {}", d.id, d.round));
            }
        }
        for (key, name) in &self.produced {
            let t = TOPICS[key.0];
            // (1) Every acknowledged produce was delivered at least once.
            if !delivered.contains(key) {
                found.push(format!("{t}/{} ({name}) was acknowledged and never delivered", key.1));
            } else if !self.ack_sent.contains(key) && !drained.contains(key) {
                // And what no consumer ever tried to ack is still there.
                found.push(format!("{t}/{} ({name}) was never acked, yet missing after the final restart", key.1));
            }
        }
        for f in found {
            self.violation(f);
        }
    }
}

// ---------------------------------------------------------------------------
// The client threads.
// ---------------------------------------------------------------------------

/// Shared by the client threads of one round.
#[derive(Default)]
struct Shared {
    /// Messages acknowledged to producers minus messages delivered to
    /// consumers this round: producers pause while it is over
    /// `BACKLOG_MAX`, so memory and disk stay bounded however many rounds.
    backlog: AtomicI64,
}

/// Backlog (see `Shared::backlog`) past which producers pause.
const BACKLOG_MAX: i64 = 2000;
/// Longest a producer pauses for the backlog before producing anyway (a
/// producer must keep finding out that its broker died).
const BACKLOG_PAUSE_MAX: Duration = Duration::from_millis(50);

/// Produces until the broker goes away: single batches and pipelines of
/// several PRODUCEs, to random topics.
fn producer(addr: SocketAddr, round: u64, worker: u64, seed: u64, shared: Arc<Shared>) -> Journal {
    let mut j = Journal::default();
    let mut rng = Rng(seed ^ (round << 32) ^ (worker << 16) ^ 0x9e0d);
    let Ok(mut c) = client(addr) else { return j };
    let mut seq = 0u64;
    let mut batch = |rng: &mut Rng, j: &mut Journal| {
        let topic = rng.below(TOPICS.len() as u64) as usize;
        let count = 1 + rng.below(8);
        let names: Vec<String> = (0..count)
            .map(|_| {
                seq += 1;
                format!("r{round}-p{worker}-{seq}")
            })
            .collect();
        j.sent.extend(names.iter().map(|n| (n.clone(), topic)));
        (topic, names)
    };
    loop {
        let paused = Instant::now();
        while shared.backlog.load(Ordering::SeqCst) > BACKLOG_MAX && paused.elapsed() < BACKLOG_PAUSE_MAX {
            thread::sleep(Duration::from_millis(1));
        }
        let depth = if rng.below(2) == 0 { 1 } else { 2 + rng.below(5) };
        let mut pending = Vec::new();
        for _ in 0..depth {
            let (topic, names) = batch(&mut rng, &mut j);
            let payloads: Vec<Vec<u8>> = names.iter().map(|n| payload(n)).collect();
            c.send_produce(TOPICS[topic], &payloads);
            pending.push((topic, names));
        }
        let mut dead = c.flush().is_err();
        for (topic, names) in pending {
            if dead {
                j.unknown_produces += names.len() as u64;
                continue;
            }
            match c.recv() {
                Ok(OwnedReply::Produced { first_id, count }) => {
                    assert_eq!(count as usize, names.len(), "seed {seed}: produce reply count");
                    shared.backlog.fetch_add(i64::from(count), Ordering::SeqCst);
                    for (i, n) in names.into_iter().enumerate() {
                        j.produced.push((topic, first_id + i as u64, n));
                    }
                }
                Ok(other) => panic!("seed {seed}: unexpected reply to PRODUCE: {other:?}"),
                Err(client::Error::Io(_)) => {
                    // The broker died: this produce and the rest are unknown.
                    dead = true;
                    j.unknown_produces += names.len() as u64;
                }
                Err(e) => panic!("seed {seed}: PRODUCE failed other than by a lost connection: {e}"),
            }
        }
        if dead {
            return j;
        }
    }
}

/// Fetches with short ack timeouts until the broker goes away. Of what it
/// gets, it acks most at once, leaves some unacked (to time out and be
/// redelivered, or be in flight at the kill), and acks some one fetch later
/// (perhaps after their deadline).
fn consumer(addr: SocketAddr, round: u64, worker: u64, seed: u64, shared: Arc<Shared>) -> Journal {
    let mut j = Journal::default();
    let mut rng = Rng(seed ^ (round << 32) ^ (worker << 16) ^ 0xc0c0);
    let Ok(mut c) = client(addr) else { return j };
    let mut later: Vec<(usize, u64)> = Vec::new();
    loop {
        let topic = rng.below(TOPICS.len() as u64) as usize;
        let f = Fetch {
            max_messages: 1 + rng.below(64) as u32,
            max_bytes: 0,
            wait_ms: 20,
            ack_timeout_ms: 50 + rng.below(250) as u32,
        };
        let msgs = match c.fetch(TOPICS[topic], f) {
            Ok(m) => m,
            Err(client::Error::Io(_)) => return j,
            Err(e) => panic!("seed {seed}: FETCH failed other than by a lost connection: {e}"),
        };
        shared.backlog.fetch_sub(msgs.len() as i64, Ordering::SeqCst);
        let mut now: Vec<(usize, u64)> = std::mem::take(&mut later);
        for m in msgs {
            j.deliveries.push(Delivery { topic, id: m.id, name: name_of(&m.payload), round });
            match rng.below(20) {
                0..=11 => now.push((topic, m.id)),
                12..=16 => {}
                _ => later.push((topic, m.id)),
            }
        }
        for (t, name) in TOPICS.iter().enumerate() {
            let ids: Vec<u64> = now.iter().filter(|a| a.0 == t).map(|a| a.1).collect();
            if ids.is_empty() {
                continue;
            }
            j.ack_sent.extend(ids.iter().map(|&id| (t, id)));
            match c.ack(name, &ids) {
                Ok(r) => j.acked.extend(ids.iter().filter(|id| !r.failed.contains(id)).map(|&id| (t, id))),
                Err(client::Error::Io(_)) => return j,
                Err(e) => panic!("seed {seed}: ACK failed other than by a lost connection: {e}"),
            }
        }
    }
}

/// Every message of every topic, fetched once without acking.
fn drain(addr: SocketAddr, round: u64, seed: u64) -> Vec<Delivery> {
    let mut c = client(addr).unwrap_or_else(|e| panic!("seed {seed}: connect for the drain: {e}"));
    let topics = c.list_topics().unwrap_or_else(|e| panic!("seed {seed}: list topics: {e}"));
    for (name, _) in &topics {
        assert!(TOPICS.contains(&name.as_str()), "seed {seed}: unexpected topic {name} (a dead-letter topic?)");
    }
    let mut out = Vec::new();
    for (topic, name) in TOPICS.iter().enumerate() {
        if !topics.iter().any(|t| t.0 == *name) {
            continue;
        }
        loop {
            let f = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
            let msgs = c.fetch(name, f).unwrap_or_else(|e| panic!("seed {seed}: drain fetch {name}: {e}"));
            if msgs.is_empty() {
                break;
            }
            out.extend(msgs.into_iter().map(|m| Delivery { topic, id: m.id, name: name_of(&m.payload), round }));
        }
    }
    out
}

/// Segments at least this large hold a turn of a `big_produce` (other
/// turns are far smaller, and segments roll at `SEGMENT_BYTES_MAX`).
const BIG_SEGMENT_BYTES_MIN: u64 = 256 << 10;

/// Sends one PRODUCE of about 4 MiB from another thread, without waiting
/// for its reply, and kills the broker as soon as the write of that turn is
/// seen under way (a segment file newly past `BIG_SEGMENT_BYTES_MIN`).
/// Copying megabytes into the page cache takes long enough that the kill
/// often lands mid-write, and SIGKILL can stop a write between pages: a
/// torn tail for the next start to cut. The produce is unknown (maybe
/// durable, never acknowledged).
fn kill_mid_write(p: Proc, data: &Path, round: u64, rng: &mut Rng, rec: &mut Record) -> Result<(), String> {
    let big_before: HashSet<u64> = segments_at_least(data, BIG_SEGMENT_BYTES_MIN);
    let topic = rng.below(TOPICS.len() as u64) as usize;
    let names: Vec<String> = (0..96).map(|i| format!("big-r{round}-{i}")).collect();
    let payloads: Vec<Vec<u8>> = names.iter().map(|n| payload(n)).collect();
    rec.unknown_produces += names.len() as u64;
    rec.sent.extend(names.into_iter().map(|n| (n, topic)));
    let addr = p.addr;
    // The thread keeps its connection open until the kill: a close could
    // make the broker drop a half-read request.
    let sender = thread::spawn(move || {
        let mut c = client(addr).ok()?;
        c.send_produce(TOPICS[topic], &payloads);
        c.flush().ok()?;
        Some(c)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && segments_at_least(data, BIG_SEGMENT_BYTES_MIN).is_subset(&big_before) {
        thread::yield_now();
    }
    let status = p.kill();
    let _ = sender.join();
    status
}

/// Bases of the segments holding at least `bytes`.
fn segments_at_least(dir: &Path, bytes: u64) -> HashSet<u64> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let base = e.file_name().to_str()?.strip_suffix(".log")?.parse().ok()?;
            (e.metadata().ok()?.len() >= bytes).then_some(base)
        })
        .collect()
}

fn segment_bases(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .expect("read data dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

/// Producers and consumers against a broker killed with SIGKILL at random
/// moments and restarted on the same directory; at the end, after a final
/// restart, everything is drained and checked:
/// 1. every acknowledged produce was delivered at least once, payload intact
///    (and one never acked by anyone is still there at the end);
/// 2. no message whose ACK was answered comes back after a restart;
/// 3. ids never repeat: one (topic, id), one message, across restarts.
#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let seed = common::seed(0xc2a5_4001);
    sigkill_rounds(seed, crash_rounds(CRASH_ROUNDS_DEFAULT), &[]);
}

/// The same with `--fsync never`, whose segments are written through a
/// shared mapping, not `pwrite` (`MappedFile`): what was copied into the
/// mapping before a reply went out must survive the process's SIGKILL, as
/// a written page does. Fewer rounds: the rounds above test the recovery
/// they share.
#[test]
fn sigkill_with_fsync_never_loses_nothing_acknowledged() {
    let seed = common::seed(0xc2a5_4002);
    sigkill_rounds(seed, crash_rounds(CRASH_ROUNDS_DEFAULT / 2), &["--fsync", "never"]);
}

/// Rounds of producers and consumers, each ended by a SIGKILL of a broker
/// started with `extra`, then a final drain and the checks of `Record`.
fn sigkill_rounds(seed: u64, rounds: u64, extra: &[&str]) {
    println!("seed {seed}, {rounds} rounds, serve {extra:?}");
    let mut rng = Rng(seed);
    let data = TempDir::new("crash-data");
    let logs = TempDir::new("crash-logs");
    let mut rec = Record::default();
    let mut max_base = 0;
    for round in 0..rounds {
        // Sometimes kill it while it is still recovering.
        if rng.below(8) == 0 {
            let p = spawn_only_with(data.path(), logs.path(), &format!("round{round}-early"), free_port(), extra);
            thread::sleep(Duration::from_millis(rng.below(20)));
            // It may have exited by itself only if its port was taken.
            if let Err(e) = p.kill() {
                assert!(e.contains("cannot listen"), "seed {seed}: round {round}: the broker {e}");
            }
            continue;
        }
        let p = spawn_broker_with(data.path(), logs.path(), &format!("round{round}"), seed, extra);
        let addr = p.addr;
        let shared = Arc::new(Shared::default());
        let mut workers = Vec::new();
        for w in 0..2 {
            let shared = shared.clone();
            workers.push(thread::spawn(move || producer(addr, round, w, seed, shared)));
        }
        for w in 2..4 {
            let shared = shared.clone();
            workers.push(thread::spawn(move || consumer(addr, round, w, seed, shared)));
        }
        thread::sleep(Duration::from_millis(20 + rng.below(600)));
        // A kill at a random moment rarely lands inside a write; every
        // third round aims one there.
        let killed =
            if rng.below(3) == 0 { kill_mid_write(p, data.path(), round, &mut rng, &mut rec) } else { p.kill() };
        if let Err(e) = killed {
            panic!("seed {seed}: round {round}: the broker {e}");
        }
        let journals: Vec<Journal> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| panic!("seed {seed}: round {round}: a client thread panicked")))
            .collect();
        rec.merge(round, journals);
        max_base = max_base.max(segment_bases(data.path()).last().copied().unwrap_or(0));
    }
    let p = spawn_broker_with(data.path(), logs.path(), "final", seed, extra);
    rec.deliveries.extend(drain(p.addr, rounds, seed));
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the final broker {e}"));
    rec.check(rounds);
    let torn = std::fs::read_dir(logs.path())
        .expect("read logs")
        .filter(|e| e.as_ref().is_ok_and(|e| read_stderr(&e.path()).contains("torn tail")))
        .count();
    let log_bytes: u64 = std::fs::read_dir(data.path())
        .expect("read data dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "seed {seed}: {} produces acknowledged, {} unknown, {} deliveries, {} acks answered ({} messages), {torn} starts cut a torn tail, last segment base {max_base}, {log_bytes} log bytes at the end",
        rec.produced.len(),
        rec.unknown_produces,
        rec.deliveries.len(),
        rec.acks_total,
        rec.durable_acks.len()
    );
    assert!(
        rec.violations.is_empty(),
        "seed {seed}: {} violations (the first {} below; broker logs in {}):\n{}",
        rec.violations_total,
        rec.violations.len(),
        logs.path().display(),
        rec.violations.join("\n")
    );
    // The run must have tested something.
    assert!(rec.produced.len() > 100, "seed {seed}: only {} produces acknowledged", rec.produced.len());
    assert!(!rec.durable_acks.is_empty(), "seed {seed}: no ACK was answered");
    assert!(max_base > 0, "seed {seed}: the log never rolled to a second segment");
}

/// A restart after a run replays messages in the order they were produced:
/// 1000 messages in batches, a kill (every acknowledged produce is durable,
/// so a kill is as good as a clean stop), a restart, a fetch of everything.
#[test]
fn restart_replays_in_produce_order() {
    let seed = common::seed(0xc2a5_4002);
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let data = TempDir::new("order-data");
    let logs = TempDir::new("order-logs");
    let p = spawn_broker(data.path(), logs.path(), "first", seed);
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let mut want: Vec<(u64, Vec<u8>)> = Vec::new();
    while want.len() < 1000 {
        let count = (1 + rng.below(60) as usize).min(1000 - want.len());
        let payloads: Vec<Vec<u8>> = (want.len()..want.len() + count).map(|i| payload(&format!("order-{i}"))).collect();
        let (first, n) = c.produce_batch("order", &payloads).unwrap_or_else(|e| panic!("seed {seed}: produce: {e}"));
        assert_eq!(n as usize, count, "seed {seed}");
        if let Some(last) = want.last() {
            assert!(first > last.0, "seed {seed}: ids must grow in produce order");
        }
        want.extend(payloads.into_iter().enumerate().map(|(i, p)| (first + i as u64, p)));
    }
    drop(c);
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the first broker {e}"));
    let p = spawn_broker(data.path(), logs.path(), "second", seed);
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    loop {
        let f = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
        let msgs = c.fetch("order", f).unwrap_or_else(|e| panic!("seed {seed}: fetch: {e}"));
        if msgs.is_empty() {
            break;
        }
        got.extend(msgs.into_iter().map(|m| (m.id, m.payload)));
    }
    drop(c);
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the second broker {e}"));
    assert_eq!(got.len(), want.len(), "seed {seed}: message count after restart");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "seed {seed}: message {i} after restart has id {}, produced as {}", g.0, w.0);
        assert!(g.1 == w.1, "seed {seed}: message {i} (id {}) came back with a different payload", g.0);
    }
}

/// A second broker on a data directory in use fails to start, saying the
/// directory is locked; the first keeps serving.
#[test]
fn second_broker_on_the_same_directory_is_refused() {
    let seed = common::seed(0xc2a5_4003);
    let data = TempDir::new("lock-data");
    let logs = TempDir::new("lock-logs");
    let first = spawn_broker(data.path(), logs.path(), "first", seed);
    let mut c = client(first.addr).expect("connect");
    c.produce("t", b"before").expect("produce");
    let first = assert_second_refused(first, data.path(), logs.path(), "second");
    // The first is undisturbed.
    c.produce("t", b"after").expect("the first broker must keep serving");
    drop(c);
    first.kill().expect("the first broker must still be running");
}

/// Starts a second broker on `data`, which `first` holds, and asserts that
/// it exits at once saying the directory is locked and naming it. Returns
/// `first`, killed if the assertion fails.
fn assert_second_refused(first: Proc, data: &Path, logs: &Path, tag: &str) -> Proc {
    let mut second = spawn_only(data, logs, tag, free_port());
    let deadline = Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(s) = second.child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let out = read_stderr(&second.stderr);
            let _ = second.kill();
            let _ = first.kill();
            panic!("the second broker on a locked directory is still running:\n{out}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let err = read_stderr(&second.stderr);
    let dir = data.display().to_string();
    if status.success() || !err.contains("locked") || !err.contains(&dir) {
        let _ = first.kill();
        panic!("the second broker must fail saying {dir} is locked; it exited with {status}:\n{err}");
    }
    first
}

/// The lock is on the data directory itself: deleting its `LOCK` file while
/// a broker runs (a cleanup script, an operator) does not let a second
/// broker start on it. Two brokers appending to one log lose acknowledged
/// messages. And the lock goes with the process: once the first is killed,
/// a broker starts.
#[test]
fn deleting_the_lock_file_does_not_let_a_second_broker_start() {
    let seed = common::seed(0xc2a5_4004);
    let data = TempDir::new("lock-deleted-data");
    let logs = TempDir::new("lock-deleted-logs");
    let first = spawn_broker(data.path(), logs.path(), "first", seed);
    let mut c = client(first.addr).expect("connect");
    c.produce("t", b"before").expect("produce");
    std::fs::remove_file(data.path().join("LOCK")).expect("delete LOCK");
    let first = assert_second_refused(first, data.path(), logs.path(), "second");
    c.produce("t", b"after").expect("the first broker must keep serving");
    drop(c);
    first.kill().expect("the first broker must still be running");
    let again = spawn_broker(data.path(), logs.path(), "after-kill", seed);
    let mut c = client(again.addr).expect("connect");
    let got = c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).expect("fetch");
    assert_eq!(got.iter().map(|m| m.payload.as_slice()).collect::<Vec<_>>(), [b"before".as_slice(), b"after"]);
    drop(c);
    again.kill().expect("the broker after the kill must be running");
}

/// SIGTERM: a graceful stop; waits for the exit and asserts it was clean.
fn stop_gracefully(mut p: Proc) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
    let status = p.child.wait().expect("wait for the broker");
    assert!(status.success(), "a graceful stop exits 0, got {status}:\n{}", read_stderr(&p.stderr));
}

/// A graceful stop marks the log clean, so that damage found after it is
/// corruption. The mark must go with the next run's first append: when that
/// run is killed mid-write, the next start must read the end of the log as
/// a crash leaves it (a torn write, cut with a warning), not refuse it as
/// damage after a clean stop.
#[test]
fn a_run_killed_after_a_clean_restart_is_read_as_a_crash() {
    let seed = common::seed(0xc2a5_4005);
    let data = TempDir::new("marker-data");
    let logs = TempDir::new("marker-logs");
    let marker = data.path().join(runnel::log::CLEAN_STOP_FILE);
    let p = spawn_broker(data.path(), logs.path(), "first", seed);
    client(p.addr).expect("connect").produce("t", b"one").expect("produce");
    stop_gracefully(p);
    assert!(marker.exists(), "a graceful stop marks the log clean");
    let p = spawn_broker(data.path(), logs.path(), "second", seed);
    let mut c = client(p.addr).expect("connect");
    c.produce("t", &[b'x'; 4000]).expect("produce");
    drop(c);
    p.kill().expect("the second broker must be running");
    assert!(!marker.exists(), "the second run appended: its kill must not pass for a clean stop");
    // Tear its last record as a kill in the middle of its write would.
    let last = data.path().join(format!("{:020}.log", segment_bases(data.path()).last().expect("a segment")));
    let r = *common::logdir::records(&std::fs::read(&last).expect("read")).last().expect("a record");
    std::fs::OpenOptions::new().write(true).open(&last).and_then(|f| f.set_len(r.start + 100)).expect("truncate");
    let p = spawn_broker(data.path(), logs.path(), "third", seed);
    let mut c = client(p.addr).expect("connect");
    let got = c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).expect("fetch");
    assert_eq!(got.iter().map(|m| m.payload.as_slice()).collect::<Vec<_>>(), [b"one".as_slice()], "the prefix");
    drop(c);
    p.kill().expect("the third broker must be running");
    let err = std::fs::read_dir(logs.path())
        .expect("read logs")
        .filter_map(|e| Some(read_stderr(&e.ok()?.path())))
        .find(|e| e.contains("torn tail"));
    assert!(err.is_some(), "the third start cut a torn tail (broker logs in {})", logs.path().display());
}

/// Rounds of `an_answered_ack_survives_sigkill` unless `RUNNEL_CRASH_ROUNDS`
/// says otherwise. A round costs a few tens of ms. Measured on a broker that
/// flushed ack replies before the turn's write: 97 to 100 rounds of 100
/// undid their ACK, so 20 rounds fail it every time.
const ACK_ROUNDS_DEFAULT: u64 = 20;
/// Segments of this size make every round's PRODUCE roll the log to a new
/// segment, and a roll syncs the old segment and the directory before the
/// turn's write: that widens the window between an early reply and the
/// write from microseconds to milliseconds.
const ACK_SEGMENT_BYTES_MAX: &str = "16384";
/// The PRODUCE sent behind the ACK: over a segment (so it rolls), and small
/// enough to arrive whole with the ACK, in one read and so one turn (a
/// frame of a few hundred KiB reaches the broker over several turns).
const ACK_BULK_BYTES: usize = 64 << 10;

/// An answered ACK is never undone by a process crash. Each round acks one
/// message and, in the same write, produces a batch to another topic, so
/// that both are served in one turn that will `fdatasync`; the broker is
/// SIGKILLed the moment the ACK's reply is read, and restarted. The acked
/// message must not come back.
#[test]
fn an_answered_ack_survives_sigkill() {
    let seed = common::seed(0xc2a5_4004);
    let rounds = crash_rounds(ACK_ROUNDS_DEFAULT);
    println!("seed {seed}, {rounds} rounds");
    let mut rng = Rng(seed);
    let data = TempDir::new("ack-data");
    let logs = TempDir::new("ack-logs");
    let args = ["--segment-bytes-max", ACK_SEGMENT_BYTES_MAX];
    let mut p = spawn_broker_with(data.path(), logs.path(), "round0", seed, &args);
    let hold = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    let mut undone = Vec::new();
    for round in 0..rounds {
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        let victim = c.produce("acked", format!("victim-{round}").as_bytes()).expect("produce the victim");
        let got: Vec<u64> = c.fetch("acked", hold).expect("fetch the victim").iter().map(|m| m.id).collect();
        assert_eq!(got, vec![victim], "seed {seed}: round {round}: the victim is the only message");
        let mut ids = Vec::new();
        codec::encode_ids(&mut ids, &[victim]);
        c.send(&Request::Ack { topic: "acked", group: "", ids: Ids { bytes: &ids } });
        c.send_produce("bulk", &[rng.bytes(ACK_BULK_BYTES)]);
        c.flush().unwrap_or_else(|e| panic!("seed {seed}: round {round}: send the ACK and the PRODUCE: {e}"));
        match c.recv() {
            Ok(OwnedReply::Ids(r)) => assert_eq!((r.done, r.failed.len()), (1, 0), "seed {seed}: round {round}"),
            other => panic!("seed {seed}: round {round}: ACK reply {other:?}"),
        }
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: round {round}: the broker {e}"));
        p = spawn_broker_with(data.path(), logs.path(), &format!("round{}", round + 1), seed, &args);
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        let back: Vec<u64> = c.fetch("acked", hold).expect("fetch after the restart").iter().map(|m| m.id).collect();
        if !back.is_empty() {
            // Acked again, so that later rounds see only their own victim.
            c.ack("acked", &back).unwrap_or_else(|e| panic!("seed {seed}: round {round}: ack again: {e}"));
            undone.push((round, back));
        }
    }
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
    println!("seed {seed}: {} of {rounds} rounds undid an answered ACK", undone.len());
    assert!(undone.is_empty(), "seed {seed}: acked messages came back after a SIGKILL (round, ids): {undone:?}");
}

// ---------------------------------------------------------------------------
// Consumer groups under SIGKILL.
// ---------------------------------------------------------------------------

/// The groups of the group crash test and their tag filters: two that read
/// every message (one acks all it gets, one a third), and one whose filter
/// passes only tagged messages (the test's messages have none).
const GROUPS: [(&str, &str); 3] = [("g-all", ""), ("g-some", ""), ("g-red", "red || blue")];
/// The topic of the group crash test.
const GROUP_TOPIC: &str = "crash-groups";

/// What the group crash test knows: acknowledged produces, and for each
/// group the acks answered (with their round), the acks sent without an
/// answer (they may or may not have taken effect), and the messages it
/// dead-lettered: a message that a group fetched and left unacked
/// `max_deliveries` times (deliveries cut by a kill count too) goes to
/// the `.dlq`, which ends it for that group as an ack does.
#[derive(Default)]
struct GroupRecord {
    produced: HashSet<u64>,
    acked: [HashMap<u64, u64>; 3],
    maybe_acked: [HashSet<u64>; 3],
    dead: [HashSet<u64>; 3],
}

impl GroupRecord {
    /// Checks what group `g` was delivered in `round`: never a message it
    /// acked (answered) earlier; after a restart (`complete`), every
    /// acknowledged produce it still owes.
    fn check(&self, g: usize, round: u64, got: &[u64], complete: bool, seed: u64) {
        let (name, filter) = GROUPS[g];
        for id in got {
            if let Some(r) = self.acked[g].get(id) {
                panic!("seed {seed}: {name} got {id} again in round {round}, acked in round {r}");
            }
        }
        if !filter.is_empty() {
            assert!(got.is_empty(), "seed {seed}: {name}'s filter passes no untagged message, got {got:?}");
            return;
        }
        if complete {
            let got: HashSet<u64> = got.iter().copied().collect();
            for id in &self.produced {
                let done =
                    self.acked[g].contains_key(id) || self.maybe_acked[g].contains(id) || self.dead[g].contains(id);
                let lost = !done && !got.contains(id);
                assert!(!lost, "seed {seed}: {name} lost {id} (acknowledged, not acked) in round {round}");
            }
        }
    }

    /// Acks `ids` for group `g`, noting what the answer says.
    fn ack(&mut self, c: &mut Client, g: usize, ids: &[u64], round: u64) -> bool {
        if ids.is_empty() {
            return true;
        }
        match c.ack_group(GROUP_TOPIC, GROUPS[g].0, ids) {
            Ok(r) => {
                for id in ids.iter().filter(|id| !r.failed.contains(id)) {
                    self.acked[g].entry(*id).or_insert(round);
                }
                true
            }
            Err(_) => {
                self.maybe_acked[g].extend(ids);
                false
            }
        }
    }
}

/// Takes every dead letter the groups made out of the topic's `.dlq`,
/// noting each for the group that dead-lettered it.
fn take_dead_letters(c: &mut Client, rec: &mut GroupRecord, seed: u64) {
    let dlq = format!("{GROUP_TOPIC}.dlq");
    let f = Fetch { max_messages: 100_000, wait_ms: 0, ack_timeout_ms: 600_000, ..Fetch::default() };
    let dead = c.fetch(&dlq, f).unwrap_or_else(|e| panic!("seed {seed}: fetch the dead letters: {e}"));
    for m in &dead {
        let info = m.dead.unwrap_or_else(|| panic!("seed {seed}: a message of {dlq} without its dead-letter fields"));
        let g = GROUPS.iter().position(|(name, _)| *name == m.origin_group);
        let g = g.unwrap_or_else(|| panic!("seed {seed}: a dead letter of group {:?}", m.origin_group));
        rec.dead[g].insert(info.origin_id);
    }
    let ids: Vec<u64> = dead.iter().map(|m| m.id).collect();
    if !ids.is_empty() {
        c.ack(&dlq, &ids).unwrap_or_else(|e| panic!("seed {seed}: ack the dead letters: {e}"));
    }
}

/// Everything group `g` has ready, fetched with a long ack timeout.
fn fetch_group_all(c: &mut Client, g: usize) -> client::Result<Vec<u64>> {
    let f = Fetch { max_messages: 100_000, wait_ms: 0, ack_timeout_ms: 600_000, ..Fetch::default() };
    Ok(c.fetch_group(GROUP_TOPIC, GROUPS[g].0, f)?.into_iter().map(|m| m.id).collect())
}

/// One round's traffic until the broker dies: produces, and each group
/// fetching with short deadlines and acking what it chooses to.
fn group_traffic(c: &mut Client, rec: &mut GroupRecord, rng: &mut Rng, round: u64, seed: u64) {
    for step in 0u64.. {
        let n = 1 + rng.below(20) as usize;
        let batch: Vec<Vec<u8>> = (0..n).map(|i| format!("r{round}-s{step}-{i}").into_bytes()).collect();
        match c.produce_batch(GROUP_TOPIC, &batch) {
            Ok((first, n)) => rec.produced.extend(first..first + u64::from(n)),
            Err(_) => return,
        }
        for (g, (name, _)) in GROUPS.iter().enumerate() {
            let f = Fetch { max_messages: 1 + rng.below(30) as u32, ack_timeout_ms: 50, ..Fetch::default() };
            let Ok(got) = c.fetch_group(GROUP_TOPIC, name, f) else { return };
            let ids: Vec<u64> = got.into_iter().map(|m| m.id).collect();
            rec.check(g, round, &ids, false, seed);
            let keep = if g == 0 { 100 } else { 33 };
            let to_ack: Vec<u64> = ids.into_iter().filter(|_| rng.percent(keep)).collect();
            if !rec.ack(c, g, &to_ack, round) {
                return;
            }
        }
    }
}

/// Three groups with different filters on one topic, the broker killed with
/// SIGKILL at random moments: after every restart, each group is owed every
/// acknowledged produce it has not acked, and no group gets again a message
/// whose ACK was answered (written before its answer, so durable against a
/// kill of the process).
#[test]
fn three_groups_survive_sigkill() {
    let seed = common::seed(7);
    let rounds = crash_rounds(12);
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("crash-groups");
    let logs = TempDir::new("crash-groups-logs");
    let data = dir.path().join("data");
    let mut rec = GroupRecord::default();
    for round in 0..=rounds {
        let p = spawn_broker(&data, logs.path(), &format!("groups-{round}"), seed);
        let mut c = client(p.addr).expect("connect");
        if round == 0 {
            for (name, filter) in GROUPS {
                let settings = GroupSettings { filter, ..GroupSettings::default() };
                c.create_group(GROUP_TOPIC, name, settings, Start::Earliest).expect("create group");
            }
        }
        take_dead_letters(&mut c, &mut rec, seed);
        for g in 0..GROUPS.len() {
            let got = fetch_group_all(&mut c, g).expect("drain a group after a restart");
            rec.check(g, round, &got, true, seed);
            let take = if g == 0 { 100 } else { 33 };
            let to_ack: Vec<u64> = got.into_iter().filter(|_| rng.percent(take)).collect();
            assert!(rec.ack(&mut c, g, &to_ack, round), "seed {seed}: ack after a restart");
        }
        if round == rounds {
            break;
        }
        let delay = Duration::from_millis(rng.below(40));
        let killer = thread::spawn(move || {
            thread::sleep(delay);
            p.kill()
        });
        group_traffic(&mut c, &mut rec, &mut rng, round, seed);
        drop(c);
        let killed = killer.join().expect("killer thread");
        assert!(killed.is_ok(), "seed {seed}: round {round}: the broker {}", killed.err().unwrap_or_default());
    }
    let acked: Vec<usize> = rec.acked.iter().map(HashMap::len).collect();
    eprintln!("seed {seed}: {} produced, acks answered per group {acked:?}", rec.produced.len());
}

/// A produce acknowledged once written (`PRODUCE_FLAG_WRITTEN`, version
/// 3) survives a SIGKILL, as docs/protocol.md says it does: its reply
/// leaves after the `write`, so the page cache holds it whatever the
/// process does next. The broker is killed the moment the last reply is
/// read, and every acknowledged message must be there after the restart.
#[test]
fn a_written_produce_survives_sigkill() {
    let seed = common::seed(0xc2a5_4014);
    println!("seed {seed}");
    let data = TempDir::new("written-data");
    let logs = TempDir::new("written-logs");
    let mut acked = Vec::new();
    let mut p = spawn_broker(data.path(), logs.path(), "round0", seed);
    for round in 0..5 {
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        c.set_produce_flags(codec::PRODUCE_FLAG_WRITTEN).expect("a version-3 broker");
        for i in 0..20 {
            let id = c.produce("written", format!("r{round}-{i}").as_bytes()).expect("produce");
            acked.push(id);
        }
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: round {round}: the broker {e}"));
        p = spawn_broker(data.path(), logs.path(), &format!("round{}", round + 1), seed);
    }
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let hold = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    let got: Vec<u64> = c.fetch("written", hold).expect("fetch").iter().map(|m| m.id).collect();
    assert_eq!(got, acked, "seed {seed}: every acknowledged written produce, in order");
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
}

// ---------------------------------------------------------------------------
// Scheduled messages through SIGKILL.
// ---------------------------------------------------------------------------

const SCHEDULE_TOPIC: &str = "crash-sched";

fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What the scheduled-messages crash test knows.
#[derive(Default)]
struct Scheduled {
    /// Each acknowledged produce's message: its id and delivery time.
    due: HashMap<u64, u64>,
    /// Messages whose ACK was answered.
    acked: HashSet<u64>,
    /// Messages delivered at least once.
    delivered: HashSet<u64>,
}

impl Scheduled {
    /// Checks a delivery seen at `seen_ms` (the client's clock, the
    /// broker's too: one machine): never before its time, never after its
    /// ACK was answered.
    fn delivered(&mut self, id: u64, at: Option<u64>, seen_ms: u64, round: u64, seed: u64) {
        assert!(!self.acked.contains(&id), "seed {seed}: round {round}: message {id} came back after its ACK");
        if let Some(&due) = self.due.get(&id) {
            assert!(seen_ms >= due, "seed {seed}: round {round}: message {id} due at {due} came at {seen_ms}");
            // A time already past at the produce is stored as none, and a
            // copy compaction made once its time had come carries none.
            assert!(at.is_none_or(|at| at == due), "seed {seed}: round {round}: message {id} carries {at:?}");
        }
        self.delivered.insert(id);
    }

    /// Produces, fetches and acks until the broker is killed.
    fn traffic(&mut self, c: &mut Client, rng: &mut Rng, round: u64, seed: u64) {
        loop {
            let base = wall_ms();
            let dues: Vec<u64> = (0..rng.range(1u64, 20)).map(|_| base + rng.below(1500u64)).collect();
            let messages: Vec<client::ProduceMessage<'_>> =
                dues.iter().map(|&due| client::ProduceMessage::new(b"s").deliver_at(due)).collect();
            let Ok((first, _)) = c.produce_messages(SCHEDULE_TOPIC, &messages) else { return };
            for (i, due) in dues.into_iter().enumerate() {
                self.due.insert(first + i as u64, due);
            }
            let f = Fetch { max_messages: 50, wait_ms: 20, ..Fetch::default() };
            let Ok(got) = c.fetch(SCHEDULE_TOPIC, f) else { return };
            let seen = wall_ms();
            let ids: Vec<u64> = got.iter().map(|m| m.id).collect();
            for m in &got {
                self.delivered(m.id, m.deliver_at_ms(), seen, round, seed);
            }
            if !ids.is_empty() && rng.percent(80) {
                let Ok(r) = c.ack(SCHEDULE_TOPIC, &ids) else { return };
                assert_eq!(r.done as usize, ids.len(), "seed {seed}: round {round}: ack");
                self.acked.extend(ids);
            }
        }
    }
}

/// Inputs of one round of the ACK_PRODUCE crash test.
const ACK_PRODUCE_INPUTS: usize = 200;

/// A stream of ACK_PRODUCE frames, each acking one input of `in` and
/// producing one message to each of `a` and `b`, until the broker dies.
fn ack_produce_stream(addr: SocketAddr, topics: [String; 3]) {
    let Ok(mut c) = client(addr) else { return };
    let hold = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    let Ok(inputs) = c.fetch(&topics[0], hold) else { return };
    for m in inputs {
        let (a, b) = ([client::ProduceMessage::new(&m.payload)], [client::ProduceMessage::new(&m.payload)]);
        let outputs: [(&str, &[client::ProduceMessage<'_>]); 2] = [(&topics[1], &a), (&topics[2], &b)];
        if c.ack_produce((&topics[0], ""), &[m.id], &outputs).is_err() {
            return;
        }
    }
}

/// Scheduled messages through SIGKILL: each is delivered at or after its
/// time and never lost, and none comes back once its ACK was answered
/// (docs/protocol.md, "Scheduled messages (version 3)", Restarts).
#[test]
fn scheduled_messages_survive_sigkill() {
    let seed = common::seed(13);
    let rounds = crash_rounds(8);
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("crash-sched");
    let logs = TempDir::new("crash-sched-logs");
    let data = dir.path().join("data");
    let mut rec = Scheduled::default();
    for round in 0..=rounds {
        let p = spawn_broker(&data, logs.path(), &format!("sched-{round}"), seed);
        let mut c = client(p.addr).expect("connect");
        assert!(c.version >= 3, "seed {seed}: the broker speaks version 3 or later");
        if round == rounds {
            // Every time has come: each message not acked comes now.
            let last = rec.due.values().max().copied().unwrap_or(0);
            while wall_ms() <= last {
                thread::sleep(Duration::from_millis(10));
            }
            loop {
                let got = c.fetch(SCHEDULE_TOPIC, Fetch { max_messages: 500, wait_ms: 200, ..Fetch::default() });
                let got = got.expect("final drain");
                if got.is_empty() {
                    break;
                }
                let seen = wall_ms();
                let ids: Vec<u64> = got.iter().map(|m| m.id).collect();
                for m in &got {
                    rec.delivered(m.id, m.deliver_at_ms(), seen, round, seed);
                }
                c.ack(SCHEDULE_TOPIC, &ids).expect("final ack");
                rec.acked.extend(ids);
            }
            break;
        }
        let delay = Duration::from_millis(rng.below(600u64));
        let killer = thread::spawn(move || {
            thread::sleep(delay);
            p.kill()
        });
        rec.traffic(&mut c, &mut rng, round, seed);
        drop(c);
        let killed = killer.join().expect("killer thread");
        assert!(killed.is_ok(), "seed {seed}: round {round}: the broker {}", killed.err().unwrap_or_default());
    }
    let lost: Vec<u64> = rec.due.keys().filter(|id| !rec.delivered.contains(id)).copied().collect();
    assert!(lost.is_empty(), "seed {seed}: scheduled messages never delivered: {lost:?}");
    eprintln!("seed {seed}: {} scheduled messages, {} acked", rec.due.len(), rec.acked.len());
}

/// Every payload of `topic`, as held now (fetched with a long timeout).
fn all_payloads(c: &mut Client, topic: &str) -> Vec<Vec<u8>> {
    let hold = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    c.fetch(topic, hold).expect("fetch").into_iter().map(|m| m.payload).collect()
}

/// ACK_PRODUCE under SIGKILL: a broker killed at a random moment of a
/// stream of such frames, then restarted. Each input must be either still
/// owed, with none of its outputs, or acked, with each of its outputs
/// exactly once: the frame is one record, all of it or none.
#[test]
fn ack_produce_is_all_or_nothing_across_sigkill() {
    let seed = common::seed(0xc2a5_4015);
    let rounds = crash_rounds(10);
    println!("seed {seed}, {rounds} rounds");
    let mut rng = Rng(seed);
    let data = TempDir::new("ap-data");
    let logs = TempDir::new("ap-logs");
    let mut p = spawn_broker(data.path(), logs.path(), "round0", seed);
    let mut partial = 0;
    for round in 0..rounds {
        let topics = [format!("in-{round}"), format!("a-{round}"), format!("b-{round}")];
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        let inputs: Vec<Vec<u8>> = (0..ACK_PRODUCE_INPUTS).map(|i| format!("{round}-{i}").into_bytes()).collect();
        c.produce_batch(&topics[0], &inputs).expect("produce the inputs");
        let (addr, t) = (p.addr, topics.clone());
        let stream = thread::spawn(move || ack_produce_stream(addr, t));
        thread::sleep(Duration::from_micros(rng.below(20_000)));
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: round {round}: the broker {e}"));
        let _ = stream.join();
        p = spawn_broker(data.path(), logs.path(), &format!("round{}", round + 1), seed);
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        let owed: HashSet<Vec<u8>> = all_payloads(&mut c, &topics[0]).into_iter().collect();
        let (a, b) = (all_payloads(&mut c, &topics[1]), all_payloads(&mut c, &topics[2]));
        for input in &inputs {
            let (in_a, in_b) = (a.iter().filter(|x| *x == input).count(), b.iter().filter(|x| *x == input).count());
            let name = String::from_utf8_lossy(input);
            if owed.contains(input) {
                assert_eq!((in_a, in_b), (0, 0), "seed {seed}: round {round}: {name} is owed, yet has outputs");
            } else {
                assert_eq!((in_a, in_b), (1, 1), "seed {seed}: round {round}: {name} was acked: each output once");
            }
        }
        if !owed.is_empty() && owed.len() < inputs.len() {
            partial += 1;
        }
    }
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
    println!("seed {seed}: {partial} of {rounds} rounds were killed mid-stream");
}

// ---------------------------------------------------------------------------
// Deliveries counted across SIGKILL.
// ---------------------------------------------------------------------------

/// The ways a message reaches a consumer, each with its own place in the
/// loop's turn: a FETCH answered at once, a parked FETCH answered at the
/// publish, and a push at the publish.
const DELIVERY_WAYS: [&str; 3] = ["fetch", "long-poll", "push"];

/// Produces one message to `topic` and has it delivered the `way` given;
/// returns its id and delivery count as the consumer saw them. The
/// consumer connection is returned too, so that it is still open (its
/// message in flight) when the broker is killed.
fn deliver_one(addr: SocketAddr, topic: &str, way: &str, produce: bool, seed: u64) -> (Client, u64, u16) {
    let mut c = client(addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let mut p = client(addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let hold = Fetch { max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    let m = match way {
        "fetch" => {
            if produce {
                p.produce(topic, b"counted").expect("produce");
            }
            c.fetch(topic, hold).expect("fetch").pop().expect("a message")
        }
        "long-poll" => {
            let wait = Request::Fetch {
                topic,
                group: "",
                max_messages: 1,
                max_bytes: 0,
                wait_ms: 30_000,
                ack_timeout_ms: 600_000,
            };
            c.send(&wait);
            c.flush().expect("send the FETCH");
            common::wire::wait_until("the FETCH parks", || p.stat(topic, "waiters").ok().flatten() == Some(1));
            p.produce(topic, b"counted").expect("produce");
            match c.recv() {
                Ok(OwnedReply::Messages { mut messages, .. }) => messages.pop().expect("a message"),
                other => panic!("seed {seed}: the parked FETCH got {other:?}"),
            }
        }
        _ => {
            c.subscribe(topic, "", 1, 600_000).expect("subscribe");
            p.produce(topic, b"counted").expect("produce");
            c.next_pushed().expect("a pushed message").message
        }
    };
    (c, m.id, m.delivery_count)
}

/// A delivery the consumer has read is counted after a SIGKILL of the
/// broker, whichever way it went out: the message, never acked, comes back
/// with one more delivery each round. (The parked FETCH and the push are
/// answered after the turn's write, at the publish: their Deliver records
/// are written by a write of their own before the flush.)
#[test]
fn a_delivery_read_before_sigkill_is_counted_after_the_restart() {
    let seed = common::seed(0xde11_7e12);
    println!("seed {seed}");
    let data = TempDir::new("counted-data");
    let logs = TempDir::new("counted-logs");
    let mut p = spawn_broker(data.path(), logs.path(), "counted0", seed);
    let mut restarts = 0;
    for way in DELIVERY_WAYS {
        let topic = format!("counted-{way}");
        for round in 1..=3u16 {
            // The first round delivers a new message; later ones, the same
            // message back after the restart (fetched at once: a parked
            // FETCH or a subscription gets it as soon as it asks).
            let (c, id, count) = if round == 1 {
                deliver_one(p.addr, &topic, way, true, seed)
            } else {
                deliver_one(p.addr, &topic, "fetch", false, seed)
            };
            assert_eq!(count, round, "seed {seed}: {way}: message {id} in round {round}");
            p.kill().unwrap_or_else(|e| panic!("seed {seed}: {way}: the broker {e}"));
            drop(c);
            restarts += 1;
            p = spawn_broker(data.path(), logs.path(), &format!("counted{restarts}"), seed);
        }
    }
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
}

/// A message whose last allowed delivery was in flight when the broker was
/// killed is dead-lettered at the restart (as if its consumer was lost),
/// not delivered once more than `max_deliveries` allows.
#[test]
fn a_last_delivery_cut_by_sigkill_dead_letters_the_message() {
    let seed = common::seed(0xde11_7e13);
    println!("seed {seed}");
    let data = TempDir::new("exhausted-data");
    let logs = TempDir::new("exhausted-logs");
    let mut p = spawn_broker(data.path(), logs.path(), "exhausted0", seed);
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    let settings = codec::TopicSettings { ack_timeout_ms: 600_000, max_deliveries: 2 };
    c.create_topic("exhausted", settings).expect("create the topic");
    let id = c.produce("exhausted", b"twice at most").expect("produce");
    drop(c);
    let now = Fetch { max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    for round in 1..=2u16 {
        let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
        let got: Vec<(u64, u16)> =
            c.fetch("exhausted", now).expect("fetch").iter().map(|m| (m.id, m.delivery_count)).collect();
        assert_eq!(got, [(id, round)], "seed {seed}: round {round}");
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: the broker {e}"));
        p = spawn_broker(data.path(), logs.path(), &format!("exhausted{round}"), seed);
    }
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    assert!(c.fetch("exhausted", now).expect("fetch").is_empty(), "seed {seed}: delivered a third time");
    let dead = c.fetch("exhausted.dlq", now).expect("fetch the dead letter");
    let info = dead.first().and_then(|m| m.dead).unwrap_or_else(|| panic!("seed {seed}: no dead letter: {dead:?}"));
    assert_eq!(
        (info.origin_id, info.origin_deliveries, info.reason),
        (id, 2, codec::DeadReason::ConsumerLost),
        "seed {seed}"
    );
    // The move is in the log: a second restart keeps it.
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the broker {e}"));
    p = spawn_broker(data.path(), logs.path(), "exhausted3", seed);
    let mut c = client(p.addr).unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
    assert!(c.fetch("exhausted", now).expect("fetch").is_empty(), "seed {seed}: back after a second restart");
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
}

// ---------------------------------------------------------------------------
// Idempotent produce (protocol version 4): a window that survives SIGKILL.
// ---------------------------------------------------------------------------

const DEDUP_TOPIC: &str = "dedup";
/// Messages per batch of the dedup crash tests.
const DEDUP_BATCH: usize = 4;

/// Batch `b` of the dedup crash tests: (dedup id, payload) per message.
fn dedup_batch(b: usize) -> Vec<(String, String)> {
    (0..DEDUP_BATCH).map(|j| (format!("id-{b}-{j}"), format!("payload-{b}-{j}"))).collect()
}

/// Produces batch `b` with its dedup ids; each message's id.
fn produce_dedup_batch(c: &mut Client, b: usize) -> client::Result<Vec<u64>> {
    let batch = dedup_batch(b);
    let messages: Vec<client::ProduceMessage<'_>> =
        batch.iter().map(|(id, p)| client::ProduceMessage::new(p.as_bytes()).dedup_id(id.as_bytes())).collect();
    c.produce_messages_ids(DEDUP_TOPIC, &messages)
}

/// Every message of the dedup topic, fetched and acked: (payload, id).
fn drain_dedup(addr: SocketAddr) -> Vec<(String, u64)> {
    let mut c = client(addr).expect("connect to drain");
    let mut got = Vec::new();
    loop {
        let f = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
        let batch = c.fetch(DEDUP_TOPIC, f).expect("fetch");
        if batch.is_empty() {
            return got;
        }
        let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
        got.extend(batch.into_iter().map(|m| (String::from_utf8_lossy(&m.payload).into_owned(), m.id)));
        c.ack(DEDUP_TOPIC, &ids).expect("ack");
    }
}

/// Waits until the producer thread has had `n` batches acknowledged.
fn wait_for_batches(progress: &AtomicI64, n: i64, seed: u64) {
    let deadline = Instant::now() + REPLY_TIMEOUT;
    while progress.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "seed {seed}: the producer did not get {n} batches acknowledged");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Checks that the topic holds each message of `batches` batches exactly
/// once, with the ids the producer was told.
fn check_stored_once(got: &[(String, u64)], batches: usize, told: &HashMap<String, u64>, seed: u64) {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    for (payload, id) in got {
        assert!(seen.insert(payload, *id).is_none(), "seed {seed}: {payload} stored twice");
    }
    for b in 0..batches {
        for (_, payload) in dedup_batch(b) {
            let id = seen.get(payload.as_str()).unwrap_or_else(|| panic!("seed {seed}: {payload} lost"));
            if let Some(t) = told.get(&payload) {
                assert_eq!(id, t, "seed {seed}: {payload} stored with another id than its producer was told");
            }
        }
    }
    assert_eq!(got.len(), batches * DEDUP_BATCH, "seed {seed}");
}

/// Messages with dedup ids are produced while the broker is SIGKILLed at a
/// random moment; after the restart every batch is sent again, acknowledged
/// or not. Each message is stored exactly once, and the ones acknowledged
/// before the kill keep the ids they were acknowledged with.
#[test]
fn sigkill_then_resending_everything_stores_each_dedup_message_once() {
    let seed = common::seed(0xd3d0_0001);
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let batches = 300;
    // One round per data directory: its ids are remembered for its window.
    for round in 0..3 {
        let (data, logs) = (TempDir::new("dedup-crash-data"), TempDir::new("dedup-crash-logs"));
        let p = spawn_broker(data.path(), logs.path(), &format!("dedup-{round}"), seed);
        let addr = p.addr;
        let progress = Arc::new(AtomicI64::new(0));
        let done = Arc::clone(&progress);
        let producer = thread::spawn(move || {
            let mut told = HashMap::new();
            let Ok(mut c) = client(addr) else { return told };
            for b in 0..batches {
                let Ok(ids) = produce_dedup_batch(&mut c, b) else { break };
                told.extend(dedup_batch(b).into_iter().map(|(_, p)| p).zip(ids));
                done.fetch_add(1, Ordering::Relaxed);
            }
            told
        });
        // The kill comes after a random number of acknowledged batches,
        // while the next one is on its way.
        wait_for_batches(&progress, rng.range(1u64, batches as u64 - 1) as i64, seed);
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let told = producer.join().expect("producer thread");
        let p = spawn_broker(data.path(), logs.path(), &format!("dedup-{round}-again"), seed);
        let mut c = client(p.addr).expect("connect after restart");
        let mut resent = HashMap::new();
        for b in 0..batches {
            let ids = produce_dedup_batch(&mut c, b).unwrap_or_else(|e| panic!("seed {seed}: resend {b}: {e}"));
            resent.extend(dedup_batch(b).into_iter().map(|(_, p)| p).zip(ids));
        }
        for (payload, id) in &told {
            assert_eq!(resent.get(payload), Some(id), "seed {seed}: {payload} answered with another id");
        }
        let got = drain_dedup(p.addr);
        check_stored_once(&got, batches, &resent, seed);
        p.kill().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// `IdempotentProducer` keeps producing while its broker is SIGKILLed and
/// started again on the same address: it reconnects and resends, and every
/// message is stored exactly once, with the id it returned.
#[test]
fn the_idempotent_producer_stores_each_message_once_across_a_broker_restart() {
    use runnel::producer::{IdempotentProducer, ProduceOptions};
    let seed = common::seed(0xd3d0_0002);
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let (data, logs) = (TempDir::new("producer-crash-data"), TempDir::new("producer-crash-logs"));
    let p = spawn_broker(data.path(), logs.path(), "producer-0", seed);
    let addr = p.addr;
    let batches = 300;
    let options = ProduceOptions { retries_max: 200, retry_backoff_ms: 10 };
    let mut producer = IdempotentProducer::connect(addr, b"", options).expect("connect");
    let progress = Arc::new(AtomicI64::new(0));
    let done = Arc::clone(&progress);
    let thread = thread::spawn(move || {
        let mut told = HashMap::new();
        for b in 0..batches {
            let payloads: Vec<String> = dedup_batch(b).into_iter().map(|(_, p)| p).collect();
            let ids = producer.produce(DEDUP_TOPIC, &payloads).unwrap_or_else(|e| panic!("batch {b}: {e}"));
            told.extend(payloads.into_iter().zip(ids));
            done.fetch_add(1, Ordering::Relaxed);
        }
        told
    });
    wait_for_batches(&progress, rng.range(1u64, batches as u64 - 1) as i64, seed);
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let p = (0..200)
        .find_map(|i| {
            thread::sleep(Duration::from_millis(10));
            start_on(data.path(), logs.path(), (&format!("producer-1-{i}"), seed), addr.port(), &[])
        })
        .unwrap_or_else(|| panic!("seed {seed}: could not start the broker again on {addr}"));
    let told = thread.join().expect("producer thread");
    assert_eq!(told.len(), batches * DEDUP_BATCH);
    let got = drain_dedup(p.addr);
    check_stored_once(&got, batches, &told, seed);
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
}

/// A retry wait survives SIGKILL: in a group whose retry policy waits
/// 3 s, one message NACKed without a delay and one whose ack deadline
/// passed are waiting for retry when the broker is killed; after the
/// restart neither is back before its wait ends, each with its delivery
/// counted.
#[test]
fn a_retry_wait_survives_sigkill() {
    let seed = common::seed(0x7e7_7a17);
    println!("seed {seed}");
    let data = TempDir::new("retry-data");
    let logs = TempDir::new("retry-logs");
    let p = spawn_broker(data.path(), logs.path(), "retry0", seed);
    let mut c = client(p.addr).expect("connect");
    let retry = Some(runnel::queue::RetryPolicy { initial_ms: 3000, multiplier_pct: 100, cap_ms: 3000, jitter_pct: 0 });
    c.create_group("retry", "g", GroupSettings { retry, ..GroupSettings::default() }, Start::Earliest)
        .unwrap_or_else(|e| panic!("seed {seed}: CREATE_GROUP: {e}"));
    let (first, _) = c.produce_batch("retry", &[b"nacked".as_slice(), b"timed out"]).expect("produce");
    let take = |c: &mut Client, ack_timeout_ms: u32| {
        let f = Fetch { max_messages: 1, wait_ms: 20_000, ack_timeout_ms, ..Fetch::default() };
        let got = c.fetch_group("retry", "g", f).unwrap_or_else(|e| panic!("seed {seed}: FETCH: {e}"));
        got.iter().map(|m| (m.id, m.delivery_count)).collect::<Vec<_>>()
    };
    assert_eq!(take(&mut c, 0), [(first, 1)], "seed {seed}");
    let nacked = Instant::now();
    c.nack_group("retry", "g", &[first], 0, false).expect("NACK");
    let timed = Instant::now();
    assert_eq!(take(&mut c, 100), [(first + 1, 1)], "seed {seed}");
    let waiting = |c: &mut Client| {
        let stats = c.stats(Some("retry")).ok()?;
        let g = stats.into_iter().find(|s| s.0 == "retry/g")?;
        g.1.into_iter().find(|kv| kv.0 == "retry_waiting").map(|kv| kv.1)
    };
    common::wire::wait_until("both wait for retry", || waiting(&mut c) == Some(2));
    // A produce's reply waits for the sync of a later turn than the
    // NACK's and the deadline's: their records are written.
    c.produce("other", b"x").expect("produce");
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the broker {e}"));
    let p = spawn_broker(data.path(), logs.path(), "retry1", seed);
    let mut c = client(p.addr).expect("connect");
    let mut back = take(&mut c, 0);
    back.extend(take(&mut c, 0));
    back.sort_unstable();
    assert_eq!(back, [(first, 2), (first + 1, 2)], "seed {seed}");
    assert!(nacked.elapsed() >= Duration::from_millis(3000), "seed {seed}: back after {:?}", nacked.elapsed());
    assert!(timed.elapsed() >= Duration::from_millis(3100), "seed {seed}: back after {:?}", timed.elapsed());
    p.kill().unwrap_or_else(|e| panic!("seed {seed}: the last broker {e}"));
}
