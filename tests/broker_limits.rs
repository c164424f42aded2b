//! The broker-wide limits, over real TCP: a topic's depth in messages and
//! bytes (dead-letter topics and REDRIVE included), the clamps on a FETCH's
//! wait and byte budget, and the number of topics (docs/protocol.md,
//! "Limits"). Limits are set small (and checked with `Limits::check`) so
//! that hitting them is cheap. No test asserts how long anything took.

mod common;

use common::wire::*;
use common::{small_limits, start};
use runnel::client::Fetch;
use runnel::codec::{ErrorCode, TopicSettings};
use runnel::limits::Limits;

#[test]
fn a_full_topic_refuses_a_whole_batch_until_acks_free_room() {
    let limits = Limits {
        topic_messages_max: 5,
        topic_bytes_max: 100,
        message_bytes_max: 100,
        fetch_bytes_max: 100,
        frame_bytes_max: 1024,
        batch_messages_max: 8,
        topic_name_bytes_max: 16,
        ..Limits::default()
    };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    let tiny = |n: usize| vec![b"m".as_slice(); n];

    // By message count.
    c.produce_batch("m", &tiny(3)).unwrap();
    assert_eq!(code(c.produce_batch("m", &tiny(3))), ErrorCode::QueueFull);
    assert_eq!((stat(&mut c, "m", "produced"), stat(&mut c, "m", "ready")), (3, 3), "none of the batch stored");
    c.produce_batch("m", &tiny(2)).unwrap(); // exactly 5
    assert_eq!(code(c.produce("m", b"6")), ErrorCode::QueueFull);
    // In-flight messages still count; acknowledging them frees room.
    let got = c.fetch("m", now(2)).unwrap();
    assert_eq!(code(c.produce("m", b"6")), ErrorCode::QueueFull, "in flight is still held");
    c.ack("m", &[got[0].id, got[1].id]).unwrap();
    c.produce_batch("m", &tiny(2)).unwrap();
    assert_eq!(code(c.produce("m", b"8")), ErrorCode::QueueFull);
    assert_eq!(stat(&mut c, "m", "produced"), 7);
    // Purging frees room too.
    assert_eq!(c.purge_topic("m").unwrap(), 5);
    c.produce_batch("m", &tiny(5)).unwrap();

    // By payload bytes.
    let p = |n: usize, b: u8| vec![b; n];
    c.produce_batch("b", &[p(40, b'a'), p(40, b'b')]).unwrap();
    assert_eq!(code(c.produce_batch("b", &[p(10, b'c'), p(11, b'd')])), ErrorCode::QueueFull);
    assert_eq!((stat(&mut c, "b", "produced"), stat(&mut c, "b", "bytes")), (2, 80), "none of the batch stored");
    c.produce("b", &p(20, b'e')).unwrap(); // exactly 100
    assert_eq!(code(c.produce("b", b"f")), ErrorCode::QueueFull);
    let got = c.fetch("b", now(1)).unwrap();
    assert_eq!(got[0].payload, p(40, b'a'));
    c.ack("b", &[got[0].id]).unwrap();
    assert_eq!(stat(&mut c, "b", "bytes"), 60);
    c.produce("b", &p(40, b'g')).unwrap();
    assert_eq!(code(c.produce("b", b"h")), ErrorCode::QueueFull);
    let left: Vec<Vec<u8>> = c.fetch("b", now(10)).unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(left, vec![p(40, b'b'), p(20, b'e'), p(40, b'g')]);
}

#[test]
fn dead_letters_and_redrive_respect_depth_limits() {
    let limits = Limits { topic_messages_max: 5, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    let five: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i]).collect();
    let (first, _) = c.produce_batch("o", &five).unwrap();
    assert_eq!(c.fetch("o", now(5)).unwrap().len(), 5);
    let all: Vec<u64> = (first..first + 5).collect();
    assert_eq!(c.nack("o", &all, 0, true).unwrap().done, 5);
    wait_until("five dead letters", || c.stat("o.dlq", "ready").ok().flatten() == Some(5));
    // The dlq is full: a sixth dead letter stays in its topic, never lost.
    let sixth = c.produce("o", b"sixth").unwrap();
    assert_eq!(c.fetch("o", now(1)).unwrap()[0].id, sixth);
    c.nack("o", &[sixth], 0, true).unwrap();
    let back = c.fetch("o", wait_for(1)).unwrap();
    assert_eq!((back[0].id, back[0].payload.as_slice()), (sixth, b"sixth".as_slice()));
    assert_eq!(stat(&mut c, "o.dlq", "ready"), 5);
    // REDRIVE moves only as many as fit in the origin: it holds the sixth
    // (in flight) and three more, so one of five fits.
    c.produce_batch("o", &[b"x".as_slice(), b"y", b"z"]).unwrap();
    assert_eq!(c.redrive("o", 0).unwrap(), 1);
    assert_eq!(stat(&mut c, "o.dlq", "ready"), 4);
    assert_eq!(code(c.produce("o", b"full")), ErrorCode::QueueFull);
    let got = c.fetch("o", now(10)).unwrap();
    assert_eq!(got.iter().map(|m| m.payload.as_slice()).collect::<Vec<_>>(), vec![b"x".as_slice(), b"y", b"z", b"a"]);
    // In-flight dead letters are not redriven.
    c.ack("o", &got.iter().map(|m| m.id).collect::<Vec<_>>()).unwrap();
    let held = c.fetch("o.dlq", now(2)).unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(c.redrive("o", 0).unwrap(), 2, "the two ready ones");
    assert_eq!(stat(&mut c, "o.dlq", "inflight"), 2);
}

#[test]
fn fetch_waits_and_budgets_are_clamped_to_the_limits() {
    let limits = Limits { fetch_wait_ms_max: 50, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    // A wait of 10 minutes is clamped to 50 ms: the reply comes, empty,
    // well within the client's read timeout.
    let f = Fetch { max_messages: 1, max_bytes: 0, wait_ms: 600_000, ack_timeout_ms: 0 };
    assert!(c.fetch("t", f).unwrap().is_empty());
    c.ping().unwrap();
    // A byte budget over fetch_bytes_max (1024) is clamped to it.
    c.produce("t", &[1u8; 600]).unwrap();
    c.produce("t", &[2u8; 600]).unwrap();
    let f = Fetch { max_messages: 10, max_bytes: u32::MAX, wait_ms: 0, ack_timeout_ms: 0 };
    assert_eq!(c.fetch("t", f).unwrap().len(), 1);
    assert_eq!(c.fetch("t", f).unwrap().len(), 1);
}

#[test]
fn topics_max_counts_user_topics_and_dead_letter_topics_that_outlive_their_origin() {
    let limits = Limits { topics_max: 3, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    assert!(c.create_topic("a", TopicSettings::default()).unwrap());
    c.produce("b", b"x").unwrap();
    c.fetch("c", now(1)).unwrap();
    assert_eq!(code(c.create_topic("d", TopicSettings::default())), ErrorCode::TooManyTopics);
    assert_eq!(code(c.produce("d", b"x")), ErrorCode::TooManyTopics);
    assert_eq!(code(c.fetch("d", now(1))), ErrorCode::TooManyTopics);
    assert_eq!(code(c.fetch("d", wait_for(1))), ErrorCode::TooManyTopics);
    assert_eq!(c.list_topics().unwrap().len(), 3, "nothing was created");
    // Updating an existing topic is not creating one.
    assert!(!c.create_topic("a", TopicSettings { ack_timeout_ms: 5, max_deliveries: 5 }).unwrap());
    // Dead-letter topics beside their origin do not count.
    let id = c.fetch("b", now(1)).unwrap()[0].id;
    c.nack("b", &[id], 0, true).unwrap();
    assert_eq!(c.fetch("b.dlq", wait_for(1)).unwrap().len(), 1);
    assert!(c.create_topic("c.dlq", TopicSettings::default()).unwrap());
    assert_eq!(c.list_topics().unwrap().len(), 5);
    // A dead-letter topic without its origin is not made, so there are
    // never more of them than topics_max.
    assert_eq!(code(c.produce("x.dlq", b"x")), ErrorCode::UnknownTopic);
    assert_eq!(code(c.create_topic("b.dlq.dlq", TopicSettings::default())), ErrorCode::UnknownTopic);
    // Deleting a topic whose dead-letter topic stays makes no room: the
    // dead-letter topic counts once its origin is gone.
    c.delete_topic("c").unwrap();
    assert_eq!(code(c.produce("d", b"x")), ErrorCode::TooManyTopics);
    c.delete_topic("c.dlq").unwrap();
    c.produce("d", b"x").unwrap();
    assert_eq!(code(c.produce("e", b"x")), ErrorCode::TooManyTopics);
}

/// The broker's timers (one per message in flight or delayed, one per
/// parked FETCH) are bounded by timers_max: a FETCH gets no more messages
/// than there are timers left, and BUSY when there are none, until acks
/// free some. A NACK or TOUCH moves a timer, so it always works.
#[test]
fn timers_are_bounded_by_timers_max() {
    let (srv, _dir) = start(Limits { timers_max: 3, ..small_limits() });
    let mut c = srv.client();
    let five: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i]).collect();
    let (first, _) = c.produce_batch("t", &five).unwrap();
    let got = c.fetch("t", now(10)).unwrap();
    assert_eq!(got.len(), 3, "three timers, three deliveries");
    assert_eq!(code(c.fetch("t", now(10))), ErrorCode::Busy, "no timer left for a delivery");
    assert_eq!(code(c.fetch("u", wait_for(1))), ErrorCode::Busy, "nor for a parked FETCH");
    assert_eq!(c.fetch("u", now(1)).unwrap().len(), 0, "a FETCH that needs no timer is answered");
    // A delayed NACK and a TOUCH move a timer: they need no room.
    assert_eq!(c.nack("t", &[first], 60_000, false).unwrap().done, 1);
    assert_eq!(c.touch("t", &[first + 1], 60_000).unwrap().done, 1);
    assert_eq!(stat(&mut c, "t", "delayed"), 1);
    // Acks free timers.
    c.ack("t", &[first + 1, first + 2]).unwrap();
    let next: Vec<u64> = c.fetch("t", now(10)).unwrap().iter().map(|m| m.id).collect();
    assert_eq!(next, [first + 3, first + 4]);
    assert!(stat(&mut c, "", "busy_replies") >= 2);
}
