//! Idempotent produce (protocol version 4): every topic's dedup window,
//! the count that `dedup_entries_max` bounds over all of them, and what a
//! PRODUCE's dedup ids decide (`Plan`). docs/protocol.md ("Idempotent
//! produce (version 4)") is the contract.
//!
//! An entry is made when its message is stored, before the turn's commit,
//! so that a retry pipelined in the same turn is a duplicate too; a commit
//! that fails withdraws the turn's produces and their entries with them
//! (`withdraw`), and the replies naming them become STORAGE, as every
//! produce reply of that turn does. Expiry is by wall clock, from the front
//! of each window (`DedupWindow::expire`): a turn looks at one entry per
//! topic that has any, plus the entries that expire.

use std::collections::HashMap;

use super::requests::Refusal;
use super::{Broker, Now, TopicId};
use crate::codec::{Batch, ErrorCode};
use crate::limits::Limits;
use crate::queue::{DedupWindow, FastMap, MsgId, Settings};

/// Every topic's dedup window.
#[derive(Default)]
pub(crate) struct Dedup {
    /// The windows of the topics that have entries. Keyed by the broker's
    /// own ids, so the fast hasher is safe.
    windows: FastMap<TopicId, DedupWindow>,
    /// Entries over all windows: what `dedup_entries_max` bounds.
    entries: u64,
}

/// What the dedup ids of a PRODUCE's batch decide: which messages are
/// stored and which are duplicates.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// (index in the batch, original id) of each duplicate, in batch order
    /// (empty, and no allocation, when the batch has none).
    pub duplicates: Vec<(u32, MsgId)>,
    /// Messages stored.
    pub count: u32,
    /// Their properties and payloads, bytes.
    pub bytes: u64,
    /// Entries the stored messages add.
    pub entries: u64,
}

impl Plan {
    /// Whether message `i` of the batch is a duplicate (not stored).
    pub fn duplicate(&self, i: usize) -> bool {
        self.duplicates.binary_search_by_key(&(i as u32), |d| d.0).is_ok()
    }
}

/// The dedup window of a topic with `settings`, ms: its own, or the
/// broker's default, at most `dedup_window_ms_max`.
pub(super) fn window_ms(settings: &Settings, defaults: &Settings, limits: &Limits) -> u64 {
    let ms = settings.dedup_window_ms.or(defaults.dedup_window_ms).unwrap_or(0);
    u64::from(ms.min(limits.dedup_window_ms_max))
}

/// BAD_ARGUMENT if a dedup id of `batch` is longer than
/// `dedup_id_bytes_max`.
pub(super) fn check_ids(batch: &Batch<'_>, limits: &Limits) -> Result<(), Refusal> {
    if !batch.with_props {
        return Ok(());
    }
    let max = limits.dedup_id_bytes_max as usize;
    match batch.messages().filter_map(|(p, _)| p.dedup_id()).find(|id| id.len() > max) {
        Some(id) => Err((
            ErrorCode::BadArgument,
            format!("a dedup id is {} bytes, more than dedup_id_bytes_max ({max})", id.len()),
        )),
        None => Ok(()),
    }
}

/// BAD_ARGUMENT if a message of `batch` has a dedup id: ACK_PRODUCE's
/// outputs are produced once, with the ack, and are not deduplicated.
pub(super) fn refuse_ids(batch: &Batch<'_>) -> Result<(), Refusal> {
    if batch.with_props && batch.messages().any(|(p, _)| p.dedup_id().is_some()) {
        let msg = "ACK_PRODUCE's outputs take no dedup id: they are stored with the ack, once";
        return Err((ErrorCode::BadArgument, msg.into()));
    }
    Ok(())
}

impl Dedup {
    /// Entries over all topics.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Entries of topic `tid`.
    pub fn entries_of(&self, tid: TopicId) -> u64 {
        self.windows.get(&tid).map_or(0, |w| w.len() as u64)
    }

    /// Decides `batch` for topic `tid`, whose next id is `first` and whose
    /// window is `window_ms`: a message whose dedup id is in the window, or
    /// on an earlier message of the batch, is a duplicate. DEDUP_FULL if
    /// the stored messages would take the broker past `dedup_entries_max`.
    pub fn plan(
        &self,
        tid: TopicId,
        batch: &Batch<'_>,
        (first, now_ms, window_ms): (MsgId, u64, u64),
        limits: &Limits,
    ) -> Result<Plan, Refusal> {
        let mut plan = Plan { count: batch.count, bytes: batch.payload_bytes(), ..Plan::default() };
        if window_ms == 0 || !batch.with_props || !batch.messages().any(|(p, _)| p.dedup_id().is_some()) {
            return Ok(plan);
        }
        let window = self.windows.get(&tid);
        // Ids repeated within the batch; a batch of one message (a
        // pipelining producer's usual request) needs no such map.
        let mut this_batch: Option<HashMap<&[u8], MsgId>> = (batch.count > 1).then(HashMap::new);
        let (mut next, mut bytes) = (first, 0);
        for (i, (props, payload)) in batch.messages().enumerate() {
            let id = props.dedup_id();
            let earlier = |d: &[u8]| this_batch.as_ref().and_then(|m| m.get(d).copied());
            let original = id.and_then(|d| earlier(d).or_else(|| window.and_then(|w| w.get(d, now_ms, window_ms))));
            if let Some(original) = original {
                plan.duplicates.push((i as u32, original));
            } else {
                if let Some(d) = id {
                    if let Some(m) = this_batch.as_mut() {
                        m.insert(d, next);
                    }
                    plan.entries += 1;
                }
                next += 1;
                bytes += (props.bytes().len() + payload.len()) as u64;
            }
        }
        plan.count = (next - first) as u32;
        plan.bytes = bytes;
        self.check_room(plan.entries, limits)?;
        Ok(plan)
    }

    /// DEDUP_FULL unless `more` entries fit under `dedup_entries_max`.
    fn check_room(&self, more: u64, limits: &Limits) -> Result<(), Refusal> {
        let max = u64::from(limits.dedup_entries_max);
        if self.entries + more <= max {
            return Ok(());
        }
        Err((
            ErrorCode::DedupFull,
            format!(
                "the broker remembers {} dedup ids and the batch brings {more}, more than dedup_entries_max ({max}); retry once older ones expire",
                self.entries
            ),
        ))
    }

    /// Message `id` of topic `tid` was stored with `dedup_id` at
    /// `produced_ms`.
    pub fn insert(&mut self, tid: TopicId, dedup_id: &[u8], id: MsgId, produced_ms: u64) {
        self.windows.entry(tid).or_default().insert(dedup_id, id, produced_ms);
        self.entries += 1;
    }

    /// The produce of topic `tid` from message `first` on was withdrawn (a
    /// failed commit): its entries go.
    pub fn withdraw(&mut self, tid: TopicId, first: MsgId) {
        if let Some(w) = self.windows.get_mut(&tid) {
            self.entries -= w.withdraw(first) as u64;
        }
    }

    /// Topic `tid` is deleted: its ids are forgotten.
    pub fn forget_topic(&mut self, tid: TopicId) {
        if let Some(w) = self.windows.remove(&tid) {
            self.entries -= w.len() as u64;
        }
    }

    /// Drops the entries whose window ended by `now_ms`; `window_ms` gives
    /// each topic's window.
    pub fn expire(&mut self, now_ms: u64, window_ms: impl Fn(TopicId) -> u64) {
        let mut gone = 0;
        self.windows.retain(|&tid, w| {
            gone += w.expire(now_ms, window_ms(tid));
            !w.is_empty()
        });
        self.entries -= gone as u64;
    }

    /// Recovery met message `id` of topic `tid`, produced at `produced_ms`
    /// with `dedup_id` (`DedupWindow::restore`).
    pub fn restore(&mut self, tid: TopicId, dedup_id: &[u8], id: MsgId, produced_ms: u64) {
        self.windows.entry(tid).or_default().restore(dedup_id, id, produced_ms);
    }

    /// Ends recovery: only the topics in `live` keep their windows, each in
    /// produce order and without what expired by `now_ms`.
    pub fn restored(&mut self, now_ms: u64, live: impl Fn(TopicId) -> Option<u64>) {
        self.windows.retain(|&tid, _| live(tid).is_some());
        self.windows.values_mut().for_each(DedupWindow::sort);
        self.entries = self.windows.values().map(|w| w.len() as u64).sum();
        self.expire(now_ms, |tid| live(tid).unwrap_or(0));
    }

    /// Log bytes of restating every window (Dedup records), at most: what
    /// compaction's headroom must hold besides its other restatements.
    pub fn restate_bytes(&self) -> u64 {
        self.windows.values().map(|w| crate::record::DedupRecord::bytes(w.len(), w.id_bytes())).sum()
    }

    /// The live entries of topic `tid`, (dedup id, message id, produced
    /// ms), oldest first: what compaction restates.
    pub fn entries_in(&self, tid: TopicId) -> impl Iterator<Item = (&[u8], MsgId, u64)> + '_ {
        self.windows.get(&tid).into_iter().flat_map(DedupWindow::entries)
    }
}

impl Broker {
    /// Takes the windows recovery rebuilt: those of topics that exist, in
    /// produce order, without what expired while the broker was down.
    pub(super) fn restore_dedup(&mut self, mut dedup: Dedup, now: Now) {
        let (topics, defaults, limits) = (&self.topics, &self.config.defaults, &self.config.limits);
        dedup.restored(now.wall_ms, |tid| topics.get(tid).map(|e| window_ms(&e.topic.settings, defaults, limits)));
        self.dedup = dedup;
    }

    /// Drops the dedup ids whose window ended (the turn's timers step).
    pub(super) fn expire_dedup(&mut self, now: Now) {
        let (topics, defaults, limits) = (&self.topics, &self.config.defaults, &self.config.limits);
        let window = |tid| topics.get(tid).map_or(0, |e| window_ms(&e.topic.settings, defaults, limits));
        self.dedup.expire(now.wall_ms, window);
    }
}
