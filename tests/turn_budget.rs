//! The loop turn's work budget (`work_items_per_turn_max`,
//! `work_bytes_per_turn_max`; src/broker/budget.rs), with budgets small
//! enough to meet: a turn's requests stop at it and the rest waits, in
//! order, for the next turn, while PING goes on being answered; a FETCH
//! gets what the turn has left; the deliveries after a sync stop at it and
//! the rest follows at the next syncs, without any client doing anything
//! more (the loop does not sleep while deliveries wait). Behaviour only:
//! no test times anything.

mod common;

use common::wire::*;
use common::{Server, TempDir};
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox};
use runnel::client::{Client, Fetch};
use runnel::codec::{self, Decoded, Reply, Request, SINCE_PUSH, TopicSettings};
use runnel::conn::{ConnState, Serve, Step};
use runnel::limits::Limits;

/// The default limits with a turn's work budget of `items` work items.
fn budget(items: u32) -> Limits {
    Limits { work_items_per_turn_max: items, ..Limits::default() }
}

fn start(limits: Limits) -> (Server, TempDir) {
    common::start(limits)
}

fn client(srv: &Server) -> Client {
    let mut c = Client::connect(srv.addr).expect("connect");
    c.set_timeout(Some(PATIENCE)).expect("timeout");
    c
}

// ---------------------------------------------------------------------------
// Without sockets: two connections' serves and the turn's commit, as the
// reactor runs them, so that what each turn does is exact.
// ---------------------------------------------------------------------------

/// The connections' output buffers, lent to the broker's commit.
struct Outs<'a>(&'a mut [ConnState]);

impl Outbox for Outs<'_> {
    fn out(&mut self, conn: ConnKey) -> Option<&mut Vec<u8>> {
        self.0.get_mut(conn.0).map(|c| &mut c.out)
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

/// The request ids of the whole replies in `out`, with their replies' ops.
fn replies(out: &[u8]) -> Vec<(u32, u8)> {
    let (mut v, mut at) = (Vec::new(), 0);
    while let Ok(Decoded::Frame(f, n)) = codec::decode_reply(&out[at..], usize::MAX) {
        v.push((f.request_id, f.op));
        at += n;
    }
    assert_eq!(at, out.len(), "a partial reply");
    v
}

/// Frames of `reqs`, request ids from `first`, in the version-1 layout.
fn frames(first: u32, reqs: &[Request<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        codec::encode_request(&mut out, first + i as u32, r, 1);
    }
    out
}

/// Connection A pipelines many LIST_TOPICS, each more than a turn's
/// budget, and a PING behind them; connection B sends a PING in the same
/// turn. B is answered in that turn, A gets one LIST_TOPICS reply a turn,
/// and A's replies, its PING's last, keep the order of its requests.
#[test]
fn a_ping_is_answered_in_a_turn_whose_budget_requests_over_it_used_and_they_follow_in_order() {
    const LISTS: u32 = 30;
    let limits = Limits { work_items_per_turn_max: 8, ..Limits::default() };
    let mut broker = Broker::in_memory(Config { limits, ..Config::default() }, Now::default());
    let mut loops = LoopStats::default();
    let mut conns = [ConnState::new(1, 0), ConnState::new(2, 0)];
    let (a, b) = (ConnKey(0), ConnKey(1));
    let hello = Request::Hello { min_version: 1, max_version: 1, token: b"" };
    let names: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
    let mut setup = vec![hello];
    setup.extend(names.iter().map(|n| Request::CreateTopic {
        topic: n,
        settings: TopicSettings::default(),
        options: Default::default(),
    }));
    let mut turn = |conns: &mut [ConnState], input: [Option<&[u8]>; 2], t: u64| -> [Step; 2] {
        let now = Now { mono_ms: t, wall_ms: 1_000 + t };
        let steps = [a, b].map(|k| {
            let mut cx = Serve { broker: &mut broker, loops: &mut loops, now };
            match input[k.0] {
                Some(bytes) => conns[k.0].serve_chunk(k, bytes, &mut cx, &mut ()),
                None => conns[k.0].serve(k, &mut cx, &mut ()),
            }
        });
        broker.commit(now, &mut Outs(conns));
        steps
    };
    // Creating topics is light: all of them in one turn, over the budget.
    let _ = turn(&mut conns, [Some(&frames(1, &setup)), Some(&frames(1, &[hello]))], 1);
    assert_eq!(replies(&conns[0].out).len(), 21, "HELLO and 20 CREATE_TOPIC");
    conns.iter_mut().for_each(|c| c.out.clear());

    let mut pipelined = vec![Request::ListTopics; LISTS as usize];
    pipelined.push(Request::Ping);
    let ping = frames(500, &[Request::Ping]);
    let steps = turn(&mut conns, [Some(&frames(100, &pipelined)), Some(&ping)], 2);
    assert_eq!(steps[0], Step::Resume, "A's requests past the budget wait for the next turn");
    assert_eq!(replies(&conns[1].out), [(500, codec::op::PING)], "B's PING in the same turn");
    assert_eq!(replies(&conns[0].out).len(), 1, "one LIST_TOPICS of 20 topics fills a budget of 8");
    assert!(!conns[0].input().is_empty(), "the rest is kept for the next turn");

    let mut turns = 1;
    while !conns[0].input().is_empty() {
        turns += 1;
        assert!(turns <= 2 * LISTS, "A is not served");
        let _ = turn(&mut conns, [None, Some(&[])], 2 + u64::from(turns));
    }
    let got = replies(&conns[0].out);
    let want: Vec<u32> = (100..100 + LISTS + 1).collect();
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), want, "A's replies in request order");
    assert_eq!(got.last().map(|r| r.1), Some(codec::op::PING), "A's PING after its lists");
    assert_eq!(turns, LISTS, "one LIST_TOPICS a turn, A's PING with the last");
}

// ---------------------------------------------------------------------------
// Over the wire.
// ---------------------------------------------------------------------------

/// A FETCH asking for more than a turn's budget gets what the turn has
/// left: fetching again gets the rest, every message once and in order.
/// In bytes too: a FETCH's payload stays within the budget's bytes, but
/// for one message.
#[test]
fn a_big_fetch_gets_the_turns_budget_and_every_message_in_order() {
    let (srv, _dir) = start(budget(8));
    let mut c = client(&srv);
    let payloads: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let (first, count) = c.produce_batch("big", &payloads).expect("PRODUCE of 100, over the budget");
    assert_eq!(count, 100);
    let mut got = Vec::new();
    while got.len() < 100 {
        let batch = c.fetch("big", Fetch { max_messages: 100, ..Fetch::default() }).expect("FETCH");
        assert!(!batch.is_empty() && batch.len() <= 8, "a FETCH of {} messages on a budget of 8", batch.len());
        got.extend(batch);
    }
    let ids: Vec<u64> = got.iter().map(|m| m.id).collect();
    assert_eq!(ids, (first..first + 100).collect::<Vec<_>>(), "every message once, in order");
    assert!(got.iter().enumerate().all(|(i, m)| m.payload == (i as u32).to_le_bytes()));

    let (srv, _dir) = start(Limits { work_bytes_per_turn_max: 1000, ..Limits::default() });
    let mut c = client(&srv);
    let big = vec![0x5a; 400];
    c.produce_batch("bytes", &[&big; 10]).expect("PRODUCE of 4000 bytes");
    let mut fetched = 0;
    while fetched < 10 {
        let batch = c.fetch("bytes", Fetch { max_messages: 10, ..Fetch::default() }).expect("FETCH");
        assert!((1..=2).contains(&batch.len()), "{} messages of 400 bytes on a budget of 1000 bytes", batch.len());
        fetched += batch.len();
    }
}

/// Parked FETCHes woken by one PRODUCE larger than the deliveries' budget:
/// the first waiter gets what the sync's budget allows, the others are
/// answered at the next syncs, in the order they parked, with no further
/// request from anyone (the loop does not sleep while deliveries wait:
/// their long polls would otherwise end first, empty).
#[test]
fn parked_fetches_past_the_budget_are_answered_at_the_next_syncs_without_waiting() {
    const WAITERS: usize = 5;
    let (srv, _dir) = start(budget(8));
    let mut c = client(&srv);
    c.create_topic("wake", TopicSettings::default()).expect("CREATE_TOPIC");
    let long_poll =
        Request::Fetch { topic: "wake", group: "", max_messages: 50, max_bytes: 0, wait_ms: 60_000, ack_timeout_ms: 0 };
    let mut waiters: Vec<Client> = Vec::new();
    for i in 0..WAITERS {
        let mut w = client(&srv);
        w.send(&long_poll);
        w.flush().expect("FETCH");
        wait_until("the FETCH to park", || stat(&mut c, "wake", "waiters") == i as u64 + 1);
        waiters.push(w);
    }
    let payloads: Vec<Vec<u8>> = (0..40u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let (first, _) = c.produce_batch("wake", &payloads).expect("PRODUCE");
    let mut ids = Vec::new();
    for w in &mut waiters {
        match w.recv().expect("the parked FETCH's reply") {
            runnel::client::OwnedReply::Messages { messages, .. } => {
                assert_eq!(messages.len(), 8, "the budget's worth to each waiter, in turn");
                ids.extend(messages.iter().map(|m| m.id));
            }
            other => panic!("FETCH: {other:?}"),
        }
    }
    assert_eq!(ids, (first..first + 40).collect::<Vec<_>>(), "oldest waiter first, every message once");
}

/// Pushes past the deliveries' budget: each sync pushes the budget's worth,
/// round the subscribers; the rest follows at the next syncs without any
/// request; every subscriber gets its share, each message once, in order.
#[test]
fn pushes_past_the_budget_reach_every_subscriber_over_the_next_syncs() {
    const SUBSCRIBERS: usize = 4;
    let (srv, _dir) = start(budget(8));
    let mut c = client(&srv);
    c.create_topic("push", TopicSettings::default()).expect("CREATE_TOPIC");
    let mut subs = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut s = Raw::connect(srv.addr);
        let mut out = Vec::new();
        codec::encode_request(&mut out, 0, &Request::Hello { min_version: 3, max_version: 3, token: b"" }, 1);
        let subscribe = Request::Subscribe { topic: "push", group: "", credit: 100, ack_timeout_ms: 0 };
        codec::encode_request(&mut out, 1, &subscribe, SINCE_PUSH);
        s.write(&out);
        assert!(matches!(s.recv().reply(), Reply::Hello { .. }));
        assert!(matches!(s.recv().reply(), Reply::Subscribed { .. }));
        subs.push(s);
    }
    let payloads: Vec<Vec<u8>> = (0..64u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let (first, _) = c.produce_batch("push", &payloads).expect("PRODUCE");
    let mut all = Vec::new();
    for s in &mut subs {
        let mut mine = Vec::new();
        while mine.len() < 64 / SUBSCRIBERS {
            let got = s.recv();
            let Reply::Pushed { messages, .. } = got.reply() else { panic!("not a push: {:?}", got.reply()) };
            assert!(messages.len() <= 8, "a pushed frame of {} messages on a budget of 8", messages.len());
            mine.extend(messages.iter().map(|m| m.id));
        }
        assert_eq!(mine.len(), 64 / SUBSCRIBERS, "an even share");
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "in order: {mine:?}");
        all.extend(mine);
    }
    all.sort_unstable();
    assert_eq!(all, (first..first + 64).collect::<Vec<_>>(), "every message once");
}
