//! A full disk is not a dead end: on a real filesystem that fills up, freeing
//! the data by any way there is (PURGE, DELETE_TOPIC, acking every message,
//! DELETE_GROUP of the group that still needed them) frees the disk,
//! whatever the segment size, and produces of big batches succeed again —
//! also after a restart or a SIGKILL while the disk is full or once it was
//! freed, also with another `--segment-bytes-max`.
//!
//! Every segment also keeps a few small messages of a topic nobody frees
//! (`KEEP`): cleaning a segment then means copying them forward first, on
//! a disk that refuses produces, which is where a full disk used to stay
//! full. Every case checks, after a graceful restart, that none of the
//! freed messages came back and that every kept and every later message is
//! there, in order.
//!
//! The broker is `runnel serve` in a child process (a SIGKILL must be
//! able to end it), on a tmpfs of `DISK_BYTES` that each case mounts for
//! itself (`mount -t tmpfs`), which needs root (or CAP_SYS_ADMIN). Where
//! the machine does not allow it (CI in a container, a user account), the
//! test prints why and returns without checking anything: it is skipped,
//! not failed. The mount is unmounted whatever happens (a drop guard).
//! What can be checked without a mount is in tests/storage_failure.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::TempDir;
use common::child::{ChildBroker, End};
use runnel::client::{Client, Error, Fetch};
use runnel::codec::ErrorCode;
use runnel::codec::group::{GroupSettings, Start};

/// The filesystem's size: small, so filling it takes a few thousand
/// produces, and smaller than the default segment (64 MiB), so that with it
/// the whole disk is one segment.
const DISK_BYTES: u64 = 4 << 20;
/// The segment sizes every way of freeing is tried with: many segments on
/// the disk, a few, and one.
const SEGMENT_SIZES: [u64; 3] = [64 << 10, 1 << 20, 64 << 20];
/// Payload of each big message.
const PAYLOAD_BYTES: usize = 1000;
/// Big messages per PRODUCE.
const BATCH_MESSAGES: usize = 16;
/// Payload of each small message kept live through the test.
const KEEP_BYTES: usize = 100;
/// The topic of those: one message after every batch, so every segment
/// keeps a few.
const KEEP: &str = "keep";
/// The topics filled with big messages, then freed.
const TOPICS: [&str; 2] = ["a", "b"];
/// The topic produced to once the disk was freed.
const AFTER: &str = "after";
/// With `Free::DeleteGroup`, the group of `TOPICS` that acks everything,
/// and the one that acks nothing and is then deleted.
const GROUPS: (&str, &str) = ("fast", "slow");
/// How long freeing may take to show (a safety net, not a measurement).
const DEADLINE: Duration = Duration::from_secs(30);

/// A tmpfs mounted on a directory of its own; unmounted on drop.
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes`, or says why it cannot.
    fn mount(tag: &str, bytes: u64) -> Result<Tmpfs, String> {
        let dir = TempDir::new(tag);
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
        if !ok {
            // Something still holds a file there: detach it now, freed once
            // released.
            let lazy = Command::new("umount").arg("-l").arg(self.dir.path()).status();
            if !lazy.is_ok_and(|s| s.success()) {
                eprintln!("full_disk: could not unmount {}", self.dir.path().display());
            }
        }
    }
}

/// How a case frees the big messages.
#[derive(Clone, Copy, Debug)]
enum Free {
    Purge,
    DeleteTopic,
    /// Fetch and ack every message (the default group).
    Ack,
    /// One group acks every message, then the other, which acked none, is
    /// deleted.
    DeleteGroup,
}

/// Where a case ends the broker and starts it again, besides the graceful
/// restart every case ends with.
#[derive(Clone, Copy, Debug)]
enum Restart {
    /// Once the disk is full, before freeing.
    WhileFull(End),
    /// Once the data is freed, before producing again.
    AfterFreeing(End),
}

/// One case: fill the disk with `segment_bytes` segments, free it `free`,
/// with `restart` (restarting with `restart_segment_bytes` segments, and
/// keeping those from then on), produce half the disk again; restart
/// gracefully and check what is there; produce half the disk again.
#[derive(Clone, Copy, Debug)]
struct Case {
    segment_bytes: u64,
    free: Free,
    restart: Option<Restart>,
    restart_segment_bytes: u64,
}

impl Case {
    fn plain(segment_bytes: u64, free: Free) -> Case {
        Case { segment_bytes, free, restart: None, restart_segment_bytes: segment_bytes }
    }
    fn restarted(segment_bytes: u64, free: Free, restart: Restart, restart_segment_bytes: u64) -> Case {
        Case { segment_bytes, free, restart: Some(restart), restart_segment_bytes }
    }
}

/// A broker on the case's tmpfs, with its stderr beside the mount.
struct Disk {
    tmpfs: Tmpfs,
    logs: TempDir,
    starts: usize,
}

impl Disk {
    /// Mounts the case's tmpfs, or prints why the case is skipped.
    fn mount(tag: &str) -> Option<Disk> {
        match Tmpfs::mount(tag, DISK_BYTES) {
            Ok(tmpfs) => Some(Disk { tmpfs, logs: TempDir::new(&format!("{tag}-logs")), starts: 0 }),
            Err(why) => {
                eprintln!("SKIPPED {tag}: {why} (this test needs to mount a tmpfs: run as root)");
                None
            }
        }
    }

    fn start(&mut self, segment_bytes: u64) -> ChildBroker {
        self.starts += 1;
        let stderr = self.logs.path().join(format!("broker-{}.stderr", self.starts));
        ChildBroker::start(&self.tmpfs.data(), &["--segment-bytes-max".into(), segment_bytes.to_string()], &stderr)
    }
}

fn is_storage(e: &Error) -> bool {
    e.code() == Some(ErrorCode::Storage)
}

fn payload(topic: &str, n: usize, bytes: usize) -> Vec<u8> {
    let mut p = format!("{topic}-{n}-").into_bytes();
    p.resize(bytes, b'x');
    p
}

fn big_batch(topic: &str, first: usize) -> Vec<Vec<u8>> {
    (0..BATCH_MESSAGES).map(|i| payload(topic, first + i, PAYLOAD_BYTES)).collect()
}

/// What filling the disk stored.
struct Filled {
    /// Big messages acknowledged.
    big: usize,
    /// The kept messages acknowledged, in order.
    kept: Vec<Vec<u8>>,
}

/// Produces big batches into `TOPICS`, each followed by one small message
/// to `KEEP`, until the broker answers STORAGE.
fn fill(c: &mut Client) -> Filled {
    let mut filled = Filled { big: 0, kept: Vec::new() };
    loop {
        let topic = TOPICS[filled.big / BATCH_MESSAGES % 2];
        match c.produce_batch(topic, &big_batch(topic, filled.big)) {
            Ok(_) => filled.big += BATCH_MESSAGES,
            Err(e) if is_storage(&e) => break,
            Err(e) => panic!("while filling the disk: {e}"),
        }
        let keep = payload(KEEP, filled.kept.len(), KEEP_BYTES);
        match c.produce(KEEP, &keep) {
            Ok(_) => filled.kept.push(keep),
            Err(e) if is_storage(&e) => break,
            Err(e) => panic!("while filling the disk: {e}"),
        }
        assert!((filled.big as u64) * (PAYLOAD_BYTES as u64) < 2 * DISK_BYTES, "the disk never filled");
    }
    assert!(
        (filled.big as u64) * (PAYLOAD_BYTES as u64) > DISK_BYTES / 2,
        "STORAGE after only {} messages: the disk was not full",
        filled.big
    );
    // Still full: not a passing hiccup.
    let e = c.produce_batch(TOPICS[0], &big_batch(TOPICS[0], 0)).expect_err("the disk is full");
    assert!(is_storage(&e), "{e}");
    filled
}

/// Runs `call` until it is not answered STORAGE, or `DEADLINE` passes (an
/// admin frame answered STORAGE may have taken effect in memory; retrying
/// is what a client does).
fn retry<T>(mut call: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    let started = Instant::now();
    loop {
        match call() {
            Err(e) if is_storage(&e) && started.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(5)),
            r => return r,
        }
    }
}

/// Runs an admin call that an earlier try answered STORAGE may have done
/// in memory already: then it is answered `gone`.
fn admin(what: &str, gone: ErrorCode, call: impl FnMut() -> Result<u64, Error>) {
    match retry(call) {
        Ok(_) => {}
        Err(e) if e.code() == Some(gone) => {}
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Creates, before the fill, what `how` needs: with `Free::DeleteGroup`,
/// the two groups of each topic.
fn prepare(c: &mut Client, how: Free) {
    if let Free::DeleteGroup = how {
        for topic in TOPICS {
            for group in [GROUPS.0, GROUPS.1] {
                c.create_group(topic, group, GroupSettings::default(), Start::Earliest).expect("create group");
            }
        }
    }
}

fn free(c: &mut Client, how: Free) {
    for topic in TOPICS {
        match how {
            Free::Purge => admin("PURGE", ErrorCode::UnknownTopic, || c.purge_topic(topic)),
            Free::DeleteTopic => admin("DELETE_TOPIC", ErrorCode::UnknownTopic, || c.delete_topic(topic)),
            Free::Ack => {
                drain(c, topic, "");
            }
            Free::DeleteGroup => {
                drain(c, topic, GROUPS.0);
                admin("DELETE_GROUP", ErrorCode::UnknownGroup, || c.delete_group(topic, GROUPS.1));
            }
        }
    }
}

/// Produces `bytes` of big messages into `AFTER`, each batch retried while
/// the broker is still reclaiming; returns their payloads, or the error of
/// the batch that did not get through (with how many bytes did).
fn produce_again(c: &mut Client, bytes: u64) -> Result<Vec<Vec<u8>>, String> {
    let mut sent = Vec::new();
    while (sent.len() * PAYLOAD_BYTES) < bytes as usize {
        let batch = big_batch(AFTER, sent.len());
        if let Err(e) = retry(|| c.produce_batch(AFTER, &batch)) {
            return Err(format!("{e} (after {} bytes)", sent.len() * PAYLOAD_BYTES));
        }
        sent.extend(batch);
    }
    Ok(sent)
}

/// Every message of `topic` for `group`, fetched and acked.
fn drain(c: &mut Client, topic: &str, group: &str) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    loop {
        let f = Fetch { max_messages: 4096, ack_timeout_ms: 600_000, ..Fetch::default() };
        let msgs = c.fetch_group(topic, group, f).expect("fetch");
        if msgs.is_empty() {
            return got;
        }
        let ids: Vec<u64> = msgs.iter().map(|m| m.id).collect();
        for chunk in ids.chunks(1024) {
            let done = retry(|| c.ack_group(topic, group, chunk)).expect("ack").done;
            assert_eq!(done as usize, chunk.len(), "acks of {topic}");
        }
        got.extend(msgs.into_iter().map(|m| m.payload));
    }
}

/// The broker's count of segments compaction removed, the files in its
/// data directory, and its log, for a failure's message.
fn why(c: &mut Client, b: &ChildBroker, data: &Path) -> String {
    let compactions = c.stat("", "compactions").ok().flatten();
    let mut files: Vec<String> = std::fs::read_dir(data)
        .map(|d| d.flatten().map(|e| format!("{:?} {}", e.file_name(), e.metadata().map_or(0, |m| m.len()))).collect())
        .unwrap_or_default();
    files.sort();
    format!("compactions {compactions:?}; files {files:?}; the broker's log:\n{}", b.log())
}

/// Ends `b` as `how` says and starts it again with `segment_bytes`.
fn restart(disk: &mut Disk, b: ChildBroker, how: End, segment_bytes: u64) -> ChildBroker {
    b.end(how);
    disk.start(segment_bytes)
}

fn run(test: &str, case: Case) {
    let tag = format!("{test}-{}k", case.segment_bytes >> 10);
    let Some(mut disk) = Disk::mount(&tag) else { return };
    let mut b = disk.start(case.segment_bytes);
    let mut c = b.client();
    prepare(&mut c, case.free);
    let filled = fill(&mut c);
    eprintln!(
        "{tag} ({case:?}): {} messages of {PAYLOAD_BYTES} bytes and {} of {KEEP_BYTES} filled the {DISK_BYTES}-byte disk",
        filled.big,
        filled.kept.len()
    );
    if let Some(Restart::WhileFull(how)) = case.restart {
        b = restart(&mut disk, b, how, case.restart_segment_bytes);
        c = b.client();
    }
    free(&mut c, case.free);
    if let Some(Restart::AfterFreeing(how)) = case.restart {
        b = restart(&mut disk, b, how, case.restart_segment_bytes);
        c = b.client();
    }
    let after = produce_again(&mut c, DISK_BYTES / 2).unwrap_or_else(|e| {
        panic!("{tag}: a produce failed after freeing the disk: {e}; {}", why(&mut c, &b, &disk.tmpfs.data()))
    });
    drop(c);
    let b = restart(&mut disk, b, End::Stop, case.restart_segment_bytes);
    let mut c = b.client();
    for topic in TOPICS {
        let back = drain(&mut c, topic, "");
        assert!(back.is_empty(), "{tag}: {} freed messages of topic {topic} came back", back.len());
    }
    assert!(drain(&mut c, KEEP, "") == filled.kept, "{tag}: the kept messages are not all there, in order");
    assert!(drain(&mut c, AFTER, "") == after, "{tag}: the messages produced after freeing are not all there");
    if let Err(e) = produce_again(&mut c, DISK_BYTES / 2) {
        panic!("{tag}: a produce failed after a restart: {e}; {}", why(&mut c, &b, &disk.tmpfs.data()));
    }
    drop(c);
    b.end(End::Stop);
}

/// Runs `free` with every segment size.
fn every_segment_size(test: &str, free: Free) {
    for segment_bytes in SEGMENT_SIZES {
        run(test, Case::plain(segment_bytes, free));
    }
}

#[test]
fn purge_frees_a_full_disk() {
    every_segment_size("full-purge", Free::Purge);
}

#[test]
fn delete_topic_frees_a_full_disk() {
    every_segment_size("full-delete", Free::DeleteTopic);
}

#[test]
fn acking_everything_frees_a_full_disk() {
    every_segment_size("full-ack", Free::Ack);
}

#[test]
fn deleting_the_group_that_held_them_frees_a_full_disk() {
    every_segment_size("full-delete-group", Free::DeleteGroup);
}

#[test]
fn a_sigkill_once_freed_then_produces_succeed() {
    for free in [Free::Purge, Free::DeleteTopic, Free::Ack, Free::DeleteGroup] {
        run("full-kill-freed", Case::restarted(1 << 20, free, Restart::AfterFreeing(End::Kill), 1 << 20));
    }
}

#[test]
fn a_sigkill_while_full_then_freeing_frees_it() {
    run("full-kill-full", Case::restarted(1 << 20, Free::Purge, Restart::WhileFull(End::Kill), 1 << 20));
    run("full-kill-full", Case::restarted(64 << 20, Free::DeleteTopic, Restart::WhileFull(End::Kill), 64 << 20));
}

#[test]
fn a_restart_while_full_with_smaller_segments_then_delete_frees_it() {
    run("full-smaller", Case::restarted(64 << 20, Free::DeleteTopic, Restart::WhileFull(End::Stop), 64 << 10));
}

#[test]
fn a_restart_while_full_with_larger_segments_then_ack_frees_it() {
    run("full-larger", Case::restarted(64 << 10, Free::Ack, Restart::WhileFull(End::Stop), 64 << 20));
}
