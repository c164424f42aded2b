//! Keeps docs/protocol.md byte-exact with the codec.
//!
//! The doc is the contract clients are written from, so its examples must be
//! what the broker really sends and accepts. This test reads the doc, decodes
//! every tagged hex dump with the codec, checks that it is the frame expected
//! for its tag, and re-encodes it to the same bytes. It also checks the doc's
//! tables of opcodes, error codes, dead-letter reasons and limits against the
//! code, so renumbering anything without updating the doc fails here.
//!
//! The dump format (docs/protocol.md, "Examples"): a fenced ```hex block
//! right after a line `<!-- example: NAME -->`. Inside the block `#` starts
//! a comment and every other token is one byte, two hex digits. A NAME
//! ending in `-request` is decoded as a request, one ending in `-reply` as a
//! reply. When an example is missing or wrong, the failure prints the bytes
//! the codec produces for it, ready to be annotated and pasted into the doc.

mod common;

use common::frames::{Expect, doc_frames, doc_frames_schedule, doc_frames_v2, encode, encode_reply};
use runnel::codec::*;
use runnel::limits::Limits;

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol.md");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("cannot read {DOC_PATH}: {e}"))
}

/// Bytes as the doc shows them, 16 to a line, for a failure message.
fn hex_block(bytes: &[u8]) -> String {
    let lines: Vec<String> =
        bytes.chunks(16).map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")).collect();
    format!("```hex\n{}\n```", lines.join("\n"))
}

/// Decodes `bytes` as the tag says, checks it against `expect`, and
/// re-encodes it. Returns what is wrong, if anything.
fn check_example(tag: &str, bytes: &[u8], expect: &Expect) -> Result<(), String> {
    let limits = DecodeLimits::from(&Limits::default());
    let mut again = Vec::new();
    match expect {
        Expect::Request(want, version) => {
            if !tag.ends_with("-request") {
                return Err("holds a request, so its tag must end in -request".into());
            }
            let (got, used) = match decode_request(bytes, &limits, *version) {
                Ok(Decoded::Frame(f, used)) => (f, used),
                other => return Err(format!("decode_request gave {other:?}")),
            };
            if used != bytes.len() {
                return Err(format!("decoding used {used} of {} bytes", bytes.len()));
            }
            if got != *want {
                return Err(format!("decoded {got:?}, expected {want:?}"));
            }
            encode_request(&mut again, got.request_id, &got.request, *version);
        }
        Expect::Reply(want) => {
            if !tag.ends_with("-reply") {
                return Err("holds a reply, so its tag must end in -reply".into());
            }
            let (got, used) = match decode_reply(bytes, usize::MAX) {
                Ok(Decoded::Frame(f, used)) => (f, used),
                other => return Err(format!("decode_reply gave {other:?}")),
            };
            if used != bytes.len() {
                return Err(format!("decoding used {used} of {} bytes", bytes.len()));
            }
            if got != *want {
                return Err(format!("decoded {got:?}, expected {want:?}"));
            }
            encode_reply(&mut again, &got);
        }
    }
    if again != bytes {
        return Err(format!("re-encoding gave other bytes:\n{}", hex_block(&again)));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Reading the doc.
// ---------------------------------------------------------------------------

/// A tagged hex dump found in the doc.
struct Example {
    tag: String,
    /// 1-based line of the tag, for messages.
    line: usize,
    bytes: Vec<u8>,
}

fn parse_tag(line: &str) -> Option<&str> {
    line.trim().strip_prefix("<!-- example:")?.strip_suffix("-->").map(str::trim)
}

fn parse_hex_line(line: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let data = line.split('#').next().unwrap_or("");
    for token in data.split_whitespace() {
        if token.len() != 2 {
            return Err(format!("`{token}` is not one byte as two hex digits"));
        }
        out.push(u8::from_str_radix(token, 16).map_err(|_| format!("`{token}` is not hex"))?);
    }
    Ok(())
}

/// Every tagged hex block of the doc. A hex block without a tag, a tag
/// without a hex block, or a tag used twice is an error.
fn examples(doc: &str) -> Result<Vec<Example>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut found: Vec<Example> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(tag) = parse_tag(lines[i]) {
            if lines.get(i + 1).map(|l| l.trim()) != Some("```hex") {
                return Err(format!("line {}: example tag `{tag}` is not followed by a ```hex line", i + 1));
            }
            if found.iter().any(|e| e.tag == tag) {
                return Err(format!("line {}: example tag `{tag}` is used twice", i + 1));
            }
            let mut bytes = Vec::new();
            let mut j = i + 2;
            loop {
                let line = lines.get(j).ok_or_else(|| format!("line {}: hex block never ends", i + 2))?;
                if line.trim() == "```" {
                    break;
                }
                parse_hex_line(line, &mut bytes).map_err(|e| format!("line {}: {e}", j + 1))?;
                j += 1;
            }
            found.push(Example { tag: tag.to_string(), line: i + 1, bytes });
            i = j;
        } else if lines[i].trim() == "```hex" {
            return Err(format!("line {}: hex block without a `<!-- example: NAME -->` line before it", i + 1));
        }
        i += 1;
    }
    Ok(found)
}

/// The cells of the table rows under the heading `heading` (up to the next
/// heading of the same or a higher level), backticks removed.
fn table_rows(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut rows = Vec::new();
    let mut inside = false;
    for line in doc.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes > 0 {
            if inside && hashes <= level {
                break;
            }
            inside = inside || line.trim() == heading;
            continue;
        }
        if inside && line.trim_start().starts_with('|') {
            let cells = line.trim().trim_matches('|').split('|').map(|c| c.trim().replace('`', "")).collect();
            rows.push(cells);
        }
    }
    assert!(!rows.is_empty(), "docs/protocol.md has no table under `{heading}`");
    rows
}

/// Asserts that the table under `heading` has a row whose first cells are
/// `first` and `second`.
fn assert_row(rows: &[Vec<String>], heading: &str, first: &str, second: &str) {
    assert!(
        rows.iter().any(|r| r.len() >= 2 && r[0] == first && r[1] == second),
        "the table under `{heading}` in docs/protocol.md needs a row `| {first} | {second} | ...`"
    );
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------

#[test]
fn every_example_decodes_to_its_frame_and_encodes_back() {
    let doc = doc();
    let found = examples(&doc).unwrap_or_else(|e| panic!("docs/protocol.md: {e}"));
    let mut expected = doc_frames();
    expected.extend(doc_frames_v2());
    expected.extend(common::push_frames::doc_frames_push());
    expected.extend(doc_frames_schedule());
    expected.extend(common::dedup_frames::doc_frames_dedup());
    expected.extend(common::inspect_frames::doc_frames_inspect());
    expected.extend(common::retry_frames::doc_frames_retry());
    expected.extend(common::frames::doc_frames_v6());
    let mut failures = Vec::new();
    for ex in &found {
        if !expected.iter().any(|f| f.name == ex.tag) {
            failures.push(format!(
                "line {}: example `{}` is not one this test knows; add it to doc_frames() in tests/common/frames.rs",
                ex.line, ex.tag
            ));
        }
    }
    for f in &expected {
        let (tag, expect) = (f.name, &f.expect);
        let want = encode(expect);
        let Some(ex) = found.iter().find(|e| e.tag == *tag) else {
            failures.push(format!("example `{tag}` is missing; the codec encodes it as\n{}", hex_block(&want)));
            continue;
        };
        if let Err(e) = check_example(tag, &ex.bytes, expect) {
            failures.push(format!(
                "line {}: example `{tag}`: {e}\nthe codec encodes it as\n{}",
                ex.line,
                hex_block(&want)
            ));
        }
    }
    assert!(failures.is_empty(), "docs/protocol.md is out of date:\n\n{}", failures.join("\n\n"));
}

#[test]
fn error_table_names_every_code() {
    let doc = doc();
    let heading = "## Error codes";
    let rows = table_rows(&doc, heading);
    // Codes 1 to 25 have no gaps; later versions take numbers from ranges.
    let codes: Vec<ErrorCode> = (0..=u8::MAX).filter_map(ErrorCode::from_u8).collect();
    for n in 1..=25u8 {
        assert!(ErrorCode::from_u8(n).is_some(), "ErrorCode::from_u8({n}) is None");
    }
    for &code in &codes {
        assert_row(&rows, heading, &(code as u8).to_string(), code.name());
    }
    // The table lists exactly the codes there are.
    assert_eq!(ErrorCode::from_u8(0), None);
    let numbered = rows.iter().filter(|r| r[0].parse::<u8>().is_ok()).count();
    assert_eq!(numbered, codes.len(), "the error table has rows for codes that do not exist");
}

#[test]
fn opcode_and_reason_tables_match_the_codec() {
    let doc = doc();
    let heading = "## Opcodes";
    let rows = table_rows(&doc, heading);
    let ops = [
        (op::HELLO, "HELLO"),
        (op::PING, "PING"),
        (op::PRODUCE, "PRODUCE"),
        (op::FETCH, "FETCH"),
        (op::ACK, "ACK"),
        (op::NACK, "NACK"),
        (op::TOUCH, "TOUCH"),
        (op::STATS, "STATS"),
        (op::CREATE_TOPIC, "CREATE_TOPIC"),
        (op::DELETE_TOPIC, "DELETE_TOPIC"),
        (op::PURGE_TOPIC, "PURGE_TOPIC"),
        (op::LIST_TOPICS, "LIST_TOPICS"),
        (op::REDRIVE, "REDRIVE"),
        (op::CREATE_GROUP, "CREATE_GROUP"),
        (op::DELETE_GROUP, "DELETE_GROUP"),
        (op::LIST_GROUPS, "LIST_GROUPS"),
        (op::RESET_GROUP, "RESET_GROUP"),
        (op::SUBSCRIBE, "SUBSCRIBE"),
        (op::CREDIT, "CREDIT"),
        (op::UNSUBSCRIBE, "UNSUBSCRIBE"),
        (op::CANCEL, "CANCEL"),
        (op::RESCHEDULE, "RESCHEDULE"),
        (op::ACK_PRODUCE, "ACK_PRODUCE"),
        (op::LOOKUP, "LOOKUP"),
        (op::PEEK, "PEEK"),
    ];
    for (code, name) in ops {
        assert_row(&rows, heading, &format!("0x{code:02x}"), name);
    }
    let heading = "#### Dead-letter reasons";
    let rows = table_rows(&doc, heading);
    for n in 1..=4u8 {
        let reason = DeadReason::from_u8(n).unwrap_or_else(|| panic!("DeadReason::from_u8({n}) is None"));
        assert_row(&rows, heading, &n.to_string(), reason.name());
    }
    assert_eq!(DeadReason::from_u8(5), None);
}

#[test]
fn limits_table_matches_the_defaults() {
    let doc = doc();
    let heading = "## Limits";
    let rows = table_rows(&doc, heading);
    let d = Limits::default();
    let limits: [(&str, u64); 45] = [
        ("frame_bytes_max", d.frame_bytes_max.into()),
        ("message_bytes_max", d.message_bytes_max.into()),
        ("batch_messages_max", d.batch_messages_max.into()),
        ("topic_name_bytes_max", d.topic_name_bytes_max.into()),
        ("topics_max", d.topics_max.into()),
        ("topic_messages_max", d.topic_messages_max),
        ("topic_bytes_max", d.topic_bytes_max),
        ("connections_max", d.connections_max.into()),
        ("output_bytes_max", d.output_bytes_max.into()),
        ("buffered_bytes_max", d.buffered_bytes_max),
        ("fetch_bytes_max", d.fetch_bytes_max.into()),
        ("fetch_wait_ms_max", d.fetch_wait_ms_max.into()),
        ("timers_max", d.timers_max.into()),
        ("read_bytes_per_turn_max", d.read_bytes_per_turn_max.into()),
        ("work_items_per_turn_max", d.work_items_per_turn_max.into()),
        ("work_bytes_per_turn_max", d.work_bytes_per_turn_max.into()),
        ("metrics_bytes_per_turn_max", d.metrics_bytes_per_turn_max.into()),
        ("handshake_timeout_ms", d.handshake_timeout_ms.into()),
        ("idle_timeout_ms", d.idle_timeout_ms.into()),
        ("frame_timeout_ms", d.frame_timeout_ms.into()),
        ("group_name_bytes_max", d.group_name_bytes_max.into()),
        ("groups_per_topic_max", d.groups_per_topic_max.into()),
        ("tags_per_message_max", d.tags_per_message_max.into()),
        ("tag_bytes_max", d.tag_bytes_max.into()),
        ("tag_sets_per_topic_max", d.tag_sets_per_topic_max.into()),
        ("props_bytes_max", d.props_bytes_max.into()),
        ("filter_bytes_max", d.filter_bytes_max.into()),
        ("filter_compiled_bytes_max", d.filter_compiled_bytes_max.into()),
        ("compiled_filters_bytes_max", d.compiled_filters_bytes_max),
        ("schedule_ahead_ms_max", d.schedule_ahead_ms_max),
        ("key_bytes_max", d.key_bytes_max.into()),
        ("lookup_results_max", d.lookup_results_max.into()),
        ("key_index_entries_per_topic_max", d.key_index_entries_per_topic_max.into()),
        ("dedup_window_ms_max", d.dedup_window_ms_max.into()),
        ("dedup_entries_max", d.dedup_entries_max.into()),
        ("dedup_id_bytes_max", d.dedup_id_bytes_max.into()),
        ("retry_delay_ms_max", d.retry_delay_ms_max.into()),
        ("nack_reason_bytes_max", d.nack_reason_bytes_max.into()),
        ("retention_ms_max", d.retention_ms_max),
        ("retention_bytes_max", d.retention_bytes_max),
        ("replay_read_bytes_per_turn", d.replay_read_bytes_per_turn),
        ("replay_read_bytes_per_sec", d.replay_read_bytes_per_sec),
        ("unwritten_records_bytes_max", d.unwritten_records_bytes_max),
        ("produce_headroom_bytes", d.produce_headroom_bytes),
        ("replay_window_messages_max", d.replay_window_messages_max.into()),
    ];
    for (name, default) in limits {
        let row = rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("the limits table in docs/protocol.md has no row for {name}"));
        let digits: String =
            row.get(1).map(|c| c.chars().take_while(char::is_ascii_digit).collect()).unwrap_or_default();
        assert_eq!(digits, default.to_string(), "default of {name} in the limits table");
        let flag = format!("--{}", name.replace('_', "-"));
        assert_eq!(row.get(2), Some(&flag), "flag of {name} in the limits table");
    }
}

/// Every STATS key a broker sends, broker-wide and per topic, has a row in
/// the doc's STATS tables.
#[test]
fn stats_tables_name_every_key() {
    let doc = doc();
    let (srv, _dir) = common::Server::start(runnel::broker::Config::default());
    let mut c = srv.client();
    c.produce("t", b"one").expect("produce");
    let sections = c.stats(None).expect("stats");
    assert!(sections.len() >= 2, "setup: the broker section and topic t, got {sections:?}");
    let missing: Vec<String> = sections
        .iter()
        .flat_map(|(name, kvs)| kvs.iter().map(move |(k, _)| (name.clone(), k.clone())))
        .filter(|(_, k)| !doc.contains(&format!("| `{k}` |")))
        .map(|(name, k)| format!("{k} (section {name:?})"))
        .collect();
    assert!(missing.is_empty(), "STATS keys missing from docs/protocol.md: {missing:?}");
}

/// The doc says once which versions this build negotiates, in one
/// sentence a reader (and this test) can find, and it is what the code
/// negotiates; no other sentence states a range or a highest version; and
/// the table of what each version added has a row for every version, and
/// none for a version the build does not speak.
#[test]
fn the_doc_states_the_versions_the_build_negotiates_once() {
    let doc = doc();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let claim = "This build negotiates protocol versions ";
    let stated: Vec<&str> = flat.match_indices(claim).map(|(at, _)| &flat[at + claim.len()..]).collect();
    assert_eq!(stated.len(), 1, "docs/protocol.md must say `{claim}N to M.` exactly once");
    let range = format!("{} to {}.", VERSION_MIN, VERSION_MAX);
    assert!(stated[0].starts_with(&range), "docs/protocol.md states versions {:?}, the code {range}", &stated[0][..8]);
    for stale in ["negotiates up to", "negotiates versions", "this build negotiates", "# runnel wire protocol, version"]
    {
        assert!(!flat.contains(stale), "docs/protocol.md states the versions again: `{stale}`");
    }
    let rows = table_rows(&doc, "### What each version added");
    let versions: Vec<String> = rows.iter().filter(|r| r[0].parse::<u16>().is_ok()).map(|r| r[0].clone()).collect();
    let want: Vec<String> = (VERSION_MIN..=VERSION_MAX).map(|v| v.to_string()).collect();
    assert_eq!(versions, want, "the rows of `What each version added`");
}

/// The opcode table's Since column is the version the codec has each op
/// from.
#[test]
fn the_opcode_table_gives_the_version_of_each_op() {
    let doc = doc();
    let rows = table_rows(&doc, "## Opcodes");
    let mut checked = 0;
    for r in rows.iter().filter(|r| r[0].starts_with("0x")) {
        let code = u8::from_str_radix(&r[0][2..], 16).unwrap_or_else(|_| panic!("op {} in the opcode table", r[0]));
        let since = op::since(code).map(|v| v.to_string());
        assert_eq!(r.get(2), since.as_ref(), "the Since of op {} ({}) in the opcode table", r[0], r[1]);
        checked += 1;
    }
    assert_eq!(checked, (0..=u8::MAX).filter(|&o| op::since(o).is_some()).count(), "every op has a row");
}

/// The anchor GitHub gives a heading: lowercase, punctuation but `-` and
/// `_` dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of the doc outside its code blocks, with their anchors (a
/// repeated one gets `-1`, `-2`, ..., as on GitHub).
fn headings(doc: &str) -> Vec<(String, String)> {
    let mut fenced = false;
    let mut found: Vec<(String, String)> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in doc.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let base = slug(line);
            let n = seen.entry(base.clone()).or_insert(0);
            let anchor = if *n == 0 { base } else { format!("{base}-{n}") };
            *n += 1;
            found.push((line.to_string(), anchor));
        }
    }
    found
}

/// Every link to a section of the doc lands on a heading, and the
/// contents list every section.
#[test]
fn every_link_names_a_section_and_the_contents_list_every_one() {
    let doc = doc();
    let heads = headings(&doc);
    let anchors: Vec<&str> = heads.iter().map(|(_, a)| a.as_str()).collect();
    let links: Vec<&str> = doc.split("](#").skip(1).filter_map(|rest| rest.split(')').next()).collect();
    let broken: Vec<&&str> = links.iter().filter(|l| !anchors.contains(l)).collect();
    assert!(broken.is_empty(), "docs/protocol.md links to sections it does not have: {broken:?}");
    let contents = doc.split("## Contents").nth(1).and_then(|c| c.split("\n## ").next()).unwrap_or("");
    for (line, anchor) in heads.iter().filter(|(l, _)| l.starts_with("## ") && l != "## Contents") {
        assert!(contents.contains(&format!("(#{anchor})")), "the contents do not list `{line}`");
    }
}
