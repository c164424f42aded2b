//! Dead letters of consumer groups over the network: the copy in
//! `<topic>.dlq` names the group that dead-lettered it (through a restart,
//! compaction and a later REDRIVE), and a REDRIVE naming a group returns
//! that group's dead letters to it alone, across a restart and compaction.

mod common;

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Delivered, Fetch, ProduceMessage};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{DeadReason, ErrorCode};
use runnel::log::LogOptions;

fn ids(got: &[Delivered]) -> Vec<u64> {
    got.iter().map(|m| m.id).collect()
}

/// Everything group `g` has ready, fetched and left in flight.
fn take(c: &mut Client, topic: &str, g: &str) -> Vec<Delivered> {
    let f = Fetch { max_messages: 1000, ack_timeout_ms: 600_000, ..Fetch::default() };
    c.fetch_group(topic, g, f).expect("fetch")
}

fn create(c: &mut Client, topic: &str, g: &str) {
    c.create_group(topic, g, GroupSettings::default(), Start::Earliest).expect("create group");
}

/// Small segments, so that a few hundred messages make compaction run.
fn small_segments() -> LogOptions {
    LogOptions { segment_bytes_max: 16 << 10, ..LogOptions::default() }
}

/// Produces and acks on another topic until compaction has removed at
/// least `n` segments.
fn churn_until_compacted(c: &mut Client, n: u64) {
    let payload = vec![b'p'; 200];
    for _ in 0..2000 {
        let (first, k) = c.produce_batch("churn", &[payload.as_slice(); 8]).expect("produce");
        c.fetch("churn", Fetch { max_messages: 100, ..Fetch::default() }).expect("fetch");
        c.ack("churn", &(first..first + u64::from(k)).collect::<Vec<_>>()).expect("ack");
        if c.stat("", "compactions").expect("stats").unwrap_or(0) >= n {
            return;
        }
    }
    panic!("compaction did not run {n} times");
}

/// `(origin_id, origin_group, tags)` of each dead letter `g` of `t.dlq`
/// has ready, fetched and left in flight.
fn dead_letters(c: &mut Client, g: &str) -> Vec<(u64, String, Vec<String>)> {
    let got = take(c, "t.dlq", g);
    got.iter()
        .map(|m| {
            let d = m.dead.expect("a dead letter has its dead-letter fields");
            (d.origin_id, m.origin_group.clone(), m.tags().iter().map(|t| t.to_string()).collect())
        })
        .collect()
}

#[test]
fn a_dead_letter_names_its_group_through_restart_compaction_and_redrive() {
    let dir = TempDir::new("dlq-origin");
    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    create(&mut c, "t", "billing");
    create(&mut c, "t", "");
    let (a, _) = c.produce_messages("t", &[ProduceMessage::new(b"a").tag("eu")]).unwrap();
    let b = c.produce("t", b"b").unwrap();
    assert_eq!(ids(&take(&mut c, "t", "billing")), vec![a, b]);
    c.nack_group("t", "billing", &[a], 0, true).unwrap();
    c.ack_group("t", "billing", &[b]).unwrap();
    assert_eq!(ids(&take(&mut c, "t", "")), vec![a, b], "the default group reads on");
    c.nack_group("t", "", &[b], 0, true).unwrap();
    // The dead letters' group names: billing's; the default group's none.
    let mut v1 = srv.client();
    let got = v1.fetch("t.dlq", Fetch { max_messages: 10, wait_ms: 0, ..Fetch::default() }).unwrap();
    assert!(got.iter().all(|m| m.origin_group.is_empty() && m.props.is_empty()), "version 1 sees neither");
    v1.nack("t.dlq", &ids(&got), 0, false).unwrap();
    drop(v1);
    let dead = dead_letters(&mut c, "");
    assert_eq!(dead, [(a, "billing".to_string(), vec!["eu".to_string()]), (b, String::new(), vec![])]);
    churn_until_compacted(&mut c, 8);
    drop(c);
    srv.stop();

    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    assert_eq!(dead_letters(&mut c, "after"), dead, "a restart after compaction keeps the origin group");
    // Redriven to billing and dead again: named billing again.
    assert_eq!(c.redrive_group("t", "billing", 0).unwrap(), 1);
    let again = take(&mut c, "t", "billing");
    assert_eq!((again.len(), again[0].payload.as_slice(), again[0].tags()), (1, &b"a"[..], vec!["eu"]));
    assert!(again[0].dead.is_none() && again[0].origin_group.is_empty());
    c.nack_group("t", "billing", &[again[0].id], 0, true).unwrap();
    let newest = dead_letters(&mut c, "after");
    assert_eq!(newest, [(again[0].id, "billing".to_string(), vec!["eu".to_string()])]);
}

#[test]
fn a_redrive_naming_a_group_reaches_that_group_alone_across_a_restart() {
    let dir = TempDir::new("dlq-redrive");
    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    for g in ["a", "b", "c"] {
        create(&mut c, "t", g);
    }
    let (m1, _) = c.produce_batch("t", &[b"one", b"two"]).unwrap();
    let m2 = m1 + 1;
    assert_eq!(ids(&take(&mut c, "t", "a")), vec![m1, m2]);
    c.nack_group("t", "a", &[m1], 0, true).unwrap();
    c.ack_group("t", "a", &[m2]).unwrap();
    assert_eq!(ids(&take(&mut c, "t", "b")), vec![m1, m2]);
    c.nack_group("t", "b", &[m2], 0, true).unwrap();
    c.ack_group("t", "b", &[m1]).unwrap();
    // c has read nothing yet; a group of the dead-letter topic holds both
    // dead letters in flight, which a REDRIVE does not wait for.
    assert_eq!(take(&mut c, "t.dlq", "reader").len(), 2);
    assert!(matches!(c.redrive_group("t", "nope", 0), Err(e) if e.code() == Some(ErrorCode::UnknownGroup)));
    assert_eq!(c.redrive_group("t", "a", 0).unwrap(), 1, "only a's dead letter moves");
    assert_eq!(c.redrive_group("t", "a", 0).unwrap(), 0);
    churn_until_compacted(&mut c, 8);
    drop(c);
    srv.stop();

    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    let back = take(&mut c, "t", "a");
    assert_eq!(back.len(), 1, "a gets its dead letter back");
    assert_eq!((back[0].payload.as_slice(), back[0].delivery_count), (&b"one"[..], 1));
    assert!(back[0].id > m2 && back[0].props.is_empty(), "a new message, its marks not shown");
    assert!(take(&mut c, "t", "b").is_empty(), "b was done with it");
    assert_eq!(ids(&take(&mut c, "t", "c")), vec![m1, m2], "c gets the originals, not the redriven copy");
    create(&mut c, "t", "late");
    let late = ids(&take(&mut c, "t", "late"));
    assert_eq!(late, vec![m1, m2], "nor does a group created later");
    // b's dead letter is still in the dead-letter topic, for its default group.
    let dlq = take(&mut c, "t.dlq", "");
    assert_eq!(dlq.len(), 1);
    let d = dlq[0].dead.unwrap();
    assert_eq!((d.origin_id, dlq[0].origin_group.as_str(), d.reason), (m2, "b", DeadReason::Rejected));
    // Once a acks it and the others have stepped over it, it leaves.
    c.ack_group("t", "a", &[back[0].id]).unwrap();
    c.ack_group("t", "c", &[m1, m2]).unwrap();
    c.ack_group("t", "late", &late).unwrap();
    assert!(take(&mut c, "t", "c").is_empty() && take(&mut c, "t", "late").is_empty());
    assert_eq!(c.stat("t", "bytes").unwrap(), Some(0), "no message is left in the topic");
}

#[test]
fn a_redrive_naming_a_group_leaves_the_others_dead_letters_in_order() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    for g in ["a", "b"] {
        create(&mut c, "t", g);
    }
    let (first, _) = c.produce_batch("t", &[b"0", b"1", b"2", b"3", b"4", b"5"]).unwrap();
    let all: Vec<u64> = (first..first + 6).collect();
    assert_eq!(ids(&take(&mut c, "t", "a")), all);
    assert_eq!(ids(&take(&mut c, "t", "b")), all);
    // Interleaved in the dead-letter topic: a, b, a, b, a, b.
    for (i, id) in all.iter().enumerate() {
        c.nack_group("t", if i % 2 == 0 { "a" } else { "b" }, &[*id], 0, true).unwrap();
    }
    // The dead-letter topic's default group takes a's first and b's first
    // and gives them back (for retry); the rest are past its cursor.
    let dlq = ids(&c.fetch_group("t.dlq", "", Fetch { max_messages: 2, ..Fetch::default() }).unwrap());
    c.nack("t.dlq", &dlq, 0, false).unwrap();
    assert_eq!(c.redrive_group("t", "a", 2).unwrap(), 2, "max_messages holds");
    assert_eq!(c.redrive_group("t", "a", 0).unwrap(), 1);
    let left = take(&mut c, "t.dlq", "");
    let origins: Vec<(u64, &str)> = left.iter().map(|m| (m.dead.unwrap().origin_id, m.origin_group.as_str())).collect();
    assert_eq!(origins, [(all[1], "b"), (all[3], "b"), (all[5], "b")], "b's stay, in order");
    assert_eq!(take(&mut c, "t", "a").iter().map(|m| m.payload[0]).collect::<Vec<_>>(), b"024");
}

/// A broadcast group's consumer dead-letters its own copy: the dead letter
/// names the group, and a REDRIVE naming it reaches the group's consumers
/// connected then, and no other group.
#[test]
fn a_broadcast_groups_dead_letter_names_it_and_goes_back_to_it_alone() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    let fanout = GroupSettings { broadcast: true, ..GroupSettings::default() };
    c.create_group("t", "fan", fanout, Start::Earliest).unwrap();
    create(&mut c, "t", "other");
    let mut member = srv.client_v2();
    assert!(take(&mut member, "t", "fan").is_empty(), "joined at the tail");
    let id = c.produce("t", b"m").unwrap();
    assert_eq!(ids(&take(&mut member, "t", "fan")), vec![id]);
    member.nack_group("t", "fan", &[id], 0, true).unwrap();
    // Looked at by a group of the dead-letter topic of its own, so that its
    // default group, which REDRIVE moves from, still has it ready.
    assert_eq!(dead_letters(&mut c, "look"), [(id, "fan".to_string(), vec![])]);
    assert_eq!(ids(&take(&mut c, "t", "other")), vec![id]);
    c.ack_group("t", "other", &[id]).unwrap();
    assert_eq!(c.redrive_group("t", "fan", 0).unwrap(), 1);
    let back = take(&mut member, "t", "fan");
    assert_eq!((back.len(), back[0].payload.as_slice()), (1, &b"m"[..]), "the member connected gets it");
    assert!(take(&mut c, "t", "other").is_empty(), "the other group does not");
}
