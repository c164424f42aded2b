//! Upgrades never lose data: data directories written by earlier builds
//! (`tests/fixtures/*/data`) open in this one and hand out exactly what the
//! build that wrote them handed out (`expected.txt`, see
//! `tests/fixtures/README.md`).
//!
//! The broker runs in-process on a copy of the fixture (recovery may cut
//! reserved space or compact, and the committed files must stay as they
//! were written). Each topic is drained with FETCH and ACK the way
//! `dump.py` drained it, and the listing is compared line by line.

mod common;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::Fetch;
use runnel::log::LogOptions;

/// Copies a fixture's data directory into a fresh temporary one.
fn copy_fixture(name: &str) -> TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("data");
    let dir = TempDir::new(&format!("upgrade-{name}"));
    for entry in fs::read_dir(&src).expect("read fixture dir") {
        let entry = entry.expect("fixture entry");
        fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy fixture file");
    }
    dir
}

/// What a broker on `dir` hands out, in `dump.py`'s format.
fn drain(dir: &Path) -> String {
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    let mut c = server.client();
    let mut topics = c.list_topics().expect("LIST_TOPICS");
    topics.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (name, s) in topics {
        let next_id = c.stat(&name, "next_id").expect("STATS").expect("next_id key");
        let _ = writeln!(
            out,
            "topic {name} ack_timeout_ms={} max_deliveries={} next_id={next_id}",
            s.ack_timeout_ms, s.max_deliveries
        );
        loop {
            let batch = c.fetch(&name, Fetch { max_messages: 1000, ..Fetch::default() }).expect("FETCH");
            if batch.is_empty() {
                break;
            }
            for m in &batch {
                let dead = match m.dead {
                    Some(d) => format!("dead:{}:{}:{}", d.origin_id, d.origin_deliveries, d.reason as u8),
                    None => "-".into(),
                };
                let payload = String::from_utf8_lossy(&m.payload);
                let _ = writeln!(out, "  {name} {} {} {dead} {payload}", m.id, m.delivery_count);
            }
            let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
            c.ack(&name, &ids).expect("ACK");
        }
    }
    server.stop();
    out
}

fn check(name: &str) {
    let expected_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("expected.txt");
    let expected = fs::read_to_string(expected_path).expect("read expected.txt");
    let dir = copy_fixture(name);
    let got = drain(dir.path());
    if got != expected {
        for (i, (g, e)) in got.lines().zip(expected.lines()).enumerate() {
            assert_eq!(g, e, "fixture {name}: line {} differs", i + 1);
        }
        assert_eq!(got.lines().count(), expected.lines().count(), "fixture {name}: line counts differ\n{got}");
    }
}

/// Log record version 1 of every kind, written by commit 59cae68.
#[test]
fn v1_data_directory_opens_with_nothing_lost() {
    check("v1");
}

/// Written by commit e2437c3, the last build before version 2 of Remove
/// and Requeue (which name the consumer group): version 1 of every kind,
/// stopped cleanly (a CLEAN_STOP marker, and the last segment's reserved
/// space after its records).
#[test]
fn v2_data_directory_opens_with_nothing_lost() {
    check("v2");
}

/// Written by commit d934b4a, the last build before version 2 of Produce
/// (which stores each message's properties): Remove records of version 2
/// (naming the default group), every other kind version 1.
#[test]
fn v3_data_directory_opens_with_nothing_lost() {
    check("v3");
}

/// Written by commit 024d8e0, the last build before the consumer groups'
/// records (Topic record version 2, Group, GroupDelete, GroupState):
/// Produce records of version 2, Remove and Requeue records of version 2
/// naming the default group, and Topic records of version 1, whose topics
/// have the default group.
#[test]
fn v4_data_directory_opens_with_nothing_lost() {
    check("v4");
}
