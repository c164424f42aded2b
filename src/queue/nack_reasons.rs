//! The reasons NACKs give (protocol version 4): each message a group still
//! needs keeps the last reason a NACK gave for it, in a side map that
//! holds entries only for messages that have one, and loses the entry when
//! the group is done with the message (so it is bounded by the group's
//! outstanding messages). A dead letter takes the reason along: the broker
//! puts it in the dead-letter copy (property `last_nack_reason`) and the
//! topic's dead notes keep it for inspection.

use super::group::Group;
use super::topic::Topic;
use super::{GroupId, MsgId};

impl Group {
    /// Keeps `reason` as message `id`'s last NACK reason in this group
    /// (an empty one keeps the earlier reason).
    pub fn note_nack_reason(&mut self, id: MsgId, reason: &str) {
        if !reason.is_empty() && self.needs(id) {
            self.nack_reasons.insert(id, reason.into());
        }
    }

    /// Message `id`'s last NACK reason in this group, if it has one.
    pub fn nack_reason(&self, id: MsgId) -> Option<&str> {
        self.nack_reasons.get(&id).map(|r| &**r)
    }

    /// Every kept reason, in id order: what compaction restates beside
    /// the group.
    pub fn nack_reasons(&self) -> Vec<(MsgId, &str)> {
        let mut v: Vec<(MsgId, &str)> = self.nack_reasons.iter().map(|(id, r)| (*id, &**r)).collect();
        v.sort_unstable();
        v
    }

    /// Entries and bytes of the kept reasons (the log's headroom for
    /// restating them).
    pub fn nack_reasons_size(&self) -> (usize, usize) {
        (self.nack_reasons.len(), self.nack_reasons.values().map(|r| r.len()).sum())
    }

    /// Recovery: the reasons of messages the group still needs.
    pub fn restore_nack_reasons(&mut self, reasons: impl Iterator<Item = (MsgId, Box<str>)>) {
        for (id, r) in reasons {
            if self.needs(id) {
                self.nack_reasons.insert(id, r);
            }
        }
    }

    /// The group is done with message `id`: its reason goes.
    pub(super) fn forget_nack_reason(&mut self, id: MsgId) {
        if !self.nack_reasons.is_empty() {
            self.nack_reasons.remove(&id);
        }
    }
}

impl Topic {
    /// Keeps `reason` as message `id`'s last NACK reason in group `g`.
    pub fn note_nack_reason(&mut self, g: GroupId, id: MsgId, reason: &str) {
        if let Some(group) = self.group_mut(g) {
            group.note_nack_reason(id, reason);
        }
    }

    /// Message `id`'s last NACK reason in group `g`, if it has one.
    pub fn nack_reason(&self, g: GroupId, id: MsgId) -> Option<&str> {
        self.group(g)?.nack_reason(id)
    }
}
