//! Push subscriptions over the network (protocol version 3): credit bounds
//! what a subscriber holds and ACK, NACK, CREDIT and passed deadlines free
//! it; subscribers of a group share its messages round-robin, beside
//! parked FETCHes; UNSUBSCRIBE and a disconnect return what was in flight;
//! a subscriber that does not read meets the output limits.
//!
//! What was pushed by a given moment is read without timing: a produce is
//! answered in the turn whose publish pushes its messages, and pushed
//! frames go out before that turn's replies; a PING on the subscriber's
//! connection then reads everything pushed before its reply.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::wire::{code, now, wait_until};
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, Pushed};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{ErrorCode, Request};
use runnel::limits::Limits;

fn server() -> (Server, TempDir) {
    Server::start(Config::default())
}

fn produce(c: &mut Client, topic: &str, n: usize) -> Vec<u64> {
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| format!("m{i}").into_bytes()).collect();
    let (first, count) = c.produce_batch(topic, &payloads).expect("produce");
    (first..first + u64::from(count)).collect()
}

/// Everything pushed to `c` so far: a PING's reply comes after it.
fn drain(c: &mut Client) -> Vec<Pushed> {
    c.ping().expect("ping");
    let n = c.pushed_waiting();
    (0..n).map(|_| c.next_pushed().expect("pushed")).collect()
}

fn ids(pushed: &[Pushed]) -> Vec<u64> {
    pushed.iter().map(|p| p.message.id).collect()
}

#[test]
fn credit_bounds_what_is_pushed_and_acks_free_it() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    let sub = s.subscribe("t", "g", 2, 60_000).expect("subscribe");
    let sent = produce(&mut p, "t", 5);
    let got = drain(&mut s);
    assert_eq!(ids(&got), sent[..2], "credit 2: the two oldest, in order");
    assert!(got.iter().all(|m| m.subscription == sub && m.topic == "t" && m.message.delivery_count == 1));
    assert_eq!(got[0].message.payload, b"m0");
    // One ACK frees one credit: exactly one more.
    assert_eq!(s.ack_group("t", "g", &[sent[0]]).expect("ack").done, 1);
    assert_eq!(ids(&drain(&mut s)), [sent[2]]);
    // A NACK frees one too, and its message comes back first.
    assert_eq!(s.nack_group("t", "g", &[sent[1]], 0, false).expect("nack").done, 1);
    let again = drain(&mut s);
    assert_eq!(ids(&again), [sent[1]]);
    assert_eq!(again[0].message.delivery_count, 2);
    // More credit: the rest at once; the reply counts what is held.
    assert_eq!(s.credit(sub, 10).expect("credit"), 2);
    assert_eq!(ids(&drain(&mut s)), sent[3..]);
    // Messages produced later are pushed as they come.
    let later = produce(&mut p, "t", 3);
    assert_eq!(ids(&drain(&mut s)), later);
}

#[test]
fn credit_zero_pauses_and_credit_resumes() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    let sub = s.subscribe("t", "", 0, 0).expect("subscribe");
    let sent = produce(&mut p, "t", 3);
    assert!(drain(&mut s).is_empty(), "credit 0 pushes nothing");
    assert_eq!(s.credit(sub, 3).expect("credit"), 0);
    assert_eq!(ids(&drain(&mut s)), sent);
}

#[test]
fn what_is_ready_at_subscribe_is_pushed_after_its_reply() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let sent = produce(&mut p, "t", 4);
    let mut s = srv.client_v2();
    // `subscribe` fails if a pushed frame came before its reply.
    let sub = s.subscribe("t", "g", 100, 0).expect("subscribe");
    let got = drain(&mut s);
    assert_eq!(ids(&got), sent);
    assert!(got.iter().all(|m| m.subscription == sub));
}

#[test]
fn subscribers_of_a_group_share_its_messages_round_robin() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut a = srv.client_v2();
    let mut b = srv.client_v2();
    a.subscribe("t", "g", 100, 0).expect("subscribe a");
    b.subscribe("t", "g", 100, 0).expect("subscribe b");
    let sent = produce(&mut p, "t", 10);
    let (ga, gb) = (ids(&drain(&mut a)), ids(&drain(&mut b)));
    assert_eq!((ga.len(), gb.len()), (5, 5), "one each in turn: a {ga:?}, b {gb:?}");
    let all: BTreeSet<u64> = ga.iter().chain(&gb).copied().collect();
    assert_eq!(all, sent.iter().copied().collect(), "each message to one of them");
    // A subscriber with less free credit takes less: group h starts at
    // the earliest message, so c gets one of the 10 at its SUBSCRIBE and d
    // the other 9, then all that come while c holds its one.
    let mut c = srv.client_v2();
    c.subscribe("t", "h", 1, 0).expect("subscribe c");
    let mut d = srv.client_v2();
    d.subscribe("t", "h", 100, 0).expect("subscribe d");
    let more = produce(&mut p, "t", 6);
    let (gc, gd) = (ids(&drain(&mut c)), ids(&drain(&mut d)));
    assert_eq!(gc, [sent[0]], "credit 1");
    assert_eq!(gd.len(), 9 + 6, "{gd:?}");
    assert!(more.iter().all(|id| gd.contains(id)));
}

#[test]
fn groups_each_get_every_message_and_broadcast_members_too() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    p.create_group("t", "all", GroupSettings { broadcast: true, ..GroupSettings::default() }, Start::Latest)
        .expect("create");
    let mut a = srv.client_v2();
    let mut b = srv.client_v2();
    let mut other = srv.client_v2();
    a.subscribe("t", "all", 10, 0).expect("subscribe a");
    b.subscribe("t", "all", 10, 0).expect("subscribe b");
    other.subscribe("t", "other", 10, 0).expect("subscribe other");
    let sent = produce(&mut p, "t", 3);
    assert_eq!(ids(&drain(&mut a)), sent, "a broadcast member gets every message");
    assert_eq!(ids(&drain(&mut b)), sent);
    assert_eq!(ids(&drain(&mut other)), sent, "another group gets every message too");
}

/// Parked FETCHes of group g of topic t, from its STATS section.
fn waiters(c: &mut Client) -> Option<u64> {
    let sections = c.stats(Some("t")).expect("stats");
    let (_, kv) = sections.into_iter().find(|s| s.0 == "t/g")?;
    kv.into_iter().find(|(k, _)| k == "waiters").map(|(_, v)| v)
}

#[test]
fn parked_fetches_are_answered_first_then_subscribers() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    s.subscribe("t", "g", 100, 0).expect("subscribe");
    let mut f = srv.client_v2();
    let fetch =
        Request::Fetch { topic: "t", group: "g", max_messages: 2, max_bytes: 0, wait_ms: 30_000, ack_timeout_ms: 0 };
    f.send(&fetch);
    f.flush().expect("flush");
    wait_until("the FETCH parks", || waiters(&mut p) == Some(1));
    let sent = produce(&mut p, "t", 5);
    let fetched = match f.recv().expect("fetch reply") {
        runnel::client::OwnedReply::Messages { messages, .. } => messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(fetched, sent[..2], "the parked FETCH takes what it asked for first");
    assert_eq!(ids(&drain(&mut s)), sent[2..]);
}

#[test]
fn a_connection_that_fetches_too_holds_at_most_its_credit() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    let sent = produce(&mut p, "t", 5);
    let f = Fetch { max_messages: 2, ack_timeout_ms: 60_000, ..Fetch::default() };
    assert_eq!(s.fetch_group("t", "g", f).expect("fetch").len(), 2);
    let sub = s.subscribe("t", "g", 3, 0).expect("subscribe");
    assert_eq!(ids(&drain(&mut s)), [sent[2]], "2 fetched + 1 pushed = credit 3");
    assert_eq!(s.credit(sub, 3).expect("credit"), 3);
}

#[test]
fn unsubscribe_and_disconnect_return_what_was_in_flight() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    let sub = s.subscribe("t", "g", 2, 0).expect("subscribe");
    let sent = produce(&mut p, "t", 4);
    assert_eq!(drain(&mut s).len(), 2);
    assert_eq!(s.unsubscribe(sub).expect("unsubscribe"), 2, "both held messages return");
    assert_eq!(code(s.credit(sub, 1)), ErrorCode::BadArgument, "the subscription is gone");
    let mut f = srv.client_v2();
    let back = f.fetch_group("t", "g", now(10)).expect("fetch");
    assert_eq!(back.iter().map(|m| m.id).collect::<Vec<_>>(), sent, "returned ones first, in order");
    assert_eq!(back[0].delivery_count, 2);
    f.nack_group("t", "g", &sent, 0, false).expect("nack");
    // A subscriber that disconnects: its messages go to the next one.
    let mut t = srv.client_v2();
    t.subscribe("t", "g", 3, 0).expect("subscribe");
    assert_eq!(drain(&mut t).len(), 3);
    drop(t);
    let mut u = srv.client_v2();
    u.subscribe("t", "g", 10, 0).expect("subscribe");
    // The one t left, then the three t held, once its close is served.
    wait_until("the disconnect returns its messages", || {
        u.ping().expect("ping");
        u.pushed_waiting() == 4
    });
    let got: BTreeSet<u64> = drain(&mut u).iter().map(|p| p.message.id).collect();
    assert_eq!(got, sent.iter().copied().collect());
}

#[test]
fn a_passed_deadline_frees_credit_and_redelivers() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    s.subscribe("t", "g", 1, 50).expect("subscribe");
    let sent = produce(&mut p, "t", 2);
    assert_eq!(ids(&drain(&mut s)), [sent[0]]);
    // Unacked past its 50 ms deadline: back to ready, first in line.
    let first = s.next_pushed().expect("redelivery");
    assert_eq!((first.message.id, first.message.delivery_count), (sent[0], 2));
    assert_eq!(s.ack_group("t", "g", &[sent[0]]).expect("ack").done, 1);
    let second = s.next_pushed().expect("next");
    assert_eq!(second.message.id, sent[1]);
}

#[test]
fn subscription_errors() {
    let limits = Limits { subscriptions_per_connection_max: 2, subscription_credit_max: 10, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let mut s = srv.client_v2();
    assert_eq!(code(s.subscribe("t", "g", 11, 0)), ErrorCode::BadArgument, "credit over the max");
    let sub = s.subscribe("t", "g", 10, 0).expect("subscribe");
    assert_eq!(code(s.subscribe("t", "g", 1, 0)), ErrorCode::BadArgument, "the same group twice");
    assert_eq!(code(s.credit(sub, 11)), ErrorCode::BadArgument);
    s.subscribe("t", "h", 1, 0).expect("a second one");
    assert_eq!(code(s.subscribe("t", "i", 1, 0)), ErrorCode::BadArgument, "past the per-connection max");
    assert_eq!(code(s.unsubscribe(sub + 100)), ErrorCode::BadArgument, "no such subscription");
    // Another connection cannot touch this one's subscription.
    let mut other = srv.client_v2();
    assert_eq!(code(other.credit(sub, 1)), ErrorCode::BadArgument);
    other.subscribe("t", "missing", 1, 0).expect("SUBSCRIBE makes a missing group, as FETCH does");
}

#[test]
fn version_2_sessions_do_not_know_subscribe() {
    let (srv, _dir) = server();
    let mut c = Client::connect_upto(srv.addr, b"", 2).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    assert!(matches!(c.subscribe("t", "", 1, 0), Err(runnel::client::Error::Version { needed: 3, version: 2 })));
    let mut raw = common::wire::Raw::connect(srv.addr);
    raw.hello();
    let mut frame = Vec::new();
    runnel::codec::encode_request(&mut frame, 7, &Request::Credit { subscription: 0, credit: 1 }, 3);
    raw.write(&frame);
    let got = raw.recv();
    assert_eq!((got.request_id(), got.error()), (7, ErrorCode::UnknownOp));
}

#[test]
fn a_subscriber_that_does_not_read_is_closed_and_its_messages_return() {
    let (srv, _dir) = Server::start(Config { limits: small_output_limits(300), ..Config::default() });
    let mut s = srv.client_v2();
    s.subscribe("t", "g", 8192, 600_000).expect("subscribe");
    let mut p = srv.client_v2();
    let sent = produce_40_mib(&mut p);
    // s never reads: its output passes half of output_bytes_max and stays
    // unread past frame_timeout_ms, and the broker closes it; everything it
    // held returns to the group.
    let mut f = srv.client_v2();
    let mut got = 0u64;
    wait_until("the stalled subscriber's messages return", || {
        let fetch = Fetch { max_messages: 256, ack_timeout_ms: 600_000, ..Fetch::default() };
        got += f.fetch_group("t", "g", fetch).expect("fetch").len() as u64;
        got == sent
    });
    drop(s);
}

/// Limits under which 40 MiB of messages pass half of `output_bytes_max`
/// many times over.
fn small_output_limits(frame_timeout_ms: u32) -> Limits {
    Limits {
        output_bytes_max: 4 << 20,
        fetch_bytes_max: 1 << 20,
        batch_messages_max: 256,
        frame_timeout_ms,
        buffered_bytes_max: 64 << 20,
        ..Limits::default()
    }
}

/// Produces 2560 messages of 16 KiB (40 MiB); returns their count.
fn produce_40_mib(p: &mut Client) -> u64 {
    let payload = vec![7u8; 16 << 10];
    let batch: Vec<&[u8]> = (0..64).map(|_| payload.as_slice()).collect();
    (0..40).map(|_| u64::from(p.produce_batch("t", &batch).expect("produce").1)).sum()
}

#[test]
fn a_subscriber_that_reads_late_is_paused_not_cut_off() {
    let (srv, _dir) = Server::start(Config { limits: small_output_limits(30_000), ..Config::default() });
    let mut s = srv.client_v2();
    s.subscribe("t", "g", 8192, 600_000).expect("subscribe");
    let mut p = srv.client_v2();
    // Far more than output_bytes_max (4 MiB) is pushable while s reads
    // nothing: the pushes stop at half of it, or s would be closed.
    let sent = produce_40_mib(&mut p);
    let mut got = 0u64;
    let mut batch = Vec::new();
    while got < sent {
        let m = s.next_pushed().expect("pushed");
        batch.push(m.message.id);
        got += 1;
        if batch.len() == 256 {
            assert_eq!(s.ack_group("t", "g", &batch).expect("ack").done, 256);
            batch.clear();
        }
    }
    assert_eq!(got, sent, "every message pushed, once");
}

#[test]
fn a_scheduled_message_is_pushed_once_it_is_due() {
    let (srv, _dir) = server();
    let mut p = srv.client_v2();
    let mut s = srv.client_v2();
    s.subscribe("t", "g", 10, 0).expect("subscribe");
    let later = [runnel::client::ProduceMessage::new(b"later").delay(100)];
    let (id, _) = p.produce_messages("t", &later).expect("produce");
    let now = produce(&mut p, "t", 1);
    // Both come, the scheduled one when its timer fires (no assertion on
    // when: the machine is shared).
    let got: BTreeSet<u64> = (0..2).map(|_| s.next_pushed().expect("pushed").message.id).collect();
    assert_eq!(got, [id, now[0]].into_iter().collect());
}
