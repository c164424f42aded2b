//! Ordering by key over the wire (protocol version 4): a group created
//! ORDERED hands out one message of a key at a time, in produce order,
//! to competing consumers, keeps other keys and unkeyed messages going,
//! keeps the flag and the order across a restart, and shows the flag to
//! version-4 sessions only. The model test of the rule itself is
//! `src/queue/order_tests.rs`.

mod common;

use std::time::Duration;

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, ProduceMessage};
use runnel::codec::{GroupSettings, Start};
use runnel::log::LogOptions;

fn connect(srv: &Server) -> Client {
    let mut c = Client::connect(srv.addr).expect("connect");
    c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
    assert!(c.version >= 4, "the broker speaks version 4");
    c
}

fn ordered() -> GroupSettings<'static> {
    GroupSettings { ordered: true, ..GroupSettings::default() }
}

/// Produces one message per `(payload, key)`.
fn produce(c: &mut Client, msgs: &[(&str, Option<&str>)]) -> Vec<u64> {
    let batch: Vec<ProduceMessage<'_>> = msgs
        .iter()
        .map(|(p, k)| {
            let m = ProduceMessage::new(p.as_bytes());
            match k {
                Some(k) => m.key(k.as_bytes()),
                None => m,
            }
        })
        .collect();
    let (first, n) = c.produce_messages("t", &batch).expect("PRODUCE");
    (first..first + u64::from(n)).collect()
}

/// The payloads a FETCH of group `o` hands this consumer now.
fn take(c: &mut Client) -> Vec<String> {
    let f = Fetch { max_messages: 100, wait_ms: 0, ..Fetch::default() };
    let got = c.fetch_group("t", "o", f).expect("FETCH");
    got.iter().map(|m| String::from_utf8_lossy(&m.payload).into_owned()).collect()
}

/// One group section's counter of STATS for topic `t`.
fn group_stat(c: &mut Client, key: &str) -> Option<u64> {
    let stats = c.stats(Some("t")).expect("STATS");
    let section = stats.iter().find(|s| s.0 == "t/o")?;
    section.1.iter().find(|kv| kv.0 == key).map(|kv| kv.1)
}

#[test]
fn an_ordered_group_hands_out_one_message_of_a_key_at_a_time_in_order() {
    let (srv, _dir) = Server::start(Config::default());
    let (mut c1, mut c2) = (connect(&srv), connect(&srv));
    c1.create_group("t", "o", ordered(), Start::Earliest).expect("CREATE_GROUP");
    let msgs = [("a1", Some("a")), ("a2", Some("a")), ("b1", Some("b")), ("x", None), ("a3", Some("a")), ("y", None)];
    let ids = produce(&mut c1, &msgs);
    let id_of = |payload: &str| ids[msgs.iter().position(|m| m.0 == payload).expect("a payload produced")];
    assert_eq!(take(&mut c1), ["a1", "b1", "x", "y"], "one of each key, and every unkeyed message");
    assert_eq!(take(&mut c2), Vec::<String>::new(), "a2 waits for a1, a3 behind it");
    assert_eq!(group_stat(&mut c1, "key_waiting"), Some(2));
    assert_eq!(group_stat(&mut c1, "keys_outstanding"), Some(2));
    // A NACK of the holder gives it back before the rest of its key.
    let a1 = id_of("a1");
    c1.nack_group("t", "o", &[a1], 0, false).expect("NACK");
    assert_eq!(take(&mut c2), ["a1"], "a1 again, to the other consumer");
    c2.ack_group("t", "o", &[a1]).expect("ACK");
    assert_eq!(take(&mut c1), ["a2"], "a2 once the group is done with a1");
    assert_eq!(take(&mut c2), Vec::<String>::new(), "a3 waits for a2");
    // A consumer that leaves gives its messages back; the key goes on.
    drop(c1);
    let mut c3 = connect(&srv);
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(take(&mut c3));
        if got.contains(&"a2".to_string()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(got.contains(&"a2".to_string()) && !got.contains(&"a3".to_string()), "a2 back, a3 still waits: {got:?}");
    let a2 = id_of("a2");
    c3.ack_group("t", "o", &[a2]).expect("ACK");
    assert!(take(&mut c3).contains(&"a3".to_string()), "a3 at last");
    srv.stop();
}

#[test]
fn the_flag_and_the_order_survive_a_restart_and_older_sessions_do_not_see_the_flag() {
    let dir = TempDir::new("ordered-restart");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = connect(&srv);
    c.create_group("t", "o", ordered(), Start::Earliest).expect("CREATE_GROUP");
    produce(&mut c, &[("k1", Some("k")), ("k2", Some("k")), ("j1", Some("j"))]);
    assert_eq!(take(&mut c), ["k1", "j1"]);
    srv.stop();

    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = connect(&srv);
    let groups = c.list_groups("t").expect("LIST_GROUPS");
    assert!(groups.iter().any(|g| g.name == "o" && g.ordered), "the flag is kept: {groups:?}");
    assert_eq!(take(&mut c), ["k1", "j1"], "what was in flight comes back; k2 still waits for k1");
    let mut v3 = Client::connect_upto(srv.addr, b"", 3).expect("connect v3");
    let groups = v3.list_groups("t").expect("LIST_GROUPS");
    assert!(groups.iter().any(|g| g.name == "o" && !g.ordered), "a version-3 session sees no flag: {groups:?}");
    srv.stop();
}
