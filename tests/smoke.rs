mod common;

use common::Server;
use runnel::broker::Config;
use runnel::client::Fetch;

#[test]
fn produce_fetch_ack_round_trip() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, n) = c.produce_batch("t", &[b"a".as_slice(), b"b"]).unwrap();
    assert_eq!(n, 2);
    let msgs = c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).unwrap();
    assert_eq!(msgs.iter().map(|m| m.id).collect::<Vec<_>>(), vec![first, first + 1]);
    assert_eq!(msgs[0].payload, b"a");
    assert_eq!(msgs[0].delivery_count, 1);
    let r = c.ack("t", &[first, first + 1, 999]).unwrap();
    assert_eq!(r.done, 2);
    assert_eq!(r.failed, vec![999]);
    assert_eq!(c.stat("t", "acked").unwrap(), Some(2));
}
