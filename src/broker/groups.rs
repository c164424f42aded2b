//! The consumer-group admin ops of protocol version 2: CREATE_GROUP,
//! DELETE_GROUP, LIST_GROUPS and RESET_GROUP, each logged before its reply
//! (they wait for the sync, as the topic admin ops do), and the numbers a
//! group shows (LIST_GROUPS, STATS, metrics).

use super::requests::Refusal;
use super::topics::{unknown, unknown_group};
use super::{Broker, GroupTimers, Now, TopicId};
use crate::codec::group::{GroupInfo, GroupSettings, GroupStats, Start};
use crate::codec::{self, ErrorCode, op};
use crate::filter_table::FilterLimits;
use crate::queue::{Counters, Group, GroupConfig, GroupId, Topic};
use crate::record::{GroupDeleteRecord, GroupStateRecord};

/// A group's numbers, as LIST_GROUPS, STATS and the metrics show them. A
/// broadcast group's are its members': in flight, retry and delayed
/// summed, lag and age the largest, cursor the lowest, one consumer each.
pub(crate) fn group_stats(t: &Topic, g: &Group, now: Now) -> GroupStats {
    if g.config.broadcast {
        let mut s = GroupStats { cursor: t.seq.next_id(), ..GroupStats::default() };
        for m in g.members().filter_map(|m| t.group(m)) {
            let ms = unit_stats(t, m, now);
            s.cursor = s.cursor.min(ms.cursor);
            s.lag = s.lag.max(ms.lag);
            s.oldest_unacked_age_ms = s.oldest_unacked_age_ms.max(ms.oldest_unacked_age_ms);
            (s.inflight, s.retry, s.delayed) = (s.inflight + ms.inflight, s.retry + ms.retry, s.delayed + ms.delayed);
            s.consumers += 1;
            s.dead_lettered += m.counters.dead_lettered;
        }
        return s;
    }
    unit_stats(t, g, now)
}

/// A group's counters; a broadcast group's are its members' (those
/// connected now) summed.
pub(crate) fn group_counters(t: &Topic, g: &Group) -> Counters {
    if !g.config.broadcast {
        return g.counters;
    }
    let mut c = g.counters;
    for m in g.members().filter_map(|m| t.group(m)) {
        let mc = &m.counters;
        c.delivered += mc.delivered;
        c.redelivered += mc.redelivered;
        c.acked += mc.acked;
        c.nacked += mc.nacked;
        c.dead_lettered += mc.dead_lettered;
        c.expired += mc.expired;
        c.filtered += mc.filtered;
    }
    c
}

/// The numbers of a group that keeps one position (not broadcast).
fn unit_stats(t: &Topic, g: &Group, now: Now) -> GroupStats {
    GroupStats {
        cursor: g.cursor(),
        lag: g.lag(&t.seq),
        inflight: g.inflight(),
        retry: g.retry_len(),
        delayed: g.delayed(),
        dead_lettered: g.counters.dead_lettered,
        oldest_unacked_age_ms: g.oldest_unacked_born_ms(&t.seq).map_or(0, |b| now.wall_ms.saturating_sub(b)),
        consumers: g.consumers,
    }
}

impl Broker {
    /// A group's settings from CREATE_GROUP's fields: BAD_FILTER for a
    /// filter that does not parse, BAD_ARGUMENT for a retry policy the
    /// broker does not take (`RetryPolicy::check`).
    fn group_config(&mut self, s: &GroupSettings<'_>) -> Result<GroupConfig, Refusal> {
        let l = &self.config.limits;
        if let Some(p) = &s.retry {
            p.check(l.retry_delay_ms_max).map_err(|e| (ErrorCode::BadArgument, e))?;
        }
        let limits = FilterLimits {
            text_bytes_max: l.filter_bytes_max,
            compiled_bytes_max: l.filter_compiled_bytes_max,
            all_bytes_max: Some(l.compiled_filters_bytes_max),
        };
        let filter = self.filters.get(s.filter, limits).map_err(|e| (ErrorCode::BadFilter, e))?;
        Ok(GroupConfig {
            broadcast: s.broadcast,
            ack_timeout_ms: s.ack_timeout_ms,
            max_deliveries: s.max_deliveries,
            filter_text: s.filter.into(),
            filter,
            ordered: s.ordered,
            retry: s.retry,
        })
    }

    /// The group named `name` of topic `tid`: UNKNOWN_GROUP if missing.
    fn named_group(&self, tid: TopicId, topic: &str, name: &str) -> Result<GroupId, Refusal> {
        let group = self.topics.get(tid).and_then(|e| e.topic.group_named(name));
        group.map(Group::id).ok_or_else(|| unknown_group(topic, name))
    }

    /// CREATE_GROUP: creates the group at `start`, or changes an existing
    /// one's settings (not its position).
    pub(super) fn create_group_op(
        &mut self,
        (topic, name): (&str, &str),
        settings: &GroupSettings<'_>,
        start: Start,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let config = self.group_config(settings)?;
        let tid = self.topic_for(topic, self.config.auto_create)?;
        let existing = self.topics.get(tid).and_then(|e| e.topic.group_named(name));
        if existing.is_some_and(|g| g.config.broadcast != config.broadcast) {
            let msg =
                format!("group {name} keeps its mode (broadcast or not): delete it and create it anew to change it");
            return Err((ErrorCode::BadArgument, msg));
        }
        let existing = existing.map(Group::id);
        let g = match existing {
            Some(g) => {
                if let Some(e) = self.topics.get_mut(tid) {
                    e.topic.configure_group(g, config);
                }
                self.log_group(tid, g);
                g
            }
            None => self.create_group(tid, name, config, start)?,
        };
        let cursor = self.topics.get(tid).and_then(|e| e.topic.group(g)).map_or(0, Group::cursor);
        codec::group::encode_group_created_reply(out, rid, existing.is_none(), cursor);
        Ok(())
    }

    /// DELETE_GROUP: the group goes, and the messages only it needed with
    /// it (by the sweep); its parked FETCHes get UNKNOWN_GROUP at the
    /// commit. Replies with how many messages it held.
    pub(super) fn delete_group_op(
        &mut self,
        topic: &str,
        name: &str,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let g = self.named_group(tid, topic, name)?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let held = e.topic.group(g).map_or(0, |x| {
            let s = group_stats(&e.topic, x, Now::default());
            s.lag + s.inflight + s.retry + s.delayed
        });
        // The group and, if broadcast, its members: each has its waiters.
        let mut units: Vec<GroupId> = e.topic.group(g).map(|x| x.members().collect()).unwrap_or_default();
        units.push(g);
        e.topic.delete_group(g, &mut GroupTimers { wheel: &mut self.wheel, topic: tid, group: g });
        GroupDeleteRecord { topic: tid, group: g }.append(&mut self.log);
        self.compactor.forget_group(tid, g);
        self.sweeps.note(tid);
        for w in units.into_iter().flat_map(|u| self.waiters.drain_group(tid, u)) {
            self.wheel.cancel(w.timer);
            let message = format!("group {name} of topic {topic} was deleted");
            self.turn.answer_later(w.conn, w.request_id, ErrorCode::UnknownGroup, message);
        }
        codec::encode_u64_reply(out, op::DELETE_GROUP, rid, held);
        Ok(())
    }

    /// RESET_GROUP: moves the group's cursor to `start`, dropping what it
    /// had in flight, back for retry or delayed; logged as a GroupState.
    pub(super) fn reset_group_op(
        &mut self,
        (topic, name): (&str, &str),
        start: Start,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let g = self.named_group(tid, topic, name)?;
        let (cursor, replay) = self.start_cursor(tid, start);
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        e.topic.reset_group(g, cursor, &mut GroupTimers { wheel: &mut self.wheel, topic: tid, group: g });
        let broadcast = e.topic.group(g).is_some_and(|x| x.config.broadcast);
        self.replays.stop(tid, g);
        if replay && !broadcast {
            self.begin_replay(tid, g, cursor, start);
        }
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        // Parked consumers of the group may find messages again.
        self.turn.mark_for_publish(e);
        let Some(e) = self.topics.get(tid) else { return Err(unknown(topic)) };
        // A broadcast group's positions are its members', which are not
        // logged.
        if !e.topic.group(g).is_some_and(|x| x.config.broadcast) {
            GroupStateRecord { topic: tid, group: g, cursor, entries: &[] }.append(&mut self.log);
            self.compactor.note_group(tid, g);
        }
        self.sweeps.note(tid);
        codec::encode_u64_reply(out, op::RESET_GROUP, rid, cursor);
        Ok(())
    }

    /// LIST_GROUPS: every group of the topic, by name, with its settings
    /// in effect and its numbers, as a session of `version` knows them.
    pub(super) fn list_groups_op(
        &mut self,
        topic: &str,
        version: u16,
        rid: u32,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let Some(e) = self.topics.get(tid) else { return Err(unknown(topic)) };
        let t = &e.topic;
        let mut groups: Vec<&Group> = t.groups().collect();
        groups.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        let infos: Vec<GroupInfo<'_>> = groups.iter().map(|g| group_info(t, g, now, version)).collect();
        codec::group::encode_groups_reply(out, rid, &infos);
        Ok(())
    }
}

/// A group as LIST_GROUPS shows it: its settings in effect (the topic's
/// where it has none of its own) and its numbers. A flag `version` does not
/// know is left out (the group is as a session of that version sees it).
fn group_info<'a>(t: &'a Topic, g: &'a Group, now: Now, version: u16) -> GroupInfo<'a> {
    let c = &g.config;
    let max_deliveries = if c.max_deliveries == 0 { t.settings.max_deliveries } else { c.max_deliveries };
    let settings = GroupSettings {
        broadcast: c.broadcast,
        ack_timeout_ms: t.ack_timeout_ms(g.id(), 0),
        max_deliveries,
        filter: &c.filter_text,
        ordered: c.ordered && version >= codec::group::SINCE_ORDERED,
        retry: c.retry.filter(|_| version >= codec::group::SINCE_RETRY),
    };
    GroupInfo { name: g.name(), settings, stats: group_stats(t, g, now) }
}
