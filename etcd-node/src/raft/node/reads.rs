//! Linearizable reads (ReadIndex): a read waits until a quorum confirmed this leader after it
//! arrived, the witness through a fresh read of its term (`maybe_read_witness`), or is served at
//! once when the witness is pinned to a two-node leader.

use super::*;

impl Raft {
    /// Asks for a linearizable read: a [`ReadState`] with `ctx` appears in a later `Ready` once
    /// it is safe to read at its index. Only the leader answers (a host forwards reads to it).
    pub fn read_index(&mut self, ctx: Vec<u8>) -> Result<(), Refused> {
        assert!(!self.awaiting_advance, "read between ready() and advance()");
        if self.lead.is_none() {
            return Err(Refused::NotLeader {
                leader: self.leader,
            });
        }
        if self.term_at(self.commit) != Some(self.term) {
            // The commit index is only known current once an entry of this term commits.
            self.leading().reads_waiting.push(ctx);
            return Ok(());
        }
        self.start_reads(vec![ctx]);
        Ok(())
    }

    /// As [`Raft::read_index`], for a read that the regular voter `asker` forwarded to this
    /// leader. When the voters are this leader and `asker` (and a witness at most), the
    /// forwarded request is itself the confirmation a round would ask `asker` for, and the
    /// read is answered at the current commit index without one. `asker` sent the request after
    /// its reads arrived, believing this member led its term, so its term was at most this
    /// leader's and it had voted in no later term: with this leader still leading that term, no
    /// leader of a later term could exist then (it needs the vote of one of the two), and every
    /// write acknowledged before the reads arrived is in this leader's log, at or below its
    /// commit index (docs/raft.md, "Reads").
    pub fn read_index_for(&mut self, ctx: Vec<u8>, asker: NodeId) -> Result<(), Refused> {
        let current = self.lead.is_some() && self.term_at(self.commit) == Some(self.term);
        if current && self.confirmed_by_asking(asker) {
            self.read_states.push(ReadState {
                index: self.commit,
                ctx,
            });
            return Ok(());
        }
        self.read_index(ctx)
    }

    /// Whether a request from `asker` confirms this leader as a round would: the voters are
    /// this leader and `asker` (and a witness at most), settled (not joint, no configuration
    /// change in the log beyond what is applied).
    fn confirmed_by_asking(&self, asker: NodeId) -> bool {
        let m = &self.membership;
        let pair = [self.cfg.id, asker];
        if self.mutated(Mutation::ForwardedReadFromAnyVoter) {
            return asker != self.cfg.id;
        }
        asker != self.cfg.id
            && !m.is_joint()
            && self.pending_conf_index <= self.applied
            && m.voters.regular.len() == 2
            && pair.iter().all(|id| m.voters.regular.contains(id))
    }

    /// Starts ReadIndex for `ctxs` at the current commit index (which is of this term).
    pub(super) fn start_reads(&mut self, ctxs: Vec<Vec<u8>>) {
        if ctxs.is_empty() {
            return;
        }
        let index = self.commit;
        let alone = self.membership.majority(|v| v == self.cfg.id);
        // Two regular voters and the witness pinned to us: no one else can win an election
        // while this subterm lasts, so our commit index is current without a round trip.
        let pinned_pair = !self.membership.is_joint()
            && self.voter()
            && self.membership.voters.regular.len() == 2
            && self.witness_pinned();
        if alone || pinned_pair || self.mutated(Mutation::ReadWithoutConfirmation) {
            self.read_states
                .extend(ctxs.into_iter().map(|ctx| ReadState { index, ctx }));
            return;
        }
        let lead = self.leading();
        lead.read_round += 1;
        let round = lead.read_round;
        lead.reads.extend(
            ctxs.into_iter()
                .map(|ctx| PendingRead { round, index, ctx }),
        );
        self.broadcast_heartbeat(round, None);
        if !self.regular_quorum_reachable() {
            self.maybe_read_witness();
        }
    }

    /// Reads the witness's term for the latest read round (one read in flight at most).
    pub(super) fn maybe_read_witness(&mut self) {
        if self.membership.witness().is_none() {
            return;
        }
        let (caller, term, now) = (self.caller(), self.term, self.ticks);
        let lead = self.leading();
        if lead.reads.is_empty() || lead.witness_read_inflight.is_some() {
            return;
        }
        lead.witness_read_inflight = Some(now);
        let round = lead.read_round;
        self.witness_out.push(WitnessRequest::ReadTerm {
            caller,
            term,
            round,
        });
    }

    /// Answers the pending reads whose round a quorum confirmed.
    pub(super) fn serve_reads(&mut self) {
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let witness = self.membership.witness();
        let confirmed = |round: u64| {
            self.membership.majority(|v| {
                v == self.cfg.id
                    || (Some(v) == witness && lead.witness_read_ack >= round)
                    || lead.progress.get(&v).is_some_and(|p| p.read_ack >= round)
            })
        };
        let served = lead.reads.iter().take_while(|r| confirmed(r.round)).count();
        let lead = self.leading();
        let done: Vec<PendingRead> = lead.reads.drain(..served).collect();
        self.read_states.extend(done.into_iter().map(|r| ReadState {
            index: r.index,
            ctx: r.ctx,
        }));
    }
}
