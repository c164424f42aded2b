//! `runnel consume`: prints a topic's messages, one a line, and
//! acknowledges each once it is printed.

use std::io::ErrorKind;
use std::time::Duration;

use runnel::client::{Client, Delivered, Fetch, GroupEntry};
use runnel::codec::ErrorCode;
use runnel::codec::group::{GroupSettings, Start};
use runnel::config::Args;

use super::{Exit, Sub, addr, connect, emit, parse_start};

/// How long each FETCH of `runnel consume` waits for a message by default.
pub(crate) const CONSUME_WAIT_MS_DEFAULT: u32 = 1000;
/// The credit of `runnel consume --push` by default: the messages it holds
/// unacknowledged, as one FETCH of it takes at most.
pub(crate) const CONSUME_CREDIT_DEFAULT: u32 = 256;

pub(crate) fn consume(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let count: Option<u64> = a.num("--count")?;
    let wait_ms: u32 = a.num("--wait-ms")?.unwrap_or(CONSUME_WAIT_MS_DEFAULT);
    let group_name = a.take("--group").unwrap_or_default();
    let wanted = Wanted::take(&mut a)?;
    let credit: Option<u32> = a.num("--credit")?;
    let push = a.switch("--push") || credit.is_some();
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut client = connect(&addr)?;
    wanted.make_or_check(&mut client, &topic, &group_name)?;
    if push {
        let credit = credit.unwrap_or(CONSUME_CREDIT_DEFAULT);
        return consume_pushed(&mut client, (&topic, &group_name), count, credit, wait_ms);
    }
    let mut got = 0u64;
    loop {
        let left = count.map_or(256, |c| c.saturating_sub(got).min(256)) as u32;
        if left == 0 {
            return Ok(());
        }
        let f = Fetch { max_messages: left, wait_ms, ..Fetch::default() };
        let msgs = client.fetch_group(&topic, &group_name, f).map_err(|e| e.to_string())?;
        if msgs.is_empty() {
            return Ok(());
        }
        print_and_ack(&mut client, (&topic, &group_name), &msgs)?;
        got += msgs.len() as u64;
    }
}

/// Prints each message's payload on a line, then acknowledges them: a
/// consume cut short (its stdout closed) acknowledges nothing it did not
/// print.
fn print_and_ack(client: &mut Client, (topic, group): (&str, &str), msgs: &[Delivered]) -> Result<(), Exit> {
    let mut out = Vec::new();
    for m in msgs {
        out.extend_from_slice(&m.payload);
        out.push(b'\n');
    }
    emit(&out)?;
    let ids: Vec<u64> = msgs.iter().map(|m| m.id).collect();
    client.ack_group(topic, group, &ids).map_err(|e| e.to_string())?;
    Ok(())
}

/// `runnel consume --push`: subscribes with `credit` (at most `count`),
/// then prints what is pushed, acknowledging each batch once printed, until
/// `count` messages or a wait of `wait_ms` with none.
fn consume_pushed(
    client: &mut Client,
    (topic, group): (&str, &str),
    count: Option<u64>,
    credit: u32,
    wait_ms: u32,
) -> Result<(), Exit> {
    let credit = count.map_or(credit, |c| credit.min(u32::try_from(c).unwrap_or(u32::MAX)));
    client.subscribe(topic, group, credit, 0).map_err(|e| e.to_string())?;
    client.set_timeout(Some(Duration::from_millis(wait_ms.max(1).into()))).map_err(|e| e.to_string())?;
    let mut got = 0u64;
    while count.is_none_or(|c| got < c) {
        let first = match client.next_pushed() {
            Ok(p) => p,
            Err(runnel::client::Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(());
            }
            // A graceful stop closes a subscriber's connection between frames
            // (it has no request to answer, as a parked FETCH is): the end of
            // the messages, as a long poll answered with none is.
            Err(e) if e.is_closed_between_frames() => return Ok(()),
            Err(e) => return Err(e.to_string().into()),
        };
        let mut batch = vec![first.message];
        while count.is_none_or(|c| got + (batch.len() as u64) < c) && client.pushed_waiting() > 0 {
            batch.push(client.next_pushed().map_err(|e| e.to_string())?.message);
        }
        print_and_ack(client, (topic, group), &batch)?;
        got += batch.len() as u64;
    }
    Ok(())
}

/// The group settings a consume's flags ask for (`--from`, `--tags`,
/// `--broadcast`, `--ordered`), each None or false where not given. A
/// consume makes a group that does not exist with them, and refuses to
/// consume for one that exists with others: it never changes a group, whose
/// settings hold for all of its consumers (`runnel group create` changes
/// them). CREATE_GROUP on an existing group would set them all, the ones
/// not given back to defaults, so it is sent only for a group not listed.
struct Wanted {
    /// `--from`: where a group made now starts (not a setting: an existing
    /// group keeps its position).
    from: Option<Start>,
    /// `--tags`: the tag filter.
    tags: Option<String>,
    /// `--broadcast`: every consumer gets every message.
    broadcast: bool,
    /// `--ordered`: one message of a key at a time.
    ordered: bool,
}

impl Wanted {
    fn take(a: &mut Args) -> Result<Wanted, Exit> {
        let from = a.take("--from").map(|v| parse_start("--from", &v)).transpose()?;
        Ok(Wanted { from, tags: a.take("--tags"), broadcast: a.switch("--broadcast"), ordered: a.switch("--ordered") })
    }

    /// Makes `group` of `topic` with these settings if it does not exist;
    /// if it does, checks that it has them.
    fn make_or_check(&self, client: &mut Client, topic: &str, group: &str) -> Result<(), Exit> {
        if self.from.is_none() && self.tags.is_none() && !self.broadcast && !self.ordered {
            return Ok(());
        }
        let existing = match client.list_groups(topic) {
            Ok(list) => list.into_iter().find(|g| g.name == group),
            Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => None,
            Err(e) => return Err(e.to_string().into()),
        };
        if let Some(g) = existing {
            return self.check(&g, topic);
        }
        let settings = GroupSettings {
            broadcast: self.broadcast,
            filter: self.tags.as_deref().unwrap_or_default(),
            ordered: self.ordered,
            ..GroupSettings::default()
        };
        let start = self.from.unwrap_or(Start::Earliest);
        client.create_group(topic, group, settings, start).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Refuses, saying what differs and how to change it, unless existing
    /// group `g` has every setting given.
    fn check(&self, g: &GroupEntry, topic: &str) -> Result<(), Exit> {
        let every = |f: &str| if f.is_empty() { "*".to_string() } else { f.to_string() };
        let mut differs = Vec::new();
        if let Some(tags) = &self.tags
            && every(tags) != every(&g.filter)
        {
            differs.push(format!("its filter is {:?}, not {:?}", every(&g.filter), every(tags)));
        }
        if self.broadcast && !g.broadcast {
            differs.push("it is not a broadcast group".to_string());
        }
        if self.ordered && !g.ordered {
            differs.push("it is not ordered by key".to_string());
        }
        if differs.is_empty() {
            return Ok(());
        }
        let name = if g.name.is_empty() { "the default group".to_string() } else { format!("group {:?}", g.name) };
        Err(Exit::Failed(format!(
            "{name} of {topic} exists with other settings: {}. A consume never changes a group's settings, which \
             hold for all of its consumers: `runnel group create` changes them (see `runnel group --help`)",
            differs.join("; ")
        )))
    }
}
