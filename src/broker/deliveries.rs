//! Deliveries counted across crashes: each FETCH reply, answered parked
//! FETCH and pushed batch appends a Deliver record (`record_deliver.rs`)
//! naming the ids it delivered, so that recovery counts a delivery the
//! consumer may have seen though the message was never acked, NACKed or
//! timed out before the broker died.
//!
//! The crash window, exactly: a reply leaves only through the reactor's
//! flush, after the log's `write` of the turn (loop order, steps 5 to 8).
//! A FETCH answered in step 3, or one answered by a shutdown, has its
//! record in that write. Deliveries made at the publish (step 7: parked
//! FETCHes woken by the turn's messages, and pushes) come after the turn's
//! write, so the broker writes their records with a second `write` of its
//! own right after the publish (`write_published`), before the flush of
//! step 8. So once a consumer can have read a delivery, its record is in
//! the page cache: a crash of the process never loses it. A crash of the
//! machine loses it if no `fdatasync` has covered it yet (a turn of only
//! deliveries does not sync, as a turn of only acks does not): then the
//! delivery is uncounted, as an ack of that turn is undone.

use super::{Broker, TopicId};
use crate::codec::{DeadInfo, DeadReason};
use crate::queue::GroupId;
use crate::record::DeliverRecord;

impl Broker {
    /// Appends the Deliver record of the ids in `scratch.delivered`,
    /// delivered by group `group` of `tid` (none for a broadcast member,
    /// whose state is not logged), and empties the list.
    pub(super) fn log_delivered(&mut self, tid: TopicId, group: GroupId) {
        if self.scratch.delivered.is_empty() {
            return;
        }
        if !group.is_member() {
            let ids = &self.scratch.delivered;
            DeliverRecord { topic: tid, group, ids }.append(&mut self.log);
            self.compactor.note_delivered(tid, group, ids);
            self.turn.delivered_records += 1;
        }
        self.scratch.delivered.clear();
    }

    /// After the publish (loop step 7): writes the Deliver records the
    /// publish appended, with no sync, so that they are in the page cache
    /// before its deliveries reach a socket. If the write fails the records
    /// stay in the log's buffer for the next commit (which reports the
    /// failure), and the deliveries go out all the same, as acks do on a
    /// failing disk.
    pub(super) fn write_published(&mut self) {
        if std::mem::take(&mut self.turn.delivered_records) == 0 {
            return;
        }
        match self.log.commit(false) {
            Ok(_) if self.log.memory_only() => self.compactor.discarded(),
            Ok(_) => {
                let last = self.log.segments().last().map_or(0, |s| s.base);
                self.compactor.committed(last);
            }
            Err(e) => log::debug!("the publish's Deliver records wait for the next commit: {e}"),
        }
    }

    /// At start, after recovery: every message whose last allowed delivery
    /// was in flight when the broker died goes to its dead-letter topic,
    /// as if its consumer had been lost (the reason it carries). The
    /// first turn writes the records.
    pub(super) fn dead_letter_exhausted(&mut self) {
        let tids: Vec<TopicId> = self.topics.iter().map(|e| e.id).collect();
        for tid in tids {
            let mut i = 0;
            while let Some(g) = self.topics.get(tid).and_then(|e| e.topic.group_id_at(i)) {
                i += 1;
                let exhausted = self.topics.get_mut(tid).map(|e| e.topic.take_exhausted(g)).unwrap_or_default();
                for (id, d) in exhausted {
                    let info = DeadInfo { origin_id: id, origin_deliveries: d, reason: DeadReason::ConsumerLost };
                    self.dead_letter(tid, g, id, info);
                }
            }
        }
    }
}
