//! Elections: the election timer, pre-vote and campaigns, the vote rule (`handle_vote`),
//! counting votes with the witness's when it completes a quorum (`poll`), becoming follower or
//! leader, and leadership transfer.

use super::*;

impl Raft {
    pub(super) fn reset_election_timer(&mut self) {
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        let n = self.cfg.election_tick;
        self.randomized_timeout = self.rng.random_range(n..n + self.election_spread());
    }

    /// How far election timeouts are spread above `election_tick`. Raft spreads them over a
    /// whole timeout so that candidates rarely split the vote. With at most two regular voters
    /// and a witness, each candidate needs the witness's vote (or the other voter's), and the
    /// witness grants at most one per term, atomically: a split needs the witness unreachable
    /// and both voters campaigning within one message delay. A fifth of the timeout is enough
    /// spread then, and the survivor of a leader crash campaigns that much sooner on average.
    pub(super) fn election_spread(&self) -> u64 {
        let n = self.cfg.election_tick;
        let v = &self.membership.voters;
        if !self.membership.is_joint() && v.witness.is_some() && v.regular.len() <= 2 {
            (n / 5).max(2).min(n)
        } else {
            n
        }
    }

    pub(super) fn become_follower(&mut self, term: u64, leader: NodeId) {
        assert!(term >= self.term, "term must never decrease");
        if term > self.term || self.leader != leader {
            self.leader_commit = 0;
        }
        if term > self.term {
            self.term = term;
            self.vote = NONE;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.lead = None;
        self.reset_election_timer();
    }

    pub(super) fn become_leader(&mut self) {
        assert_eq!(self.role, Role::Candidate);
        self.role = Role::Leader;
        self.leader = self.cfg.id;
        let next = self.last_index() + 1;
        let now = self.ticks;
        let silent_since = now.saturating_sub(self.cfg.liveness_ticks() + 1);
        let progress = self
            .membership
            .replicas()
            .into_iter()
            .filter(|&p| p != self.cfg.id)
            .map(|p| {
                let mut pr = Progress::new(next, now);
                if !self.votes.contains_key(&p) {
                    // Silent through the election: its liveness counts from when this node
                    // last heard from it. One long silent (down, cut off) may be replaced by
                    // the first adjustment of R at once (a leader elected with the witness's
                    // vote while the other member is down commits a tick later, not a
                    // liveness window later); one heard from lately (it handed leadership
                    // over, or its vote is merely slower than the witness's over a WAN) keeps
                    // its place, so the cluster does not depend on the witness for nothing.
                    pr.last_heard = self.heard.get(&p).map_or(silent_since, |&t| t.min(now));
                }
                (p, pr)
            })
            .collect();
        self.lead = Some(Leading {
            progress,
            subterm: 0,
            subterm_start: next,
            rset: self.membership.voters.regular.clone(),
            witness_subterm: None,
            witness_match: 0,
            witness_inflight: None,
            transfer: None,
            reads_waiting: Vec::new(),
            reads: VecDeque::new(),
            read_round: 0,
            witness_read_ack: 0,
            witness_read_inflight: None,
            reentry: None,
            reentry_backoff: 0,
            reentry_failures: 0,
            last_at_ticks: VecDeque::from([next]),
        });
        self.reset_election_timer();
        // No configuration change until this first entry is applied (a configuration change
        // proposed before the leader commits in its term could overlap an unknown earlier one).
        self.pending_conf_index = self.append_entry(EntryData::Empty);
        // A member silent through the election leaves R now, not at the next tick.
        self.adjust_replication_set();
        if !self.voter() {
            // A retiring node won (its log held what the others lacked): it leads only to
            // replicate that and hand over.
            self.hand_over();
        }
    }

    /// Starts an election (or a pre-vote round). Also callable by tests and the host.
    pub fn campaign(&mut self) {
        if self.role == Role::Leader || !self.promotable() || self.unapplied_conf_change() {
            return;
        }
        self.start_campaign(self.cfg.pre_vote, false);
    }

    pub(super) fn start_campaign(&mut self, pre: bool, transfer: bool) {
        if pre {
            self.role = Role::PreCandidate;
            self.leader = NONE;
        } else {
            self.term += 1;
            self.vote = self.cfg.id;
            self.role = Role::Candidate;
            self.leader = NONE;
        }
        self.lead = None;
        self.reset_election_timer();
        self.votes.clear();
        self.witness_asked = false;
        self.votes.insert(self.cfg.id, true);
        let term = self.vote_term();
        let last_index = self.last_index();
        let (last_term, _) = self.log.last_position();
        let voters: BTreeSet<NodeId> = self
            .membership
            .halves()
            .flat_map(|h| h.regular.iter().copied())
            .filter(|&v| v != self.cfg.id)
            .collect();
        for p in voters {
            self.send(
                p,
                term,
                Body::Vote {
                    pre,
                    last_index,
                    last_term,
                    transfer,
                },
            );
        }
        self.poll();
    }

    /// The term a (pre-)candidate campaigns in.
    pub(super) fn vote_term(&self) -> u64 {
        if self.role == Role::PreCandidate {
            self.term + 1
        } else {
            self.term
        }
    }

    /// Counts votes; wins, loses, or asks the witness when its vote would complete a quorum.
    pub(super) fn poll(&mut self) {
        let granted = |v: NodeId| self.votes.get(&v) == Some(&true);
        if self.membership.majority(granted) {
            if self.role == Role::PreCandidate {
                self.start_campaign(false, false);
            } else {
                self.become_leader();
            }
            return;
        }
        if !self
            .membership
            .majority(|v| self.votes.get(&v) != Some(&false))
        {
            let term = self.term;
            self.become_follower(term, NONE);
            return;
        }
        let Some(w) = self.membership.witness() else {
            return;
        };
        if self.witness_asked || !self.membership.majority(|v| v == w || granted(v)) {
            return;
        }
        self.witness_asked = true;
        let granted_in = |set: &BTreeSet<NodeId>| -> Vec<NodeId> {
            set.iter().copied().filter(|&v| granted(v)).collect()
        };
        let (last_log_term, last_log_subterm) = self.log.last_position();
        let request = VoteRequest {
            caller: self.caller(),
            term: self.vote_term(),
            candidate: self.cfg.id,
            last_log_term,
            last_log_subterm,
            granted: granted_in(&self.membership.voters.regular),
            granted_outgoing: self
                .membership
                .outgoing
                .as_ref()
                .map_or_else(Vec::new, |o| granted_in(&o.regular)),
        };
        let pre = self.role == Role::PreCandidate;
        self.witness_out.push(WitnessRequest::Vote { pre, request });
    }

    /// Hands leadership to regular voter `to` (never the witness): once `to` holds the whole
    /// log it is told to campaign at once. Proposals are refused meanwhile; the transfer is
    /// abandoned after an election timeout.
    pub fn transfer_leader(&mut self, to: NodeId) -> Result<(), Refused> {
        assert!(
            !self.awaiting_advance,
            "transfer between ready() and advance()"
        );
        self.check_leader()?;
        if Some(to) == self.membership.witness() {
            return Err(Refused::TransferToWitness { id: to });
        }
        if to == self.cfg.id {
            return Ok(());
        }
        if !self.membership.voters.regular.contains(&to) {
            return Err(Refused::NotAVoter { id: to });
        }
        self.start_transfer(to);
        Ok(())
    }

    /// Tells regular voter `to` to campaign once it holds the whole log.
    pub(super) fn start_transfer(&mut self, to: NodeId) {
        let (now, last) = (self.ticks, self.last_index());
        let lead = self.leading();
        lead.transfer = Some((to, now));
        if lead.progress[&to].matched == last {
            let term = self.term;
            self.send(to, term, Body::TimeoutNow);
        } else {
            self.send_append(to);
        }
    }

    pub(super) fn handle_vote(
        &mut self,
        from: NodeId,
        term: u64,
        pre: bool,
        last_index: u64,
        last_term: u64,
    ) {
        let can_vote = self.vote == from
            || (self.vote == NONE && self.leader == NONE)
            || (pre && term > self.term);
        let (my_last_term, _) = self.log.last_position();
        let up_to_date = (last_term, last_index) >= (my_last_term, self.last_index());
        let granted = can_vote && up_to_date;
        if granted && !pre {
            self.vote = from;
            self.election_elapsed = 0;
        }
        // A granted pre-vote answers in the term asked about; anything else in ours.
        let reply_term = if granted && pre { term } else { self.term };
        self.send(from, reply_term, Body::VoteResp { pre, granted });
    }

    pub(super) fn handle_vote_resp(&mut self, from: NodeId, term: u64, pre: bool, granted: bool) {
        let expected = if pre {
            Role::PreCandidate
        } else {
            Role::Candidate
        };
        if self.role != expected || term != self.vote_term() {
            return;
        }
        self.votes.entry(from).or_insert(granted);
        self.poll();
    }
}
