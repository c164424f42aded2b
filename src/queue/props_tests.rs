//! Tests for message properties in the queue: `Seq` stores each message's
//! properties with it (nothing for blocks without any), and `Tags` interns
//! tag sets per topic within a bound. A seeded random test drives a `Seq`
//! with tagged, headed and plain messages and compares it after every step
//! with a `BTreeMap` model; set `RUNNEL_SEED=<seed>` to replay one seed.

use std::collections::{BTreeMap, BTreeSet};

use super::seq::Seq;
use super::*;
use crate::codec::props::{put_header, put_tag};
use crate::codec::{CODEC_VERSION_MAX, Props, PropsLimits};
use crate::testkit::{Rng, SeedGuard, seeds};

/// A properties blob with these tags (in this order) and headers.
fn blob(tags: &[&str], headers: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for t in tags {
        put_tag(&mut b, t);
    }
    for (k, v) in headers {
        put_header(&mut b, k, v);
    }
    b
}

fn parsed(blob: &[u8]) -> Props<'_> {
    Props::parse(blob, CODEC_VERSION_MAX, &PropsLimits::ANY).expect("a valid blob")
}

/// Appends a message with properties `blob`, its tags interned (within
/// `max` sets).
fn append(seq: &mut Seq, blob: &[u8], payload: &[u8], max: u32) -> Result<MsgId, TagsFull> {
    let props = parsed(blob);
    let tag_set = seq.intern_tags(&props, max)?;
    Ok(seq.append(1_000, Body { props, tag_set, payload }).0)
}

/// The tags of message `id` as its tag set names them, sorted.
fn tags_of(seq: &Seq, id: MsgId) -> Vec<String> {
    let Some(set) = seq.tag_set(id) else { return Vec::new() };
    let mut names: Vec<String> = seq.tags().names(set).map(str::to_string).collect();
    names.sort();
    names
}

#[test]
fn a_message_keeps_its_properties_and_its_tag_set() {
    let mut seq = Seq::new(1);
    let plain = append(&mut seq, &[], b"plain", 10).unwrap();
    let headed = append(&mut seq, &blob(&[], &[("k", b"v")]), b"headed", 10).unwrap();
    let tagged = append(&mut seq, &blob(&["b", "a", "b"], &[]), b"tagged", 10).unwrap();
    let same = append(&mut seq, &blob(&["a", "b"], &[("x", b"")]), b"same set", 10).unwrap();
    let m = seq.get(plain).unwrap();
    assert_eq!((m.props, m.tag_set, m.payload), (Props::EMPTY, None, &b"plain"[..]));
    let m = seq.get(headed).unwrap();
    assert_eq!((m.props.header("k"), m.tag_set, m.payload), (Some(&b"v"[..]), None, &b"headed"[..]));
    assert_eq!(seq.get(tagged).unwrap().props.tags().collect::<Vec<_>>(), ["b", "a", "b"], "kept as produced");
    assert_eq!(tags_of(&seq, tagged), ["a", "b"], "a set: distinct, in no order");
    assert_eq!(seq.tag_set(tagged), seq.tag_set(same), "one set, interned once");
    assert_eq!(seq.tags().len(), 1);
    let set = seq.tag_set(tagged).unwrap();
    assert_eq!(seq.tags().messages_of(set), 2);
    assert_eq!(seq.live_bytes(), [plain, headed, tagged, same].iter().map(|&id| seq.get(id).unwrap().bytes()).sum());
    seq.release(tagged);
    assert_eq!(seq.tag_set(tagged), None, "a released message has no tag set");
    assert_eq!(seq.tags().messages_of(set), 1);
}

/// A block that has no properties stores none, and its first message with
/// some makes every live message in it carry a properties length.
#[test]
fn properties_arrive_in_a_block_of_plain_messages() {
    let mut seq = Seq::new(1);
    for i in 0..10u8 {
        append(&mut seq, &[], &[i; 5], 10).unwrap();
    }
    seq.release(3);
    let plain_heap = seq.heap_bytes();
    let tagged = append(&mut seq, &blob(&["t"], &[]), b"tagged", 10).unwrap();
    for id in (1..=10).filter(|&id| id != 3) {
        let m = seq.get(id).unwrap();
        assert_eq!((m.props, m.tag_set, m.payload), (Props::EMPTY, None, &[(id - 1) as u8; 5][..]), "message {id}");
    }
    assert_eq!(seq.get(3), None);
    assert_eq!(tags_of(&seq, tagged), ["t"]);
    assert_eq!(seq.live_bytes(), 9 * 5 + seq.get(tagged).unwrap().bytes());
    assert!(seq.heap_bytes() > plain_heap);
}

#[test]
fn the_tag_set_table_is_bounded_and_forgets_sets_no_message_holds() {
    let mut seq = Seq::new(1);
    let a = append(&mut seq, &blob(&["a"], &[]), b"", 2).unwrap();
    let b = append(&mut seq, &blob(&["b"], &[]), b"", 2).unwrap();
    let before = (seq.live(), seq.live_bytes(), seq.next_id());
    assert_eq!(append(&mut seq, &blob(&["c"], &[]), b"", 2), Err(TagsFull { max: 2 }));
    assert_eq!((seq.live(), seq.live_bytes(), seq.next_id()), before, "a refused message is not stored");
    // Known sets and untagged messages still come in.
    append(&mut seq, &blob(&["a"], &[]), b"", 2).unwrap();
    append(&mut seq, &blob(&[], &[("h", b"")]), b"", 2).unwrap();
    let epoch = seq.tags().epoch();
    // Once no message holds {b}, {c} takes its room, and the epoch says
    // that an id may now name another set.
    seq.release(b);
    let c = append(&mut seq, &blob(&["c"], &[]), b"", 2).unwrap();
    assert_eq!(tags_of(&seq, c), ["c"]);
    assert_eq!(tags_of(&seq, a), ["a"]);
    assert_eq!(seq.tags().len(), 2);
    assert_ne!(seq.tags().epoch(), epoch);
    // A set that comes back while it is still in the table keeps its id.
    let set_c = seq.tag_set(c);
    seq.release(c);
    let c2 = append(&mut seq, &blob(&["c"], &[]), b"", 2).unwrap();
    assert_eq!(seq.tag_set(c2), set_c);
}

#[test]
fn untake_gives_back_a_reference_for_a_message_not_stored() {
    let mut seq = Seq::new(1);
    let props_blob = blob(&["x"], &[]);
    let set = seq.intern_tags(&parsed(&props_blob), 1).unwrap();
    seq.untake_tags(set);
    // The set is held by nothing: a new one may take its room.
    assert!(append(&mut seq, &blob(&["y"], &[]), b"", 1).is_ok());
}

/// A live message of the model: (properties blob, payload, distinct tags).
type Held = (Vec<u8>, Vec<u8>, BTreeSet<String>);

/// Sets come and go without end; the table, its tags and its memory stay
/// bounded by the sets held.
#[test]
fn a_stream_of_new_tag_sets_keeps_the_table_bounded() {
    let mut seq = Seq::new(1);
    let mut heap_max = 0;
    for i in 0..10_000u32 {
        let (x, y) = (format!("x{i:05}"), format!("y{i:05}"));
        let id = append(&mut seq, &blob(&[&x, &y], &[]), b"", 3).unwrap();
        assert!(seq.tags().len() <= 3 && seq.tags().distinct_tags() <= 6, "message {i}");
        seq.release(id);
        if i <= 100 {
            heap_max = heap_max.max(seq.tags().heap_bytes());
        }
        assert!(i <= 100 || seq.tags().heap_bytes() <= heap_max, "message {i}: the table grew");
    }
}

/// The model: each live message's properties, payload and tags.
#[derive(Default)]
struct Model {
    /// Live messages by id.
    live: BTreeMap<MsgId, Held>,
}

impl Model {
    fn check(&self, seq: &Seq, seed: u64, step: usize) {
        let at = format!("seed {seed}, step {step}");
        let got: Vec<MsgId> = seq.iter_live().map(|m| m.id).collect();
        assert_eq!(got, self.live.keys().copied().collect::<Vec<_>>(), "{at}");
        let mut bytes = 0;
        let mut sets = BTreeMap::new();
        for (&id, (props, payload, tags)) in &self.live {
            let m = seq.get(id).expect("live");
            assert_eq!((m.props.bytes(), m.payload), (&props[..], &payload[..]), "{at}: message {id}");
            let want: Vec<&String> = tags.iter().collect();
            let names = tags_of(seq, id);
            assert_eq!(names.iter().collect::<Vec<_>>(), want, "{at}: tags of {id}");
            if let Some(set) = seq.tag_set(id) {
                *sets.entry(set).or_insert(0u64) += 1;
            }
            bytes += (props.len() + payload.len()) as u64;
        }
        assert_eq!(seq.live_bytes(), bytes, "{at}");
        assert_eq!(seq.tags().held() as usize, sets.len(), "{at}: sets held");
        for (set, n) in sets {
            assert_eq!(seq.tags().messages_of(set), n, "{at}: holders of set {}", set.raw());
        }
    }
}

/// Random properties: none, headers only, tags from a small alphabet (so
/// that sets repeat and the table fills), or both.
fn random_blob(rng: &mut Rng) -> (Vec<u8>, BTreeSet<String>) {
    const TAGS: [&str; 5] = ["a", "b", "c", "dd", "eee"];
    let mut tags = Vec::new();
    let mut headers: Vec<(&str, &[u8])> = Vec::new();
    match rng.below(4u32) {
        0 => {}
        1 => headers.push(("k", b"value")),
        kind => {
            for _ in 0..rng.range(1u32, 4) {
                tags.push(rng.pick(&TAGS));
            }
            if kind == 3 {
                headers.push(("h", b""));
            }
        }
    }
    let set = tags.iter().map(|t| t.to_string()).collect();
    (blob(&tags, &headers), set)
}

#[test]
fn seq_with_properties_matches_a_model() {
    for seed in seeds(20) {
        let _guard = SeedGuard { test: "seq_with_properties_matches_a_model", seed, replay: "cargo test --lib props" };
        let mut rng = Rng::new(seed);
        let mut seq = Seq::new(1);
        let mut model = Model::default();
        let max = rng.range(1u32, 12);
        for step in 0..10_000 {
            if rng.percent(55) || model.live.is_empty() {
                let (props, tags) = random_blob(&mut rng);
                let len = rng.below(40usize);
                let payload = rng.bytes(len);
                match append(&mut seq, &props, &payload, max) {
                    Ok(id) => {
                        model.live.insert(id, (props, payload, tags));
                    }
                    Err(TagsFull { max: m }) => {
                        assert_eq!(m, max);
                        let mut held: BTreeSet<_> =
                            model.live.values().map(|v| &v.2).filter(|t| !t.is_empty()).collect();
                        assert_eq!(held.len() as u32, max, "seed {seed}: refused only when full of held sets");
                        assert!(held.insert(&tags), "seed {seed}: a held set is never refused");
                    }
                }
            } else {
                let ids: Vec<MsgId> = model.live.keys().copied().collect();
                let id = rng.pick(&ids);
                assert!(seq.release(id).is_some());
                model.live.remove(&id);
            }
            assert!(seq.tags().len() <= max, "seed {seed}");
            if step % 50 == 0 || step > 9_990 {
                model.check(&seq, seed, step);
            }
        }
    }
}

/// Bytes per queued message: plain messages pay nothing for properties
/// (`seq_memory_per_message_is_within_target` measures them); a tagged
/// message pays its properties with their length, and two bytes of the
/// tag column. Prints the figure the README gives.
#[test]
fn seq_memory_per_tagged_message() {
    const N: u64 = 100_000;
    const PAYLOAD_BYTES: u64 = 100;
    let mut seq = Seq::new(1);
    let payload = [0xA5u8; PAYLOAD_BYTES as usize];
    let one_tag = blob(&["eu"], &[]);
    for i in 0..N {
        let props = parsed(&one_tag);
        let tag_set = seq.intern_tags(&props, 10).unwrap();
        seq.append(1_700_000_000_000 + i, Body { props, tag_set, payload: &payload });
    }
    let per_message = seq.heap_bytes() as f64 / N as f64;
    let extra = (2 + one_tag.len() + 2) as f64;
    println!(
        "seq memory: {per_message:.2} bytes/message for {N} messages of {PAYLOAD_BYTES} bytes with one 2-byte tag \
         ({extra} of it for the tag: its properties, their length, the tag column)"
    );
    assert!(per_message <= (PAYLOAD_BYTES + 24) as f64 + extra, "{per_message:.2} bytes per message");
}
