//! Consumer groups over the network (protocol version 2): every group gets
//! every message, acks are per group, a message leaves once every group is
//! done with it; start positions, reset, delete, the errors, STATS per
//! group, version-1 clients on the default group, and restarts (with
//! compaction) that rebuild every group exactly.

mod common;

use common::wire::{code, now};
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, ErrorCode, Request, TopicSettings};
use runnel::limits::Limits;
use runnel::log::LogOptions;

fn ids(got: &[runnel::client::Delivered]) -> Vec<u64> {
    got.iter().map(|m| m.id).collect()
}

/// Everything group `g` has ready, fetched and left in flight.
fn take(c: &mut Client, topic: &str, g: &str) -> Vec<u64> {
    let f = Fetch { max_messages: 1000, ack_timeout_ms: 600_000, ..Fetch::default() };
    ids(&c.fetch_group(topic, g, f).expect("fetch"))
}

fn create(c: &mut Client, topic: &str, g: &str, start: Start) -> (bool, u64) {
    c.create_group(topic, g, GroupSettings::default(), start).expect("create group")
}

/// A group's entry in LIST_GROUPS.
fn entry(c: &mut Client, topic: &str, g: &str) -> runnel::client::GroupEntry {
    let groups = c.list_groups(topic).expect("list groups");
    groups.into_iter().find(|e| e.name == g).unwrap_or_else(|| panic!("no group {g:?}"))
}

/// A key of group `g`'s STATS section (`<topic>/<group>`).
fn gstat(c: &mut Client, topic: &str, g: &str, key: &str) -> Option<u64> {
    let name = format!("{topic}/{g}");
    let sections = c.stats(Some(topic)).expect("stats");
    let (_, kv) = sections.into_iter().find(|s| s.0 == name)?;
    kv.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A new connection whose FETCH of group `g` of topic "t" is parked (as
/// `c` sees in STATS).
fn park(srv: &Server, c: &mut Client, g: &str) -> Client {
    let mut waiting = srv.client_v2();
    let fetch =
        Request::Fetch { topic: "t", group: g, max_messages: 1, max_bytes: 0, wait_ms: 30_000, ack_timeout_ms: 0 };
    waiting.send(&fetch);
    waiting.flush().expect("flush");
    common::wire::wait_until("the FETCH parks", || gstat(c, "t", g, "waiters") == Some(1));
    waiting
}

fn live(c: &mut Client, topic: &str) -> u64 {
    c.stat(topic, "bytes").expect("stats").expect("bytes") // payloads are one byte each
}

#[test]
fn every_group_gets_every_message_and_a_message_stays_until_all_are_done() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    create(&mut c, "t", "a", Start::Earliest);
    create(&mut c, "t", "b", Start::Earliest);
    let (first, _) = c.produce_batch("t", &[b"1", b"2", b"3"]).unwrap();
    let all = vec![first, first + 1, first + 2];
    assert_eq!(take(&mut c, "t", "a"), all);
    assert_eq!(take(&mut c, "t", "b"), all, "b competes with nobody in a");
    // Acks are per group: a's ack does not touch b's in-flight copy.
    assert_eq!(c.ack_group("t", "a", &all).unwrap().done, 3);
    assert_eq!(live(&mut c, "t"), 3, "b still needs all three");
    let again = c.ack_group("t", "a", &[first]).unwrap();
    assert_eq!((again.done, again.failed), (0, vec![first]), "acked already in a");
    assert_eq!(c.nack_group("t", "b", &[first], 0, false).unwrap().done, 1);
    assert_eq!(take(&mut c, "t", "b"), vec![first], "back for retry in b only");
    assert!(take(&mut c, "t", "a").is_empty());
    assert_eq!(c.ack_group("t", "b", &all).unwrap().done, 3);
    assert_eq!(live(&mut c, "t"), 0, "every group is done");
    let (a, b) = (entry(&mut c, "t", "a"), entry(&mut c, "t", "b"));
    assert_eq!((a.stats.inflight, b.stats.inflight, a.stats.lag), (0, 0, 0));
}

#[test]
fn start_positions_and_an_implicit_group_at_the_earliest_message() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    let (first, _) = c.produce_batch("t", &[b"1", b"2"]).unwrap();
    // Later born times for the last two (not a timing assertion: only so
    // that a start by time has something to tell apart).
    std::thread::sleep(std::time::Duration::from_millis(20));
    c.produce_batch("t", &[b"3", b"4"]).unwrap();
    // No group existed: the topic kept everything for the first one, which
    // a FETCH creates at the earliest message.
    assert_eq!(take(&mut c, "t", "implicit").len(), 4);
    assert_eq!(create(&mut c, "t", "latest", Start::Latest), (true, first + 4));
    assert_eq!(create(&mut c, "t", "from-id", Start::Id(first + 2)).1, first + 2);
    let born = c.fetch_group("t", "probe", now(4)).unwrap()[2].born_ms;
    assert_eq!(create(&mut c, "t", "from-time", Start::Time(born)).1, first + 2);
    assert!(take(&mut c, "t", "latest").is_empty());
    assert_eq!(take(&mut c, "t", "from-id"), vec![first + 2, first + 3]);
    // An id past the newest starts with the next message produced.
    assert_eq!(create(&mut c, "t", "far", Start::Id(first + 1000)).1, first + 4);
    let (created, _) = create(&mut c, "t", "from-id", Start::Earliest);
    assert!(!created, "an existing group keeps its position");
    let next = c.produce("t", b"5").unwrap();
    assert_eq!(take(&mut c, "t", "latest"), vec![next]);
    assert_eq!(take(&mut c, "t", "from-time"), vec![first + 2, first + 3, next]);
    assert_eq!(take(&mut c, "t", "far"), vec![next]);
}

#[test]
fn reset_moves_a_group_and_drops_what_it_had_in_flight() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    create(&mut c, "t", "a", Start::Earliest);
    create(&mut c, "t", "keeper", Start::Earliest);
    let (first, _) = c.produce_batch("t", &[b"1", b"2", b"3"]).unwrap();
    let got = take(&mut c, "t", "a");
    c.ack_group("t", "a", &got[..2]).unwrap();
    // Back to the start: the keeper group still holds them, so a gets all
    // three again; its in-flight copy of the third is dropped.
    assert_eq!(c.reset_group("t", "a", Start::Earliest).unwrap(), first, "the oldest message held");
    assert_eq!(c.ack_group("t", "a", &[first + 2]).unwrap().failed, vec![first + 2]);
    assert_eq!(take(&mut c, "t", "a"), vec![first, first + 1, first + 2]);
    // Forward past everything: a is done with all of them.
    assert_eq!(c.reset_group("t", "a", Start::Latest).unwrap(), first + 3);
    assert!(take(&mut c, "t", "a").is_empty());
    assert_eq!(entry(&mut c, "t", "a").stats.inflight, 0);
    assert_eq!(code(c.reset_group("t", "nope", Start::Latest)), ErrorCode::UnknownGroup);
}

#[test]
fn deleting_a_group_releases_what_only_it_needed_and_ends_its_waiters() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    create(&mut c, "t", "a", Start::Earliest);
    create(&mut c, "t", "b", Start::Earliest);
    c.produce_batch("t", &[b"1", b"2", b"3"]).unwrap();
    let got = take(&mut c, "t", "a");
    c.ack_group("t", "a", &got).unwrap();
    take(&mut c, "t", "b");
    // A consumer of b parks; deleting b answers it UNKNOWN_GROUP.
    let mut waiting = park(&srv, &mut c, "b");
    assert_eq!(c.delete_group("t", "b").unwrap(), 3, "it held three in flight");
    assert_eq!(code(waiting.recv()), ErrorCode::UnknownGroup);
    common::wire::wait_until("the sweep releases them", || live(&mut c, "t") == 0);
    assert_eq!(code(c.delete_group("t", "b")), ErrorCode::UnknownGroup);
    assert_eq!(code(c.ack_group("t", "b", &[1])), ErrorCode::UnknownGroup);
    // A group of the same name later is a new group, at its start.
    assert!(create(&mut c, "t", "b", Start::Earliest).0, "created anew");
    assert!(take(&mut c, "t", "b").is_empty());
}

#[test]
fn bad_names_filters_and_too_many_groups_get_their_errors_and_disturb_nothing() {
    let limits = Limits { groups_per_topic_max: 2, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let mut c = srv.client_v2();
    let id = c.produce("t", b"m").unwrap();
    create(&mut c, "t", "a", Start::Earliest);
    let bad = |filter| GroupSettings { filter, ..GroupSettings::default() };
    assert_eq!(code(c.create_group("t", "f", bad("re:("), Start::Earliest)), ErrorCode::BadFilter);
    assert_eq!(code(c.create_group("t", "f", bad("a || "), Start::Earliest)), ErrorCode::BadFilter);
    assert_eq!(code(c.fetch_group("t", "bad name", now(1))), ErrorCode::BadArgument);
    assert_eq!(code(c.fetch_group("t", "ünï", now(1))), ErrorCode::BadArgument);
    assert_eq!(code(c.ack_group("t", "missing", &[id])), ErrorCode::UnknownGroup);
    assert_eq!(code(c.touch_group("t", "missing", &[id], 0)), ErrorCode::UnknownGroup);
    assert_eq!(code(c.nack_group("t", "missing", &[id], 0, false)), ErrorCode::UnknownGroup);
    create(&mut c, "t", "b", Start::Earliest);
    assert_eq!(code(c.fetch_group("t", "c", now(1))), ErrorCode::TooManyGroups);
    assert_eq!(code(c.create_group("t", "c", GroupSettings::default(), Start::Latest)), ErrorCode::TooManyGroups);
    assert_eq!(code(c.list_groups("nope")), ErrorCode::UnknownTopic);
    // Nothing else changed: both groups still get the message.
    let names: Vec<String> = c.list_groups("t").unwrap().into_iter().map(|g| g.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(take(&mut c, "t", "a"), vec![id]);
    assert_eq!(take(&mut c, "t", "b"), vec![id]);
}

#[test]
fn a_filter_drops_untagged_messages_for_its_group_only() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    let settings = GroupSettings { filter: "red || blue", ..GroupSettings::default() };
    c.create_group("t", "colors", settings, Start::Earliest).unwrap();
    create(&mut c, "t", "all", Start::Earliest);
    let (first, _) = c.produce_batch("t", &[b"1", b"2"]).unwrap();
    assert!(take(&mut c, "t", "colors").is_empty(), "untagged messages pass only *");
    let e = entry(&mut c, "t", "colors");
    assert_eq!((e.filter.as_str(), e.stats.lag), ("red || blue", 0));
    assert_eq!(gstat(&mut c, "t", "colors", "filtered"), Some(2));
    assert_eq!(take(&mut c, "t", "all"), vec![first, first + 1]);
    c.ack_group("t", "all", &[first, first + 1]).unwrap();
    assert_eq!(live(&mut c, "t"), 0, "done for the filtering group too");
}

#[test]
fn version_1_clients_use_the_default_group_and_see_version_1_stats() {
    let (srv, _dir) = Server::start(Config::default());
    let mut v2 = srv.client_v2();
    let mut v1 = srv.client();
    create(&mut v2, "t", "a", Start::Earliest);
    let id = v1.produce("t", b"m").unwrap();
    assert_eq!(ids(&v1.fetch("t", now(1)).unwrap()), vec![id], "the default group, created by the FETCH");
    assert_eq!(take(&mut v2, "t", ""), Vec::<u64>::new(), "the same group: in flight to v1");
    v1.ack("t", &[id]).unwrap();
    assert_eq!(live(&mut v2, "t"), 1, "group a still needs it");
    let sections: Vec<String> = v1.stats(Some("t")).unwrap().into_iter().map(|s| s.0).collect();
    assert_eq!(sections, ["", "t"], "version 1 sees version 1's sections");
    let sections: Vec<String> = v2.stats(Some("t")).unwrap().into_iter().map(|s| s.0).collect();
    assert_eq!(sections, ["", "t", "t/", "t/a"]);
    assert_eq!(gstat(&mut v2, "t", "", "acked"), Some(1));
    assert_eq!(gstat(&mut v2, "t", "a", "lag"), Some(1));
    assert_eq!(gstat(&mut v2, "t", "", "consumers"), Some(2), "both clients fetched from it");
}

#[test]
fn a_topic_without_groups_keeps_its_messages_for_the_first_group() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    c.create_topic("t", TopicSettings::default()).unwrap();
    let (first, _) = c.produce_batch("t", &[b"1", b"2"]).unwrap();
    assert!(c.list_groups("t").unwrap().is_empty());
    assert_eq!(take(&mut c, "t", "late"), vec![first, first + 1]);
}

#[test]
fn a_parked_fetch_of_a_named_group_gets_the_next_message() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client_v2();
    create(&mut c, "t", "a", Start::Earliest);
    create(&mut c, "t", "b", Start::Earliest);
    let mut waiting = park(&srv, &mut c, "b");
    let long = Fetch { max_messages: 1, wait_ms: 30_000, ..Fetch::default() };
    let id = c.produce("t", b"m").unwrap();
    match waiting.recv().unwrap() {
        runnel::client::OwnedReply::Messages { messages, .. } => assert_eq!(ids(&messages), vec![id]),
        other => panic!("expected messages, got {other:?}"),
    }
    assert_eq!(ids(&c.fetch_group("t", "a", long).unwrap()), vec![id], "a gets it too");
}

#[test]
fn a_broadcast_group_gives_every_consumer_every_message_from_when_it_joined() {
    let dir = TempDir::new("broadcast");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut admin = srv.client_v2();
    let settings = GroupSettings { broadcast: true, ..GroupSettings::default() };
    admin.create_group("t", "all", settings, Start::Earliest).unwrap();
    let (mut a, mut b) = (srv.client_v2(), srv.client_v2());
    assert!(take(&mut a, "t", "all").is_empty(), "a joins at the tail");
    let (first, _) = admin.produce_batch("t", &[b"1", b"2"]).unwrap();
    assert_eq!(take(&mut a, "t", "all"), vec![first, first + 1]);
    assert!(take(&mut b, "t", "all").is_empty(), "b joined after them");
    let third = admin.produce("t", b"3").unwrap();
    assert_eq!(take(&mut a, "t", "all"), vec![third]);
    assert_eq!(take(&mut b, "t", "all"), vec![third], "each consumer gets its own copy");
    let e = entry(&mut admin, "t", "all");
    assert!(e.broadcast);
    assert_eq!((e.stats.consumers, e.stats.inflight), (2, 4));
    assert_eq!(gstat(&mut admin, "t", "all", "delivered"), Some(4), "the members' deliveries");
    // An ACK counts for its consumer only; b's copy of the third is not a's.
    assert_eq!(a.ack_group("t", "all", &[first, first + 1, third]).unwrap().done, 3);
    assert_eq!(b.ack_group("t", "all", &[first]).unwrap().failed, vec![first], "never b's");
    assert_eq!(live(&mut admin, "t"), 1, "only b still holds the third");
    // b leaves: its in-flight copy goes with it (no one else gets it).
    drop(b);
    common::wire::wait_until("b's copy goes", || live(&mut admin, "t") == 0);
    assert_eq!(entry(&mut admin, "t", "all").stats.consumers, 1);
    // A reset moves the consumers; the group itself still needs nothing.
    admin.reset_group("t", "all", Start::Earliest).unwrap();
    let fourth = admin.produce("t", b"4").unwrap();
    assert_eq!(take(&mut a, "t", "all"), vec![fourth]);
    a.ack_group("t", "all", &[fourth]).unwrap();
    // The mode is kept; a restart keeps the group, not its positions.
    let clustering = GroupSettings::default();
    assert_eq!(code(admin.create_group("t", "all", clustering, Start::Earliest)), ErrorCode::BadArgument);
    drop((a, admin));
    srv.stop();
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    let e = entry(&mut c, "t", "all");
    assert!(e.broadcast && e.stats.consumers == 0);
    c.produce("t", b"5").unwrap();
    assert_eq!(live(&mut c, "t"), 0, "with no member the group needs nothing");
    assert!(take(&mut c, "t", "all").is_empty());
}

/// Sends `frame` (a whole request frame, request id `rid`) and returns the
/// error code of its reply.
fn raw_error(c: &mut Client, rid: u32, frame: &[u8]) -> ErrorCode {
    c.write_raw(frame).expect("write");
    c.expect_reply(rid);
    code(c.recv())
}

#[test]
fn bad_group_fields_get_their_errors_and_the_connection_goes_on() {
    let limits = Limits { group_name_bytes_max: 8, filter_bytes_max: 16, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let mut c = srv.client_v2();
    let id = c.produce("t", b"m").unwrap();
    let create = |group, filter| Request::CreateGroup {
        topic: "t",
        group,
        settings: GroupSettings { filter, ..GroupSettings::default() },
        start: Start::Earliest,
    };
    let encode = |rid, req: &Request<'_>| {
        let mut f = Vec::new();
        codec::encode_request(&mut f, rid, req, 2);
        f
    };
    // The flags byte follows the header, the topic "t" and the group "g".
    let flags_at = 12 + 3 + 3;
    let mut f = encode(1, &create("g", ""));
    f[flags_at] = 0x80;
    assert_eq!(raw_error(&mut c, 1, &f), ErrorCode::Malformed, "an unknown flag");
    let mut f = encode(2, &create("g", ""));
    f[flags_at + 1] = 9;
    assert_eq!(raw_error(&mut c, 2, &f), ErrorCode::BadArgument, "an unknown start kind");
    let mut f = encode(3, &create("g", ""));
    f[flags_at + 1] = 1; // latest, with a value
    f[flags_at + 2] = 5;
    assert_eq!(raw_error(&mut c, 3, &f), ErrorCode::BadArgument, "a value with latest");
    let long = encode(4, &create("g", "a-filter-of-17-by"));
    assert_eq!(raw_error(&mut c, 4, &long), ErrorCode::BadFilter, "a filter over filter_bytes_max");
    let name = encode(5, &create("nine-byte", ""));
    assert_eq!(raw_error(&mut c, 5, &name), ErrorCode::BadArgument, "a name over group_name_bytes_max");
    let regex = encode(6, &create("g", "re:[z-a]"));
    assert_eq!(raw_error(&mut c, 6, &regex), ErrorCode::BadFilter, "a regex that does not compile");
    let reset = Request::ResetGroup { topic: "t", group: "g", start: Start::Latest };
    let mut f = encode(7, &reset);
    f[flags_at] = 4;
    assert_eq!(raw_error(&mut c, 7, &f), ErrorCode::BadArgument, "RESET_GROUP: an unknown start kind");
    // Nothing was created, and the connection goes on.
    assert!(c.list_groups("t").unwrap().is_empty());
    assert_eq!(take(&mut c, "t", "g"), vec![id]);
    // The group ops need version 2: a version-1 session gets UNKNOWN_OP.
    let mut v1 = srv.client();
    let f = encode(8, &Request::ListGroups { topic: "t" });
    assert_eq!(raw_error(&mut v1, 8, &f), ErrorCode::UnknownOp);
    v1.ping().expect("the version-1 connection goes on");
}

/// Small segments, so that a few hundred messages make compaction run.
fn small_segments() -> LogOptions {
    LogOptions { segment_bytes_max: 16 << 10, ..LogOptions::default() }
}

#[test]
fn a_restart_rebuilds_every_group_and_compaction_never_gives_back_an_acked_message() {
    let dir = TempDir::new("groups-restart");
    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    create(&mut c, "t", "fast", Start::Earliest);
    create(&mut c, "t", "slow", Start::Earliest);
    let settings = GroupSettings { filter: "x", max_deliveries: 9, ..GroupSettings::default() };
    c.create_group("t", "tagged", settings, Start::Latest).unwrap();
    // Fast acks everything as it comes; slow holds the first few hundred
    // (acks none): compaction must move them forward for slow while
    // keeping fast's acks.
    let payload = vec![b'p'; 200];
    let mut all = Vec::new();
    for _ in 0..40 {
        let (first, n) = c.produce_batch("t", &[payload.as_slice(); 8]).unwrap();
        all.extend(first..first + u64::from(n));
        let got = take(&mut c, "t", "fast");
        assert_eq!(c.ack_group("t", "fast", &got).unwrap().done as usize, got.len());
    }
    let slow_got = take(&mut c, "t", "slow");
    assert_eq!(slow_got, all);
    // slow acks the second half; the first half stays in flight.
    let half = all.len() / 2;
    c.ack_group("t", "slow", &all[half..]).unwrap();
    // Churn on another topic until compaction has removed segments.
    for _ in 0..400 {
        let (first, n) = c.produce_batch("churn", &[payload.as_slice(); 8]).unwrap();
        let got = c.fetch("churn", Fetch { max_messages: 100, ..Fetch::default() }).unwrap();
        assert_eq!(got.len(), n as usize);
        c.ack("churn", &(first..first + u64::from(n)).collect::<Vec<_>>()).unwrap();
        if c.stat("", "compactions").unwrap().unwrap_or(0) >= 8 {
            break;
        }
    }
    assert!(c.stat("", "compactions").unwrap().unwrap_or(0) >= 1, "compaction ran");
    drop(c);
    srv.stop();

    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client_v2();
    let names: Vec<String> = c.list_groups("t").unwrap().into_iter().map(|g| g.name).collect();
    assert_eq!(names, ["fast", "slow", "tagged"]);
    let tagged = entry(&mut c, "t", "tagged");
    assert_eq!((tagged.filter.as_str(), tagged.max_deliveries), ("x", 9));
    assert!(take(&mut c, "t", "fast").is_empty(), "fast acked everything before the restart");
    assert_eq!(take(&mut c, "t", "slow"), all[..half].to_vec(), "slow gets back only what it had not acked");
    assert!(take(&mut c, "t", "tagged").is_empty());
    let next = c.produce("t", b"n").unwrap();
    assert_eq!(take(&mut c, "t", "fast"), vec![next]);
}

/// Groups with the same tag filter share one compiled filter, on any
/// topic and through a restart; a new filter that would take the compiled
/// filters past `compiled_filters_bytes_max` gets BAD_FILTER, one other
/// groups use costs nothing more; and a restart under a budget lowered
/// below what the log's filters take keeps every group with its filter,
/// refusing only new filters (docs/protocol.md, "Tag filters").
#[test]
fn groups_share_compiled_filters_within_a_budget_a_restart_never_enforces() {
    let dir = TempDir::new("filter-budget");
    // Room for one `re:\w{5}` (some 170 KB compiled), not for two.
    let limits = Limits { compiled_filters_bytes_max: 256 << 10, ..Limits::default() };
    let srv =
        Server::start_in(Config { limits: limits.clone(), ..Config::default() }, LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    let heavy = GroupSettings { filter: r"re:\w{5}", ..GroupSettings::default() };
    for i in 0..100 {
        c.create_group(&format!("t{i}"), "audit", heavy, Start::Earliest).expect("a shared filter");
    }
    let bytes = common::wire::stat(&mut c, "", "compiled_filters_bytes");
    assert_eq!(common::wire::stat(&mut c, "", "compiled_filters"), 1, "one compiled filter for 100 groups");
    assert!(bytes > 64 << 10 && bytes < 256 << 10, "{bytes} bytes");
    let other = GroupSettings { filter: r"re:\w{6}", ..GroupSettings::default() };
    match c.create_group("t0", "other", other, Start::Earliest) {
        Err(runnel::client::Error::Broker { code, message }) => {
            assert_eq!(ErrorCode::from_u8(code), Some(ErrorCode::BadFilter), "{message}");
            assert!(message.contains("compiled_filters_bytes_max"), "{message}");
        }
        other => panic!("a second large filter past the budget: {other:?}"),
    }
    assert!(c.list_groups("t0").expect("list").iter().all(|g| g.name != "other"), "nothing was done");
    let small = GroupSettings { filter: "eu || us", ..GroupSettings::default() };
    c.create_group("t0", "lists", small, Start::Earliest).expect("a small filter fits");
    drop(c);
    srv.stop();

    let lowered = Limits { compiled_filters_bytes_max: 32 << 10, filter_compiled_bytes_max: 32 << 10, ..limits };
    let srv = Server::start_in(Config { limits: lowered, ..Config::default() }, LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    assert_eq!(common::wire::stat(&mut c, "", "compiled_filters"), 2, "each text compiled once at the restart");
    let after = common::wire::stat(&mut c, "", "compiled_filters_bytes");
    assert!(after > bytes && after > 32 << 10, "{after} bytes: both kept, past the lowered budget");
    for i in 0..100 {
        let groups = c.list_groups(&format!("t{i}")).expect("list");
        assert!(groups.iter().any(|g| g.name == "audit" && g.filter == r"re:\w{5}"), "t{i}: {groups:?}");
    }
    let tagged = |tag: &str| [runnel::client::ProduceMessage::new(b"m").tag(tag)];
    c.produce_messages("t7", &tagged("ab")).expect("produce");
    let kept = c.produce_messages("t7", &tagged("abcde")).expect("produce").0;
    assert_eq!(take(&mut c, "t7", "audit"), [kept], "the filter still decides");
    let refused = c.create_group("t0", "new", GroupSettings { filter: "x", ..GroupSettings::default() }, Start::Latest);
    assert_eq!(code(refused), ErrorCode::BadFilter, "a new filter while the log's take more than the budget");
    c.create_group("t0", "again", heavy, Start::Latest).expect("a filter other groups use costs nothing more");
    for i in 0..100 {
        c.delete_group(&format!("t{i}"), "audit").expect("delete");
    }
    c.delete_group("t0", "again").expect("delete");
    assert_eq!(common::wire::stat(&mut c, "", "compiled_filters"), 1, "gone with its last group");
    c.create_group("t0", "new", GroupSettings { filter: "x", ..GroupSettings::default() }, Start::Latest)
        .expect("room again");
}
