//! ACK_PRODUCE over the network (protocol version 3): acks and produces
//! in one frame, all of it or none; the reply names the ids no longer in
//! flight to the connection, and then nothing was done; a restart rebuilds
//! both halves from the one record.

mod common;

use common::wire::{code, now};
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, ProduceMessage};
use runnel::codec::ErrorCode;
use runnel::codec::group::{GroupSettings, Start};
use runnel::log::LogOptions;

fn payloads(c: &mut Client, topic: &str) -> Vec<Vec<u8>> {
    let hold = Fetch { max_messages: 1000, ack_timeout_ms: 600_000, ..Fetch::default() };
    c.fetch(topic, hold).expect("fetch").into_iter().map(|m| m.payload).collect()
}

fn held(c: &mut Client, topic: &str, n: u32, ack_timeout_ms: u32) -> Vec<u64> {
    let f = Fetch { max_messages: n, ack_timeout_ms, ..Fetch::default() };
    c.fetch(topic, f).expect("fetch").iter().map(|m| m.id).collect()
}

#[test]
fn acks_and_produces_together_and_survive_a_restart() {
    let dir = TempDir::new("ack-produce");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    c.produce_batch("in", &[b"1", b"2", b"3"]).expect("produce");
    let ids = held(&mut c, "in", 3, 600_000);
    let x = [ProduceMessage::new(b"x").tag("t")];
    let yz = [ProduceMessage::new(b"y"), ProduceMessage::new(b"z")];
    let r = c.ack_produce(("in", ""), &ids[..2], &[("out", &x), ("out2", &yz)]).expect("ack_produce");
    assert_eq!((r.done, r.failed.clone()), (2, vec![]));
    assert_eq!(r.outputs, [(1, 1), (1, 2)]);
    drop(c);
    srv.stop();
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client_v2();
    assert_eq!(payloads(&mut c, "in"), [b"3".to_vec()], "the two acked are gone, the third is back");
    assert_eq!(payloads(&mut c, "out"), [b"x".to_vec()]);
    assert_eq!(payloads(&mut c, "out2"), [b"y".to_vec(), b"z".to_vec()]);
}

#[test]
fn an_id_no_longer_in_flight_to_the_connection_means_nothing_is_done() {
    let (srv, _dir) = Server::start(Config::default());
    let mut a = srv.client_v2();
    let mut b = srv.client_v2();
    a.produce_batch("in", &[b"1", b"2"]).expect("produce");
    let mine = held(&mut a, "in", 1, 600_000);
    let theirs = held(&mut b, "in", 1, 600_000);
    let out = [ProduceMessage::new(b"o")];
    let both = [mine[0], theirs[0]];
    let r = a.ack_produce(("in", ""), &both, &[("out", &out)]).expect("ack_produce");
    assert_eq!((r.done, r.failed, r.outputs), (0, vec![theirs[0]], vec![]), "the reply names the one held elsewhere");
    assert!(payloads(&mut a, "out").is_empty(), "nothing was produced");
    assert_eq!(a.ack("in", &mine).expect("ack").done, 1, "nothing was acked either");
    assert_eq!(code(a.ack_produce(("in", ""), &[theirs[0], theirs[0]], &[])), ErrorCode::BadArgument);
    let mut old = Client::connect_upto(srv.addr, b"", 2).expect("connect");
    assert!(matches!(old.ack_produce(("in", ""), &mine, &[]), Err(runnel::client::Error::Version { .. })));
    assert_eq!(b.fetch("in", now(1)).expect("fetch").len(), 0);
}

/// A broadcast group has no shared pending list for ACK_PRODUCE to settle:
/// it is refused with BAD_ARGUMENT whoever asks, a member of the group or a
/// connection that never fetched from it, and nothing is acked or produced
/// (an ACK on the group, by contrast, acts on the member's own copies).
#[test]
fn a_broadcast_group_is_refused_to_members_and_non_members_alike() {
    let (srv, _dir) = Server::start(Config::default());
    let mut member = srv.client_v2();
    let mut stranger = srv.client_v2();
    let fanout = GroupSettings { broadcast: true, ..GroupSettings::default() };
    member.create_group("in", "fan", fanout, Start::Earliest).expect("create group");
    assert!(member.fetch_group("in", "fan", now(1)).expect("join").is_empty(), "a member starts at the tail");
    member.produce_batch("in", &[b"1"]).expect("produce");
    let f = Fetch { max_messages: 1, ack_timeout_ms: 600_000, ..Fetch::default() };
    let ids: Vec<u64> = member.fetch_group("in", "fan", f).expect("fetch").iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 1);
    let out = [ProduceMessage::new(b"o")];
    for (who, c) in [("a member", &mut member), ("a non-member", &mut stranger)] {
        let refused = c.ack_produce(("in", "fan"), &ids, &[("out", &out)]);
        assert_eq!(code(refused), ErrorCode::BadArgument, "{who}");
    }
    assert!(payloads(&mut stranger, "out").is_empty(), "nothing was produced");
    assert_eq!(member.ack_group("in", "fan", &ids).expect("ack").done, 1, "nor acked: the member acks it now");
    assert_eq!(stranger.ack_group("in", "fan", &ids).expect("ack").failed, ids, "an ACK of a non-member fails per id");
}
