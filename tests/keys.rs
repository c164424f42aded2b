//! Message keys and inspection (protocol version 4): a key travels with
//! its message to a version-4 consumer, is left out for an earlier session,
//! and is held to `key_bytes_max`; LOOKUP and PEEK show each group's state
//! over real TCP, and the key index is rebuilt after a restart.

mod common;

use std::time::Duration;

use common::wire::{code, now};
use runnel::broker::Config;
use runnel::client::{Client, GroupLine, Inspection, ProduceMessage, State};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{DeadReason, ErrorCode};
use runnel::limits::Limits;
use runnel::log::LogOptions;

fn client_upto(srv: &common::Server, version: u16) -> Client {
    let mut c = Client::connect_upto(srv.addr, b"", version).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    c
}

#[test]
fn a_key_reaches_a_version_4_consumer_and_is_left_out_for_version_3() {
    let (srv, _dir) = common::start(Limits::default());
    let mut p = srv.client_v2();
    let m = ProduceMessage::new(b"order placed").key(b"order-17").tag("eu");
    p.produce_messages("orders", &[m]).expect("produce");
    p.create_group("orders", "old", GroupSettings::default(), Start::Earliest).expect("group");
    let got = p.fetch("orders", now(1)).expect("fetch");
    assert_eq!(got[0].key(), Some(&b"order-17"[..]));
    assert_eq!(got[0].tags(), ["eu"]);
    let mut v3 = client_upto(&srv, 3);
    let got = v3.fetch_group("orders", "old", now(1)).expect("fetch v3");
    assert_eq!((got[0].key(), got[0].tags()), (None, vec!["eu"]), "a version-3 session gets no key");
}

#[test]
fn keys_are_held_to_key_bytes_max_and_to_one_a_message() {
    let (srv, _dir) = common::start(Limits { key_bytes_max: 4, ..Limits::default() });
    let mut p = srv.client_v2();
    assert!(p.produce_messages("t", &[ProduceMessage::new(b"x").key(b"abcd")]).is_ok());
    let long = p.produce_messages("t", &[ProduceMessage::new(b"x").key(b"abcde")]);
    assert_eq!(code(long), ErrorCode::BadArgument);
    let two = p.produce_messages("t", &[ProduceMessage::new(b"x").key(b"a").key(b"b")]);
    assert!(two.is_err(), "the client refuses a second key before sending");
    let mut v3 = client_upto(&srv, 3);
    let refused = v3.produce_messages("t", &[ProduceMessage::new(b"x").key(b"a")]);
    assert!(refused.is_err(), "a version-3 session cannot send a key");
}

/// The state LOOKUP or PEEK shows for `group`.
fn state_in(i: &Inspection, group: &str) -> GroupLine {
    i.groups.iter().find(|g| g.group == group).cloned().unwrap_or_else(|| panic!("no line for {group}: {i:?}"))
}

fn produce_keyed(c: &mut Client, topic: &str, key: &[u8], payload: &[u8]) -> u64 {
    c.produce_messages(topic, &[ProduceMessage::new(payload).key(key)]).expect("produce").0
}

#[test]
fn lookup_and_peek_show_every_groups_state_without_delivering() {
    let (srv, _dir) = common::start(Limits::default());
    let mut c = srv.client_v2();
    for g in ["a", "b"] {
        c.create_group("orders", g, GroupSettings::default(), Start::Earliest).expect("group");
    }
    let m1 = produce_keyed(&mut c, "orders", b"k1", b"one");
    let m2 = produce_keyed(&mut c, "orders", b"k1", b"two");
    let m3 = produce_keyed(&mut c, "orders", b"k2", b"three");
    let m4 = produce_keyed(&mut c, "orders", b"k1", b"four");
    let got = c.fetch_group("orders", "a", now(2)).expect("fetch a");
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [m1, m2]);
    c.ack_group("orders", "a", &[m1]).expect("ack");
    c.nack_group("orders", "a", &[m2], 60_000, false).expect("nack");
    let mut other = srv.client_v2();
    assert_eq!(other.fetch_group("orders", "b", now(1)).expect("fetch b")[0].id, m1);

    let found = c.lookup("orders", b"k1").expect("lookup");
    assert_eq!(found.iter().map(|i| i.id).collect::<Vec<_>>(), [m4, m2, m1], "newest first");
    assert!(found.iter().all(|i| i.message.as_ref().is_some_and(|m| m.payload.is_none() && m.key() == Some(b"k1"))));
    assert_eq!((state_in(&found[0], "a").state, state_in(&found[0], "b").state), (State::Ready, State::Ready));
    let waiting = state_in(&found[1], "a");
    assert_eq!((waiting.state, waiting.deliveries), (State::Waiting, 1));
    assert!(waiting.until_ms > found[1].message.as_ref().expect("held").born_ms + 50_000, "{waiting:?}");
    assert_eq!(state_in(&found[2], "a").state, State::Done);
    let held = state_in(&found[2], "b");
    assert_eq!((held.state, held.deliveries), (State::InFlight, 1));
    assert!(held.consumer != 0 && held.until_ms > 0, "{held:?}");

    let peeked = c.peek("orders", m3).expect("peek");
    let m = peeked.message.as_ref().expect("held");
    assert_eq!((m.payload.as_deref(), m.key(), m.len), (Some(&b"three"[..]), Some(&b"k2"[..]), 5));
    assert_eq!(peeked.groups.len(), 2);
    assert_eq!(code(c.peek("orders", 1_000)), ErrorCode::NotFound);
    assert_eq!(code(c.peek("nope", m1)), ErrorCode::UnknownTopic);
    assert!(c.lookup("orders", b"none").expect("lookup").is_empty());
    // Peeking delivered nothing: group b still gets m2 next.
    assert_eq!(other.fetch_group("orders", "b", now(1)).expect("fetch b")[0].id, m2);

    // Rejected by b and done by a, m1 leaves the topic: PEEK no longer
    // finds it, LOOKUP still names it, with each group's outcome.
    other.nack_group("orders", "b", &[m1], 0, true).expect("reject");
    assert_eq!(code(c.peek("orders", m1)), ErrorCode::NotFound);
    let gone = c.lookup("orders", b"k1").expect("lookup").pop().expect("m1");
    assert_eq!((gone.id, gone.message.is_some()), (m1, false));
    assert_eq!(state_in(&gone, "a").state, State::Done);
    let dead = state_in(&gone, "b");
    assert_eq!((dead.state, dead.dead_reason, dead.deliveries), (State::DeadLettered, DeadReason::Rejected as u8, 1));
    // Its dead letter carries the key too.
    let dlq = c.fetch("orders.dlq", now(1)).expect("fetch dlq");
    assert_eq!(dlq[0].key(), Some(&b"k1"[..]));
    let in_dlq = c.lookup("orders.dlq", b"k1").expect("lookup dlq");
    assert_eq!(in_dlq[0].message.as_ref().and_then(|m| m.dead).map(|d| d.origin_id), Some(m1));
}

#[test]
fn the_key_index_is_rebuilt_from_the_log_after_a_restart() {
    let dir = common::TempDir::new("keys-restart");
    let config = || Config { limits: Limits { lookup_results_max: 2, ..Limits::default() }, ..Config::default() };
    let srv = common::Server::start_in(config(), LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    c.create_group("t", "g", GroupSettings::default(), Start::Earliest).expect("group");
    let ids: Vec<u64> =
        (0..5).map(|i| produce_keyed(&mut c, "t", if i % 2 == 0 { b"even" } else { b"odd" }, b"m")).collect();
    let got = c.fetch_group("t", "g", now(1)).expect("fetch");
    c.ack_group("t", "g", &[got[0].id]).expect("ack");
    let before = (c.lookup("t", b"even").expect("lookup"), c.lookup("t", b"odd").expect("lookup"));
    assert_eq!(before.0.iter().map(|i| i.id).collect::<Vec<_>>(), [ids[4], ids[2]], "lookup_results_max newest");
    drop(c);
    srv.stop();
    let srv = common::Server::start_in(config(), LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    let after = (c.lookup("t", b"even").expect("lookup"), c.lookup("t", b"odd").expect("lookup"));
    let ids_of = |v: &Vec<Inspection>| v.iter().map(|i| i.id).collect::<Vec<_>>();
    assert_eq!((ids_of(&after.0), ids_of(&after.1)), (ids_of(&before.0), ids_of(&before.1)));
    assert_eq!(state_in(&after.1[0], "g").state, State::Ready);
}

/// Version 5 tells a retry wait and a wait behind a key apart from a NACK
/// delay and from ready; a version-4 session is told `waiting` and
/// `ready` for them, as version 4 says.
#[test]
fn version_5_tells_a_retry_wait_and_a_wait_behind_a_key_apart() {
    let (srv, _dir) = common::start(Limits::default());
    let mut c = srv.client_v2();
    let retry = runnel::queue::RetryPolicy { initial_ms: 60_000, multiplier_pct: 100, cap_ms: 60_000, jitter_pct: 0 };
    let settings = GroupSettings { ordered: true, retry: Some(retry), ..GroupSettings::default() };
    c.create_group("t", "o", settings, Start::Earliest).expect("group");
    let m1 = produce_keyed(&mut c, "t", b"k", b"first");
    let m2 = produce_keyed(&mut c, "t", b"k", b"second");
    let m3 = produce_keyed(&mut c, "t", b"j", b"other key");
    let got = c.fetch_group("t", "o", now(3)).expect("fetch");
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [m1, m3], "m2 waits behind m1");
    c.nack_group("t", "o", &[m1], 0, false).expect("nack: the retry policy's wait");
    c.nack_group("t", "o", &[m3], 60_000, false).expect("nack with a delay");
    let states = |c: &mut Client| -> Vec<(State, u16, bool)> {
        [m1, m2, m3]
            .iter()
            .map(|&id| {
                let l = state_in(&c.peek("t", id).expect("peek"), "o");
                (l.state, l.deliveries, l.until_ms > 0)
            })
            .collect()
    };
    assert_eq!(
        states(&mut c),
        [(State::RetryWaiting, 1, true), (State::BehindKey, 0, false), (State::Waiting, 1, true)],
        "version 5"
    );
    let mut v4 = client_upto(&srv, 4);
    assert_eq!(
        states(&mut v4),
        [(State::Waiting, 1, true), (State::Ready, 0, false), (State::Waiting, 1, true)],
        "version 4"
    );
}

/// A message a group's filter does not pass is done for that group from
/// the moment it is produced, whether or not the group has fetched since
/// (docs/protocol.md, "Tag filters"): one that every group's filter drops
/// is not held at all (PEEK: NOT_FOUND; LOOKUP: no message, each group
/// done), and one another group still needs shows `filtered` for the
/// group whose filter drops it, and leaves once that other group is done.
#[test]
fn a_message_every_filter_drops_is_not_held_from_its_produce_on() {
    let (srv, _dir) = common::start(Limits::default());
    let mut c = srv.client_v2();
    let eu = GroupSettings { filter: "eu", ..GroupSettings::default() };
    c.create_group("orders", "eu", eu, Start::Earliest).expect("group");
    let tagged = |tag: &str| [ProduceMessage::new(b"order").key(b"k").tag(tag)];
    let us = c.produce_messages("orders", &tagged("us")).expect("produce").0;
    assert_eq!(code(c.peek("orders", us)), ErrorCode::NotFound, "never fetched, but its only group drops it");
    let found = c.lookup("orders", b"k").expect("lookup");
    assert_eq!((found.len(), found[0].message.is_some()), (1, false), "{found:?}");
    assert_eq!(state_in(&found[0], "eu").state, State::Done);
    assert_eq!(common::wire::stat(&mut c, "orders", "bytes"), 0, "nothing of it is held");

    c.create_group("orders", "all", GroupSettings::default(), Start::Latest).expect("group");
    let kept = c.produce_messages("orders", &tagged("us")).expect("produce").0;
    let peeked = c.peek("orders", kept).expect("held for group all");
    assert_eq!((state_in(&peeked, "eu").state, state_in(&peeked, "all").state), (State::Filtered, State::Ready));
    let got = c.fetch_group("orders", "all", now(10)).expect("fetch all");
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [kept]);
    c.ack_group("orders", "all", &[kept]).expect("ack");
    assert_eq!(code(c.peek("orders", kept)), ErrorCode::NotFound, "done by all, and by eu at its produce");

    let mine = c.produce_messages("orders", &tagged("eu")).expect("produce").0;
    let got = c.fetch_group("orders", "eu", now(10)).expect("fetch eu");
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [mine], "eu gets what it passes");
    let filtered = c.stats(Some("orders")).expect("stats").into_iter().find(|s| s.0 == "orders/eu");
    let filtered = filtered.and_then(|s| s.1.into_iter().find(|kv| kv.0 == "filtered")).map(|kv| kv.1);
    assert_eq!(filtered, Some(2), "both messages it dropped are counted");
}
