//! The record codec: every kind round-trips through its encoder and the
//! decoder, the sizes the compactor counts are what the encoders write, and
//! bodies that do not match their layout are refused.

use super::*;
use crate::codec::PropsLimits;
use crate::log::{LogOptions, ReadRecord};
use crate::testkit::TempDir;

/// Appends records with `write`, commits them, reopens the log and returns
/// every record read back as (kind, version, body).
fn written(write: impl FnOnce(&mut Log)) -> Vec<(RecordKind, u8, Vec<u8>)> {
    let dir = TempDir::new("record");
    {
        let (mut log, _) = Log::open(dir.path(), LogOptions::default(), |_| Ok(())).expect("open");
        write(&mut log);
        log.commit(true).expect("commit");
    }
    let mut read = Vec::new();
    let keep = |r: &ReadRecord<'_>| {
        read.push((r.kind, r.version, r.body.to_vec()));
        Ok(())
    };
    Log::open(dir.path(), LogOptions::default(), keep).expect("reopen");
    read
}

fn one(write: impl FnOnce(&mut Log)) -> (RecordKind, u8, Vec<u8>) {
    let mut records = written(write);
    assert_eq!(records.len(), 1, "one record");
    records.remove(0)
}

#[test]
fn every_kind_round_trips_at_its_version() {
    let settings =
        Settings { ack_timeout_ms: 1234, max_deliveries: 7, dedup_window_ms: None, retention: Default::default() };
    let topic = TopicRecord { topic: TopicId(3), next_id: 99, settings, next_group_id: Some(5), name: "orders.dlq" };
    let (kind, version, body) = one(|log| topic.append(log));
    assert_eq!((kind, version), (RecordKind::Topic, RecordKind::Topic.version()));
    assert!(matches!(Record::decode(kind, version, &body), Ok(Record::Topic(t)) if t == topic));

    let delete = DeleteRecord { topic: TopicId::FLOOR, next_id: 1 << 40 };
    let (kind, version, body) = one(|log| delete.append(log));
    assert!(matches!(Record::decode(kind, version, &body), Ok(Record::Delete(d)) if d == delete));

    let purge = PurgeRecord { topic: TopicId(9), below_id: 77 };
    let (kind, version, body) = one(|log| purge.append(log));
    assert!(matches!(Record::decode(kind, version, &body), Ok(Record::Purge(p)) if p == purge));

    let ids = [5, 1 << 50, 6];
    let remove = RemoveRecord { topic: TopicId(2), group: GroupId::DEFAULT, reason: RemoveReason::Redriven, ids: &ids };
    let (kind, version, body) = one(|log| remove.append(log));
    let Ok(Record::Remove { topic, group, reason, ids: got }) = Record::decode(kind, version, &body) else {
        panic!("a Remove record decodes to Remove")
    };
    assert_eq!((topic, group, reason), (remove.topic, remove.group, remove.reason));
    assert_eq!(got.iter().collect::<Vec<_>>(), ids);

    let entries = [(8, 3), (u64::MAX, u16::MAX)];
    let requeue = RequeueRecord { topic: TopicId(4), group: GroupId::DEFAULT, entries: &entries };
    let (kind, version, body) = one(|log| requeue.append(log));
    let Ok(Record::Requeue { topic, group, entries: got }) = Record::decode(kind, version, &body) else {
        panic!("a Requeue record decodes to Requeue")
    };
    assert_eq!((topic, group), (requeue.topic, requeue.group));
    assert_eq!(got.iter().collect::<Vec<_>>(), entries);
}

/// A properties blob: two tags and a header.
fn props_blob() -> &'static [u8] {
    let mut blob = Vec::new();
    codec::props::put_tag(&mut blob, "eu");
    codec::props::put_header(&mut blob, "trace", b"\x00\x01");
    codec::props::put_tag(&mut blob, "red");
    Box::leak(blob.into_boxed_slice())
}

fn props() -> Props<'static> {
    Props::parse(props_blob(), codec::CODEC_VERSION_MAX, &PropsLimits::ANY).expect("a valid blob")
}

fn messages() -> Vec<MessageRecord<'static>> {
    let dead = DeadInfo { origin_id: 41, origin_deliveries: 16, reason: DeadReason::ConsumerLost };
    let none = Props::EMPTY;
    vec![
        MessageRecord { id: 1, born_ms: 1_700_000_000_000, deliveries: 0, dead: None, props: none, payload: b"one" },
        MessageRecord { id: 7, born_ms: 3, deliveries: 2, dead: Some(dead), props: none, payload: b"" },
        MessageRecord { id: 8, born_ms: 4, deliveries: u16::MAX, dead: None, props: none, payload: &[0xff; 300] },
        MessageRecord { id: 9, born_ms: 5, deliveries: 0, dead: None, props: props(), payload: b"tagged" },
        MessageRecord { id: 10, born_ms: 6, deliveries: 1, dead: Some(dead), props: props(), payload: b"" },
    ]
}

#[test]
fn produce_records_round_trip_message_by_message() {
    let sent = messages();
    let (kind, version, body) = one(|log| {
        let mut w = ProduceWriter::begin(log, TopicId(5));
        for m in &sent {
            w.push(log, m);
        }
        w.end(log);
    });
    let Ok(Record::Produce { topic, messages }) = Record::decode(kind, version, &body) else {
        panic!("a Produce record decodes to Produce")
    };
    assert_eq!(topic, TopicId(5));
    let got: Result<Vec<_>, _> = messages.collect();
    assert_eq!(got.expect("every message decodes"), sent);
}

#[test]
fn a_produce_writer_with_no_message_writes_nothing() {
    let records = written(|log| {
        ProduceWriter::begin(log, TopicId(1)).end(log);
        ProduceWriter::begin(log, TopicId(1)).end_withdrawable(log);
        PurgeRecord { topic: TopicId(1), below_id: 2 }.append(log);
    });
    let kinds: Vec<RecordKind> = records.iter().map(|r| r.0).collect();
    assert_eq!(kinds, [RecordKind::Purge]);
}

#[test]
fn the_sizes_counted_are_the_sizes_written() {
    for m in messages() {
        let mut body = Vec::new();
        put_message(&mut body, &m);
        let (payload, props) = (m.payload.len() as u64, m.props.bytes().len() as u64);
        assert_eq!(body.len() as u64, message_record_bytes(payload, props, m.dead.is_some()), "{m:?}");
    }
    // Every setting a Topic record may carry, so that it is at its largest.
    let retention = crate::queue::Retention { ms: 1, bytes: 1 };
    let settings = Settings { retention, ..Settings::default() };
    let log_bytes = |write: &dyn Fn(&mut Log)| -> u64 {
        let dir = TempDir::new("record-size");
        let (mut log, _) = Log::open(dir.path(), LogOptions::default(), |_| Ok(())).expect("open");
        write(&mut log);
        // The write's own Write record is the log's, not the record's.
        log.commit(true).expect("commit").bytes - crate::log::WRITE_RECORD_BYTES as u64
    };
    let name = "a-topic-name";
    let topic = TopicRecord { topic: TopicId(1), next_id: 1, settings, next_group_id: Some(1), name };
    assert_eq!(log_bytes(&|log| topic.append(log)), TopicRecord::bytes(name.len()));
    let delete = DeleteRecord { topic: TopicId::FLOOR, next_id: 1 };
    assert_eq!(log_bytes(&|log| delete.append(log)), DeleteRecord::BYTES);
}

#[test]
fn bodies_that_do_not_match_their_layout_are_refused() {
    let purge = [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0];
    assert!(Record::decode(RecordKind::Purge, 1, &purge).is_ok());
    let short = Record::decode(RecordKind::Purge, 1, &purge[..11]);
    assert!(short.is_err_and(|e| e.contains("too short")));
    let mut long = purge.to_vec();
    long.push(0);
    assert!(Record::decode(RecordKind::Purge, 1, &long).is_err_and(|e| e.contains("left over")));
    let newer = Record::decode(RecordKind::Purge, RecordKind::Purge.version() + 1, &purge);
    assert!(newer.is_err_and(|e| e.contains("unknown to this build")));
    // A Remove record with a reason no build writes.
    let remove = [1, 0, 0, 0, 9, 0, 0, 0, 0];
    assert!(Record::decode(RecordKind::Remove, 1, &remove).is_err_and(|e| e.contains("reason")));
    // A Remove record whose count says more ids than it holds.
    let remove = [1, 0, 0, 0, 1, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    assert!(Record::decode(RecordKind::Remove, 1, &remove).is_err());
    // A Produce record with bytes after its last message.
    let mut produce = vec![1, 0, 0, 0, 1, 0, 0, 0];
    put_message(&mut produce, &messages()[0]);
    produce.push(0);
    let Ok(Record::Produce { messages, .. }) = Record::decode(RecordKind::Produce, 1, &produce) else {
        panic!("the header decodes")
    };
    let got: Vec<_> = messages.collect();
    assert_eq!(got.len(), 2, "the message, then the error: {got:?}");
    assert!(got[1].as_ref().is_err_and(|e| e.contains("left over")));
}

/// Remove and Requeue records of version 1 name no group (the default
/// one); version 2 names it. Both are read: a log written before groups
/// opens in every later build.
#[test]
fn remove_and_requeue_read_both_versions() {
    let v1_remove = [3, 0, 0, 0, 1, 2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0];
    let Ok(Record::Remove { topic, group, reason, ids }) = Record::decode(RecordKind::Remove, 1, &v1_remove) else {
        panic!("version 1 of Remove decodes")
    };
    assert_eq!((topic, group, reason), (TopicId(3), GroupId::DEFAULT, RemoveReason::Acked));
    assert_eq!(ids.iter().collect::<Vec<_>>(), [7, 8]);
    let v2_remove = [3, 0, 0, 0, 9, 0, 0, 0, 2, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0];
    let Ok(Record::Remove { group, reason, ids, .. }) = Record::decode(RecordKind::Remove, 2, &v2_remove) else {
        panic!("version 2 of Remove decodes")
    };
    assert_eq!((group, reason), (GroupId(9), RemoveReason::DeadLettered));
    assert_eq!(ids.iter().collect::<Vec<_>>(), [7]);
    let v1_requeue = [3, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 4, 0];
    let Ok(Record::Requeue { group, entries, .. }) = Record::decode(RecordKind::Requeue, 1, &v1_requeue) else {
        panic!("version 1 of Requeue decodes")
    };
    assert_eq!(group, GroupId::DEFAULT);
    assert_eq!(entries.iter().collect::<Vec<_>>(), [(7, 4)]);
    let v2_requeue = [3, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 4, 0];
    let Ok(Record::Requeue { group, entries, .. }) = Record::decode(RecordKind::Requeue, 2, &v2_requeue) else {
        panic!("version 2 of Requeue decodes")
    };
    assert_eq!(group, GroupId(9));
    assert_eq!(entries.iter().collect::<Vec<_>>(), [(7, 4)]);
    // A version-1 body read as version 2 does not fit its layout.
    assert!(Record::decode(RecordKind::Requeue, 2, &v1_requeue).is_err());
}

#[test]
fn a_group_round_trips_in_remove_and_requeue() {
    let group = GroupId(41);
    let ids = [1, 2];
    let remove = RemoveRecord { topic: TopicId(2), group, reason: RemoveReason::Acked, ids: &ids };
    let (kind, version, body) = one(|log| remove.append(log));
    assert_eq!(version, 2);
    assert!(matches!(Record::decode(kind, version, &body), Ok(Record::Remove { group: g, .. }) if g == group));
    let entries = [(1, 1)];
    let requeue = RequeueRecord { topic: TopicId(2), group, entries: &entries };
    let (kind, version, body) = one(|log| requeue.append(log));
    assert!(matches!(Record::decode(kind, version, &body), Ok(Record::Requeue { group: g, .. }) if g == group));
}

/// Produce records of version 1 carry no properties; version 2 announces
/// them with flag bit 0x02. A version-1 record still reads (a log written
/// before properties opens in every later build), and its messages have
/// none.
#[test]
fn produce_reads_version_1_and_version_2_messages() {
    let mut v1 = vec![5, 0, 0, 0, 1, 0, 0, 0];
    v1.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]);
    v1.extend_from_slice(&[3, 0, 0, 0]);
    v1.extend_from_slice(b"old");
    let Ok(Record::Produce { topic, messages }) = Record::decode(RecordKind::Produce, 1, &v1) else {
        panic!("version 1 of Produce decodes")
    };
    let got: Vec<_> = messages.collect::<Result<_, _>>().expect("its message decodes");
    let old = MessageRecord { id: 2, born_ms: 9, deliveries: 1, dead: None, props: Props::EMPTY, payload: b"old" };
    assert_eq!((topic, got), (TopicId(5), vec![old]));

    // Version 2 with properties: after the flags, `props_len u16` and the
    // blob, then the payload.
    let mut v2 = vec![5, 0, 0, 0, 1, 0, 0, 0];
    v2.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x02]);
    v2.extend_from_slice(&(props_blob().len() as u16).to_le_bytes());
    v2.extend_from_slice(props_blob());
    v2.extend_from_slice(&[3, 0, 0, 0]);
    v2.extend_from_slice(b"new");
    let mut written = vec![5, 0, 0, 0, 1, 0, 0, 0];
    put_message(&mut written, &MessageRecord { props: props(), payload: b"new", ..old });
    assert_eq!(v2, written, "the layout docs/log-format.md gives");
    let Ok(Record::Produce { messages, .. }) = Record::decode(RecordKind::Produce, 2, &v2) else {
        panic!("version 2 of Produce decodes")
    };
    let got: Vec<_> = messages.collect::<Result<_, _>>().expect("its message decodes");
    assert_eq!(got[0].props.tags().collect::<Vec<_>>(), ["eu", "red"]);
    assert_eq!(got[0].props.header("trace"), Some(&b"\x00\x01"[..]));
}

#[test]
fn produce_version_2_refuses_unknown_flags_and_bad_properties() {
    let decode_one = |body: &[u8]| -> Result<(), String> {
        let Ok(Record::Produce { mut messages, .. }) = Record::decode(RecordKind::Produce, 2, body) else {
            panic!("the header decodes")
        };
        messages.next().expect("one message").map(|_| ())
    };
    let head = [5, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let mut unknown_flag = head.to_vec();
    unknown_flag.extend_from_slice(&[0x08, 0, 0, 0, 0]);
    assert!(decode_one(&unknown_flag).is_err_and(|e| e.contains("flags")));
    // Flagged with properties, but a property type no version knows.
    let mut bad_type = head.to_vec();
    bad_type.extend_from_slice(&[0x02, 4, 0, 9, 1, 0, b'x', 0, 0, 0, 0]);
    assert!(decode_one(&bad_type).is_err_and(|e| e.contains("properties")));
    // An entry that runs past the blob.
    let mut runs_past = head.to_vec();
    runs_past.extend_from_slice(&[0x02, 3, 0, 1, 5, 0, 0, 0, 0, 0]);
    assert!(decode_one(&runs_past).is_err_and(|e| e.contains("properties")));
    // Flagged, with an empty blob: no build writes that.
    let mut empty = head.to_vec();
    empty.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0]);
    assert!(decode_one(&empty).is_err_and(|e| e.contains("has none")));
}

#[test]
fn an_ack_produce_record_round_trips_with_its_outputs() {
    let msgs = messages();
    let (kind, version, body) = one(|log| {
        let mut w = AckProduceWriter::begin(log, TopicId(2), GroupId(4), &[7, 9]);
        w.output(log, TopicId(3));
        for m in &msgs {
            w.push(log, m);
        }
        w.output(log, TopicId(5));
        w.push(log, &msgs[0]);
        w.end(log);
    });
    assert_eq!((kind, version), (RecordKind::AckProduce, 1));
    let Ok(Record::AckProduce { topic, group, ids, outputs }) = Record::decode(kind, version, &body) else {
        panic!("an AckProduce record decodes to AckProduce")
    };
    assert_eq!((topic, group, ids.iter().collect::<Vec<_>>()), (TopicId(2), GroupId(4), vec![7, 9]));
    let got: Vec<(TopicId, Vec<MessageRecord<'_>>)> = outputs
        .map(|o| {
            let (t, m) = o.expect("an output");
            (t, m.collect::<Result<Vec<_>, _>>().expect("its messages"))
        })
        .collect();
    assert_eq!(got, vec![(TopicId(3), msgs.clone()), (TopicId(5), vec![msgs[0]])]);
    // A body cut short anywhere is refused, never misread.
    for cut in 0..body.len() {
        let refused = match Record::decode(kind, version, &body[..cut]) {
            Err(_) => true,
            Ok(Record::AckProduce { outputs, .. }) => outputs
                .flat_map(|o| o.map(|(_, m)| m.collect::<Vec<_>>()).unwrap_or_else(|e| vec![Err(e)]))
                .any(|m| m.is_err()),
            Ok(_) => false,
        };
        assert!(refused, "a body cut at {cut} of {} bytes", body.len());
    }
}

#[test]
fn the_records_of_scheduled_messages_round_trip() {
    let ids = [3, 1 << 40];
    for kind in [RecordKind::Cancel, RecordKind::Due] {
        let (got_kind, version, body) = one(|log| ScheduledRecord { topic: TopicId(6), ids: &ids }.append(kind, log));
        assert_eq!((got_kind, version), (kind, 1));
        let got = match Record::decode(got_kind, version, &body) {
            Ok(Record::Cancel { topic, ids } | Record::Due { topic, ids }) => (topic, ids.iter().collect::<Vec<_>>()),
            other => panic!("{kind:?} decodes to {other:?}"),
        };
        assert_eq!(got, (TopicId(6), ids.to_vec()));
    }
    let entries = [(4, 1_767_225_600_123), (u64::MAX, 0)];
    let (kind, version, body) = one(|log| RescheduleRecord { topic: TopicId(7), entries: &entries }.append(log));
    let Ok(Record::Reschedule { topic, entries: got }) = Record::decode(kind, version, &body) else {
        panic!("a Reschedule record decodes to Reschedule")
    };
    assert_eq!((topic, got.iter().collect::<Vec<_>>()), (TopicId(7), entries.to_vec()));
    assert!(Record::decode(RecordKind::Due, 1, &body[..body.len() - 1]).is_err(), "a short body is refused");
}

#[test]
fn a_delay_record_round_trips() {
    let entries = [(4, 2, 1_767_225_600_123), (u64::MAX, u16::MAX, 0)];
    for retry in [false, true] {
        let delay = DelayRecord { topic: TopicId(7), group: GroupId(3), retry, entries: &entries };
        let (kind, version, body) = one(|log| delay.append(log));
        assert_eq!(body.len() as u64 + RECORD_HEADER_BYTES as u64, DelayRecord::bytes(entries.len()));
        let Ok(Record::Delay { topic, group, retry: r, entries: got }) = Record::decode(kind, version, &body) else {
            panic!("a Delay record decodes to Delay")
        };
        assert_eq!(r, retry);
        assert_eq!((topic, group, got.iter().collect::<Vec<_>>()), (TopicId(7), GroupId(3), entries.to_vec()));
        // Version 1 (no flags byte) still reads: NACK delays.
        let mut v1 = body[..8].to_vec();
        v1.extend_from_slice(&body[9..]);
        let Ok(Record::Delay { retry: r1, entries: got1, .. }) = Record::decode(kind, 1, &v1) else {
            panic!("a version-1 Delay record decodes to Delay")
        };
        assert!(!r1);
        assert_eq!(got1.iter().collect::<Vec<_>>(), entries.to_vec());
    }
}

#[test]
fn a_nack_reason_record_round_trips() {
    let entries = [(4, "db timeout"), (u64::MAX, "")];
    let r = NackReasonRecord { topic: TopicId(7), group: GroupId(3), entries: &entries };
    let (kind, version, body) = one(|log| r.append(log));
    assert_eq!((kind, version), (RecordKind::NackReason, 1));
    assert_eq!(body.len() as u64 + RECORD_HEADER_BYTES as u64, NackReasonRecord::bytes(2, 10));
    let Ok(Record::NackReason { topic, group, entries: got }) = Record::decode(kind, version, &body) else {
        panic!("a NackReason record decodes to NackReason")
    };
    let got: Vec<(u64, &str)> = got.map(|e| e.expect("entry")).collect();
    assert_eq!((topic, group, got), (TopicId(7), GroupId(3), entries.to_vec()));
    let short = Record::decode(kind, version, &body[..body.len() - 1]).expect("the header reads");
    let Record::NackReason { mut entries, .. } = short else { panic!("NackReason") };
    assert!(entries.any(|e| e.is_err()), "a short body is refused");
}

#[test]
fn a_group_record_keeps_its_retry_policy_and_version_1_has_none() {
    let retry = Some(RetryPolicy { initial_ms: 100, multiplier_pct: 200, cap_ms: 30_000, jitter_pct: 20 });
    let g = GroupRecord {
        topic: TopicId(2),
        group: GroupId(5),
        broadcast: false,
        ordered: true,
        ack_timeout_ms: 9,
        max_deliveries: 4,
        cursor: 77,
        name: "billing",
        filter: "eu",
        retry,
    };
    let (kind, version, body) = one(|log| g.append(log));
    assert_eq!((kind, version), (RecordKind::Group, 2));
    assert_eq!(body.len() as u64 + RECORD_HEADER_BYTES as u64, g.bytes());
    let Ok(Record::Group(got)) = Record::decode(kind, version, &body) else { panic!("a Group record decodes") };
    assert_eq!(got, g);
    let plain = GroupRecord { retry: None, ..g };
    let (_, _, body) = one(|log| plain.append(log));
    assert_eq!(body.len() as u64 + RECORD_HEADER_BYTES as u64, plain.bytes());
    let Ok(Record::Group(got)) = Record::decode(kind, 1, &body) else { panic!("version 1 decodes") };
    assert_eq!(got, plain, "without a policy, versions 1 and 2 are the same bytes");
}
