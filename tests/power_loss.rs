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
//! its directory is synced, or a journal's prefix; of each file's unsynced
//! writes a prefix, the last perhaps torn at any byte, the tear today's
//! recovery cuts as a torn tail), lays it out in a fresh directory and
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
//! Also here: a repair interrupted by a power loss (a recorded `runnel serve
//! --repair` on overlapping segments, crashed at every line, then repaired
//! again: nothing lost), a crash of the process after any file operation,
//! and the tests of the recorder (the trace replayed rebuilds exactly what
//! the run left) and of the simulator on synthetic traces.
//!
//! The suite tries every directory operation and sync (just before and
//! after each) and a sample of the other lines, and every line around the
//! removals and around the first produces. The long version tries every
//! line of a longer run, with more crashes drawn at each, for several seeds
//! and segment sizes:
//!
//! ```text
//! for seg in 4096 65536; do for seed in 1 2 3; do
//!   RUNNEL_SEED=$seed RUNNEL_POWER_LOSS_CUTS=all RUNNEL_POWER_LOSS_DRAWS=8 \
//!   RUNNEL_POWER_LOSS_ROUNDS=600 RUNNEL_POWER_LOSS_SEGMENT_BYTES=$seg \
//!     cargo test --release --test power_loss every_cut -- --nocapture
//! done; done
//! ```
//!
//! The sector model (issue #34): runs of larger writes, on segments of
//! three sizes, crashed after each write and inside each sync with any of
//! the unsynced writes' 512-byte sectors kept, in any order
//! (`Writes::Sectors`, and its superset `Writes::EachSector`): no start may
//! be refused, no acknowledged produce lost, no synced ACK undone; and a
//! bit flipped in bytes a later write says were synced, or in the middle
//! of a segment before the last, must be refused every time. The suite
//! tries a sample; the long version every write and sync of longer runs,
//! with more crashes at each:
//!
//! ```text
//! RUNNEL_POWER_LOSS_SECTOR_ROUNDS=400 RUNNEL_POWER_LOSS_SECTOR_CUTS=all RUNNEL_POWER_LOSS_DRAWS=6 \
//!     cargo test --release --test power_loss -- sector bit_flipped --nocapture
//! ```
//!
//! Crashed disks are laid out under `/dev/shm` when there is one (the
//! starts sync; there is no disk to wait for), else the temporary directory;
//! `RUNNEL_POWER_LOSS_SCRATCH` names another place.
//!
//! Seeds: `RUNNEL_SEED` replays the choices each crash draws; the recorded
//! run's timing is the machine's, so its trace differs from run to run. A
//! failure prints the seed, the cut (the line after which the power went),
//! what the crash kept and dropped, the files it left and what the start
//! did wrong.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::logdir::{Msgs, try_fetch_all_with};
use common::power_loss::{Choices, CrashModel, Cut, Disk, Keep, Metadata, Op, OpKind, Trace, Writes};
use common::power_loss::{SECTOR_BYTES, sector_kept, sector_version};
use common::recorder::{Recorded, Traced, now_ns};
use common::{Rng, TempDir};
use runnel::client::{Client, Fetch, OwnedReply};
use runnel::log::{LogOptions, RECORD_HEADER_BYTES, RecordKind, WriteFrame};
use runnel::testkit::SeedGuard;

/// The data directory, under the recorder's root: its parents do not exist
/// when the broker starts.
const DATA_REL: &str = "new/parents/data";
/// Small segments: the log rolls every few rounds and compaction removes
/// the old ones as their messages are acknowledged
/// (`RUNNEL_POWER_LOSS_SEGMENT_BYTES` sets another size for the recorded
/// run).
const SEGMENT_BYTES_MAX: &str = "4096";
/// The one topic.
const TOPIC: &str = "power";
/// Rounds of the workload: a batch produced, fetched, mostly acknowledged
/// (`RUNNEL_POWER_LOSS_ROUNDS` sets another number).
const ROUNDS: u64 = 240;
/// Messages a round produces.
const BATCH: u64 = 3;
/// One message in this many is fetched and never acknowledged: it stays
/// live, so compaction copies it forward before it removes a segment.
const KEPT_IN_FLIGHT_ONE_IN: u64 = 5;
/// The seed the workload draws its payload lengths from.
const WORKLOAD_SEED: u64 = 25;
/// Up to this many directory operations not yet durable at a cut, every
/// subset of them is tried.
const DIR_SUBSETS_PENDING_MAX: usize = 4;
/// The free bytes the short-disk run's broker is told its disk has: short
/// of space (less than 2 MiB past the headroom), so compaction unlinks a
/// removed segment at once, yet room for produces (1 MiB and the headroom).
const SHORT_FREE_BYTES: u64 = 3 << 19;
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
    /// When it was sent, and when its reply came.
    sent_ns: u64,
    answered_ns: u64,
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

/// Rounds of the recorded run.
fn rounds() -> u64 {
    env_u64("RUNNEL_POWER_LOSS_ROUNDS", ROUNDS)
}

/// The run every test here checks, recorded once.
fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| record_run(None))
}

/// The same workload on a disk the broker is told is nearly full
/// (`SHORT_FREE_BYTES`), recorded once.
fn short_run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| record_run(Some(SHORT_FREE_BYTES)))
}

/// The environment variable `name` as a number, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Records the workload; with `free_bytes`, on a broker told that its disk
/// has that many bytes free.
fn record_run(free_bytes: Option<u64>) -> Run {
    let segment = env_u64("RUNNEL_POWER_LOSS_SEGMENT_BYTES", SEGMENT_BYTES_MAX.parse().expect("a number"));
    let segment_bytes_max = segment.to_string();
    record_workload(&Workload {
        segment_bytes_max: &segment_bytes_max,
        free_bytes,
        rounds: rounds(),
        produces: 1,
        batch: BATCH,
        filler_max: 300,
    })
}

/// What a recorded run does: `rounds` rounds of `produces` PRODUCEs sent
/// together (so that one turn's write holds their records), each of a
/// batch of `batch` messages with up to `filler_max` bytes of filler, then
/// the messages fetched and mostly acknowledged, on segments of
/// `segment_bytes_max` (and with `free_bytes`, on a broker told that its
/// disk has that many bytes free).
struct Workload<'a> {
    segment_bytes_max: &'a str,
    free_bytes: Option<u64>,
    rounds: u64,
    produces: u64,
    batch: u64,
    filler_max: usize,
}

fn record_workload(w: &Workload<'_>) -> Run {
    let args = ["--fsync", "turn", "--segment-bytes-max", w.segment_bytes_max];
    let free = w.free_bytes.map(|b| b.to_string());
    let env: Vec<(&str, &str)> = free.iter().map(|f| ("RUNNEL_FILEOPS_FREE_BYTES", f.as_str())).collect();
    let t = Traced::spawn_over(&Disk::default(), DATA_REL, &args, &env);
    let mut c = Client::connect(t.addr).expect("connect to the traced broker");
    c.set_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut rng = Rng::new(WORKLOAD_SEED);
    let (mut produced, mut acks) = (Vec::new(), Vec::<Acked>::new());
    let (batch, filler_max) = (w.batch, w.filler_max);
    for round in 0..w.rounds {
        let sent: Vec<Vec<Vec<u8>>> = (0..w.produces)
            .map(|p| {
                let payloads: Vec<Vec<u8>> = (0..batch)
                    .map(|i| format!("power-loss {round}.{p}.{i} {}", "x".repeat(rng.range(10usize, filler_max))))
                    .map(String::into_bytes)
                    .collect();
                c.send_produce(TOPIC, &payloads);
                payloads
            })
            .collect();
        for payloads in sent {
            let Ok(OwnedReply::Produced { first_id: first, count: n }) = c.recv() else { panic!("a PRODUCE failed") };
            let acked_ns = now_ns();
            assert_eq!(u64::from(n), batch);
            for a in acks.iter_mut().filter(|a| a.covered_ns == u64::MAX) {
                a.covered_ns = acked_ns;
            }
            for (i, payload) in payloads.into_iter().enumerate() {
                produced.push(Produced { id: first + i as u64, payload, acked_ns });
            }
        }
        let most = (w.produces * batch) as u32 + 1;
        let f = Fetch { max_messages: most, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
        let got = c.fetch(TOPIC, f).expect("fetch");
        let ids: Vec<u64> = got.iter().map(|m| m.id).filter(|id| id % KEPT_IN_FLIGHT_ONE_IN != 0).collect();
        if !ids.is_empty() {
            let sent_ns = now_ns();
            let r = c.ack(TOPIC, &ids).expect("ack");
            assert!(r.failed.is_empty(), "acks failed: {:?}", r.failed);
            acks.push(Acked { ids, sent_ns, answered_ns: now_ns(), covered_ns: u64::MAX });
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
    /// What a start after a power loss at `cut` must and must not hold;
    /// after a crash of the process only (`process`), an ACK answered
    /// before the cut must not be undone either: its record was written
    /// before the reply.
    fn expected(&self, cut: u64, process: bool) -> Expected {
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
                Some(a) if a.covered_ns < at || (process && a.answered_ns < at) => {
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
    fn check(&self, cut: u64, got: &Msgs, process: bool) -> Result<(), String> {
        let e = self.expected(cut, process);
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
            let what = if process { "answered" } else { "synced" };
            return Err(format!("brought back {} messages whose ACK was {what} (ids {undone:?})", undone.len()));
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

/// Crashes drawn at each cut besides the four uniform ones (everything
/// pending kept or dropped, directory operations and writes apart), from
/// `RUNNEL_POWER_LOSS_DRAWS` or `default`.
fn draws(default: u64) -> u64 {
    env_u64("RUNNEL_POWER_LOSS_DRAWS", default)
}

/// The crashes to try at a cut: the four uniform ones, every subset of the
/// directory operations not yet durable if there are few (with every
/// unsynced write kept), then `draws` drawn from `rng`, alternately under
/// the POSIX and the journal model.
fn power_losses(cut: &Cut<'_>, draws: u64, rng: &mut Rng) -> Vec<Choices> {
    let mut v = vec![
        Choices::uniform(cut, false, Keep::Drop),
        Choices::uniform(cut, false, Keep::Whole),
        Choices::uniform(cut, true, Keep::Drop),
        Choices::uniform(cut, true, Keep::Whole),
    ];
    v.extend(Choices::every_dir_subset(cut, Keep::Whole, DIR_SUBSETS_PENDING_MAX));
    for i in 0..draws {
        let metadata = if i % 2 == 0 { Metadata::Posix } else { Metadata::Journal };
        v.push(CrashModel { metadata, writes: Writes::InOrder }.choose(cut, rng));
    }
    v.dedup();
    v
}

/// What a crash at a cut point may leave: the choices to try there.
type Crashes = dyn Fn(&Cut<'_>, &mut Rng) -> Vec<Choices>;

/// What a start on a crashed disk must hold after a power loss at a cut
/// (`Ok`, or why not).
type Check<'a> = dyn Fn(u64, &Msgs) -> Result<(), String> + 'a;

/// Crashes the recorded run at each of `cuts` as `crashes` says, starts a
/// broker on each distinct disk, and fails naming the first crashes that
/// break a promise.
fn check_cuts(test: &'static str, cuts: &[u64], crashes: &Crashes, seed: u64) {
    check_run_cuts(test, run(), cuts, crashes, false, seed);
}

/// `check_cuts` on `run`; `process`: the crashes are of the process only,
/// so no answered ACK may be undone.
fn check_run_cuts(test: &'static str, run: &Run, cuts: &[u64], crashes: &Crashes, process: bool, seed: u64) {
    let check = |k: u64, got: &Msgs| run.check(k, got, process);
    check_crashes(test, &run.rec.trace, LogOptions::default(), (cuts, crashes), &check, seed);
}

/// Crashes `trace` at each of `cuts` as `crashes` says, starts a broker
/// whose log opens with `log` on each distinct disk, and fails naming the
/// first crashes whose start `check` faults.
fn check_crashes(
    test: &'static str,
    trace: &Trace,
    log: LogOptions,
    (cuts, crashes): (&[u64], &Crashes),
    check: &Check<'_>,
    seed: u64,
) {
    let _guard = SeedGuard { test, seed, replay: REPLAY };
    let mut rng = Rng::new(seed);
    let mut distinct = BTreeSet::new();
    let (mut tried, mut failures) = (0, Vec::new());
    for &k in cuts {
        let cut = trace.cut(k);
        for choices in crashes(&cut, &mut rng) {
            let disk = cut.disk(&choices);
            distinct.insert(disk.digest());
            let outcome = started_on(&disk, &log);
            tried += 1;
            let verdict = match outcome {
                Ok(got) => check(k, &got),
                Err(e) => Err(format!("the start was refused: {e}")),
            };
            if let Err(why) = verdict {
                failures.push(format!("{}\n    disk: {}\n    {why}", cut.describe(&choices), disk.listing()));
            }
        }
    }
    eprintln!(
        "{test}: seed {seed}: {} cut points, {tried} crashes, {} distinct disks, {} broke a promise",
        cuts.len(),
        distinct.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{test}: seed {seed}: {} of {tried} crashes broke a promise; the first:\n{}",
        failures.len(),
        failures.iter().take(3).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// What a start on `disk` with `log` found: started once per distinct disk
/// and options, whichever test asks first (the tests share the recorded
/// run, and many of their crashes leave the same disk).
fn started_on(disk: &Disk, log: &LogOptions) -> Result<Msgs, String> {
    type Started = Mutex<HashMap<(u64, String), Result<Msgs, String>>>;
    static STARTED: OnceLock<Started> = OnceLock::new();
    let key = (disk.digest(), format!("{log:?}"));
    let started = STARTED.get_or_init(Started::default);
    if let Some(found) = started.lock().expect("the starts' table").get(&key) {
        return found.clone();
    }
    let found = start_on(disk, log.clone());
    started.lock().expect("the starts' table").insert(key, found.clone());
    found
}

/// Lays `disk` out in a fresh directory and starts a broker on its data
/// directory, its log opened with `log`: every message it holds, or why it
/// refused to start.
fn start_on(disk: &Disk, log: LogOptions) -> Result<Msgs, String> {
    let dir = scratch_dir("power-loss-disk");
    disk.write_to(dir.path());
    try_fetch_all_with(&dir.path().join(DATA_REL), log)
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
    assert!(syncs as u64 >= rounds(), "every produce was synced: {syncs} syncs for {} rounds", rounds());
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

/// A run that begins on files already there (`Trace::over`) finds them
/// durable: a power loss undoes only what the run did.
#[test]
fn a_run_over_existing_files_takes_them_as_durable() {
    let mut s = Script::new();
    s.push(OpKind::Rename { from: s.path("d/0.log"), to: s.path("d/1.log") });
    let mut before = Disk::default();
    before.files.insert(PathBuf::from("0.log"), b"old".to_vec());
    let trace = s.trace().over(before.under(Path::new("d")));
    let cut = trace.cut(trace.end());
    let names = |keep: bool| cut.disk(&Choices::uniform(&cut, keep, Keep::Whole)).files.into_keys().collect::<Vec<_>>();
    assert_eq!(names(false), [PathBuf::from("d/0.log")], "the rename undone");
    assert_eq!(names(true), [PathBuf::from("d/1.log")]);
    assert_eq!(cut.disk(&Choices::uniform(&cut, true, Keep::Drop)).files[Path::new("d/1.log")], b"old");
    assert_eq!(Choices::every_dir_subset(&cut, Keep::Whole, 4).len(), 2, "the rename kept or not");
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
/// take the directory and keep every promise, an answered ACK never undone
/// (the broker's order of operations, as `tests/crash.rs` checks with real
/// kills, here at exact points). A sample of the cut points.
#[test]
fn a_process_crash_after_any_file_operation_keeps_every_promise() {
    let seed = common::seed(0);
    let cuts = sampled(&run().rec.trace, 12, &mut Rng::new(seed));
    let kept = |cut: &Cut<'_>, _: &mut Rng| vec![Choices::uniform(cut, true, Keep::Whole)];
    check_run_cuts("a_process_crash_after_any_file_operation_keeps_every_promise", run(), &cuts, &kept, true, seed);
}

/// Issue #25 (b): the data directory and its parents are made with
/// `mkdir`; a power loss after the first acknowledged produces must not
/// take the directory with them. Every cut from the start of the run to the
/// third round's acknowledgement.
#[test]
fn a_new_data_directory_survives_a_power_loss_after_its_first_produces() {
    let run = run();
    let trace = &run.rec.trace;
    let until = run.produced[(3 * BATCH) as usize].acked_ns;
    let cuts: Vec<u64> = (1..=trace.end()).filter(|&k| trace.ops[k as usize - 1].ts_ns <= until).collect();
    let draws = draws(2);
    let losses = move |cut: &Cut<'_>, rng: &mut Rng| power_losses(cut, draws, rng);
    check_cuts("a_new_data_directory_survives_a_power_loss_after_its_first_produces", &cuts, &losses, common::seed(1));
}

/// While space is short, compaction unlinks a removed segment at once, on
/// the loop, with no rename (the shim tells the broker its disk has 1.5 MiB
/// free). A power loss around any unlink must leave a log a start
/// takes, holding what was acknowledged: each unlink durable before the
/// next.
#[test]
fn removals_on_a_short_disk_survive_a_power_loss() {
    let run = short_run();
    let trace = &run.rec.trace;
    let unlinks =
        count(trace, |o| matches!(&o.kind, OpKind::Unlink { path } if path.extension().is_some_and(|e| e == "log")));
    assert!(unlinks >= 5, "setup: compaction unlinked segments at once: {unlinks}");
    let cuts = around(trace, |o| matches!(o.kind, OpKind::Unlink { .. }));
    let draws = draws(2);
    let losses = move |cut: &Cut<'_>, rng: &mut Rng| power_losses(cut, draws, rng);
    let seed = common::seed(6);
    check_run_cuts("removals_on_a_short_disk_survive_a_power_loss", run, &cuts, &losses, false, seed);
}

/// Every directory operation and every sync of the recorded run, just
/// before and just after it, and a seeded sample of the other lines (one
/// in eight), the end included; with `RUNNEL_POWER_LOSS_CUTS=all`, every
/// line (the long version, with more draws: the header says how). Each
/// cut point with every uniform crash, every subset of a few pending
/// directory operations, and crashes drawn under both metadata models with
/// unsynced writes kept in order (a prefix, the last perhaps torn).
#[test]
fn every_cut_keeps_what_was_acknowledged() {
    let seed = common::seed(5);
    let trace = &run().rec.trace;
    let cuts = if std::env::var("RUNNEL_POWER_LOSS_CUTS").is_ok_and(|v| v == "all") {
        (0..=trace.end()).collect()
    } else {
        let mut cuts: BTreeSet<u64> =
            around(trace, |o| o.kind.is_dir_op() || matches!(o.kind, OpKind::Sync { .. })).into_iter().collect();
        cuts.extend(sampled(trace, 8, &mut Rng::new(seed)));
        cuts.into_iter().collect::<Vec<_>>()
    };
    let draws = draws(2);
    let losses = move |cut: &Cut<'_>, rng: &mut Rng| power_losses(cut, draws, rng);
    check_cuts("every_cut_keeps_what_was_acknowledged", &cuts, &losses, seed);
}

/// Cut points just before and just after each line that `pick` picks.
fn around(trace: &Trace, pick: impl Fn(&Op) -> bool) -> Vec<u64> {
    let mut cuts = BTreeSet::new();
    for o in trace.ops.iter().filter(|o| pick(o)) {
        cuts.insert(o.seq);
        cuts.insert(o.seq + 1);
    }
    cuts.into_iter().collect()
}

/// Issue #25 (a): compaction renames a segment to `….log.removing`, and the
/// release thread then cuts and unlinks the file. A power loss around any
/// of these, or around any other rename, unlink or truncate (a roll cuts
/// the segment it closes), must leave a log a start takes, holding what was
/// acknowledged: cuts between a rename and the release thread's cut
/// included.
#[test]
fn compaction_removals_survive_a_power_loss() {
    let trace = &run().rec.trace;
    let cuts =
        around(trace, |o| matches!(o.kind, OpKind::Rename { .. } | OpKind::Unlink { .. } | OpKind::Truncate { .. }));
    let draws = draws(2);
    let losses = move |cut: &Cut<'_>, rng: &mut Rng| power_losses(cut, draws, rng);
    check_cuts("compaction_removals_survive_a_power_loss", &cuts, &losses, common::seed(2));
}

/// A data directory whose second and third segments are renamed to begin
/// before the one before them ends (as damage could leave it), so that
/// `--repair` must rename both up, the higher first, the lower onto the
/// higher's old name; and the messages in it.
fn overlapping_segments() -> (Disk, Msgs) {
    let dir = TempDir::new("power-loss-repair");
    let log = LogOptions { segment_bytes_max: SEGMENT_BYTES_MAX.parse().expect("a number"), ..LogOptions::default() };
    let srv = common::Server::start_in(runnel::broker::Config::default(), log, dir.path());
    let mut c = srv.client();
    let mut produced = Msgs::new();
    while common::logdir::segments(dir.path()).len() < 4 {
        let payload = format!("repair {} {}", produced.len(), "y".repeat(100)).into_bytes();
        let id = c.produce(TOPIC, &payload).expect("produce");
        produced.insert((TOPIC.to_string(), id), payload);
    }
    drop(c);
    srv.stop();
    common::logdir::crashed(dir.path());
    let segs = common::logdir::segments(dir.path());
    let second = common::logdir::base_of(&segs[1]);
    for (seg, base) in [(&segs[1], second - 8), (&segs[2], second)] {
        std::fs::rename(seg, dir.path().join(format!("{base:020}.log"))).expect("rename a segment");
    }
    (Disk::read(dir.path()), produced)
}

/// `--repair` renames segments to close the gaps and overlaps damage left,
/// and an interrupted repair is finished by running it again. A power loss
/// at any point of a repair, then a start with `--repair`, must keep every
/// record: a rename must not land on the name of a segment whose own
/// rename a power loss undid.
#[test]
fn a_repair_interrupted_by_a_power_loss_is_finished_by_the_next() {
    let (damaged, produced) = overlapping_segments();
    let args = ["--repair", "--segment-bytes-max", SEGMENT_BYTES_MAX];
    let rec = Traced::spawn_over(&damaged.under(Path::new(DATA_REL)), DATA_REL, &args, &[]).stop(true);
    let renames = count(&rec.trace, |o| matches!(o.kind, OpKind::Rename { .. }));
    assert!(renames >= 3, "setup: the repair renamed two segments (and the stop its marker): {renames}");
    let cuts: Vec<u64> = (0..=rec.trace.end()).collect();
    let draws = draws(4);
    let losses = move |cut: &Cut<'_>, rng: &mut Rng| power_losses(cut, draws, rng);
    let check = |_: u64, got: &Msgs| {
        let lost: Vec<u64> = produced.keys().filter(|k| !got.contains_key(*k)).map(|k| k.1).collect();
        if lost.is_empty() {
            Ok(())
        } else {
            Err(format!("lost {} of {} messages: {lost:?}", lost.len(), produced.len()))
        }
    };
    let log = LogOptions { repair: true, ..LogOptions::default() };
    let seed = common::seed(4);
    check_crashes(
        "a_repair_interrupted_by_a_power_loss_is_finished_by_the_next",
        &rec.trace,
        log,
        (&cuts, &losses),
        &check,
        seed,
    );
}

// ---------------------------------------------------------------------------
// The sector model (issue #34).
// ---------------------------------------------------------------------------

/// The sector models keep or lose each 512-byte sector an unsynced write
/// touches whole: a sector holds all of the write's bytes in it or none,
/// and a later sector can survive an earlier one lost. Under `Sectors` a
/// sector holds a later write's bytes only with an earlier write's there
/// (a page is written back with what it holds); `EachSector` draws each
/// write on its own.
#[test]
fn unsynced_writes_survive_sector_by_sector() {
    let mut s = Script::new();
    s.open(3, "f", libc::O_CREAT | libc::O_WRONLY);
    s.open(4, "", libc::O_RDONLY);
    s.sync(4);
    let first: Vec<u8> = (0..3000).map(|i| (i % 251 + 1) as u8).collect();
    let second = vec![0xee; 700];
    let (at, then) = (100, 3100);
    s.write(3, at, &first);
    s.write(3, then, &second);
    let trace = s.trace();
    let cut = trace.cut(trace.end());
    let mut rng = Rng::new(common::seed(34));
    // A write's part of a sector: the bytes it wrote there as the file
    // holds them, and whether it holds them all (else none).
    let part = |f: &[u8], bytes: &[u8], start: u64, sector: u64| -> Option<bool> {
        let lo = (sector * SECTOR_BYTES).max(start);
        let hi = ((sector + 1) * SECTOR_BYTES).min(start + bytes.len() as u64);
        let got: Vec<u8> = (lo..hi).map(|i| f.get(i as usize).copied().unwrap_or(0)).collect();
        let whole = got == bytes[(lo - start) as usize..(hi - start) as usize];
        assert!(whole || got.iter().all(|&b| b == 0), "sector {sector} kept in part: {got:?}");
        (lo < hi).then_some(whole)
    };
    let shared = then / SECTOR_BYTES; // both writes touch it
    for writes in [Writes::Sectors, Writes::EachSector] {
        let (mut holes, mut second_alone) = (0, 0);
        for _ in 0..300 {
            let choices = CrashModel { metadata: Metadata::Posix, writes }.choose(&cut, &mut rng);
            let f = cut.disk(&choices).files.get(Path::new("f")).cloned().expect("its name was synced");
            let kept: Vec<bool> = (0..=shared).filter_map(|sector| part(&f, &first, at, sector)).collect();
            holes += usize::from(kept.windows(2).any(|w| !w[0] && w[1]));
            let later = part(&f, &second, then, shared) == Some(true);
            second_alone += usize::from(later && part(&f, &first, at, shared) == Some(false));
        }
        assert!(holes > 0, "{writes:?}: a later sector sometimes survives an earlier one lost");
        match writes {
            Writes::Sectors => assert_eq!(second_alone, 0, "a page holds the first write when the second is in it"),
            _ => assert!(second_alone > 0, "{writes:?}: each write on its own"),
        }
    }
    assert!(!sector_kept(1, 0, 3) && sector_kept(1, 100, 3), "0% keeps none, 100% every sector");
    assert!((0..64).all(|s| sector_version(9, 2, s) <= 2), "a version is how many of the writes a sector took");
}

/// The sector runs: larger writes (three PRODUCEs at once, each of two
/// messages of up to 1,500 bytes: a write of several records over several
/// sectors), on segments of 4 KiB, 128 KiB and 1 MiB
/// (`RUNNEL_POWER_LOSS_SECTOR_ROUNDS` rounds each).
fn sector_runs() -> &'static [Run] {
    static RUNS: OnceLock<Vec<Run>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let rounds = std::env::var("RUNNEL_POWER_LOSS_SECTOR_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(60);
        ["4096", "131072", "1048576"]
            .into_iter()
            .map(|segment_bytes_max| {
                let free_bytes = None;
                record_workload(&Workload {
                    segment_bytes_max,
                    free_bytes,
                    rounds,
                    produces: 3,
                    batch: 2,
                    filler_max: 1500,
                })
            })
            .collect()
    })
}

/// The cut points of the sector model in `trace`: right after every write
/// (it returned; none of it synced) and right before and after every sync
/// (a cut before the line is a cut inside the sync: it did not complete).
/// With `RUNNEL_POWER_LOSS_SECTOR_CUTS=all` every one, else a seeded
/// sample of `sample` of them, and the end.
fn sector_cuts(trace: &Trace, sample: usize, rng: &mut Rng) -> Vec<u64> {
    let mut cuts = BTreeSet::new();
    for o in trace.ops.iter().filter(|o| o.ok) {
        match o.kind {
            OpKind::Write { .. } => {
                cuts.insert(o.seq + 1);
            }
            OpKind::Sync { .. } => {
                cuts.extend([o.seq, o.seq + 1]);
            }
            _ => {}
        }
    }
    let mut cuts: Vec<u64> = cuts.into_iter().collect();
    if std::env::var("RUNNEL_POWER_LOSS_SECTOR_CUTS").is_ok_and(|v| v == "all") {
        return cuts;
    }
    let mut picked = BTreeSet::from([trace.end()]);
    for _ in 0..sample.min(cuts.len()) {
        picked.insert(cuts.swap_remove(rng.below(cuts.len() as u64) as usize));
    }
    picked.into_iter().collect()
}

/// Crashes at a cut under the sector models: each unsynced write's
/// sectors drawn, alternately under `Sectors` and `EachSector`, with the
/// directory operations not yet durable drawn under the POSIX and the
/// journal model in turn; `draws` crashes, with the four uniform ones
/// (everything pending kept or lost, directory operations and writes
/// apart).
fn sector_crashes(draws: u64) -> impl Fn(&Cut<'_>, &mut Rng) -> Vec<Choices> {
    move |cut: &Cut<'_>, rng: &mut Rng| {
        let mut v: Vec<Choices> = [(false, Keep::Drop), (false, Keep::Whole), (true, Keep::Drop), (true, Keep::Whole)]
            .into_iter()
            .map(|(dir_ops, keep)| Choices::uniform(cut, dir_ops, keep))
            .collect();
        for i in 0..draws {
            let writes = if i % 2 == 0 { Writes::Sectors } else { Writes::EachSector };
            let metadata = if i / 2 % 2 == 0 { Metadata::Posix } else { Metadata::Journal };
            v.push(CrashModel { metadata, writes }.choose(cut, rng));
        }
        v.dedup();
        v
    }
}

/// A power cut that keeps any of the unsynced writes' sectors: no start is
/// refused, no acknowledged produce is lost, no synced ACK is undone.
#[test]
fn a_power_cut_that_keeps_any_sectors_of_unsynced_writes_keeps_every_promise() {
    let seed = common::seed(0x34);
    let mut rng = Rng::new(seed);
    let draws = std::env::var("RUNNEL_POWER_LOSS_DRAWS").ok().and_then(|d| d.parse().ok()).unwrap_or(3);
    for run in sector_runs() {
        let cuts = sector_cuts(&run.rec.trace, 40, &mut rng);
        let test = "a_power_cut_that_keeps_any_sectors_of_unsynced_writes_keeps_every_promise";
        check_run_cuts(test, run, &cuts, &sector_crashes(draws), false, seed);
    }
}

/// The whole records at the start of `data`, up to the first that is not
/// (by its header and CRC alone): each one's offset, end, kind and, for a
/// Write record, what it says.
fn whole_records(data: &[u8]) -> Vec<(usize, usize, u8, Option<WriteFrame>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = data.get(at..at + RECORD_HEADER_BYTES) {
        let len = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes")) as usize;
        let Some(rec) = data.get(at..at + RECORD_HEADER_BYTES + len) else { break };
        let mut crc = crc32fast::Hasher::new();
        crc.update(&rec[0..4]);
        crc.update(&rec[8..]);
        if h[8] == 0 || crc.finalize() != u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) {
            break;
        }
        let frame =
            (h[8] == RecordKind::Write as u8).then(|| WriteFrame::decode(&rec[RECORD_HEADER_BYTES..])).flatten();
        out.push((at, rec.len() + at, h[8], frame));
        at += rec.len();
    }
    out
}

/// A byte of a record in `data` (a last segment) that a whole Write record
/// after it says a completed sync covered, drawn from `rng`: where a bit
/// flipped is damage to what may have been acknowledged.
fn vouched_byte(data: &[u8], rng: &mut Rng) -> Option<usize> {
    let recs = whole_records(data);
    let candidates: Vec<(usize, usize)> = recs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.2 != RecordKind::Write as u8)
        .filter(|(i, r)| recs[i + 1..].iter().any(|w| w.3.is_some_and(|f| f.synced_bytes >= r.1 as u64)))
        .map(|(_, r)| (r.0, r.1))
        .collect();
    let &(from, to) = candidates.get(rng.below(candidates.len().max(1) as u64) as usize)?;
    Some(from + RECORD_HEADER_BYTES + rng.below((to - from - RECORD_HEADER_BYTES) as u64) as usize)
}

/// The segment files of a crashed disk's data directory, in log order.
fn segment_files(disk: &Disk) -> Vec<PathBuf> {
    let data = Path::new(DATA_REL);
    let mut segs: Vec<PathBuf> = disk
        .files
        .keys()
        .filter(|p| p.parent() == Some(data) && p.extension().is_some_and(|e| e == "log"))
        .cloned()
        .collect();
    segs.sort();
    segs
}

/// With a bit flipped in a record that a later write's Write record says a
/// completed sync covered, in the last segment of a disk a power cut left
/// (any sectors of the unsynced writes kept), or in the middle of a
/// segment before the last, the start is refused every time.
#[test]
fn a_bit_flipped_in_synced_bytes_is_refused_after_any_power_cut() {
    let seed = common::seed(0x3434);
    let _guard =
        SeedGuard { test: "a_bit_flipped_in_synced_bytes_is_refused_after_any_power_cut", seed, replay: REPLAY };
    let mut rng = Rng::new(seed);
    let (mut last, mut closed, mut failures) = (0, 0, Vec::new());
    for run in sector_runs() {
        let trace = &run.rec.trace;
        for k in sector_cuts(trace, 12, &mut rng) {
            let cut = trace.cut(k);
            for choices in sector_crashes(1)(&cut, &mut rng).into_iter().skip(1) {
                let disk = cut.disk(&choices);
                let segs = segment_files(&disk);
                let Some(tail) = segs.last() else { continue };
                let mut flips = Vec::new();
                if let Some(at) = vouched_byte(&disk.files[tail], &mut rng) {
                    flips.push((tail.clone(), at));
                    last += 1;
                }
                if let Some(mid) = segs.len().checked_sub(1).filter(|&n| n > 0).map(|n| &segs[n / 2]) {
                    let recs = whole_records(&disk.files[mid]);
                    let r = recs[recs.len() / 2];
                    flips.push((mid.clone(), (r.0 + RECORD_HEADER_BYTES + r.1) / 2));
                    closed += 1;
                }
                for (file, at) in flips {
                    let mut bad = disk.clone();
                    bad.files.get_mut(&file).expect("the segment")[at] ^= 1 << rng.below(8u32);
                    match start_on(&bad, LogOptions::default()) {
                        Err(e) if e.contains("corrupt") => {}
                        other => failures.push(format!(
                            "{}; bit flipped at byte {at} of {}: {:?}",
                            cut.describe(&choices),
                            file.display(),
                            other.map(|m| m.len())
                        )),
                    }
                }
            }
        }
    }
    eprintln!(
        "seed {seed}: {last} flips in a last segment, {closed} in a segment before it, {} not refused",
        failures.len()
    );
    assert!(last >= 10 && closed >= 10, "setup: {last} and {closed} flips");
    assert!(failures.is_empty(), "{} flips were not refused; the first: {}", failures.len(), failures[0]);
}
