//! `runnel consume`: prints a topic's messages, one a line, and
//! acknowledges each once it is printed.

use std::io::ErrorKind;
use std::time::Duration;

use runnel::client::{Client, Delivered, Fetch};

use super::{Exit, Sub, addr, connect, emit, group_flags};
use runnel::config::Args;

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
    let mut filter = String::new();
    let group = group_flags(&mut a, "--from", &mut filter)?;
    let credit: Option<u32> = a.num("--credit")?;
    let push = a.switch("--push") || credit.is_some();
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut client = connect(&addr)?;
    if let Some((settings, start)) = group {
        client.create_group(&topic, &group_name, settings, start).map_err(|e| e.to_string())?;
    }
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
