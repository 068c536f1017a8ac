//! The witness and the replication set R: when the leader asks the witness to store an entry
//! (`maybe_ask_witness`) or credits it without I/O, subterms, R shrinking and a voter's
//! re-entry, which members are reachable, and the witness's answers (`step_witness`).

use super::*;

impl Raft {
    /// Who asks the witness: this cluster, its witness member, and what this node saw of that
    /// witness (the witness rules refuse a witness that lost its state).
    pub(super) fn caller(&self) -> Caller {
        let witness_id = self.membership.witness().unwrap_or(NONE);
        let seen = match self.witness_known {
            Some(k) if k.id == witness_id && !self.mutated(Mutation::ForgetWitnessIdentity) => {
                k.seen
            }
            _ => Seen::NOTHING,
        };
        Caller {
            cluster_id: self.cfg.cluster_id,
            witness_id,
            seen,
        }
    }

    /// How this node asks its witness (None: the configuration has none).
    pub fn witness_caller(&self) -> Option<Caller> {
        self.membership.witness().map(|_| self.caller())
    }

    /// What this node knows of its witness.
    pub fn witness_known(&self) -> Option<KnownWitness> {
        self.witness_known
    }

    /// Learns what a witness step, or the leader, saw of witness `known.id`: only of the witness
    /// of this node's configuration (a late answer of a removed witness, or a leader whose
    /// configuration is ahead, teaches nothing until this node applies the same change).
    pub(super) fn learn_witness(&mut self, known: KnownWitness) {
        if known.seen == Seen::NOTHING || Some(known.id) != self.membership.witness() {
            return;
        }
        self.witness_known = Some(KnownWitness::learn(self.witness_known, known));
    }

    /// The index a subquorum of R (the leader included) has persisted: (quorum - 1)-th highest
    /// match among R's regular members; 0 if R's regular members are fewer. Outside a joint
    /// configuration only (the witness is never in R during one).
    pub(super) fn subquorum_index(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let need = self.membership.voters.quorum() - 1;
        let mut matches: Vec<u64> = lead
            .rset
            .iter()
            .filter(|&&m| self.membership.voters.regular.contains(&m))
            .map(|&m| self.match_of(m))
            .collect();
        matches.sort_unstable_by(|a, b| b.cmp(a));
        if need == 0 || matches.len() < need {
            0
        } else {
            matches[need - 1]
        }
    }

    /// A regular member's persisted index as the leader knows it.
    pub(super) fn match_of(&self, id: NodeId) -> u64 {
        if id == self.cfg.id {
            if self.mutated(Mutation::CommitBeforePersist) {
                return self.last_index();
            }
            return self.persisted;
        }
        let lead = self.lead.as_ref().expect("leader");
        lead.progress.get(&id).map_or(0, |p| p.matched)
    }

    /// The highest index the witness counts as having acknowledged (with the shortcut).
    pub(super) fn witness_credit(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let Some(w) = self.membership.witness() else {
            return 0;
        };
        let mut credit = lead.witness_match;
        let pinned = lead.witness_subterm == Some(lead.subterm)
            || self.mutated(Mutation::CreditWitnessWithoutWrite);
        if pinned && lead.rset.contains(&w) {
            let sq = self.subquorum_index();
            if sq >= lead.subterm_start {
                credit = credit.max(sq);
            }
        }
        credit
    }

    /// AppendToWitness when conditions 1-4 hold (design note "Log replication to the witness").
    pub(super) fn maybe_ask_witness(&mut self) {
        let Some(w) = self.membership.voters.witness else {
            return;
        };
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        if self.membership.is_joint()
            || !lead.rset.contains(&w)
            || lead.witness_subterm == Some(lead.subterm)
            || lead.witness_inflight.is_some()
        {
            return;
        }
        let index = self.subquorum_index();
        if index < lead.subterm_start {
            return; // nothing of the current subterm is persisted by a subquorum of R yet
        }
        // Condition 1: every entry from the subterm's start on is of (term, subterm); the entry
        // itself may already be compacted.
        if let Some(entry) = self.log.entry(index) {
            assert_eq!(
                (entry.term, entry.subterm),
                (self.term, lead.subterm),
                "condition 1"
            );
        }
        let request = AppendRequest {
            caller: self.caller(),
            term: self.term,
            leader: self.cfg.id,
            entry_term: self.term,
            entry_subterm: lead.subterm,
            index,
            replication_set: lead.rset.iter().copied().collect(),
            replication_set_outgoing: Vec::new(),
        };
        let now = self.ticks;
        self.leading().witness_inflight = Some(now);
        self.witness_out.push(WitnessRequest::Append(request));
    }

    pub(super) fn expire_witness_requests(&mut self) {
        let (now, limit) = (self.ticks, self.cfg.election_tick);
        let lead = self.leading();
        if lead.witness_inflight.is_some_and(|t| now - t > limit) {
            lead.witness_inflight = None;
            self.maybe_ask_witness();
        }
        let lead = self.leading();
        if lead.witness_read_inflight.is_some_and(|t| now - t > limit) {
            lead.witness_read_inflight = None;
        }
    }

    pub(super) fn adjust_replication_set(&mut self) {
        let transferring = self.lead.as_ref().is_some_and(|l| l.transfer.is_some());
        if transferring
            || self.membership.is_joint()
            || !self.membership.voters.regular.contains(&self.cfg.id)
        {
            // During a transfer, a new subterm's entry would leave the target behind the log.
            return;
        }
        let last = self.last_index();
        let skip_catch_up = self.mutated(Mutation::ReenterBeforeCatchUp);
        let next = self.adjusted_rset(|pr| pr.matched == last || skip_catch_up);
        if next != self.leading().rset {
            let lead = self.leading();
            if lead.reentry.take().is_some() {
                lead.reentry_failures = 0;
            }
            self.new_subterm(next);
        }
    }

    /// R after adjustment, with `caught_up` deciding whether a reachable voter may enter it.
    pub(super) fn adjusted_rset(&self, caught_up: impl Fn(&Progress) -> bool) -> BTreeSet<NodeId> {
        let (now, window) = (self.ticks, self.cfg.liveness_ticks());
        let lead = self.lead.as_ref().expect("leader");
        let witness = self
            .membership
            .voters
            .witness
            .filter(|_| !self.mutated(Mutation::WitnessKeptOutOfR));
        replication_set::adjust(
            &lead.rset,
            &self.membership.voters.regular,
            witness,
            self.cfg.id,
            |v| {
                let pr = &lead.progress[&v];
                Liveness {
                    reachable: now - pr.last_heard <= window,
                    caught_up: caught_up(pr),
                }
            },
        )
    }

    /// A voter that keeps up under a steady stream of proposals may never hold the very last
    /// index, so it would never re-enter R and the cluster would keep depending on the witness.
    /// When a reachable voter outside R holds everything the leader had
    /// [`REENTRY_LOOKBACK_TICKS`] ago, the leader asks the host to hold new proposals (at most
    /// [`REENTRY_HOLD_TICKS`]) so that the voter catches up and re-enters R; a hold that does
    /// not succeed backs off, an election timeout the first time, twice that the next, up to 16
    /// times. Called once per tick, after the adjustment.
    pub(super) fn hold_for_reentry(&mut self) {
        let (now, last, election) = (self.ticks, self.last_index(), self.cfg.election_tick);
        let lead = self.leading();
        let mark = lead.last_at_ticks[0];
        if lead.last_at_ticks.len() == REENTRY_LOOKBACK_TICKS {
            lead.last_at_ticks.pop_front();
        }
        lead.last_at_ticks.push_back(last);
        match lead.reentry {
            Some((_, since)) if now - since >= REENTRY_HOLD_TICKS => {
                lead.reentry = None;
                lead.reentry_backoff = now + (election << lead.reentry_failures.min(4));
                lead.reentry_failures += 1;
            }
            Some(_) => {}
            None if now < lead.reentry_backoff || lead.transfer.is_some() => {}
            None => {
                if self.membership.is_joint() {
                    return;
                }
                let rset = self.leading().rset.clone();
                let entering = self
                    .adjusted_rset(|pr| pr.matched >= mark)
                    .into_iter()
                    .find(|v| !rset.contains(v) && self.membership.voters.regular.contains(v));
                if let Some(v) = entering {
                    self.leading().reentry = Some((v, now));
                }
            }
        }
    }

    /// Should the host hold new proposals for now? True for at most [`REENTRY_HOLD_TICKS`] while
    /// a voter that keeps up catches up to re-enter the replication set. Proposing anyway is
    /// safe; it only keeps that voter out of R longer.
    pub fn proposals_held(&self) -> bool {
        self.lead.as_ref().is_some_and(|l| l.reentry.is_some())
    }

    /// Starts a subterm with replication set `rset`, opened by an empty entry.
    pub(super) fn new_subterm(&mut self, rset: BTreeSet<NodeId>) {
        let start = self.last_index() + 1;
        let lead = self.leading();
        lead.rset = rset;
        lead.subterm += 1;
        lead.subterm_start = start;
        self.append_entry(EntryData::Empty);
    }

    /// Is a follower recently heard from (within the liveness window)?
    /// The host's word that its connection to member `id` closed or is refused (its process
    /// died, say). A leader counts it unreachable now instead of after the liveness window and
    /// adjusts R at once (the witness replaces it), so writes barely pause; a message from it
    /// makes it reachable again. A follower whose leader it is campaigns now instead of after
    /// its election timeout. Safety never rests on it: R may change and an election may start
    /// at any time; a member wrongly reported costs a witness write and a re-entry, or a term.
    pub fn report_unreachable(&mut self, id: NodeId) {
        assert!(
            !self.awaiting_advance,
            "report between ready() and advance()"
        );
        if self.role == Role::Follower && self.leader == id && id != NONE {
            self.campaign();
            return;
        }
        let silent = self.ticks.saturating_sub(self.cfg.liveness_ticks() + 1);
        let Some(pr) = self.lead.as_mut().and_then(|l| l.progress.get_mut(&id)) else {
            return;
        };
        pr.last_heard = pr.last_heard.min(silent);
        self.adjust_replication_set();
    }

    pub(super) fn reachable(&self, id: NodeId) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        lead.progress
            .get(&id)
            .is_some_and(|p| self.ticks - p.last_heard <= self.cfg.liveness_ticks())
    }

    /// Would the regular voters we hear from make a quorum without the witness?
    pub(super) fn regular_quorum_reachable(&self) -> bool {
        let w = self.membership.witness();
        self.membership
            .majority(|v| Some(v) != w && (v == self.cfg.id || self.reachable(v)))
    }

    /// Is the witness pinned in this subterm: in R, and it acknowledged (so it recorded our R)?
    pub(super) fn witness_pinned(&self) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        self.membership
            .voters
            .witness
            .is_some_and(|w| lead.rset.contains(&w) && lead.witness_subterm == Some(lead.subterm))
    }

    /// Check-quorum: a quorum heard from within an election timeout, counting the witness when
    /// it is pinned in this subterm (it recorded this leader's R and acknowledged).
    pub(super) fn quorum_active(&self) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        let window = self.cfg.election_tick;
        let witness = self.membership.witness();
        let pinned = self.witness_pinned();
        self.membership.majority(|v| {
            v == self.cfg.id
                || (Some(v) == witness && pinned)
                || lead
                    .progress
                    .get(&v)
                    .is_some_and(|p| self.ticks - p.last_heard <= window)
        })
    }

    /// Handles the outcome of a witness step the host ran for this node.
    pub fn step_witness(&mut self, response: WitnessResponse) {
        assert!(
            !self.awaiting_advance,
            "step_witness between ready() and advance()"
        );
        let witness = response.witness_id();
        match &response {
            WitnessResponse::Append { seen, .. }
            | WitnessResponse::Vote { seen, .. }
            | WitnessResponse::ReadTerm { seen, .. } => self.learn_witness(KnownWitness {
                id: witness,
                seen: *seen,
            }),
            WitnessResponse::Failed { .. } => {}
        }
        match response {
            WitnessResponse::Append { request, reply, .. } => {
                if let AppendReply::StaleTerm { term } = reply
                    && term > self.term
                {
                    self.become_follower(term, NONE);
                    return;
                }
                if self.role != Role::Leader
                    || request.term != self.term
                    || request.caller.witness_id != self.membership.witness().unwrap_or(NONE)
                {
                    return;
                }
                let stale_ack_credited = self.mutated(Mutation::CreditStaleSubtermAck);
                let lead = self.leading();
                lead.witness_inflight = None;
                if let AppendReply::Ack { index, .. } = reply {
                    lead.witness_match = lead.witness_match.max(index);
                    lead.witness_subterm = lead.witness_subterm.max(Some(request.entry_subterm));
                    if stale_ack_credited {
                        lead.witness_subterm = Some(lead.subterm);
                    }
                }
                self.maybe_commit();
            }
            WitnessResponse::Vote {
                pre,
                request,
                reply,
                ..
            } => {
                if !reply.granted && reply.term > self.term && !(pre && reply.term < request.term) {
                    self.become_follower(reply.term, NONE);
                    return;
                }
                let expected = if pre {
                    Role::PreCandidate
                } else {
                    Role::Candidate
                };
                let w = request.caller.witness_id;
                if self.role != expected
                    || request.term != self.vote_term()
                    || Some(w) != self.membership.witness()
                {
                    return;
                }
                self.votes.entry(w).or_insert(reply.granted);
                self.poll();
            }
            WitnessResponse::ReadTerm {
                witness,
                term,
                round,
                witness_term,
                ..
            } => {
                let trusted = self.mutated(Mutation::WitnessTermReadTrusted);
                if witness_term > self.term && !trusted {
                    self.become_follower(witness_term, NONE);
                    return;
                }
                if self.role != Role::Leader
                    || term != self.term
                    || Some(witness) != self.membership.witness()
                {
                    return;
                }
                let lead = self.leading();
                lead.witness_read_inflight = None;
                if witness_term == term || trusted {
                    lead.witness_read_ack = lead.witness_read_ack.max(round);
                }
                self.serve_reads();
            }
            WitnessResponse::Failed { request } => {
                if Some(request.witness_id()) != self.membership.witness() {
                    return; // a failure of a witness no longer in the configuration
                }
                if let Some(lead) = self.lead.as_mut() {
                    match request {
                        WitnessRequest::Append(_) => lead.witness_inflight = None,
                        WitnessRequest::ReadTerm { .. } => lead.witness_read_inflight = None,
                        WitnessRequest::Vote { .. } => {}
                    }
                }
            }
        }
    }
}
