//! Recovery's second pass, record by record, against logs written here.

use crate::broker::{Broker, Config, Now, TopicId};
use crate::codec::Props;
use crate::log::{Log, LogOptions, OpenError};
use crate::queue::Settings;
use crate::record::{DeleteRecord, MessageRecord, ProduceWriter, TopicRecord};
use crate::testkit::TempDir;

/// A log holding what `write` appends, opened by a broker.
fn open_after(write: impl FnOnce(&mut Log)) -> Result<Broker, OpenError> {
    let dir = TempDir::new("replay");
    {
        let (mut log, _) = Log::open(dir.path(), LogOptions::default(), |_| Ok(())).expect("open log");
        write(&mut log);
        log.commit(true).expect("commit");
    }
    Broker::open(Config::default(), dir.path(), LogOptions::default(), Now::default())
}

#[test]
fn only_a_delete_record_may_name_the_floor_topic_id() {
    let floor = DeleteRecord { topic: TopicId::FLOOR, next_id: 500 };
    let broker = open_after(|log| floor.append(log)).expect("the floor's restatement is read");
    assert_eq!(broker.topic_count(), 0);
    let settings = Settings::default();
    let topic = TopicRecord { topic: TopicId::FLOOR, next_id: 1, settings, next_group_id: Some(1), name: "t" };
    let err = open_after(|log| topic.append(log)).err().expect("a Topic record with the floor id is refused");
    assert!(matches!(&err, OpenError::Apply { why, .. } if why.contains("names no topic")), "{err}");
    let err = open_after(|log| {
        let mut w = ProduceWriter::begin(log, TopicId::FLOOR);
        w.push(
            log,
            &MessageRecord { id: 1, born_ms: 0, deliveries: 0, dead: None, props: Props::EMPTY, payload: b"m" },
        );
        w.end(log);
    })
    .err()
    .expect("a Produce record with the floor id is refused");
    assert!(matches!(&err, OpenError::Apply { why, .. } if why.contains("names no topic")), "{err}");
}

// -----------------------------------------------------------------------
// Consumer groups
// -----------------------------------------------------------------------

use super::Replay;
use crate::broker::topics::Topics;
use crate::compactor::Compactor;
use crate::queue::{GroupId, MsgId};
use crate::record::{GroupDeleteRecord, GroupRecord, GroupStateRecord, RemoveReason, RemoveRecord, RequeueRecord};

/// The topic table recovery builds from what `write` appends.
fn replayed(write: impl FnOnce(&mut Log)) -> Topics {
    let dir = TempDir::new("replay-groups");
    {
        let (mut log, _) = Log::open(dir.path(), LogOptions::default(), |_| Ok(())).expect("open log");
        write(&mut log);
        log.commit(true).expect("commit");
    }
    let mut topics = Topics::default();
    let mut notes = Compactor::default();
    let mut replay = Replay::new(&mut topics, &mut notes);
    Log::open_replaying(dir.path(), LogOptions::default(), Box::new(crate::log::open_file), &mut replay)
        .expect("reopen");
    replay.finish();
    topics
}

const T: TopicId = TopicId(0);

fn topic(log: &mut Log, next_group_id: Option<u32>) {
    let settings = Settings::default();
    TopicRecord { topic: T, next_id: 1, settings, next_group_id, name: "t" }.append(log);
}

fn group(log: &mut Log, g: u32, name: &str, cursor: MsgId, filter: &str) {
    let (broadcast, ack_timeout_ms, max_deliveries) = (false, 0, 0);
    let group = GroupId(g);
    GroupRecord {
        topic: T,
        group,
        broadcast,
        ordered: false,
        ack_timeout_ms,
        max_deliveries,
        cursor,
        name,
        filter,
        retry: None,
    }
    .append(log);
}

fn produce(log: &mut Log, ids: std::ops::RangeInclusive<MsgId>, deliveries: u16) {
    let mut w = ProduceWriter::begin(log, T);
    for id in ids {
        w.push(
            log,
            &MessageRecord { id, born_ms: id * 10, deliveries, dead: None, props: Props::EMPTY, payload: b"m" },
        );
    }
    w.end(log);
}

fn acked(log: &mut Log, g: u32, ids: &[MsgId]) {
    RemoveRecord { topic: T, group: GroupId(g), reason: RemoveReason::Acked, ids }.append(log);
}

fn live(topics: &Topics) -> Vec<MsgId> {
    topics.get(T).expect("t").topic.seq.iter_live().map(|m| m.id).collect()
}

/// (cursor, ready, the deliveries of `id`) of group `g`.
fn state(topics: &Topics, g: u32, id: MsgId) -> (MsgId, u64, u16) {
    let t = &topics.get(T).expect("t").topic;
    let group = t.group(GroupId(g)).expect("the group");
    (group.cursor(), t.ready(GroupId(g)), t.deliveries(GroupId(g), id))
}

#[test]
fn each_group_comes_back_with_its_own_acks_and_deliveries() {
    let topics = replayed(|log| {
        topic(log, Some(3));
        group(log, 1, "a", 0, "");
        group(log, 2, "b", 0, "");
        produce(log, 1..=5, 0);
        acked(log, 1, &[1, 2, 3]);
        acked(log, 2, &[1]);
        RequeueRecord { topic: T, group: GroupId(2), entries: &[(2, 3)] }.append(log);
    });
    assert_eq!(live(&topics), [2, 3, 4, 5], "1 is done by both");
    assert_eq!(state(&topics, 1, 4), (4, 2, 0), "a acked up to 3");
    let (_, ready, deliveries) = state(&topics, 2, 2);
    assert_eq!((ready, deliveries), (4, 3), "b acked 1 and delivered 2 three times");
    let t = &topics.get(T).expect("t").topic;
    assert_eq!(t.groups().count(), 2, "no default group: the topic record is version 2");
    assert_eq!(t.next_group_id(), 3);
}

#[test]
fn a_group_state_supersedes_what_came_before_it() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "a", 0, "");
        produce(log, 1..=6, 0);
        acked(log, 1, &[1]);
        // Delivered 1..=4, acked 1 and 3; 2 and 4 pending.
        GroupStateRecord { topic: T, group: GroupId(1), cursor: 5, entries: &[(2, 1), (4, 2), (6, 1)] }.append(log);
        acked(log, 1, &[4]);
    });
    assert_eq!(live(&topics), [2, 5, 6], "1, 3 and 4 are done");
    assert_eq!(state(&topics, 1, 2), (5, 3, 1), "2 back for retry, then 5 and 6");
    assert_eq!(state(&topics, 1, 6).2, 1, "6 carries its count");
}

#[test]
fn a_group_starts_where_its_record_says_and_a_deleted_one_holds_nothing() {
    let topics = replayed(|log| {
        topic(log, Some(1));
        produce(log, 1..=4, 0);
        group(log, 1, "late", 3, "");
        group(log, 2, "gone", 0, "");
        GroupDeleteRecord { topic: T, group: GroupId(2) }.append(log);
    });
    assert_eq!(live(&topics), [3, 4], "below its start, the only group needs nothing");
    assert_eq!(state(&topics, 1, 3).0, 3);
    let t = &topics.get(T).expect("t").topic;
    assert!(t.group(GroupId(2)).is_none());
    assert_eq!(t.next_group_id(), 3, "a deleted group's id is not reused");
}

fn delivered(log: &mut Log, g: u32, ids: &[MsgId]) {
    crate::record::DeliverRecord { topic: T, group: GroupId(g), ids }.append(log);
}

#[test]
fn each_deliver_record_counts_one_delivery_of_each_id() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "a", 0, "");
        produce(log, 1..=4, 0);
        delivered(log, 1, &[1, 2, 3]);
        acked(log, 1, &[2]);
        RequeueRecord { topic: T, group: GroupId(1), entries: &[(3, 1)] }.append(log);
        // 3 again (a retry comes before the cursor's), then 1 again.
        delivered(log, 1, &[3, 4, 1]);
        delivered(log, 1, &[2]);
    });
    assert_eq!(state(&topics, 1, 1).2, 2, "1 was delivered twice and never acked");
    assert_eq!(state(&topics, 1, 3).2, 2, "3: requeued at 1, delivered again");
    assert_eq!(state(&topics, 1, 4).2, 1);
    assert_eq!(live(&topics), [1, 3, 4], "2 is acked: a later Deliver record does not bring it back");
}

#[test]
fn a_deliver_record_after_a_group_state_adds_to_what_it_states() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "a", 0, "");
        produce(log, 1..=4, 0);
        // Delivered 1 and 2 (each once, stated without the delivery of
        // the turn the restatement was written ahead of); 3 acked.
        GroupStateRecord { topic: T, group: GroupId(1), cursor: 4, entries: &[(1, 1), (2, 0)] }.append(log);
        delivered(log, 1, &[2, 3]);
    });
    assert_eq!(state(&topics, 1, 1).2, 1);
    assert_eq!(state(&topics, 1, 2).2, 1, "stated at 0, then its Deliver record");
    assert_eq!(live(&topics), [1, 2, 4], "3 is done: its Deliver record is ignored");
}

#[test]
fn a_topic_without_groups_keeps_everything() {
    let topics = replayed(|log| {
        topic(log, Some(1));
        produce(log, 1..=3, 0);
    });
    assert_eq!(live(&topics), [1, 2, 3]);
    assert_eq!(topics.get(T).expect("t").topic.groups().count(), 0);
}

#[test]
fn a_filtering_group_does_not_get_back_what_its_filter_dropped() {
    let topics = replayed(|log| {
        topic(log, Some(3));
        group(log, 1, "all", 0, "");
        group(log, 2, "tagged", 0, "a || b");
        produce(log, 1..=4, 0);
        acked(log, 1, &[1, 2, 3, 4]);
        // The filtering group stepped over 1..=3 (untagged), which
        // leaves no record, and acked nothing.
    });
    assert!(live(&topics).is_empty(), "untagged messages are done for the filtering group");
}

fn restated(log: &mut Log, g: u32, name: &str, cursor: MsgId, pending: &[(MsgId, u16)]) {
    group(log, g, name, cursor, "");
    GroupStateRecord { topic: T, group: GroupId(g), cursor, entries: pending }.append(log);
}

#[test]
fn a_group_restated_after_the_acks_of_another_keeps_what_it_still_needs() {
    // b's own records were in a segment compaction removed: it comes
    // back only in its restatement, after a's acks.
    let topics = replayed(|log| {
        topic(log, Some(3));
        group(log, 1, "a", 1, "");
        produce(log, 1..=6, 0);
        acked(log, 1, &[1, 2, 3, 4, 5, 6]);
        restated(log, 2, "b", 4, &[(2, 1)]);
    });
    assert_eq!(live(&topics), [2, 4, 5, 6], "b had 2 in flight and had not read 4..=6");
    assert_eq!(state(&topics, 2, 2), (4, 4, 1), "2 back for retry, then 4, 5 and 6");
    assert_eq!(state(&topics, 1, 7).0, 7, "a read past 6");
}

#[test]
fn a_group_first_met_in_its_own_acks_holds_what_it_has_not_acked_until_its_state() {
    // b's oldest records went with a removed segment: its next acks
    // come before its restatement.
    let topics = replayed(|log| {
        topic(log, Some(3));
        group(log, 1, "a", 1, "");
        produce(log, 1..=6, 0);
        acked(log, 1, &[1, 2, 3, 4, 5, 6]);
        acked(log, 2, &[5]);
        restated(log, 2, "b", 6, &[(3, 2)]);
    });
    assert_eq!(live(&topics), [3, 6], "b still had 3 and had not read 6; it acked 5 and the rest before");
    assert_eq!(state(&topics, 2, 3), (6, 2, 2), "3 back for retry, then 6");
}

#[test]
fn a_group_created_after_others_acked_does_not_bring_their_messages_back() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "a", 1, "");
        produce(log, 1..=3, 0);
        acked(log, 1, &[1, 2, 3]);
        topic(log, Some(3));
        group(log, 2, "b", 1, "");
    });
    assert!(live(&topics).is_empty(), "b was created after 1..=3 were released");
}

#[test]
fn a_groups_cursor_goes_past_what_it_acked_even_when_that_is_released() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "a", 1, "");
        produce(log, 1..=4, 0);
        acked(log, 1, &[1, 2, 3]);
    });
    assert_eq!(live(&topics), [4]);
    assert_eq!(state(&topics, 1, 4), (4, 1, 0), "the cursor the group had before the restart");
}

#[test]
fn groups_of_a_deleted_topic_are_not_placed_in_the_topic_that_takes_its_id() {
    let topics = replayed(|log| {
        topic(log, Some(2));
        group(log, 1, "old", 1, "");
        DeleteRecord { topic: T, next_id: 1 }.append(log);
        topic(log, Some(3));
        group(log, 1, "a", 1, "");
        produce(log, 1..=3, 0);
        acked(log, 1, &[1, 2, 3]);
        restated(log, 2, "b", 2, &[]);
    });
    assert_eq!(live(&topics), [2, 3], "b, restated after the Delete record, had not read 2 and 3");
}
