//! Counters, the STATS reply, and the metrics' view of the topics.
//!
//! Two owners: the broker counts what it does (`BrokerStats`), the loop
//! counts what it does with sockets and buffers (`LoopStats`, owned by the
//! reactor, or the simulation, and lent to each call that reports it).

use super::groups::{group_counters, group_stats};
use super::topics::dead_letter_name;
use super::{Broker, Now, TopicId};
use crate::codec;
use crate::log::FsyncMode;
use crate::queue::{Counters, Group, GroupId, Topic};

/// The message of a BUSY reply.
pub(super) const BUSY_MESSAGE: &str =
    "the broker's connection buffers are full (buffered_bytes_max); nothing was done: back off and retry";

/// What the broker counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct BrokerStats {
    /// How long recovery took at start, ms.
    pub recovery_ms: u64,
    /// When the broker started, monotonic ms.
    pub started_mono_ms: u64,
    /// Produce batches answered after a commit.
    pub produces_committed: u64,
    /// Requests answered BUSY because the buffers were full, or a FETCH
    /// because the broker held `timers_max` timers (counter).
    pub busy_replies: u64,
}

/// What the loop counts: its turns, its connections, the bytes through
/// their sockets and what their buffers take. The reactor (or the
/// simulation) owns and writes them; the broker reads them, for STATS and
/// for the buffers' limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopStats {
    /// Client connections open.
    pub connections: u64,
    /// Turns of the loop.
    pub turns: u64,
    /// Bytes read from client connections.
    pub bytes_in: u64,
    /// Bytes written to client connections.
    pub bytes_out: u64,
    /// Bytes the client connections' input and output buffers take (their
    /// capacity), kept up to date by each connection as its buffers change
    /// (`ConnState::account`). What `buffered_bytes_max` bounds.
    pub buffered_bytes: u64,
}

/// One topic's numbers, for metrics.
#[derive(Clone, Debug)]
pub struct TopicMetrics {
    pub name: String,
    pub ready: u64,
    pub inflight: u64,
    pub delayed: u64,
    /// Live messages in `<name>.dlq`.
    pub dead_letter: u64,
    pub bytes: u64,
    pub counters: Counters,
    /// Age of the oldest unacknowledged message, ms; 0 when none.
    pub oldest_age_ms: u64,
    /// Distinct tag sets its messages hold (`tag_sets_per_topic_max`
    /// bounds them).
    pub tag_sets: u64,
}

/// One consumer group's numbers, for metrics.
#[derive(Clone, Debug)]
pub struct GroupMetrics {
    pub topic: String,
    /// Empty for the default group.
    pub group: String,
    pub stats: crate::codec::group::GroupStats,
    pub counters: Counters,
}

impl Broker {
    /// Every topic, in the order they were created (their ids): what a
    /// scrape of the metrics walks, a slice at a time (a topic deleted
    /// meanwhile is passed over). Sorting ids costs a scrape little;
    /// sorting 10,000 names, a few ms, which a hundred scrapes arriving
    /// at once would spend in one turn.
    pub fn topics_by_id(&self) -> Vec<TopicId> {
        let mut ids: Vec<TopicId> = self.topics.iter().map(|e| e.id).collect();
        ids.sort_unstable_by_key(|t| t.0);
        ids
    }

    /// The numbers of each consumer group of topic `tid`, for metrics, by
    /// group name (none if the topic is gone).
    pub fn group_metrics_of(&self, tid: TopicId, now: Now) -> Vec<GroupMetrics> {
        let Some(e) = self.topics.get(tid) else { return Vec::new() };
        let t = &e.topic;
        let mut groups: Vec<&Group> = t.groups().collect();
        groups.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        groups
            .into_iter()
            .map(|g| GroupMetrics {
                topic: t.name.to_string(),
                group: g.name().to_string(),
                stats: group_stats(t, g, now),
                counters: group_counters(t, g),
            })
            .collect()
    }

    /// Topic `tid`'s numbers, for metrics (None if it is gone).
    pub fn topic_metrics_of(&self, tid: TopicId, now: Now) -> Option<TopicMetrics> {
        let g = GroupId::DEFAULT;
        let t = &self.topics.get(tid)?.topic;
        let dlq = self.topics.id(&dead_letter_name(&t.name)).and_then(|d| self.topics.get(d));
        Some(TopicMetrics {
            name: t.name.to_string(),
            ready: t.ready(g),
            inflight: t.inflight(g),
            delayed: t.delayed(g),
            dead_letter: dlq.map_or(0, |d| d.topic.seq.live()),
            bytes: t.seq.live_bytes(),
            counters: t.counters(g),
            oldest_age_ms: t.seq.oldest_born_ms().map_or(0, |b| now.wall_ms.saturating_sub(b)),
            tag_sets: u64::from(t.seq.tags().held()),
        })
    }

    /// The STATS reply: the broker's section, then one per topic (only
    /// `only`'s, if named), each followed in a version-2 session by one per
    /// group of it, `<topic>/<group>`.
    pub(super) fn write_stats(
        &self,
        only: &str,
        version: u16,
        rid: u32,
        now: Now,
        loops: &LoopStats,
        out: &mut Vec<u8>,
    ) {
        let mut w = codec::StatsWriter::begin(out, rid);
        w.section(out, "");
        for (k, v) in self.broker_section(now, loops) {
            w.kv(out, k, v);
        }
        // Version 2's (tag filters), for the sessions that speak it.
        if version >= 2 {
            w.kv(out, "compiled_filters", self.filters.len() as u64);
            w.kv(out, "compiled_filters_bytes", self.filters.bytes());
        }
        // Version 4's keys, for the sessions that speak it.
        if version >= crate::codec::V4 {
            w.kv(out, "dedup_entries", self.dedup.entries());
            w.kv(out, "dedup_entries_max", self.config.limits.dedup_entries_max.into());
            w.kv(out, "replays", self.replays_under_way());
            w.kv(out, "replay_read_bytes", self.replays.read_bytes);
            w.kv(out, "replay_turn_bytes_max", self.replays.turn_bytes_max);
        }
        let g = GroupId::DEFAULT;
        for e in self.topics.sorted(only) {
            let t = &e.topic;
            let c = t.counters(g);
            w.section(out, &t.name);
            for (k, v) in [
                ("ready", t.ready(g)),
                ("inflight", t.inflight(g)),
                ("delayed", t.delayed(g)),
                ("produced", c.produced),
                ("delivered", c.delivered),
                ("redelivered", c.redelivered),
                ("acked", c.acked),
                ("nacked", c.nacked),
                ("dead_lettered", c.dead_lettered),
                ("expired", c.expired),
                ("bytes", t.seq.live_bytes()),
                ("next_id", t.seq.next_id()),
                ("waiters", self.waiters.waiting(e.id, g) as u64),
                ("id", u64::from(e.id.0)),
                ("tag_sets", u64::from(t.seq.tags().held())),
                ("scheduled", t.seq.schedule().len()),
            ] {
                w.kv(out, k, v);
            }
            if version >= crate::codec::V4 {
                let window_ms = super::dedup::window_ms(&t.settings, &self.config.defaults, &self.config.limits);
                w.kv(out, "dedup_window_ms", window_ms);
                w.kv(out, "dedup_entries", self.dedup.entries_of(e.id));
                for (k, v) in self.retention_stats(e.id, t.settings.retention) {
                    w.kv(out, k, v);
                }
            }
            if version >= 2 {
                self.write_group_sections(e.id, t, now, &mut w, out);
            }
        }
        w.finish(out);
    }

    /// The STATS sections of each group of topic `t`, by name.
    fn write_group_sections(&self, tid: TopicId, t: &Topic, now: Now, w: &mut codec::StatsWriter, out: &mut Vec<u8>) {
        let mut groups: Vec<&Group> = t.groups().collect();
        groups.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        for g in groups {
            let s = group_stats(t, g, now);
            let c = &group_counters(t, g);
            w.section(out, &format!("{}/{}", t.name, g.name()));
            for (k, v) in [
                ("lag", s.lag),
                ("inflight", s.inflight),
                ("retry", s.retry),
                ("delayed", s.delayed),
                ("dead_lettered", s.dead_lettered),
                ("oldest_unacked_age_ms", s.oldest_unacked_age_ms),
                ("consumers", u64::from(s.consumers)),
                ("delivered", c.delivered),
                ("redelivered", c.redelivered),
                ("acked", c.acked),
                ("filtered", c.filtered),
                ("cursor", s.cursor),
                ("waiters", self.waiters.waiting(tid, g.id()) as u64),
            ] {
                w.kv(out, k, v);
            }
            if g.config.ordered {
                let (waiting, keys) = g.key_lines();
                w.kv(out, "key_waiting", waiting);
                w.kv(out, "keys_outstanding", keys);
            }
            if let Some(p) = &g.config.retry {
                w.kv(out, "retry_initial_ms", p.initial_ms.into());
                w.kv(out, "retry_cap_ms", p.cap_ms.into());
                w.kv(out, "retry_multiplier_pct", p.multiplier_pct.into());
                w.kv(out, "retry_jitter_pct", p.jitter_pct.into());
                w.kv(out, "retry_waiting", g.retry_waiting());
            }
        }
    }

    /// The broker's own section of STATS, in its order.
    fn broker_section(&self, now: Now, loops: &LoopStats) -> [(&'static str, u64); 25] {
        let (s, ls, l) = (&self.stats, &self.log.stats, &self.config.limits);
        [
            ("uptime_ms", now.mono_ms.saturating_sub(s.started_mono_ms)),
            ("connections", loops.connections),
            ("turns", loops.turns),
            ("topics", self.topics.len() as u64),
            ("bytes_in", loops.bytes_in),
            ("bytes_out", loops.bytes_out),
            ("log_bytes", self.log.bytes()),
            ("log_segments", self.log.segments().len() as u64),
            ("fsyncs", ls.fsyncs),
            ("log_commits", ls.commits),
            ("log_records", ls.records),
            ("storage_failures", ls.failures),
            ("produces_committed", s.produces_committed),
            ("compactions", self.compactor.compactions),
            ("recovery_ms", s.recovery_ms),
            ("recovered_records", self.recovery.records),
            ("recovery_truncated_bytes", self.recovery.truncated_bytes),
            ("recovery_repaired_bytes", self.recovery.repaired_bytes),
            ("fsync_turn", u64::from(self.log.fsync_mode() == FsyncMode::Turn)),
            ("memory_only", u64::from(self.log.memory_only())),
            // The limits a client sizes its reply buffer and its pings by,
            // which the HELLO reply does not carry.
            ("output_bytes_max", l.output_bytes_max.into()),
            ("fetch_bytes_max", l.fetch_bytes_max.into()),
            ("idle_timeout_ms", l.idle_timeout_ms.into()),
            ("buffered_bytes", loops.buffered_bytes),
            ("busy_replies", s.busy_replies),
        ]
    }
}
