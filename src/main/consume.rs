//! `runnel consume`: prints a topic's messages, one a line, and
//! acknowledges each once its reader has it.
//!
//! What a reader has depends on where stdout goes ([`Output`]):
//!
//! - **A terminal, a file or a device**: a write that returned is on the
//!   screen or in the file. The consume fetches a batch (up to 256, or what
//!   `--count` leaves; pushed, up to `--credit`), prints it with one write
//!   and acknowledges it.
//! - **A pipe or a socket**: a write that returned is only in a buffer,
//!   which a reader may never take from: `runnel consume t | head -1` ends
//!   its reader after one line, and what the pipe holds then is lost to it.
//!   Acknowledging a message once a later write succeeds does not help (a
//!   pipe takes many writes before its reader reads one), nor does
//!   acknowledging nothing (every message the consume held would come back
//!   with a delivery counted, and be dead-lettered on its last allowed
//!   one). So the consume takes one message at a time (a FETCH of one, or
//!   a credit of one), writes it, and acknowledges it once the reader has
//!   taken every byte of it (`sys::unread_bytes`); it takes the next only
//!   while the reader is still there. With one message in the pipe at a
//!   time, one read takes at most one message: `head -n N` takes N, and
//!   exactly those N are acknowledged.
//!
//! When the reader goes away, what the consume holds that the reader did
//! not take (at most one message, fetched or written as the reader left)
//! is not acknowledged: the consume exits (status 141), and the close of
//! its connection returns the message to ready at once, as for any
//! consumer that leaves (docs/protocol.md, "Closing"; a NACK would make it
//! wait in a group with a retry policy). That delivery counts, since the
//! protocol has no way to give one back uncounted: on its last allowed
//! delivery (`--max-deliveries 1`) the message is dead-lettered, reason
//! `consumer_lost`, and `runnel redrive` brings it back. The consume looks
//! for its reader before it takes each message, and is woken if the
//! reader goes while it waits for one (the wait then ends with the
//! connection, having taken nothing), so that this happens only to a
//! message taken in the moment its reader left.

use std::fs::File;
use std::io::{self, IsTerminal};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use runnel::client::{Client, Delivered, Fetch, GroupEntry, OwnedReply};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, ErrorCode, Ids, Request};
use runnel::config::Args;
use runnel::sys::{self, Reader, Stream, Woke};

use super::{Exit, Sub, addr, connect, emit, parse_start};

/// How long each FETCH of `runnel consume` waits for a message by default.
pub(crate) const CONSUME_WAIT_MS_DEFAULT: u32 = 1000;
/// The credit of `runnel consume --push` by default: the messages it holds
/// unacknowledged, as one FETCH of it takes at most.
pub(crate) const CONSUME_CREDIT_DEFAULT: u32 = 256;
/// Most messages one FETCH takes for a terminal or a file.
const BATCH_MAX: u32 = 256;
/// The first pause between two looks at whether the reader took a message:
/// short, since a reader blocked in `read` takes it at once. Each pause
/// doubles, up to `TAKE_PAUSE_MAX` for a slow reader (a pager).
const TAKE_PAUSE_MIN: Duration = Duration::from_micros(20);
/// The longest pause between two looks at whether the reader took a
/// message.
const TAKE_PAUSE_MAX: Duration = Duration::from_millis(10);
/// The ack timeout a consume assumes when it cannot learn its group's, to
/// TOUCH a message its reader is slow to take (a third of it).
const ACK_TIMEOUT_MS_GUESS: u32 = 3000;

pub(crate) fn consume(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let left: Option<u64> = a.num("--count")?;
    let wait_ms: u32 = a.num("--wait-ms")?.unwrap_or(CONSUME_WAIT_MS_DEFAULT);
    let group = a.take("--group").unwrap_or_default();
    let wanted = Wanted::take(&mut a)?;
    let credit: Option<u32> = a.num("--credit")?;
    let push = a.switch("--push") || credit.is_some();
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut client = connect(&addr)?;
    wanted.make_or_check(&mut client, &topic, &group)?;
    let mut c = Consumer { client, topic, group, left, wait_ms, touch_every: None };
    match (push, Output::of_stdout()) {
        (false, Output::Settled) => c.fetch_batches(),
        (false, Output::Stream(s)) => c.fetch_one_at_a_time(s),
        (true, Output::Settled) => c.pushed_batches(credit.unwrap_or(CONSUME_CREDIT_DEFAULT)),
        (true, Output::Stream(s)) => c.pushed_one_at_a_time(s),
    }
}

/// Where stdout goes, as far as what a write that returned tells.
#[derive(Clone, Copy, Debug)]
enum Output {
    /// A terminal, a file or a device: what is written is shown or stored.
    Settled,
    /// A pipe or a socket: what is written waits there for its reader.
    Stream(Stream),
}

impl Output {
    fn of_stdout() -> Output {
        let stdout = io::stdout();
        if stdout.is_terminal() {
            return Output::Settled;
        }
        let kind = stdout.as_fd().try_clone_to_owned().and_then(|fd| File::from(fd).metadata());
        match kind.map(|m| m.file_type()) {
            Ok(t) if t.is_fifo() => Output::Stream(Stream::Pipe),
            Ok(t) if t.is_socket() => Output::Stream(Stream::Socket),
            _ => Output::Settled,
        }
    }
}

/// One consume: its connection, what it reads, and how far it got.
struct Consumer {
    client: Client,
    topic: String,
    /// The consumer group ("" = the default group).
    group: String,
    /// Messages still to print (what `--count` leaves); None: no limit.
    left: Option<u64>,
    /// `--wait-ms`: a wait this long with no message ends the consume.
    wait_ms: u32,
    /// How often to TOUCH a message its reader is slow to take: a third of
    /// the group's ack timeout, learned with the first such message.
    touch_every: Option<Duration>,
}

impl Consumer {
    /// Terminal or file: FETCHes of a batch, each printed, then acknowledged.
    fn fetch_batches(&mut self) -> Result<(), Exit> {
        loop {
            let max_messages = self.room(BATCH_MAX);
            if max_messages == 0 {
                return Ok(());
            }
            let f = Fetch { max_messages, wait_ms: self.wait_ms, ..Fetch::default() };
            let msgs = self.client.fetch_group(&self.topic, &self.group, f).map_err(failed)?;
            if msgs.is_empty() {
                return Ok(());
            }
            emit(&lines(&msgs))?;
            self.took(msgs.len());
            self.ack(&msgs.iter().map(|m| m.id).collect::<Vec<_>>())?;
        }
    }

    /// Pipe or socket: one message at a time, each acknowledged once the
    /// reader took it (with the next FETCH, in the same round trip).
    fn fetch_one_at_a_time(&mut self, stream: Stream) -> Result<(), Exit> {
        let mut taken = None;
        loop {
            let done = self.left == Some(0);
            let gone = !done && reader_gone()?;
            if done || gone {
                if let Some(id) = taken {
                    self.ack(&[id])?;
                }
                return if gone { Err(Exit::StdoutClosed) } else { Ok(()) };
            }
            let Some(m) = self.fetch_one(taken.take())? else { return Ok(()) };
            self.hand_over(stream, &m)?;
            self.took(1);
            taken = Some(m.id);
        }
    }

    /// The next message, with `ack` (one the reader took) acknowledged in
    /// the same round trip; None once a wait of `wait_ms` passed with none.
    /// If the reader goes away while the FETCH waits at the broker, it ends
    /// at once (StdoutClosed): the FETCH goes with the connection, having
    /// delivered nothing.
    fn fetch_one(&mut self, ack: Option<u64>) -> Result<Option<Delivered>, Exit> {
        let mut ids = Vec::new();
        if let Some(id) = ack {
            codec::encode_ids(&mut ids, &[id]);
            let ack = Request::Ack { topic: &self.topic, group: &self.group, ids: Ids { bytes: &ids } };
            self.client.try_send(&ack).map_err(failed)?;
        }
        let (topic, group, wait_ms) = (self.topic.as_str(), self.group.as_str(), self.wait_ms);
        let f = Request::Fetch { topic, group, max_messages: 1, max_bytes: 0, wait_ms, ack_timeout_ms: 0 };
        self.client.try_send(&f).map_err(failed)?;
        self.client.flush().map_err(failed)?;
        if ack.is_some() {
            self.client.recv().map_err(failed)?;
        }
        self.await_broker(None, true)?;
        match self.client.recv().map_err(failed)? {
            OwnedReply::Messages { messages, .. } => Ok(messages.into_iter().next()),
            other => Err(Exit::Failed(format!("protocol: unexpected reply {other:?}"))),
        }
    }

    /// Terminal or file, `--push`: subscribes with `credit` (at most what
    /// `--count` leaves), prints what is pushed and acknowledges each batch
    /// once printed, lowering the credit first where `--count` leaves less,
    /// so that nothing is pushed that will not be printed.
    fn pushed_batches(&mut self, credit: u32) -> Result<(), Exit> {
        let mut credit = self.room(credit);
        if credit == 0 {
            return Ok(());
        }
        let sub = self.client.subscribe(&self.topic, &self.group, credit, 0).map_err(failed)?;
        loop {
            let Some(first) = self.next_pushed(false)? else { return Ok(()) };
            let mut batch = vec![first];
            while (batch.len() as u32) < self.room(u32::MAX) && self.client.pushed_waiting() > 0 {
                batch.push(self.client.next_pushed().map_err(failed)?.message);
            }
            emit(&lines(&batch))?;
            self.took(batch.len());
            if self.room(credit) < credit {
                credit = self.room(credit);
                self.client.credit(sub, credit).map_err(failed)?;
            }
            self.ack(&batch.iter().map(|m| m.id).collect::<Vec<_>>())?;
            if self.left == Some(0) {
                return Ok(());
            }
        }
    }

    /// Pipe or socket, `--push`: a credit of one, each message acknowledged
    /// once the reader took it; before the last acknowledgment (`--count`
    /// reached, or the reader gone) the credit goes to 0, so that nothing
    /// more is pushed.
    fn pushed_one_at_a_time(&mut self, stream: Stream) -> Result<(), Exit> {
        if self.left == Some(0) {
            return Ok(());
        }
        if reader_gone()? {
            return Err(Exit::StdoutClosed);
        }
        let sub = self.client.subscribe(&self.topic, &self.group, 1, 0).map_err(failed)?;
        loop {
            let Some(m) = self.next_pushed(true)? else { return Ok(()) };
            self.hand_over(stream, &m)?;
            self.took(1);
            let gone = reader_gone()?;
            if gone || self.left == Some(0) {
                self.client.credit(sub, 0).map_err(failed)?;
            }
            self.ack(&[m.id])?;
            if gone {
                return Err(Exit::StdoutClosed);
            }
            if self.left == Some(0) {
                return Ok(());
            }
        }
    }

    /// The next pushed message; None once a wait of `wait_ms` passed with
    /// none, or once the broker closed the connection between frames. With
    /// `watch` (stdout a pipe or socket), it ends at once (StdoutClosed) if
    /// the reader goes away while it waits.
    fn next_pushed(&mut self, watch: bool) -> Result<Option<Delivered>, Exit> {
        let wait = Duration::from_millis(self.wait_ms.max(1).into());
        if !self.await_broker(Some(wait), watch)? {
            return Ok(None);
        }
        match self.client.next_pushed() {
            Ok(p) => Ok(Some(p.message)),
            // A graceful stop closes a subscriber's connection between
            // frames (it has no request to answer, as a parked FETCH is):
            // the end of the messages, as a long poll answered with none is.
            Err(e) if e.is_closed_between_frames() => Ok(None),
            Err(e) => Err(failed(e)),
        }
    }

    /// Waits until the broker has sent something (a reply, a pushed frame,
    /// the end of the connection), for up to `timeout` (None: as long as it
    /// takes); false if the time passed first. With `watch`, ends at once
    /// (StdoutClosed) if stdout's reader goes away meanwhile. No read
    /// timeout is set on the connection, so a reply is waited for as long
    /// as the broker takes.
    fn await_broker(&mut self, timeout: Option<Duration>, watch: bool) -> Result<bool, Exit> {
        if self.client.buffered_bytes() > 0 || self.client.pushed_waiting() > 0 {
            return Ok(true);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let stdout = io::stdout();
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let written = watch.then(|| stdout.as_fd());
            let woke = sys::wait_for_either(self.client.stream().as_fd(), written, left);
            match woke.map_err(|e| Exit::Failed(format!("connection: {e}")))? {
                Woke::Readable => return Ok(true),
                Woke::ReaderGone => return Err(Exit::StdoutClosed),
                Woke::TimedOut => return Ok(false),
                Woke::Interrupted => {}
            }
        }
    }

    /// Writes `m` to stdout, a pipe or socket, and waits until its reader
    /// has taken every byte of it; StdoutClosed if the reader went away
    /// first. A reader slow to take it (a pager) does not let its ack
    /// deadline pass: the consume TOUCHes it meanwhile.
    fn hand_over(&mut self, stream: Stream, m: &Delivered) -> Result<(), Exit> {
        emit(&lines(std::slice::from_ref(m)))?;
        let stdout = io::stdout();
        let mut pause = TAKE_PAUSE_MIN;
        let mut touch_at = None;
        loop {
            let unread = sys::unread_bytes(stdout.as_fd(), stream).map_err(stdout_failed)?;
            let reader = sys::reader(stdout.as_fd()).map_err(stdout_failed)?;
            // A pipe keeps what its reader left in it, so an empty pipe was
            // emptied by the reader, gone since or not. A socket drops what
            // its peer left unread, and then says so by an error (which
            // stays), so an empty one without an error was read.
            if unread == 0 && (stream == Stream::Pipe || reader != Reader::Failed) {
                return Ok(());
            }
            if reader != Reader::There {
                return Err(Exit::StdoutClosed);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(TAKE_PAUSE_MAX);
            let every = self.touch_every()?;
            let now = Instant::now();
            match touch_at {
                Some(at) if now < at => {}
                Some(_) => {
                    self.client.touch_group(&self.topic, &self.group, &[m.id], 0).map_err(failed)?;
                    touch_at = Some(now + every);
                }
                None => touch_at = Some(now + every),
            }
        }
    }

    /// A third of the group's ack timeout, learned once (LIST_GROUPS, or
    /// LIST_TOPICS from a version-1 broker, which has the default group
    /// alone).
    fn touch_every(&mut self) -> Result<Duration, Exit> {
        if let Some(every) = self.touch_every {
            return Ok(every);
        }
        let ms = match self.client.list_groups(&self.topic) {
            Ok(groups) => groups.into_iter().find(|g| g.name == self.group).map(|g| g.ack_timeout_ms),
            Err(runnel::client::Error::Version { .. }) => {
                let topics = self.client.list_topics().map_err(failed)?;
                topics.into_iter().find(|t| t.0 == self.topic).map(|t| t.1.ack_timeout_ms)
            }
            Err(e) => return Err(failed(e)),
        };
        let every = Duration::from_millis((u64::from(ms.unwrap_or(ACK_TIMEOUT_MS_GUESS)) / 3).max(1));
        self.touch_every = Some(every);
        Ok(every)
    }

    fn ack(&mut self, ids: &[u64]) -> Result<(), Exit> {
        self.client.ack_group(&self.topic, &self.group, ids).map(|_| ()).map_err(failed)
    }

    /// How many of a batch of up to `max` to take: `max`, or less where
    /// `--count` leaves less.
    fn room(&self, max: u32) -> u32 {
        self.left.map_or(max, |left| u32::try_from(left).unwrap_or(u32::MAX).min(max))
    }

    /// `n` more messages printed.
    fn took(&mut self, n: usize) {
        if let Some(left) = &mut self.left {
            *left = left.saturating_sub(n as u64);
        }
    }
}

/// The messages' payloads, one a line.
fn lines(msgs: &[Delivered]) -> Vec<u8> {
    let mut out = Vec::with_capacity(msgs.iter().map(|m| m.payload.len() + 1).sum());
    for m in msgs {
        out.extend_from_slice(&m.payload);
        out.push(b'\n');
    }
    out
}

/// Whether stdout's reader is gone (stdout being a pipe or socket).
fn reader_gone() -> Result<bool, Exit> {
    sys::reader(io::stdout().as_fd()).map(|r| r != Reader::There).map_err(stdout_failed)
}

fn stdout_failed(e: io::Error) -> Exit {
    Exit::Failed(format!("stdout: {e}"))
}

fn failed(e: runnel::client::Error) -> Exit {
    Exit::Failed(e.to_string())
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
