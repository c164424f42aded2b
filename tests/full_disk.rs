//! A full disk is not a dead end: on a real filesystem that fills up, freeing
//! the data (PURGE, DELETE, or acking every message) frees the disk, whatever
//! the segment size, and produces succeed again — also after a restart, also
//! a restart while the disk is full, also with another `--segment-bytes-max`.
//!
//! Each test mounts a tmpfs of `DISK_BYTES` of its own (`mount -t tmpfs`),
//! which needs root (or CAP_SYS_ADMIN). Where the machine does not allow it
//! (CI in a container, a user account), the test prints why and returns
//! without checking anything: it is skipped, not failed. The mount is
//! unmounted whatever happens (a drop guard). What can be checked without a
//! mount is in tests/storage_failure.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Error, Fetch};
use runnel::codec::ErrorCode;
use runnel::log::LogOptions;

/// The filesystem's size: small, so filling it takes a few thousand
/// produces, and smaller than the default segment (64 MiB), so the whole
/// disk is one segment.
const DISK_BYTES: u64 = 4 << 20;
/// A small segment size: the disk holds many.
const SMALL_SEGMENT_BYTES: u64 = 64 << 10;
/// Payload of each message.
const PAYLOAD_BYTES: usize = 1000;
/// Messages per PRODUCE while filling.
const BATCH_MESSAGES: usize = 16;
/// How long freeing may take to show (a safety net, not a measurement).
const DEADLINE: Duration = Duration::from_secs(60);

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

/// Mounts a tmpfs for one test, or prints why the test is skipped.
fn tmpfs(test: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(test, DISK_BYTES) {
        Ok(t) => Some(t),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why} (this test needs to mount a tmpfs: run as root)");
            None
        }
    }
}

fn segments(bytes: u64) -> LogOptions {
    LogOptions { segment_bytes_max: bytes, ..LogOptions::default() }
}

fn start(dir: &Path, log: LogOptions) -> Server {
    Server::start_in(Config::default(), log, dir)
}

fn is_storage(e: &Error) -> bool {
    e.code() == Some(ErrorCode::Storage)
}

fn payload(topic: &str, n: usize) -> Vec<u8> {
    let mut p = format!("{topic}-{n}-").into_bytes();
    p.resize(PAYLOAD_BYTES, b'x');
    p
}

const TOPICS: [&str; 2] = ["a", "b"];

/// Produces into both topics until the broker answers STORAGE; returns how
/// many messages were acknowledged.
fn fill(c: &mut Client) -> usize {
    let mut acked = 0;
    loop {
        let topic = TOPICS[acked / BATCH_MESSAGES % 2];
        let batch: Vec<Vec<u8>> = (0..BATCH_MESSAGES).map(|i| payload(topic, acked + i)).collect();
        match c.produce_batch(topic, &batch) {
            Ok(_) => acked += BATCH_MESSAGES,
            Err(e) if is_storage(&e) => break,
            Err(e) => panic!("while filling the disk: {e}"),
        }
        assert!((acked as u64) * (PAYLOAD_BYTES as u64) < 2 * DISK_BYTES, "the disk never filled");
    }
    assert!(
        (acked as u64) * (PAYLOAD_BYTES as u64) > DISK_BYTES / 2,
        "STORAGE after only {acked} messages: the disk was not full"
    );
    // Still full: not a passing hiccup.
    let more: Vec<Vec<u8>> = (0..BATCH_MESSAGES).map(|i| payload("a", i)).collect();
    let e = c.produce_batch("a", &more).expect_err("the disk is full");
    assert!(is_storage(&e), "{e}");
    acked
}

/// How the test frees the data.
#[derive(Clone, Copy, Debug)]
enum Free {
    Purge,
    Delete,
    /// Fetch and ack every message.
    Ack,
}

/// Runs `call` until it is not answered STORAGE (an admin frame answered
/// STORAGE may have taken effect in memory; retrying is what a client does).
fn retry<T>(what: &str, mut call: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    let started = Instant::now();
    loop {
        match call() {
            Err(e) if is_storage(&e) && started.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(5)),
            Err(e) if is_storage(&e) => panic!("{what}: still STORAGE after {DEADLINE:?}: {e}"),
            r => return r,
        }
    }
}

fn free(c: &mut Client, how: Free) {
    for topic in TOPICS {
        match how {
            Free::Purge => {
                retry("PURGE", || c.purge_topic(topic)).expect("purge");
            }
            Free::Delete => match retry("DELETE", || c.delete_topic(topic)) {
                Ok(_) => {}
                // An earlier try answered STORAGE but deleted it in memory.
                Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => {}
                Err(e) => panic!("delete: {e}"),
            },
            Free::Ack => loop {
                let f = Fetch { max_messages: 4096, ack_timeout_ms: 600_000, ..Fetch::default() };
                let ids: Vec<u64> = c.fetch(topic, f).expect("fetch").iter().map(|m| m.id).collect();
                if ids.is_empty() {
                    break;
                }
                for chunk in ids.chunks(1024) {
                    assert_eq!(c.ack(topic, chunk).expect("ack").done as usize, chunk.len());
                }
            },
        }
    }
}

/// Produces `bytes` of new messages into topic "after", each batch retried
/// while the broker is still reclaiming; returns their payloads.
fn produce_again(c: &mut Client, bytes: u64) -> Vec<Vec<u8>> {
    let mut sent = Vec::new();
    while (sent.len() * PAYLOAD_BYTES) < bytes as usize {
        let batch: Vec<Vec<u8>> = (0..BATCH_MESSAGES).map(|i| payload("after", sent.len() + i)).collect();
        retry("PRODUCE after freeing", || c.produce_batch("after", &batch)).expect("produce after freeing");
        sent.extend(batch);
    }
    sent
}

/// Every message of `topic`, fetched and acked.
fn drain(c: &mut Client, topic: &str) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    loop {
        let f = Fetch { max_messages: 4096, ack_timeout_ms: 600_000, ..Fetch::default() };
        let msgs = c.fetch(topic, f).expect("fetch");
        if msgs.is_empty() {
            return got;
        }
        let ids: Vec<u64> = msgs.iter().map(|m| m.id).collect();
        for chunk in ids.chunks(1024) {
            c.ack(topic, chunk).expect("ack");
        }
        got.extend(msgs.into_iter().map(|m| m.payload));
    }
}

/// One scenario: fill the disk with `first` segments; optionally restart
/// while it is full with `full_restart` segments; free the data `how`;
/// produce a quarter of the disk again; restart with `last` segments and
/// check what is there; produce again.
fn scenario(test: &str, first: u64, full_restart: Option<u64>, how: Free, last: u64) {
    let Some(disk) = tmpfs(test) else { return };
    let data = disk.data();
    let srv = start(&data, segments(first));
    let mut c = srv.client();
    let filled = fill(&mut c);
    eprintln!("{test}: {filled} messages of {PAYLOAD_BYTES} bytes filled the {DISK_BYTES}-byte disk");
    let srv = match full_restart {
        Some(bytes) => {
            drop(c);
            srv.stop();
            start(&data, segments(bytes))
        }
        None => srv,
    };
    let mut c = srv.client();
    free(&mut c, how);
    let after = produce_again(&mut c, DISK_BYTES / 4);
    drop(c);
    srv.stop();

    let srv = start(&data, segments(last));
    let mut c = srv.client();
    for topic in TOPICS {
        let back = drain(&mut c, topic);
        assert!(back.is_empty(), "{test}: {} freed messages of topic {topic} came back", back.len());
    }
    assert_eq!(drain(&mut c, "after"), after, "{test}: the messages produced after freeing");
    produce_again(&mut c, DISK_BYTES / 4);
}

#[test]
fn purge_frees_a_full_disk_with_default_segments() {
    scenario("full-purge-default", 64 << 20, None, Free::Purge, 64 << 20);
}

#[test]
fn delete_frees_a_full_disk_with_small_segments() {
    scenario("full-delete-small", SMALL_SEGMENT_BYTES, None, Free::Delete, SMALL_SEGMENT_BYTES);
}

#[test]
fn acking_everything_frees_a_full_disk_with_default_segments() {
    scenario("full-ack-default", 64 << 20, None, Free::Ack, 64 << 20);
}

#[test]
fn acking_everything_frees_a_full_disk_with_small_segments() {
    scenario("full-ack-small", SMALL_SEGMENT_BYTES, None, Free::Ack, SMALL_SEGMENT_BYTES);
}

#[test]
fn a_restart_on_a_full_disk_then_purge_frees_it() {
    scenario("full-restart-purge", 64 << 20, Some(64 << 20), Free::Purge, 64 << 20);
}

#[test]
fn a_restart_on_a_full_disk_with_smaller_segments_then_delete_frees_it() {
    scenario("full-restart-smaller", 64 << 20, Some(SMALL_SEGMENT_BYTES), Free::Delete, SMALL_SEGMENT_BYTES);
}

#[test]
fn a_restart_on_a_full_disk_with_larger_segments_then_ack_frees_it() {
    scenario("full-restart-larger", SMALL_SEGMENT_BYTES, Some(64 << 20), Free::Ack, 64 << 20);
}
