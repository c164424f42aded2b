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
use runnel::client::{Client, Delivered, Fetch, Inspection};
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

/// How a listing shows what it drains: as `dump_groups.py` prints it
/// (version 2), as `dump_v6.py` (delivery times among the properties), or
/// as `dump_v7.py` (every property in its order, the topic's dedup window).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listing {
    V5,
    V6,
    V7,
}

/// A topic's line, its settings (with `Listing::V7`, its dedup window) and
/// next id.
fn topic_line(c: &mut Client, name: &str, s: &TopicSettings, listing: Listing, out: &mut String) {
    let next_id = c.stat(name, "next_id").expect("STATS").expect("next_id key");
    let window = match listing {
        Listing::V7 => {
            let window = c.stat(name, "dedup_window_ms").expect("STATS").expect("dedup_window_ms key");
            format!(" dedup_window_ms={window}")
        }
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "topic {name} ack_timeout_ms={} max_deliveries={}{window} next_id={next_id}",
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
        topic_line(&mut c, &name, &s, Listing::V5, &mut out);
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
/// With `Listing::V6` the delivery time is among the properties (`at=`),
/// as `dump_v6.py` prints it in version 3; with `Listing::V7` every
/// property is shown in its order, as `dump_v7.py` prints them.
fn group_line(prefix: &str, m: &Delivered, listing: Listing) -> String {
    let dead = match m.dead {
        Some(d) => format!("dead:{}:{}:{}", d.origin_id, d.origin_deliveries, d.reason as u8),
        None => "-".into(),
    };
    let origin = if m.origin_group.is_empty() { "-" } else { &m.origin_group };
    let mut props: Vec<String> = m.tags().iter().map(|t| format!("tag={t}")).collect();
    props.extend(m.headers().iter().map(|(k, v)| format!("hdr:{k}={}", String::from_utf8_lossy(v))));
    if let Some(at) = m.deliver_at_ms().filter(|_| listing == Listing::V6) {
        props.push(format!("at={at}"));
    }
    let props = match listing {
        Listing::V7 => render_props(&m.props),
        _ if props.is_empty() => "-".into(),
        _ => props.join(","),
    };
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
    drain_groups_on(&mut c, Listing::V5, &mut out);
    server.stop();
    out
}

/// What `dump_v6.py` prints: each message named in the fixture's
/// `far.txt` (scheduled 50 years ahead) rescheduled to now, with the answer,
/// then `drain_groups`'s listing in version 3, delivery times shown.
fn drain_v6(dir: &Path) -> String {
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    let mut c = Client::connect_upto(server.addr, b"", 3).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut out = String::new();
    reschedule_far(&mut c, "v6", &mut out);
    drain_groups_on(&mut c, Listing::V6, &mut out);
    server.stop();
    out
}

/// Reschedules to now each message named in the fixture's `far.txt`
/// (scheduled 50 years ahead), with the answer, onto `out`.
fn reschedule_far(c: &mut Client, fixture: &str, out: &mut String) {
    let far = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture).join("far.txt");
    let far = fs::read_to_string(far).expect("read far.txt");
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
}

/// What `dump_v7.py` prints: `reschedule_far`'s lines, each key named in
/// the fixture's `keys.txt` looked up (every message the index holds under
/// it, and its state in every group), then every topic with its dedup
/// window and every group drained in version 4, all properties shown.
fn drain_v7(dir: &Path) -> String {
    drain_v7_of(dir, "v7")
}

/// `drain_v7` of fixture `name`, a directory `make_v7.py` wrote (its
/// `far.txt` and `keys.txt`).
fn drain_v7_of(dir: &Path, name: &str) -> String {
    let server = Server::start_in(Config::default(), LogOptions::default(), dir);
    let mut c = Client::connect_upto(server.addr, b"", 4).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut out = String::new();
    reschedule_far(&mut c, name, &mut out);
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("keys.txt");
    for line in fs::read_to_string(keys).expect("read keys.txt").lines() {
        let (topic, key) = line.split_once(' ').expect("`topic key`");
        for found in c.lookup(topic, key.as_bytes()).expect("LOOKUP") {
            lookup_lines(topic, key, &found, &mut out);
        }
    }
    drain_groups_on(&mut c, Listing::V7, &mut out);
    server.stop();
    out
}

/// One LOOKUP entry and its group lines, as `dump_v7.py` prints them.
fn lookup_lines(topic: &str, key: &str, found: &Inspection, out: &mut String) {
    let m = found.message.as_ref();
    let flags = m.is_some() as u8
        | (m.is_some_and(|m| m.dead.is_some()) as u8) << 1
        | (m.is_some_and(|m| m.payload.is_some()) as u8) << 2;
    let _ = writeln!(
        out,
        "lookup {topic} {key} {} flags={flags} born_ms={} {} len={}",
        found.id,
        m.map_or(0, |m| m.born_ms),
        render_props(m.map_or(&[][..], |m| &m.props)),
        m.map_or(0, |m| m.len)
    );
    for g in &found.groups {
        let _ = writeln!(
            out,
            "  '{}' state={} deliveries={} until_ms={} consumer={} dead_reason={} '{}'",
            g.group, g.state as u8, g.deliveries, g.until_ms, g.consumer, g.dead_reason, g.last_nack_reason
        );
    }
}

/// A message's properties in their order, as `v2proto.render_props` shows
/// them: `tag=`, `hdr:k=v`, `at=`, `key=`, `dedup=`, or `-` for none.
fn render_props(raw: &[u8]) -> String {
    let lossy = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    let mut items = Vec::new();
    let mut p = 0;
    while p + 3 <= raw.len() {
        let len = u16::from_le_bytes([raw[p + 1], raw[p + 2]]) as usize;
        let v = &raw[p + 3..p + 3 + len];
        items.push(match raw[p] {
            1 => format!("tag={}", lossy(v)),
            3 => format!("at={}", u64::from_le_bytes(v.try_into().expect("8 bytes"))),
            5 => format!("key={}", lossy(v)),
            6 => format!("dedup={}", lossy(v)),
            _ => {
                let k = u16::from_le_bytes([v[0], v[1]]) as usize;
                format!("hdr:{}={}", lossy(&v[2..2 + k]), lossy(&v[2 + k..]))
            }
        });
        p += 3 + len;
    }
    if items.is_empty() { "-".into() } else { items.join(",") }
}

/// Every topic's settings, its groups' settings and cursors, and each
/// group drained, onto `out`, shown as `listing` says.
fn drain_groups_on(c: &mut Client, listing: Listing, out: &mut String) {
    let mut topics = c.list_topics().expect("LIST_TOPICS");
    topics.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, s) in topics {
        topic_line(c, &name, &s, listing, out);
        let groups = c.list_groups(&name).expect("LIST_GROUPS");
        for g in &groups {
            let flags = g.broadcast as u8 | (g.ordered as u8) << 1;
            let _ = writeln!(
                out,
                " group '{}' flags={flags} ack_timeout_ms={} max_deliveries={} filter='{}' cursor={}",
                g.name, g.ack_timeout_ms, g.max_deliveries, g.filter, g.stats.cursor
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
                    let _ = writeln!(out, "{}", group_line(&format!("{name}/{g}"), m, listing));
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

/// The group cursors this build reports other than the build that wrote
/// the fixture did, each checked here: (fixture, line of `expected.txt`,
/// that build's cursor, this build's). Those builds, reopening a data
/// directory, put a group's cursor back at its last restated position when
/// every message it had acked past it was released; this build gives back
/// the cursor the group had before the restart. What each group is handed
/// is the same.
const CURSORS_NOW: &[(&str, usize, u64, u64)] =
    &[("v5", 46, 0, 8), ("v5", 49, 0, 4), ("v5", 175, 493, 517), ("v6", 6, 791, 881), ("v7", 103, 1031, 1121)];

/// `expected` with the cursors of `CURSORS_NOW` for fixture `name`.
fn with_cursors_now(name: &str, expected: &str) -> String {
    let mut lines: Vec<String> = expected.lines().map(str::to_string).collect();
    for &(_, line, then, now) in CURSORS_NOW.iter().filter(|c| c.0 == name) {
        let l = &mut lines[line - 1];
        let then = format!(" cursor={then}");
        assert!(l.ends_with(&then), "fixture {name}: line {line} does not end with{then}: {l}");
        *l = format!("{} cursor={now}", &l[..l.len() - then.len()]);
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn check_with(name: &str, drain: fn(&Path) -> String) {
    let expected_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("expected.txt");
    let expected = with_cursors_now(name, &fs::read_to_string(expected_path).expect("read expected.txt"));
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

/// Written by commit 77c2238, with every record of protocol version 4:
/// `make_v7.py`, the v6 fixture's directory and
/// then version 4's records: topics with their own dedup window (Topic
/// record version 3), keyed messages and messages with dedup ids (Dedup
/// records where compaction restated the windows), an ordered group (Group
/// flag 0x02) with keyed messages in flight and others waiting behind their
/// key, and Deliver records (messages in flight at the stop, some fetched
/// twice). Every topic's dedup window setting, every group's flags, what
/// LOOKUP finds under each key and what every group hands out must be as
/// that build showed them. (The windows themselves have passed by the time
/// the test runs, so no duplicate is checked against them.)
#[test]
fn v7_data_directory_opens_with_every_key_dedup_window_and_delivery_as_it_was() {
    check_with("v7", drain_v7);
}

/// Written by commit a50b6ae, the last build before Write records (every
/// write of the log framed, docs/log-format.md "Writes"): `make_v7.py`,
/// as the v7 fixture, so records of every kind and no Write record. It
/// opens with everything as that build showed it; the drain's first write
/// appends to the last segment that build wrote.
#[test]
fn v8_data_directory_written_before_framing_opens_with_nothing_lost() {
    check_with("v8", |dir| drain_v7_of(dir, "v8"));
}

/// A segment written before framing is appended to after a Write record of
/// no records that says every byte before it is durable (the start synced
/// them), so that damage to what the older build wrote is refused after
/// the append, and a write torn after it is cut whole.
#[test]
fn v8_last_segment_is_framed_from_where_the_older_build_left_it() {
    use runnel::log::{RECORD_HEADER_BYTES, RecordKind, WRITE_RECORD_BYTES, WriteFrame};
    let dir = copy_fixture("v8");
    let last = {
        let mut segs: Vec<_> = fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(|e| Some(e.ok()?.path()).filter(|p| p.extension().is_some_and(|x| x == "log")))
            .collect();
        segs.sort();
        segs.pop().expect("a segment")
    };
    let old = fs::read(&last).expect("read");
    // Where its records end: the first header past them is followed by
    // zeros only (reserved space).
    let mut old_end = 0;
    while old[old_end..].iter().any(|&b| b != 0) {
        old_end += RECORD_HEADER_BYTES + u32::from_le_bytes(old[old_end..old_end + 4].try_into().expect("4")) as usize;
    }
    let server = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    server.client().produce("after", b"written by this build").expect("produce");
    server.stop();
    let data = fs::read(&last).expect("read");
    assert_eq!(&data[..old_end], &old[..old_end], "what the older build wrote is kept as it was");
    let at = |i: usize| {
        let len = u32::from_le_bytes(data[i..i + 4].try_into().expect("4 bytes")) as usize;
        (data[i + 8], WriteFrame::decode(&data[i + RECORD_HEADER_BYTES..i + RECORD_HEADER_BYTES + len]))
    };
    let (kind, frame) = at(old_end);
    assert_eq!(kind, RecordKind::Write as u8, "a Write record right where the older build's records end");
    let frame = frame.expect("a Write record's body");
    assert_eq!((frame.synced_bytes, frame.records_bytes), (old_end as u64, 0), "{frame:?}");
    let (kind, next) = at(old_end + WRITE_RECORD_BYTES);
    assert_eq!(kind, RecordKind::Write as u8, "the write of records after it, framed");
    assert!(next.is_some_and(|f| f.synced_bytes == (old_end + WRITE_RECORD_BYTES) as u64), "{next:?}");

    // As after a crash: damage to the older build's bytes is refused, and
    // the write torn after them is cut whole.
    fs::remove_file(dir.path().join(runnel::log::CLEAN_STOP_FILE)).expect("a clean stop left its marker");
    let open = || runnel::log::Log::open(dir.path(), LogOptions::default(), |_| Ok(()));
    let mut bad = data.clone();
    bad[old_end - 3] ^= 0x40;
    fs::write(&last, &bad).expect("write");
    assert!(matches!(open(), Err(runnel::log::OpenError::Corrupt { .. })), "damage the first Write record vouches for");
    let torn = old_end + 2 * WRITE_RECORD_BYTES + 5;
    fs::write(&last, &data[..torn]).expect("write");
    let (_, recovery) = open().unwrap_or_else(|e| panic!("a torn write after them is cut: {e}"));
    assert_eq!(recovery.truncated_bytes, (torn - old_end - WRITE_RECORD_BYTES) as u64, "cut at the torn write");
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
