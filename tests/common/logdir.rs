//! Helpers for tests that damage a data directory and start a broker on it.
//!
//! They read only the record *frame* of docs/log-format.md (`u32 len`,
//! `u32 crc`, `u8 kind`, `u8 version`, `u16 reserved`, then `len` body
//! bytes), never the record bodies: which messages a record holds is found
//! by searching it for their payloads, each of which is unique. So a change
//! to a body layout does not break these tests, and nothing here repeats
//! the broker's replay logic. What a recovered broker holds is read back as
//! a client sees it: a broker started on the directory, every topic fetched
//! with `wait_ms` 0.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runnel::broker::Config;
use runnel::client::{Client, Fetch};
use runnel::log::{CLEAN_STOP_FILE, LogOptions};

use super::{Server, TempDir};

/// Bytes in a record's frame header (docs/log-format.md).
pub const HEADER_BYTES: u64 = 12;
/// Record kinds the tests recognise (docs/log-format.md).
pub const KIND_TOPIC: u8 = 1;
pub const KIND_PRODUCE: u8 = 4;
pub const KIND_REMOVE: u8 = 5;
/// The Write record each write of the log begins with (docs/log-format.md,
/// "Writes").
pub const KIND_WRITE: u8 = 18;

/// Messages, by (topic, id), with their payloads.
pub type Msgs = BTreeMap<(String, u64), Vec<u8>>;

/// One record of a segment file, by its frame only.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    /// Byte offset in its file of its first header byte.
    pub start: u64,
    /// Byte offset in its file just past its body.
    pub end: u64,
    pub kind: u8,
}

/// The records of an undamaged segment file, in order, up to the zeros of
/// the space reserved ahead of them (docs/log-format.md).
pub fn records(data: &[u8]) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < data.len() as u64 {
        let p = pos as usize;
        if data[p..].iter().all(|&b| b == 0) {
            break;
        }
        assert!(data.len() - p >= HEADER_BYTES as usize, "test setup: a record header is cut at byte {pos}");
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4 bytes")) as u64;
        let end = pos + HEADER_BYTES + len;
        assert!(end <= data.len() as u64, "test setup: a record at byte {pos} runs past the end");
        out.push(Rec { start: pos, end, kind: data[p + 8] });
        pos = end;
    }
    out
}

/// The records of `recs` that are not Write records: what the broker
/// wrote.
pub fn broker_records(recs: &[Rec]) -> Vec<Rec> {
    recs.iter().copied().filter(|r| r.kind != KIND_WRITE).collect()
}

/// Where the write holding record `r` of `recs` begins: at the Write
/// record before it (every write the log issues begins with one), or at
/// `r` where none does.
pub fn write_start(recs: &[Rec], r: Rec) -> u64 {
    recs.iter().rev().find(|w| w.kind == KIND_WRITE && w.start <= r.start).map_or(r.start, |w| w.start)
}

/// Bytes of the Write records among `recs`.
pub fn write_record_bytes(recs: &[Rec]) -> u64 {
    recs.iter().filter(|r| r.kind == KIND_WRITE).map(|r| r.end - r.start).sum()
}

/// The segment files of a data directory, in log order.
pub fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .expect("read data dir")
        .filter_map(|e| {
            let p = e.expect("dir entry").path();
            let base = p.file_name()?.to_str()?.strip_suffix(".log")?.parse::<u64>().ok()?;
            Some((base, p))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// The log offset a segment file's name gives.
pub fn base_of(p: &Path) -> u64 {
    p.file_name().and_then(|n| n.to_str()?.strip_suffix(".log")?.parse().ok()).expect("a segment file name")
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Copies every file of `src` into a fresh temporary directory.
pub fn copy_dir(src: &Path, tag: &str) -> TempDir {
    let dst = TempDir::new(tag);
    for e in fs::read_dir(src).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_file() {
            fs::copy(&p, dst.path().join(p.file_name().expect("name"))).expect("copy file");
        }
    }
    dst
}

/// Every file of `dir` with its bytes: to check that something changed
/// nothing.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let p = e.expect("entry").path();
            (p.file_name().expect("name").to_string_lossy().into_owned(), fs::read(&p).expect("read file"))
        })
        .collect()
}

/// Makes `dir` look like the data directory of a run that crashed: a
/// crash leaves no clean-stop marker.
pub fn crashed(dir: &Path) {
    fs::remove_file(dir.join(CLEAN_STOP_FILE)).expect("a graceful stop left a clean-stop marker");
}

pub fn file_len(p: &Path) -> u64 {
    fs::metadata(p).expect("metadata").len()
}

/// Every message a broker started on `dir` holds, fetched like a client.
pub fn fetch_all(dir: &Path) -> Msgs {
    try_fetch_all(dir).unwrap_or_else(|e| panic!("bind broker: {e}"))
}

/// `fetch_all`, or why the broker did not start on `dir`.
pub fn try_fetch_all(dir: &Path) -> Result<Msgs, String> {
    try_fetch_all_with(dir, LogOptions::default())
}

/// `try_fetch_all` with a broker whose log is opened with `log`.
pub fn try_fetch_all_with(dir: &Path, log: LogOptions) -> Result<Msgs, String> {
    let srv = Server::try_start_in(Config::default(), log, dir)?;
    let mut c: Client = srv.client();
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut out = Msgs::new();
    for (topic, _) in c.list_topics().expect("list topics") {
        loop {
            let f = Fetch { max_messages: 8192, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
            let msgs = c.fetch(&topic, f).expect("fetch");
            if msgs.is_empty() {
                break;
            }
            for m in msgs {
                let again = out.insert((topic.clone(), m.id), m.payload);
                assert!(again.is_none(), "message {topic}/{} delivered twice in one drain", m.id);
            }
        }
    }
    drop(c);
    srv.stop();
    Ok(out)
}

/// `msgs` without the messages whose payload is in `data`.
pub fn without_payloads_in(msgs: &Msgs, data: &[u8]) -> Msgs {
    msgs.iter().filter(|(_, p)| !contains(data, p)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Asserts that every recovered message was produced, with its payload.
pub fn assert_nothing_invented(got: &Msgs, produced: &Msgs, ctx: &str) {
    for (k, p) in got {
        match produced.get(k) {
            Some(q) => assert!(p == q, "{ctx}: message {k:?} came back with a different payload"),
            None => panic!("{ctx}: message {k:?} was never produced (payload {:?})", String::from_utf8_lossy(p)),
        }
    }
}

/// Asserts that `got` is `expected`, naming the messages missing and the
/// ones too many (by key; payloads compared too) rather than dumping both.
pub fn assert_msgs_eq(got: &Msgs, expected: &Msgs, ctx: &str) {
    let missing: Vec<_> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    let changed: Vec<_> = got.iter().filter(|(k, p)| expected.get(*k).is_some_and(|q| q != *p)).map(|e| e.0).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && changed.is_empty(),
        "{ctx}: {} messages held, {} expected; missing {missing:?}; too many {extra:?}; payload changed {changed:?}",
        got.len(),
        expected.len()
    );
}
