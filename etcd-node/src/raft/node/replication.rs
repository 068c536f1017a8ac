//! Log replication: appends and their answers, heartbeats, the commit rule (`maybe_commit`),
//! and a follower's side (`handle_append`, `handle_snapshot`).

use super::*;

impl Raft {
    pub(super) fn reply_append(&mut self, to: NodeId, index: u64, reject: bool) {
        let term = self.term;
        self.send(to, term, Body::AppendResp { index, reject });
    }

    pub(super) fn handle_append(
        &mut self,
        from: NodeId,
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
    ) {
        if prev_index < self.commit {
            // Already committed here: answer with what we have committed.
            self.reply_append(from, self.commit, false);
            return;
        }
        if self.term_at(prev_index) != Some(prev_term) {
            let hint = self.last_index().min(prev_index.saturating_sub(1));
            self.reply_append(from, hint, true);
            return;
        }
        let last_new = prev_index + entries.len() as u64;
        for e in entries {
            if e.index <= self.last_index() {
                if self.term_at(e.index) == Some(e.term) {
                    continue;
                }
                assert!(
                    e.index > self.commit,
                    "leader asked to overwrite committed entry {}",
                    e.index
                );
                self.log.truncate_from(e.index);
                self.persisted = self.persisted.min(e.index - 1);
            }
            self.log.push(e);
        }
        self.commit_to(commit.min(last_new));
        self.reply_append(from, last_new, false);
    }

    pub(super) fn handle_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        let index = snapshot.meta.index;
        if index <= self.commit {
            self.reply_append(from, self.commit, false);
            return;
        }
        if self.term_at(index) == Some(snapshot.meta.term) {
            // We hold the snapshot's last entry, hence everything before it.
            self.commit_to(index);
            self.reply_append(from, index, false);
            return;
        }
        self.log.restore(&snapshot.meta);
        self.membership = snapshot.meta.membership.clone();
        // The Ready that carries the snapshot persists and applies it before anything else.
        (self.commit, self.persisted, self.applied) = (index, index, index);
        self.snapshot = snapshot.clone();
        self.snapshot_sendable = false;
        self.snapshot_wanted = false;
        self.pending_snapshot = Some(snapshot);
        self.reply_append(from, index, false);
    }

    pub(super) fn commit_to(&mut self, index: u64) {
        if index > self.commit {
            assert!(
                index <= self.last_index(),
                "commit {index} past the log end"
            );
            self.commit = index;
        }
    }

    pub(super) fn append_entry(&mut self, data: EntryData) -> u64 {
        let subterm = self.lead.as_ref().expect("only a leader appends").subterm;
        let entry = Entry {
            term: self.term,
            subterm,
            index: self.last_index() + 1,
            data,
        };
        self.log.push(entry);
        let peers: Vec<NodeId> = self.leading().progress.keys().copied().collect();
        for p in peers {
            self.send_append(p);
        }
        self.maybe_commit();
        self.last_index()
    }

    pub(super) fn send_append(&mut self, to: NodeId) {
        let (last, max_batch, max_inflight, now) = (
            self.last_index(),
            self.cfg.max_batch as u64,
            self.cfg.max_inflight,
            self.ticks,
        );
        let lead = self.lead.as_mut().expect("leader");
        let Some(pr) = lead.progress.get_mut(&to) else {
            return;
        };
        if !pr.can_send(max_inflight) || (pr.replicate && pr.next > last) {
            return;
        }
        let prev_index = pr.next - 1;
        let body = match self.log.term(prev_index) {
            Some(prev_term) => {
                let hi = last.min(prev_index + max_batch);
                let entries = self.log.slice(prev_index + 1, hi).to_vec();
                pr.sent(hi.max(prev_index));
                Body::Append {
                    prev_index,
                    prev_term,
                    entries,
                    commit: self.commit,
                }
            }
            None if !self.snapshot_sendable
                || self.snapshot.meta.index < self.log.snapshot_index() =>
            {
                // Dropped from memory after the latest snapshot (trim_log), or the host keeps
                // no data of it (compact_in_place, a restart): a new one is needed. The follower
                // waits for it (this is asked again on its heartbeats).
                self.snapshot_wanted = true;
                return;
            }
            None => {
                // The entries the follower needs are compacted: send the snapshot instead.
                pr.snapshot = Some((self.snapshot.meta.index, now));
                Body::Snapshot {
                    snapshot: self.snapshot.clone(),
                }
            }
        };
        let term = self.term;
        self.send(to, term, body);
    }

    /// The highest index every regular member holds: on a leader, the lowest of its own
    /// persisted index and its followers' match indexes; on a follower, what its leader said.
    pub(super) fn held_by_all(&self) -> u64 {
        match &self.lead {
            Some(lead) => lead
                .progress
                .values()
                .map(|pr| pr.matched)
                .fold(self.persisted, u64::min),
            None => self.heard_held,
        }
    }

    /// Sends each follower a heartbeat with the commit index it can apply and read round
    /// `read`. With `newer_than`, only to the followers that hold entries committed after it:
    /// a new commit is told at once (otherwise followers learn it with the next append or
    /// heartbeat, up to a heartbeat later: a follower that forwarded a client's proposal would
    /// answer that much later).
    pub(super) fn broadcast_heartbeat(&mut self, read: u64, newer_than: Option<u64>) {
        let (term, commit, held) = (self.term, self.commit, self.held_by_all());
        let targets: Vec<(NodeId, u64)> = self
            .leading()
            .progress
            .iter()
            .map(|(&p, pr)| (p, commit.min(pr.matched)))
            .filter(|&(_, c)| newer_than.is_none_or(|before| c > before))
            .collect();
        for (p, commit) in targets {
            self.send(p, term, Body::Heartbeat { commit, read, held });
        }
    }

    pub(super) fn handle_append_resp(&mut self, from: NodeId, index: u64, reject: bool) {
        let (now, last) = (self.ticks, self.last_index());
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        if pr.snapshot.is_some_and(|(sent, _)| reject || index < sent) {
            // An answer to an Append sent before the snapshot (nothing else is sent while it
            // is outstanding; the snapshot's own answer covers its index): stale. Probing
            // again would send the snapshot again, once per such answer, while the first one
            // is still on its way.
            return;
        }
        if reject {
            let next = (index + 1).min(pr.next.saturating_sub(1)).max(1);
            pr.probe_from(next);
        } else if pr.acknowledge(index) {
            let caught_up = pr.matched == last;
            let reentering = caught_up && lead.reentry.is_some_and(|(v, _)| v == from);
            if caught_up && lead.transfer.is_some_and(|(to, _)| to == from) {
                let term = self.term;
                self.send(from, term, Body::TimeoutNow);
            }
            if reentering {
                // The hold did its job: the voter re-enters R now, not at the next tick.
                self.adjust_replication_set();
            }
            self.maybe_commit();
        }
        self.send_append(from);
    }

    pub(super) fn handle_heartbeat_resp(&mut self, from: NodeId, read: u64) {
        let (now, last, retry) = (self.ticks, self.last_index(), self.cfg.election_tick);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        pr.read_ack = pr.read_ack.max(read);
        if let Some((_, sent)) = pr.snapshot {
            if now - sent > retry {
                // The snapshot was lost: send it again.
                pr.probe_from(pr.next);
                self.send_append(from);
            }
        } else if !pr.replicate {
            pr.paused = false;
            self.send_append(from);
        } else if pr.matched < last {
            // Appends may have been lost (a partition, a drop). Ask about the entry before
            // `next` with no entries: a follower that lacks it rejects, and we probe from its hint.
            let prev_index = pr.next - 1;
            if let Some(prev_term) = self.log.term(prev_index) {
                let (term, commit) = (self.term, self.commit);
                self.send(
                    from,
                    term,
                    Body::Append {
                        prev_index,
                        prev_term,
                        entries: Vec::new(),
                        commit,
                    },
                );
            } else {
                pr.probe_from(pr.next);
                self.send_append(from);
            }
        }
        self.serve_reads();
    }

    pub(super) fn maybe_commit(&mut self) {
        if self.lead.is_none() {
            return;
        }
        let witness = self.membership.witness();
        let credit = self.witness_credit();
        let candidate = self.membership.committed(|v| {
            if Some(v) == witness {
                credit
            } else {
                self.match_of(v)
            }
        });
        if candidate > self.commit && self.term_at(candidate) == Some(self.term) {
            let before = self.commit;
            self.commit_to(candidate);
            self.broadcast_heartbeat(0, Some(before));
            let waiting = std::mem::take(&mut self.leading().reads_waiting);
            self.start_reads(waiting);
        }
        self.maybe_ask_witness();
    }
}
