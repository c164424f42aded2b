//! Rebuilds a vector's frame from its `header` and `body` alone, as a
//! client writer does with docs/vectors/README.md's promise: "build the
//! request from `header.request_id` and the body's fields with your
//! encoder". The encoder here is written from docs/protocol.md's layout
//! tables, field by field, and shares no code with the codec: each field
//! of the layout is taken from the body in layout order, by its name, and
//! every field of the body must be taken. So a field the body leaves out,
//! one given twice, or one out of order fails, as it would fail a client.

use super::json::Value;

/// Names in a body that are no wire field (docs/vectors/README.md): the
/// names of numbered things, given beside their numbers.
const NOT_WIRE: [&str; 3] = ["name", "reason_name", "state_name"];

/// The fields of one JSON object, taken in order.
struct Fields<'a> {
    /// Where the object is, for messages.
    what: String,
    fields: &'a [(String, Value)],
    at: usize,
}

fn fields<'a>(what: impl Into<String>, v: &'a Value) -> Fields<'a> {
    match v {
        Value::Obj(fields) => Fields { what: what.into(), fields, at: 0 },
        other => panic!("{}: {other:?} is not an object", what.into()),
    }
}

impl<'a> Fields<'a> {
    /// The next field, which must be `name`.
    fn take(&mut self, name: &str) -> &'a Value {
        let got = self.fields.get(self.at).map(|(k, _)| k.as_str());
        assert_eq!(got, Some(name), "{}: the field after {} must be {name}", self.what, self.previous());
        self.at += 1;
        &self.fields[self.at - 1].1
    }

    fn previous(&self) -> String {
        self.at.checked_sub(1).map_or("the start".to_string(), |i| self.fields[i].0.clone())
    }

    /// The next field if it is `name`.
    fn peek(&self, name: &str) -> bool {
        self.fields.get(self.at).is_some_and(|(k, _)| k == name)
    }

    /// Steps over the next field, the name of a number (no wire field).
    fn skip_name(&mut self, name: &str) {
        assert!(NOT_WIRE.contains(&name), "{name} is a wire field");
        self.take(name);
    }

    fn num(&mut self, name: &str) -> u64 {
        match self.take(name) {
            Value::Num(n) => *n,
            other => panic!("{}: {name} is {other:?}, not a number", self.what),
        }
    }

    fn text(&mut self, name: &str) -> &'a str {
        match self.take(name) {
            Value::Str(s) => s,
            other => panic!("{}: {name} is {other:?}, not a string", self.what),
        }
    }

    fn hex(&mut self, name: &str) -> Vec<u8> {
        let s = self.text(name);
        assert!(s.len().is_multiple_of(2), "{}: {name} is not whole bytes of hex", self.what);
        (0..s.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|_| panic!("{}: {name} is not hex", self.what))
            })
            .collect()
    }

    fn array(&mut self, name: &str) -> &'a [Value] {
        match self.take(name) {
            Value::Arr(items) => items,
            other => panic!("{}: {name} is {other:?}, not an array", self.what),
        }
    }

    fn object(&mut self, name: &str) -> Fields<'a> {
        let what = format!("{}.{name}", self.what);
        fields(what, self.take(name))
    }

    /// Asserts that every field was taken.
    fn done(self) {
        let rest: Vec<&str> = self.fields[self.at..].iter().map(|(k, _)| k.as_str()).collect();
        assert!(rest.is_empty(), "{}: fields no layout has: {rest:?}", self.what);
    }

    fn int<const N: usize>(&mut self, name: &str, out: &mut Vec<u8>) -> u64 {
        let v = self.num(name);
        assert!(N == 8 || v < 1 << (8 * N), "{}: {name} = {v} does not fit {N} bytes", self.what);
        out.extend_from_slice(&v.to_le_bytes()[..N]);
        v
    }
    fn u8(&mut self, name: &str, out: &mut Vec<u8>) -> u8 {
        self.int::<1>(name, out) as u8
    }
    fn u16(&mut self, name: &str, out: &mut Vec<u8>) -> u16 {
        self.int::<2>(name, out) as u16
    }
    fn u32(&mut self, name: &str, out: &mut Vec<u8>) -> u32 {
        self.int::<4>(name, out) as u32
    }
    fn u64(&mut self, name: &str, out: &mut Vec<u8>) -> u64 {
        self.int::<8>(name, out)
    }
    /// A string field: its u16 length (not a body field), then its bytes.
    fn str(&mut self, name: &str, out: &mut Vec<u8>) {
        let s = self.text(name);
        put_len16(out, s.len());
        out.extend_from_slice(s.as_bytes());
    }
    /// Bytes given as hex with a u16 length before them on the wire.
    fn hex16(&mut self, name: &str, out: &mut Vec<u8>) {
        let b = self.hex(name);
        put_len16(out, b.len());
        out.extend_from_slice(&b);
    }
    /// A u32 `count` and that many u64 ids.
    fn ids(&mut self, count: &str, ids: &str, out: &mut Vec<u8>) {
        let n = self.u32(count, out);
        let ids = self.array(ids);
        assert_eq!(ids.len() as u64, u64::from(n), "{}: {count} is not the number of {ids:?}", self.what);
        for id in ids {
            let Value::Num(id) = id else { panic!("{}: an id is {id:?}", self.what) };
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    /// An array counted by the field before it: each item written by `each`.
    fn items(&mut self, name: &str, count: u64, out: &mut Vec<u8>, each: impl Fn(Fields<'a>, &mut Vec<u8>)) {
        let items = self.array(name);
        assert_eq!(items.len() as u64, count, "{}: {name} has other than its count of items", self.what);
        for (i, item) in items.iter().enumerate() {
            each(fields(format!("{}.{name}[{i}]", self.what), item), out);
        }
    }
}

fn put_len16(out: &mut Vec<u8>, len: usize) {
    let len = u16::try_from(len).expect("a length that fits u16");
    out.extend_from_slice(&len.to_le_bytes());
}

// ---------------------------------------------------------------------------
// The frame.
// ---------------------------------------------------------------------------

/// The frame a vector's `header` and `body` make, in the layouts of
/// protocol `version`, the body's bytes after `bytes_past_layout` of the
/// vector's own (which a client is not told, and ignores). `None` for a
/// refused request, which has no body.
pub fn frame(v: &Value, version: u16) -> Option<Vec<u8>> {
    let name = match v.get("name") {
        Some(Value::Str(n)) => n.clone(),
        other => panic!("a vector without a name: {other:?}"),
    };
    if v.get("refused").is_some() {
        assert!(v.get("body").is_none(), "{name}: a refused request has no body");
        return None;
    }
    let mut h = fields(format!("{name}.header"), v.get("header").expect("a header"));
    let _len = h.num("len");
    let (op, status, flags, request_id) = (h.num("op"), h.num("status"), h.num("flags"), h.num("request_id"));
    h.done();
    let body = fields(format!("{name}.body"), v.get("body").unwrap_or_else(|| panic!("{name}: no body")));
    let mut out = Vec::new();
    match v.get("direction") {
        Some(Value::Str(d)) if d == "request" => request(op as u8, body, version, &mut out),
        Some(Value::Str(d)) if d == "reply" => reply(op as u8 & 0x7f, (status, flags), body, &mut out),
        other => panic!("{name}: direction {other:?}"),
    }
    if let Some(Value::Num(extra)) = v.get("bytes_past_layout") {
        out.resize(out.len() + *extra as usize, 0);
    }
    let mut frame = Vec::with_capacity(12 + out.len());
    frame.extend_from_slice(&(8 + out.len() as u32).to_le_bytes());
    frame.extend_from_slice(&[op as u8, status as u8]);
    frame.extend_from_slice(&(flags as u16).to_le_bytes());
    frame.extend_from_slice(&(request_id as u32).to_le_bytes());
    frame.extend_from_slice(&out);
    Some(frame)
}

// ---------------------------------------------------------------------------
// Requests, by op, in the layouts of `version`.
// ---------------------------------------------------------------------------

/// Version 2's group, after the topic of the requests that carry one.
fn topic_group(f: &mut Fields<'_>, version: u16, out: &mut Vec<u8>) {
    f.str("topic", out);
    if version >= 2 {
        f.str("group", out);
    }
}

fn request(op: u8, mut f: Fields<'_>, version: u16, out: &mut Vec<u8>) {
    match op {
        0x01 => {
            f.u16("min_version", out);
            f.u16("max_version", out);
            f.hex16("token", out);
        }
        0x02 | 0x33 => {}
        0x10 => {
            f.str("topic", out);
            if version >= 3 {
                f.u8("flags", out);
            }
            batch(&mut f, version, out);
        }
        0x11 => {
            topic_group(&mut f, version, out);
            for name in ["max_messages", "max_bytes", "wait_ms", "ack_timeout_ms"] {
                f.u32(name, out);
            }
        }
        0x12 => {
            topic_group(&mut f, version, out);
            f.ids("count", "ids", out);
        }
        0x13 => {
            topic_group(&mut f, version, out);
            f.u32("delay_ms", out);
            let flags = f.u8("flags", out);
            f.ids("count", "ids", out);
            if flags & 0x02 != 0 {
                f.str("reason", out);
            }
        }
        0x14 => {
            topic_group(&mut f, version, out);
            f.u32("ack_timeout_ms", out);
            f.ids("count", "ids", out);
        }
        0x20 | 0x31 | 0x32 | 0x42 => f.str("topic", out),
        0x30 => create_topic(&mut f, out),
        0x34 => {
            topic_group(&mut f, version, out);
            f.u32("max_messages", out);
        }
        0x40..=0x43 => group_op(op, &mut f, out),
        _ => later_request(op, &mut f, out),
    }
    f.done();
}

/// The requests of versions 3 and 4 (SUBSCRIBE, CREDIT, UNSUBSCRIBE,
/// ACK_PRODUCE, CANCEL, RESCHEDULE, LOOKUP, PEEK).
fn later_request(op: u8, f: &mut Fields<'_>, out: &mut Vec<u8>) {
    match op {
        0x60 => {
            f.str("topic", out);
            f.str("group", out);
            f.u32("credit", out);
            f.u32("ack_timeout_ms", out);
        }
        0x61 => {
            f.u32("subscription", out);
            f.u32("credit", out);
        }
        0x62 => {
            f.u32("subscription", out);
        }
        0x63 => {
            f.str("topic", out);
            f.str("group", out);
            f.ids("count", "ids", out);
            let n = f.u16("outputs_count", out);
            f.items("outputs", n.into(), out, |mut o, out| {
                o.str("topic", out);
                batch(&mut o, 2, out);
                o.done();
            });
        }
        0x50 | 0x53 => {
            f.str("topic", out);
            f.u64("id", out);
        }
        0x51 => {
            f.str("topic", out);
            f.u64("id", out);
            f.u8("kind", out);
            f.u64("value", out);
        }
        0x52 => {
            f.str("topic", out);
            f.hex16("key", out);
        }
        other => panic!("{}: op {other:#04x} is no request", f.what),
    }
}

/// PRODUCE's `count` and messages: `len` and `payload`, after `props_len`
/// and `props` from version 2 on.
fn batch(f: &mut Fields<'_>, version: u16, out: &mut Vec<u8>) {
    let n = f.u32("count", out);
    f.items("messages", n.into(), out, |mut m, out| {
        if version >= 2 {
            props(&mut m, out);
        }
        payload(&mut m, out);
        m.done();
    });
}

/// `len` (u32) and `payload`, which must be `len` bytes.
fn payload(f: &mut Fields<'_>, out: &mut Vec<u8>) {
    let len = f.u32("len", out);
    let p = f.hex("payload");
    assert_eq!(p.len() as u64, u64::from(len), "{}: len is not the payload's", f.what);
    out.extend_from_slice(&p);
}

fn create_topic(f: &mut Fields<'_>, out: &mut Vec<u8>) {
    f.str("topic", out);
    f.u32("ack_timeout_ms", out);
    f.u16("max_deliveries", out);
    // Version 4's settings list, to the end of the body.
    if !f.peek("settings") {
        return;
    }
    let listed = f.fields.get(f.at).map_or(0, |(_, v)| count_of(v));
    f.items("settings", listed, out, |mut s, out| {
        let id = s.u8("id", out);
        s.skip_name("name");
        let width = match id {
            1 => 4,
            2 | 3 => 8,
            other => panic!("{}: topic setting {other} has no layout", s.what),
        };
        put_len16(out, width);
        let v = s.num("value");
        out.extend_from_slice(&v.to_le_bytes()[..width]);
        s.done();
    });
}

/// The number of items of an array (a list that runs to the end of the
/// body has no count field of its own).
fn count_of(v: &Value) -> u64 {
    match v {
        Value::Arr(items) => items.len() as u64,
        _ => 0,
    }
}

fn group_op(op: u8, f: &mut Fields<'_>, out: &mut Vec<u8>) {
    f.str("topic", out);
    if op == 0x42 {
        return;
    }
    f.str("group", out);
    match op {
        0x40 => {
            let flags = f.u8("flags", out);
            f.u8("start_kind", out);
            f.u64("start_value", out);
            f.u32("ack_timeout_ms", out);
            f.u16("max_deliveries", out);
            f.str("filter", out);
            if flags & 0x04 != 0 {
                retry_policy(f, out);
            }
        }
        0x43 => {
            f.u8("start_kind", out);
            f.u64("start_value", out);
        }
        _ => {}
    }
}

/// A retry policy (version 4): 11 bytes after the filter.
fn retry_policy(f: &mut Fields<'_>, out: &mut Vec<u8>) {
    let mut p = f.object("retry_policy");
    p.u32("initial_ms", out);
    p.u32("cap_ms", out);
    p.u16("multiplier_pct", out);
    p.u8("jitter_pct", out);
    p.done();
}

/// A message's `props_len` and `props`: each entry `type` u8, its length
/// u16 (no body field), and its value as its type lays it out.
fn props(f: &mut Fields<'_>, out: &mut Vec<u8>) {
    let props_len = f.num("props_len");
    let start = out.len() + 2;
    put_len16(out, props_len as usize);
    let entries = f.array("props");
    for (i, e) in entries.iter().enumerate() {
        let mut e = fields(format!("{}.props[{i}]", f.what), e);
        let kind = e.u8("type", out);
        e.skip_name("name");
        let mut value = Vec::new();
        match kind {
            1 => value.extend_from_slice(e.text("tag").as_bytes()),
            2 => {
                e.str("key", &mut value);
                value.extend_from_slice(&e.hex("value"));
            }
            3 | 4 => {
                e.u64("value", &mut value);
            }
            5 | 6 => value.extend_from_slice(&e.hex("value")),
            7 => value.extend_from_slice(e.text("value").as_bytes()),
            other => panic!("{}: property type {other} has no layout", e.what),
        }
        put_len16(out, value.len());
        out.extend_from_slice(&value);
        e.done();
    }
    assert_eq!((out.len() - start) as u64, props_len, "{}: props_len is not the properties' bytes", f.what);
}

// ---------------------------------------------------------------------------
// Replies, by op.
// ---------------------------------------------------------------------------

/// The limits of a HELLO reply of `version`, in layout order, with their
/// widths.
fn hello_fields(version: u64) -> Vec<(&'static str, usize)> {
    let mut names =
        vec![("frame_bytes_max", 4), ("message_bytes_max", 4), ("batch_messages_max", 4), ("topic_name_bytes_max", 4)];
    if version >= 2 {
        names.extend([
            ("output_bytes_max", 4),
            ("fetch_bytes_max", 4),
            ("idle_timeout_ms", 4),
            ("map_epoch", 8),
            ("group_name_bytes_max", 4),
            ("tags_per_message_max", 4),
            ("tag_bytes_max", 4),
            ("props_bytes_max", 4),
            ("filter_bytes_max", 4),
        ]);
    }
    if version >= 6 {
        names.extend([
            ("subscription_credit_max", 4),
            ("key_bytes_max", 4),
            ("dedup_id_bytes_max", 4),
            ("nack_reason_bytes_max", 4),
            ("lookup_results_max", 4),
        ]);
    }
    names
}

fn reply(op: u8, (status, flags): (u64, u64), mut f: Fields<'_>, out: &mut Vec<u8>) {
    if status != 0 {
        f.str("message", out);
        return f.done();
    }
    match op {
        0x01 => {
            let version = f.u16("version", out);
            for (name, width) in hello_fields(version.into()) {
                match width {
                    4 => f.u32(name, out) as u64,
                    _ => f.u64(name, out),
                };
            }
        }
        0x02 => {}
        0x10 => {
            f.u64("first_id", out);
            f.u32("count", out);
            // Version 4: header flag 0x0001 announces the duplicates.
            if flags & 0x0001 != 0 {
                let n = f.u32("duplicate_count", out);
                f.items("duplicates", n.into(), out, |mut d, out| {
                    d.u32("index", out);
                    d.u64("id", out);
                    d.done();
                });
            }
        }
        0x11 | 0x6f => {
            f.str("topic", out);
            let n = f.u32("count", out);
            f.items("messages", n.into(), out, delivered);
        }
        0x12..=0x14 => {
            f.u32("done", out);
            f.ids("failed_count", "failed", out);
        }
        0x20 => stats(&mut f, out),
        0x30 => {
            f.u8("created", out);
        }
        0x31 | 0x32 | 0x34 | 0x41 | 0x62 => {
            f.u64("count", out);
        }
        0x33 => {
            let n = f.u32("count", out);
            f.items("topics", n.into(), out, |mut t, out| {
                t.str("name", out);
                t.u32("ack_timeout_ms", out);
                t.u16("max_deliveries", out);
                t.done();
            });
        }
        _ => later_reply(op, &mut f, out),
    }
    f.done();
}

/// The replies of the ops of versions 2 to 4.
fn later_reply(op: u8, f: &mut Fields<'_>, out: &mut Vec<u8>) {
    match op {
        0x40 => {
            f.u8("created", out);
            f.u64("cursor", out);
        }
        0x42 => {
            let n = f.u32("count", out);
            f.items("groups", n.into(), out, group_info);
        }
        0x43 => {
            f.u64("cursor", out);
        }
        0x50 | 0x51 => {
            f.u64("deliver_at_ms", out);
        }
        0x52 | 0x53 => {
            let n = f.u32("count", out);
            f.items("entries", n.into(), out, inspected);
        }
        0x60 => {
            f.u32("subscription", out);
        }
        0x61 => {
            f.u32("inflight", out);
        }
        0x63 => {
            f.u32("done", out);
            f.ids("failed_count", "failed", out);
            let n = f.u16("outputs_count", out);
            f.items("outputs", n.into(), out, |mut o, out| {
                o.u64("first_id", out);
                o.u32("count", out);
                o.done();
            });
        }
        other => panic!("{}: op {other:#04x} has no OK reply", f.what),
    }
}

/// A delivered message (FETCH reply, pushed frame): its flag bits say
/// which fields follow `flags`, in the order dead-letter fields, origin
/// group, properties.
fn delivered(mut m: Fields<'_>, out: &mut Vec<u8>) {
    m.u64("id", out);
    m.u64("born_ms", out);
    m.u16("delivery_count", out);
    let flags = m.u8("flags", out);
    if flags & 0x01 != 0 {
        dead_fields(&mut m, out);
    }
    if flags & 0x04 != 0 {
        m.str("origin_group", out);
    }
    if flags & 0x02 != 0 {
        props(&mut m, out);
    }
    payload(&mut m, out);
    m.done();
}

fn dead_fields(m: &mut Fields<'_>, out: &mut Vec<u8>) {
    m.u64("origin_id", out);
    m.u16("origin_deliveries", out);
    m.u8("reason", out);
    m.skip_name("reason_name");
}

fn stats(f: &mut Fields<'_>, out: &mut Vec<u8>) {
    for (i, s) in f.array("sections").iter().enumerate() {
        let mut s = fields(format!("{}.sections[{i}]", f.what), s);
        s.str("name", out);
        let n = s.u16("key_count", out);
        s.items("pairs", n.into(), out, |mut p, out| {
            // A STATS key's length is one byte.
            let key = p.text("key");
            out.push(u8::try_from(key.len()).expect("a key under 256 bytes"));
            out.extend_from_slice(key.as_bytes());
            p.u64("value", out);
            p.done();
        });
        s.done();
    }
}

fn group_info(mut g: Fields<'_>, out: &mut Vec<u8>) {
    g.str("name", out);
    let flags = g.u8("flags", out);
    g.u32("ack_timeout_ms", out);
    g.u16("max_deliveries", out);
    g.str("filter", out);
    if flags & 0x04 != 0 {
        retry_policy(&mut g, out);
    }
    for name in ["cursor", "lag", "inflight", "retry", "delayed", "dead_lettered", "oldest_unacked_age_ms"] {
        g.u64(name, out);
    }
    g.u32("consumers", out);
    g.done();
}

/// An entry of a LOOKUP or PEEK reply.
fn inspected(mut e: Fields<'_>, out: &mut Vec<u8>) {
    e.u64("id", out);
    let flags = e.u8("flags", out);
    if flags & 0x01 != 0 {
        e.u64("born_ms", out);
    }
    if flags & 0x02 != 0 {
        dead_fields(&mut e, out);
    }
    if flags & 0x01 != 0 {
        props(&mut e, out);
        let len = e.u32("len", out);
        if flags & 0x04 != 0 {
            let p = e.hex("payload");
            assert_eq!(p.len() as u64, u64::from(len), "{}: len is not the payload's", e.what);
            out.extend_from_slice(&p);
        }
    }
    let n = e.u16("group_count", out);
    e.items("groups", n.into(), out, |mut g, out| {
        g.str("name", out);
        g.u8("state", out);
        g.skip_name("state_name");
        g.u16("deliveries", out);
        g.u64("until_ms", out);
        g.u64("consumer", out);
        g.u8("dead_reason", out);
        g.str("last_nack_reason", out);
        g.done();
    });
    e.done();
}
