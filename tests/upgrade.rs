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
use std::time::Duration;

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Delivered, Fetch};
use runnel::codec::TopicSettings;
use runnel::codec::schedule::When;
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

/// A topic's line, its settings and next id.
fn topic_line(c: &mut Client, name: &str, s: &TopicSettings, out: &mut String) {
    let next_id = c.stat(name, "next_id").expect("STATS").expect("next_id key");
    let _ = writeln!(
        out,
        "topic {name} ack_timeout_ms={} max_deliveries={} next_id={next_id}",
        s.ack_timeout_ms, s.max_deliveries
    );
}

/// What a broker on `dir` hands out, in `dump.py`'s format.
fn drain(dir: &Path) -> String {
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    let mut c = server.client();
    let mut topics = c.list_topics().expect("LIST_TOPICS");
    topics.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (name, s) in topics {
        topic_line(&mut c, &name, &s, &mut out);
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

/// A delivered message as `dump_groups.py` prints it, after `prefix`
/// (`topic/group`): id, delivery count, dead-letter fields, origin group,
/// properties, payload.
/// With `times` set, the delivery time is among the properties (`at=`),
/// as `dump_v6.py` prints it in version 3.
fn group_line(prefix: &str, m: &Delivered, times: bool) -> String {
    let dead = match m.dead {
        Some(d) => format!("dead:{}:{}:{}", d.origin_id, d.origin_deliveries, d.reason as u8),
        None => "-".into(),
    };
    let origin = if m.origin_group.is_empty() { "-" } else { &m.origin_group };
    let mut props: Vec<String> = m.tags().iter().map(|t| format!("tag={t}")).collect();
    props.extend(m.headers().iter().map(|(k, v)| format!("hdr:{k}={}", String::from_utf8_lossy(v))));
    if let Some(at) = m.deliver_at_ms().filter(|_| times) {
        props.push(format!("at={at}"));
    }
    let props = if props.is_empty() { "-".into() } else { props.join(",") };
    let payload = String::from_utf8_lossy(&m.payload);
    format!("  {prefix} {} {} {dead} {origin} {props} {payload}", m.id, m.delivery_count)
}

/// What a broker on `dir` hands out to each consumer group, in
/// `dump_groups.py`'s format: per topic its settings, its groups' settings
/// and cursors, then each group drained (a topic without groups by its
/// default group, which that FETCH creates).
fn drain_groups(dir: &Path) -> String {
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    // Version 2, as `dump_groups.py` speaks it.
    let mut c = Client::connect_upto(server.addr, b"", 2).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut out = String::new();
    drain_groups_on(&mut c, false, &mut out);
    server.stop();
    out
}

/// What `dump_v6.py` prints: each message named in the fixture's
/// `far.txt` (scheduled 50 years ahead) rescheduled to now, with the answer,
/// then `drain_groups`'s listing in version 3, delivery times shown.
fn drain_v6(dir: &Path) -> String {
    let far = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v6/far.txt");
    let far = fs::read_to_string(far).expect("read far.txt");
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    let mut c = Client::connect_upto(server.addr, b"", 3).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut out = String::new();
    for line in far.lines() {
        let (topic, id) = line.split_once(' ').expect("`topic id`");
        let id: u64 = id.parse().expect("an id");
        let status = match c.reschedule(topic, id, When::At(1)) {
            Ok(_) => 0,
            Err(e) => e.code().map_or(255, |code| code as u8),
        };
        let _ = writeln!(out, "reschedule {topic} {id} status={status}");
    }
    c.ping().expect("PING");
    drain_groups_on(&mut c, true, &mut out);
    server.stop();
    out
}

/// Every topic's settings, its groups' settings and cursors, and each
/// group drained, onto `out`; delivery times shown when `times` is set.
fn drain_groups_on(c: &mut Client, times: bool, out: &mut String) {
    let mut topics = c.list_topics().expect("LIST_TOPICS");
    topics.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, s) in topics {
        topic_line(c, &name, &s, out);
        let groups = c.list_groups(&name).expect("LIST_GROUPS");
        for g in &groups {
            let _ = writeln!(
                out,
                " group '{}' flags={} ack_timeout_ms={} max_deliveries={} filter='{}' cursor={}",
                g.name, g.broadcast as u8, g.ack_timeout_ms, g.max_deliveries, g.filter, g.stats.cursor
            );
        }
        let mut names: Vec<String> = groups.into_iter().map(|g| g.name).collect();
        if names.is_empty() {
            names.push(String::new());
        }
        for g in names {
            loop {
                let batch = c.fetch_group(&name, &g, Fetch { max_messages: 1000, ..Fetch::default() }).expect("FETCH");
                if batch.is_empty() {
                    break;
                }
                for m in &batch {
                    let _ = writeln!(out, "{}", group_line(&format!("{name}/{g}"), m, times));
                }
                let ids: Vec<u64> = batch.iter().map(|m| m.id).collect();
                c.ack_group(&name, &g, &ids).expect("ACK");
            }
        }
    }
}

fn check(name: &str) {
    check_with(name, drain);
}

fn check_with(name: &str, drain: fn(&Path) -> String) {
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

/// Written by commit 1975fa2, the last build before the records of protocol
/// version 3: `make_v5.py`, consumer groups at different positions (one by id,
/// one by time, one reset back, one deleted), tag filters (a list and a
/// regular expression), a broadcast group, tags and headers, per-group
/// in-flight, NACK-delayed and dead-lettered messages, and 4 KiB segments
/// compacted under two groups far apart (GroupState records). Every group's
/// settings, cursor and messages must be as that build handed them out.
#[test]
fn v5_data_directory_opens_with_every_group_as_it_was() {
    check_with("v5", drain_groups);
}

/// Written by commit fbf8bc9, the last build before the records of protocol
/// version 4: `make_v6.py`, the v5 fixture's directory and then version 3's
/// records: scheduled messages (fallen due while it ran, due after it
/// stopped, 50 years ahead; cancelled and rescheduled ones; Due records),
/// NACK delays (Delay records), ACK_PRODUCE records, PRODUCEs acknowledged
/// once written, and 4 KiB segments compacted with all of them alive. The
/// messages 50 years ahead must still be scheduled (RESCHEDULE finds them),
/// and every group must hand out what that build handed out.
#[test]
fn v6_data_directory_opens_with_every_schedule_and_delay_as_it_was() {
    check_with("v6", drain_v6);
}

/// The v5 fixture's dead letters were written before dead letters named
/// their group: they name none, so a REDRIVE naming the group that made
/// them moves none of them, and one with the empty group moves both, for
/// every group.
#[test]
fn v5_dead_letters_name_no_group_and_go_back_for_every_group() {
    let dir = copy_fixture("v5");
    let server = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = server.client_v2();
    assert_eq!(c.redrive_group("shop", "billing", 0).expect("REDRIVE billing"), 0);
    assert_eq!(c.redrive_group("shop", "", 0).expect("REDRIVE"), 2);
    let f = Fetch { max_messages: 1000, ..Fetch::default() };
    let got = c.fetch_group("shop", "later", f).expect("FETCH");
    let tail: Vec<&[u8]> = got.iter().rev().take(2).rev().map(|m| m.payload.as_slice()).collect();
    assert_eq!(tail, [&b"item-7"[..], b"item-8"], "a group that never had them gets them");
    server.stop();
}
