//! Configuration changes: proposing one (with etcd's strict reconfiguration check), applying
//! it, joint configurations, and a removed leader handing over.

use super::*;

impl Raft {
    /// Whether a committed configuration change is not applied yet. A node does not campaign
    /// then (etcd's guard): it would count votes in a configuration already replaced.
    pub(super) fn unapplied_conf_change(&self) -> bool {
        self.commit > self.applied
            && self
                .log
                .slice(self.applied + 1, self.commit)
                .iter()
                .any(|e| matches!(e.data, EntryData::ConfChange(_)))
    }

    /// Proposes a configuration change; returns its index. It takes effect when applied. A
    /// change of more than one voter passes through a joint configuration, which the leader
    /// leaves by itself once the change is applied.
    pub fn propose_conf_change(&mut self, cc: ConfChange) -> Result<u64, Refused> {
        assert!(
            !self.awaiting_advance,
            "propose between ready() and advance()"
        );
        if !self
            .checked_conf_change(&cc)?
            .voters
            .regular
            .contains(&self.cfg.id)
        {
            return Err(Refused::InvalidConfChange(format!(
                "it removes the leader ({:x}); transfer leadership to another member first",
                self.cfg.id
            )));
        }
        let index = self.append_entry(EntryData::ConfChange(cc));
        self.pending_conf_index = index;
        Ok(index)
    }

    /// The first step of removing this leader, which it does not propose itself (above): `cc`
    /// is checked as [`Raft::propose_conf_change`] checks a change, then leadership goes to the
    /// most up-to-date other regular voter (returned), through which the caller proposes `cc`.
    pub fn hand_over_before_removal(&mut self, cc: &ConfChange) -> Result<NodeId, Refused> {
        if self
            .checked_conf_change(cc)?
            .voters
            .regular
            .contains(&self.cfg.id)
        {
            return Err(Refused::InvalidConfChange(
                "the change does not remove this leader".into(),
            ));
        }
        let to = self.successor().ok_or_else(|| {
            Refused::InvalidConfChange("no other regular voter to hand leadership to".into())
        })?;
        self.start_transfer(to);
        Ok(to)
    }

    /// The configuration `cc` would give, if this leader may propose it now.
    fn checked_conf_change(&self, cc: &ConfChange) -> Result<Membership, Refused> {
        self.check_leader()?;
        if self.pending_conf_index > self.applied {
            return Err(Refused::ConfChangePending {
                index: self.pending_conf_index,
            });
        }
        let next = self
            .membership
            .apply(cc)
            .map_err(|e| Refused::InvalidConfChange(e.to_string()))?;
        if cc.changes.is_empty() {
            return Err(Refused::InvalidConfChange(
                "the leader leaves a joint configuration by itself".into(),
            ));
        }
        Ok(next)
    }

    /// The regular voter other than this leader that holds the most of its log.
    fn successor(&self) -> Option<NodeId> {
        let lead = self.lead.as_ref()?;
        self.membership
            .voters
            .regular
            .iter()
            .copied()
            .filter(|&v| v != self.cfg.id)
            .max_by_key(|&v| (lead.progress.get(&v).map_or(0, |p| p.matched), Reverse(v)))
    }

    /// etcd's strict reconfiguration check, for a leader about to propose `cc`: would the
    /// configuration after it have a quorum among this leader, the regular voters it heard from
    /// lately and the current witness when the host says it is usable (its storage opens and
    /// answers)? Refuses a change that leaves the cluster unable to commit, e.g. removing the
    /// witness while the other member is down, or removing the other member while the witness
    /// cannot be reached. A witness being added does not count.
    pub fn check_reconfig_quorum(
        &self,
        cc: &ConfChange,
        witness_usable: bool,
    ) -> Result<(), Refused> {
        self.check_leader()?;
        let next = self
            .membership
            .apply(cc)
            .map_err(|e| Refused::InvalidConfChange(e.to_string()))?;
        // etcd's readiness rule: a learner is promoted only once it holds at least 90% of the
        // leader's log, so the new voter does not hold the quorum back while it catches up.
        let leader_match = self.match_of(self.cfg.id);
        for c in &cc.changes {
            let promoted =
                c.kind == ChangeKind::AddVoter && self.membership.learners.contains(&c.node);
            if promoted
                && u128::from(self.match_of(c.node)) * 100
                    < u128::from(leader_match) * u128::from(LEARNER_READY_PERCENT)
            {
                return Err(Refused::InvalidConfChange(
                    "can only promote a learner member which is in sync with leader".into(),
                ));
            }
        }
        let w = next
            .witness()
            .filter(|&w| witness_usable && self.membership.witness() == Some(w));
        let unreachable: Vec<String> = next
            .voters
            .regular
            .iter()
            .filter(|&&v| v != self.cfg.id && !self.reachable(v))
            .map(|v| format!("member {v:x} is not reachable"))
            .chain(
                next.witness()
                    .filter(|&v| Some(v) != w)
                    .map(|v| format!("the witness {v:x} cannot be used from this member")),
            )
            .collect();
        if next
            .voters
            .majority(|v| Some(v) == w || v == self.cfg.id || self.reachable(v))
        {
            return Ok(());
        }
        Err(Refused::InvalidConfChange(format!(
            "the configuration after this change would have no quorum: {}; start the member \
             (or wait until it is connected) or repair the witness, and try again",
            unreachable.join(", ")
        )))
    }

    /// A committed configuration change is applied: it takes effect now.
    pub(super) fn apply_conf_change(&mut self, cc: &ConfChange) {
        // A change that no longer applies (it was checked against the configuration it was
        // proposed in) is skipped identically on every node.
        let Ok(next) = self.membership.apply(cc) else {
            return;
        };
        let witness_changed = next.witness() != self.membership.witness();
        let was_voter = self.voter();
        self.membership = next;
        if let Some(w) = self.membership.witness()
            && witness_changed
            && cc.witness_generation != 0
        {
            // The new witness's generation, read by the proposer from its fresh storage: every
            // member is bound to it before the witness can be used.
            self.witness_known = Some(KnownWitness {
                id: w,
                seen: Seen {
                    generation: cc.witness_generation,
                    ..Seen::NOTHING
                },
            });
        }
        if witness_changed && let Some(lead) = self.lead.as_mut() {
            // Nothing a previous witness acknowledged or confirmed counts for a new one.
            lead.witness_match = 0;
            lead.witness_subterm = None;
            lead.witness_inflight = None;
            lead.witness_read_ack = 0;
            lead.witness_read_inflight = None;
        }
        if self.role != Role::Leader {
            self.removed |= was_voter && !self.voter();
            if !self.promotable() && self.role != Role::Follower {
                let term = self.term;
                self.become_follower(term, NONE);
            }
            return;
        }
        let (next_index, now) = (self.last_index() + 1, self.ticks);
        let replicas: BTreeSet<NodeId> = self
            .membership
            .replicas()
            .into_iter()
            .filter(|&p| p != self.cfg.id)
            .collect();
        let voters = self.membership.voters.regular.clone();
        let lead = self.leading();
        lead.progress.retain(|p, _| replicas.contains(p));
        for p in replicas {
            lead.progress
                .entry(p)
                .or_insert_with(|| Progress::new(next_index, now));
        }
        if lead.transfer.is_some_and(|(to, _)| !voters.contains(&to)) {
            lead.transfer = None;
        }
        // "A configuration change resets R to the regular voters and increments the subterm."
        self.new_subterm(voters);
        if !self.voter() {
            self.removed |= was_voter;
            self.hand_over();
        }
    }

    /// This leader applied its own removal (an earlier leader proposed it). Stepping down at
    /// once could strand the others: they may not know the change is committed, so their old
    /// configuration still needs this node's vote. It keeps leading as a non-voter instead,
    /// refusing proposals, replicating and heartbeating the commit index, and hands leadership
    /// to the most up-to-date regular voter, again whenever a handover times out.
    pub(super) fn hand_over(&mut self) {
        match self.successor() {
            Some(to) => self.start_transfer(to),
            None => {
                let term = self.term;
                self.become_follower(term, NONE);
            }
        }
    }

    /// A leader in a joint configuration leaves it once the change that entered it is applied.
    pub(super) fn maybe_leave_joint(&mut self) {
        if self.role == Role::Leader
            && self.lead.as_ref().is_some_and(|l| l.transfer.is_none())
            && self.membership.is_joint()
            && self.pending_conf_index <= self.applied
        {
            self.pending_conf_index =
                self.append_entry(EntryData::ConfChange(ConfChange::default()));
        }
    }
}
