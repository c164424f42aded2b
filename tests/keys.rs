//! Message keys (protocol version 4): a key travels with its message to a
//! version-4 consumer, is left out for an earlier session, and is held to
//! `key_bytes_max`.

mod common;

use std::time::Duration;

use common::wire::{code, now};
use runnel::client::{Client, ProduceMessage};
use runnel::codec::ErrorCode;
use runnel::codec::group::{GroupSettings, Start};
use runnel::limits::Limits;

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
