//! Power loss: what a broker's disk could hold had the power gone at any
//! point of a run, and whether the next start keeps every promise on it.
//!
//! A real `runnel serve --fsync turn` child runs under the file-operation
//! recorder (`tests/shim/fileops.rs`, built by `common::recorder`), with
//! small segments, so that it rolls, compacts, renames and releases segments
//! often, on a data directory whose parents do not exist yet. A client
//! produces, fetches and acknowledges over the wire, noting when each reply
//! came (`CLOCK_MONOTONIC`, the recorder's clock); the run ends with a
//! graceful stop. Then, for many cut points, the simulator
//! (`common::power_loss`) rebuilds what the disk could hold after a power
//! loss there, under a crash model (a directory entry durable only once
//! its directory is synced, or a journal's prefix; unsynced writes
//! dropped, kept or kept in part), lays it out in a fresh directory and
//! starts a broker on it in this process (`Reactor::bind`, which runs the
//! log's open and recovery exactly as `runnel serve` does; then every
//! message is fetched over the wire). Each start must not be refused, must
//! hold every message whose produce was acknowledged before the cut, and
//! must not hold one whose ACK a completed sync covered before the cut (an
//! ACK answered and not yet synced may be undone: at-least-once).
//!
//! The mmap write path of `--fsync never` makes no call a shim can see, so
//! only `--fsync turn` is recorded.
//!
//! The suite runs a sample of the cut points. The long version tries every
//! cut point of the trace, with more crashes drawn at each:
//!
//! ```text
//! RUNNEL_POWER_LOSS_CUTS=all RUNNEL_POWER_LOSS_DRAWS=8 \
//!     cargo test --release --test power_loss -- --include-ignored every_cut
//! ```
//!
//! Seeds: `RUNNEL_SEED` replays the choices each crash draws; the recorded
//! run's timing is the machine's, so its trace differs from run to run.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::logdir::{Msgs, try_fetch_all};
use common::power_loss::{Choices, CrashModel, Cut, Disk, Keep, Metadata, Op, OpKind, Trace, Writes};
use common::recorder::{Recorded, Traced, now_ns};
use common::{Rng, TempDir};
use runnel::client::{Client, Fetch};
use runnel::testkit::SeedGuard;

/// The data directory, under the recorder's root: its parents do not exist
/// when the broker starts.
const DATA_REL: &str = "new/parents/data";
/// Small segments: the log rolls every few rounds and compaction removes
/// the old ones as their messages are acknowledged.
const SEGMENT_BYTES_MAX: &str = "4096";
/// The one topic.
const TOPIC: &str = "power";
/// Rounds of the workload: a batch produced, fetched, mostly acknowledged.
const ROUNDS: u64 = 240;
/// Messages a round produces.
const BATCH: u64 = 3;
/// One message in this many is fetched and never acknowledged: it stays
/// live, so compaction copies it forward before it removes a segment.
const KEPT_IN_FLIGHT_ONE_IN: u64 = 5;
/// The seed the workload draws its payload lengths from.
const WORKLOAD_SEED: u64 = 25;
/// How the test names itself on a failure, to replay.
const REPLAY: &str = "cargo test --release --test power_loss";

// ---------------------------------------------------------------------------
// The recorded run.
// ---------------------------------------------------------------------------

/// A produced message, as its producer saw it.
struct Produced {
    id: u64,
    payload: Vec<u8>,
    /// When its PRODUCE's reply came.
    acked_ns: u64,
}

/// An ACK, as its consumer saw it.
struct Acked {
    ids: Vec<u64>,
    /// When it was sent.
    sent_ns: u64,
    /// When the reply came to the first PRODUCE sent after this ACK was
    /// answered (`u64::MAX`: none was): that produce's sync covered the
    /// ACK's record, which was written before the ACK was answered.
    covered_ns: u64,
}

/// The recorded run: what the recorder saw, and what the client saw.
struct Run {
    rec: Recorded,
    produced: Vec<Produced>,
    acks: Vec<Acked>,
}

/// The run every test here checks, recorded once.
fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(record_run)
}

fn record_run() -> Run {
    let t = Traced::spawn(DATA_REL, &["--fsync", "turn", "--segment-bytes-max", SEGMENT_BYTES_MAX]);
    let mut c = Client::connect(t.addr).expect("connect to the traced broker");
    c.set_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut rng = Rng::new(WORKLOAD_SEED);
    let (mut produced, mut acks) = (Vec::new(), Vec::<Acked>::new());
    for round in 0..ROUNDS {
        let payloads: Vec<Vec<u8>> = (0..BATCH)
            .map(|i| format!("power-loss {round}.{i} {}", "x".repeat(rng.range(10usize, 300))).into_bytes())
            .collect();
        let (first, n) = c.produce_batch(TOPIC, &payloads).expect("produce");
        let acked_ns = now_ns();
        assert_eq!(u64::from(n), BATCH);
        for a in acks.iter_mut().filter(|a| a.covered_ns == u64::MAX) {
            a.covered_ns = acked_ns;
        }
        for (i, payload) in payloads.into_iter().enumerate() {
            produced.push(Produced { id: first + i as u64, payload, acked_ns });
        }
        let f = Fetch { max_messages: BATCH as u32 + 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
        let got = c.fetch(TOPIC, f).expect("fetch");
        let ids: Vec<u64> = got.iter().map(|m| m.id).filter(|id| id % KEPT_IN_FLIGHT_ONE_IN != 0).collect();
        if !ids.is_empty() {
            let sent_ns = now_ns();
            let r = c.ack(TOPIC, &ids).expect("ack");
            assert!(r.failed.is_empty(), "acks failed: {:?}", r.failed);
            acks.push(Acked { ids, sent_ns, covered_ns: u64::MAX });
        }
    }
    drop(c);
    Run { rec: t.stop(true), produced, acks }
}

// ---------------------------------------------------------------------------
// What a start after a cut must hold.
// ---------------------------------------------------------------------------

/// What a broker started after a power loss at a cut must and must not
/// hold.
struct Expected {
    /// Acknowledged before the cut, and no ACK of it sent before the cut.
    present: Msgs,
    /// Acknowledged by an ACK that a completed sync covered before the cut.
    absent: BTreeSet<(String, u64)>,
}

impl Run {
    /// What a start after a power loss at `cut` must and must not hold.
    fn expected(&self, cut: u64) -> Expected {
        let at = self.rec.trace.cut_ts_ns(cut);
        let mut ack_of: HashMap<u64, &Acked> = HashMap::new();
        for a in &self.acks {
            for id in &a.ids {
                ack_of.insert(*id, a);
            }
        }
        let mut e = Expected { present: Msgs::new(), absent: BTreeSet::new() };
        for p in self.produced.iter().filter(|p| p.acked_ns < at) {
            let key = (TOPIC.to_string(), p.id);
            match ack_of.get(&p.id) {
                Some(a) if a.covered_ns < at => {
                    e.absent.insert(key);
                }
                Some(a) if a.sent_ns < at => {}
                _ => {
                    e.present.insert(key, p.payload.clone());
                }
            }
        }
        e
    }

    /// Why `got`, what a start after `cut` holds, breaks a promise, if it
    /// does.
    fn check(&self, cut: u64, got: &Msgs) -> Result<(), String> {
        let e = self.expected(cut);
        let produced: HashMap<u64, &Produced> = self.produced.iter().map(|p| (p.id, p)).collect();
        for ((topic, id), payload) in got {
            match produced.get(id) {
                Some(p) if topic == TOPIC && p.payload == *payload => {}
                _ => return Err(format!("holds {topic}/{id}, which was never produced as it is")),
            }
        }
        let missing: Vec<u64> = e.present.keys().filter(|k| !got.contains_key(*k)).map(|k| k.1).collect();
        if !missing.is_empty() {
            return Err(format!(
                "lost {} of the {} messages acknowledged to their producer and not acked before the cut (ids {:?}); holds {}",
                missing.len(),
                e.present.len(),
                &missing[..missing.len().min(12)],
                got.len()
            ));
        }
        let undone: Vec<u64> = e.absent.iter().filter(|k| got.contains_key(*k)).map(|k| k.1).collect();
        if !undone.is_empty() {
            return Err(format!("brought back {} messages whose ACK was synced (ids {undone:?})", undone.len()));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Crashing at cut points.
// ---------------------------------------------------------------------------

/// Where the crashed disks are laid out: a memory filesystem if there is
/// one (the starts sync, and there is no disk to wait for), else the
/// temporary directory.
fn scratch() -> PathBuf {
    if let Some(d) = std::env::var_os("RUNNEL_POWER_LOSS_SCRATCH") {
        return d.into();
    }
    let shm = Path::new("/dev/shm");
    let writable = shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly());
    if writable { shm.to_path_buf() } else { std::env::temp_dir() }
}

/// A fresh directory under `scratch()`, removed on drop.
fn scratch_dir(tag: &str) -> TempDir {
    let t = TempDir::new(tag);
    let dir = scratch().join(t.path().file_name().expect("a name"));
    drop(t);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    TempDir(dir)
}

/// What a crash at a cut point may leave: the choices to try there.
type Crashes = dyn Fn(&Cut<'_>, &mut Rng) -> Vec<Choices>;

/// Crashes the recorded run at each of `cuts` as `crashes` says, starts a
/// broker on each distinct disk, and fails naming the first crashes that
/// break a promise.
fn check_cuts(test: &'static str, cuts: &[u64], crashes: &Crashes, seed: u64) {
    let _guard = SeedGuard { test, seed, replay: REPLAY };
    let run = run();
    let trace = &run.rec.trace;
    let mut rng = Rng::new(seed);
    let mut started: HashMap<u64, Result<Msgs, String>> = HashMap::new();
    let (mut tried, mut failures) = (0, Vec::new());
    for &k in cuts {
        let cut = trace.cut(k);
        for choices in crashes(&cut, &mut rng) {
            let disk = cut.disk(&choices);
            let outcome = started.entry(disk.digest()).or_insert_with(|| start_on(&disk));
            tried += 1;
            let verdict = match outcome {
                Ok(got) => run.check(k, got),
                Err(e) => Err(format!("the start was refused: {e}")),
            };
            if let Err(why) = verdict {
                failures.push(format!("{}\n    disk: {}\n    {why}", cut.describe(&choices), disk.listing()));
            }
        }
    }
    eprintln!(
        "{test}: seed {seed}: {} cut points, {tried} crashes, {} distinct disks started, {} broke a promise",
        cuts.len(),
        started.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{test}: seed {seed}: {} of {tried} crashes broke a promise; the first:\n{}",
        failures.len(),
        failures.iter().take(3).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Lays `disk` out in a fresh directory and starts a broker on its data
/// directory: every message it holds, or why it refused to start.
fn start_on(disk: &Disk) -> Result<Msgs, String> {
    let dir = scratch_dir("power-loss-disk");
    disk.write_to(dir.path());
    try_fetch_all(&dir.path().join(DATA_REL))
}

// ---------------------------------------------------------------------------
// The recorder and the simulator.
// ---------------------------------------------------------------------------

/// Whether a line is of this kind (by its op's name).
fn count(trace: &Trace, f: impl Fn(&Op) -> bool) -> usize {
    trace.ops.iter().filter(|o| o.ok && f(o)).count()
}

/// The recorder sees every call that changes the broker's files: the
/// simulator, replaying the whole trace with nothing lost, rebuilds exactly
/// the directory the run left. And the run did what the power-loss tests
/// need: it created the data directory and its parents, rolled, removed and
/// released segments, and synced.
#[test]
fn the_recorder_sees_every_file_operation_the_broker_makes() {
    let run = run();
    let trace = &run.rec.trace;
    let end = trace.cut(trace.end());
    let rebuilt = end.disk(&Choices::uniform(&end, true, Keep::Whole));
    let real = Disk::read(run.rec.root.path());
    assert_eq!(rebuilt.listing(), real.listing(), "the trace replayed gives the files the run left");
    assert!(rebuilt == real, "the trace replayed gives the bytes the run left");
    let removing = |p: &Path| p.to_string_lossy().ends_with(".log.removing");
    let mkdirs = count(trace, |o| matches!(o.kind, OpKind::Mkdir { .. }));
    let renames = count(trace, |o| matches!(&o.kind, OpKind::Rename { to, .. } if removing(to)));
    let releases = count(trace, |o| matches!(&o.kind, OpKind::Unlink { path } if removing(path)));
    let syncs = count(trace, |o| matches!(o.kind, OpKind::Sync { data_only: true, .. }));
    eprintln!(
        "trace: {} lines; {mkdirs} mkdirs, {renames} removals, {releases} releases, {syncs} fdatasyncs",
        trace.end()
    );
    assert_eq!(mkdirs, 3, "the data directory and its two parents were made");
    assert!(renames >= 5, "compaction removed segments: {renames}");
    assert!(releases >= 3, "the release thread unlinked removed segments: {releases}");
    assert!(syncs as u64 >= ROUNDS, "every produce was synced: {syncs} syncs for {ROUNDS} rounds");
}

/// A synthetic trace, for tests of the simulator itself.
struct Script {
    root: PathBuf,
    ops: Vec<Op>,
    data: Vec<u8>,
}

impl Script {
    fn new() -> Script {
        Script { root: PathBuf::from("/sim"), ops: Vec::new(), data: Vec::new() }
    }
    fn push(&mut self, kind: OpKind) {
        let seq = self.ops.len() as u64;
        self.ops.push(Op { seq, ts_ns: seq, ok: true, kind });
    }
    fn path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() { self.root.clone() } else { self.root.join(rel) }
    }
    fn open(&mut self, fd: i32, rel: &str, flags: i32) {
        let path = self.path(rel);
        self.push(OpKind::Open { fd, flags, path });
    }
    fn write(&mut self, fd: i32, at: u64, bytes: &[u8]) {
        let data = self.data.len()..self.data.len() + bytes.len();
        self.data.extend_from_slice(bytes);
        self.push(OpKind::Write { fd, at, data });
    }
    /// A sync of `fd` covering every line before it.
    fn sync(&mut self, fd: i32) {
        let covers_below = self.ops.len() as u64;
        self.push(OpKind::Sync { fd, data_only: false, covers_below });
    }
    fn trace(&self) -> Trace {
        Trace::from_parts(&self.root, self.ops.clone(), self.data.clone())
    }
}

/// The file `rel` on the disk a crash at the end of `s` leaves with
/// `choices` made by `pick`.
fn file_after(s: &Script, rel: &str, pick: impl Fn(&Cut<'_>) -> Choices) -> Option<Vec<u8>> {
    let trace = s.trace();
    let cut = trace.cut(trace.end());
    cut.disk(&pick(&cut)).files.get(Path::new(rel)).cloned()
}

#[test]
fn a_created_file_survives_a_power_loss_only_once_its_directory_is_synced() {
    let mut s = Script::new();
    s.open(3, "f", libc::O_CREAT | libc::O_WRONLY);
    s.write(3, 0, b"abc");
    s.sync(3);
    assert_eq!(file_after(&s, "f", |c| Choices::uniform(c, true, Keep::Drop)), Some(b"abc".to_vec()));
    assert_eq!(file_after(&s, "f", |c| Choices::uniform(c, false, Keep::Whole)), None, "its name was not synced");
    s.open(4, "", libc::O_RDONLY);
    s.sync(4);
    assert_eq!(file_after(&s, "f", |c| Choices::uniform(c, false, Keep::Drop)), Some(b"abc".to_vec()));
}

#[test]
fn unsynced_writes_are_dropped_kept_or_kept_in_part() {
    let mut s = Script::new();
    s.open(3, "f", libc::O_CREAT | libc::O_WRONLY);
    s.open(4, "", libc::O_RDONLY);
    s.sync(4);
    s.write(3, 0, b"durable ");
    s.sync(3);
    s.write(3, 8, b"pending");
    let after = |k: Keep| file_after(&s, "f", |c| Choices::uniform(c, true, k));
    assert_eq!(after(Keep::Drop), Some(b"durable ".to_vec()));
    assert_eq!(after(Keep::Whole), Some(b"durable pending".to_vec()));
    assert_eq!(after(Keep::Prefix(3)), Some(b"durable pen".to_vec()));
    let trace = s.trace();
    let cut = trace.cut(trace.end());
    assert_eq!((cut.pending_dir_ops.len(), cut.pending_changes.len()), (0, 1), "only the last write is pending");
}

/// `InOrder` keeps a prefix of a file's unsynced writes (the last of it
/// perhaps in part); `Independent` can keep a later one and lose an
/// earlier one (the power loss of issue #34).
#[test]
fn unsynced_writes_survive_in_order_or_each_on_its_own() {
    let mut s = Script::new();
    s.open(3, "f", libc::O_CREAT | libc::O_WRONLY);
    s.open(4, "", libc::O_RDONLY);
    s.sync(4);
    for (i, w) in [b"aaaa", b"bbbb", b"cccc"].iter().enumerate() {
        s.write(3, 4 * i as u64, *w);
    }
    let trace = s.trace();
    let cut = trace.cut(trace.end());
    let mut rng = Rng::new(common::seed(3));
    let mut out_of_order = 0;
    for writes in [Writes::InOrder, Writes::Independent] {
        for _ in 0..200 {
            let choices = CrashModel { metadata: Metadata::Posix, writes }.choose(&cut, &mut rng);
            let f = cut.disk(&choices).files.get(Path::new("f")).cloned().expect("its name was synced");
            // Each write's first byte: was it kept (of what survives)?
            let kept: Vec<bool> = (0..3).map(|i| f.get(4 * i).is_some_and(|&b| b != 0)).collect();
            let holes = kept.windows(2).any(|w| !w[0] && w[1]);
            if writes == Writes::InOrder {
                assert!(!holes, "in order, a later write survived an earlier one lost: {f:?}");
                assert!(f.len() <= 12 && b"aaaabbbbcccc".starts_with(&f), "a prefix of the writes: {f:?}");
            } else {
                out_of_order += usize::from(holes);
            }
        }
    }
    assert!(out_of_order > 0, "each on its own, a later write sometimes survives an earlier one lost");
}

/// The shape of issue #25's removal: a rename not yet durable, and a cut
/// of the renamed file after it, leave the old name holding the cut file.
#[test]
fn a_rename_not_yet_durable_leaves_the_old_name_with_what_came_after() {
    let mut s = Script::new();
    s.open(3, "0.log", libc::O_CREAT | libc::O_WRONLY);
    s.write(3, 0, b"records");
    s.sync(3);
    s.open(4, "", libc::O_RDONLY);
    s.sync(4);
    s.push(OpKind::Rename { from: s.path("0.log"), to: s.path("0.log.removing") });
    s.push(OpKind::Truncate { fd: 3, len: 0 });
    let dropped = |c: &Cut<'_>| Choices::uniform(c, false, Keep::Whole);
    assert_eq!(file_after(&s, "0.log", dropped), Some(Vec::new()), "the old name, cut");
    assert_eq!(file_after(&s, "0.log", |c| Choices::uniform(c, false, Keep::Drop)), Some(b"records".to_vec()));
    s.sync(4);
    assert_eq!(file_after(&s, "0.log", dropped), None, "once the directory is synced the rename holds");
}

#[test]
fn a_journal_keeps_directory_operations_in_their_order() {
    let mut s = Script::new();
    s.push(OpKind::Mkdir { path: s.path("x") });
    s.push(OpKind::Mkdir { path: s.path("y") });
    s.open(3, "", libc::O_RDONLY);
    s.sync(3);
    s.open(4, "x/f", libc::O_CREAT | libc::O_WRONLY);
    s.open(5, "y/g", libc::O_CREAT | libc::O_WRONLY);
    s.open(6, "y", libc::O_RDONLY);
    s.sync(6);
    let trace = s.trace();
    let cut = trace.cut(trace.end());
    assert_eq!(cut.pending_dir_ops.len(), 1, "x/f's name is not durable; y/g's is");
    assert_eq!(cut.journal_kept_min(), 1, "a journal that holds y/g holds x/f, made before it");
    let mut rng = Rng::new(common::seed(7));
    let (mut posix_dropped, mut journal_dropped) = (0, 0);
    for _ in 0..64 {
        for (metadata, dropped) in [(Metadata::Posix, &mut posix_dropped), (Metadata::Journal, &mut journal_dropped)] {
            let choices = CrashModel { metadata, writes: Writes::Independent }.choose(&cut, &mut rng);
            if !cut.disk(&choices).files.contains_key(Path::new("x/f")) {
                *dropped += 1;
            }
        }
    }
    assert!(posix_dropped > 0, "POSIX may lose x/f's name");
    assert_eq!(journal_dropped, 0, "a journal never loses it");
}

// ---------------------------------------------------------------------------
// The promises, at cut points.
// ---------------------------------------------------------------------------

/// Cut points: every `one_in`th line (from a seeded offset), and the end.
fn sampled(trace: &Trace, one_in: u64, rng: &mut Rng) -> Vec<u64> {
    let mut cuts: Vec<u64> = (rng.below(one_in)..trace.end()).step_by(one_in as usize).collect();
    cuts.push(trace.end());
    cuts
}

/// A crash of the process, not the machine, right after any call: every
/// call made reached the page cache, and nothing else did. The start must
/// take the directory and keep every promise (the broker's order of
/// operations, as `tests/crash.rs` checks with real kills, here at exact
/// points). A sample of the cut points.
#[test]
fn a_process_crash_after_any_file_operation_keeps_every_promise() {
    let seed = common::seed(0);
    let cuts = sampled(&run().rec.trace, 12, &mut Rng::new(seed));
    let kept = |cut: &Cut<'_>, _: &mut Rng| vec![Choices::uniform(cut, true, Keep::Whole)];
    check_cuts("a_process_crash_after_any_file_operation_keeps_every_promise", &cuts, &kept, seed);
}
