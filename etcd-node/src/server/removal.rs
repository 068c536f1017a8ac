//! When a member that applied its own removal stops. The server's loop and the simulator both
//! run this rule, so the simulator stops removed nodes exactly when real members stop (a rule
//! that stopped one too early could strand entries only it holds: docs/raft.md, "Leader
//! transfer").

use crate::raft::{NONE, Raft, Role};

/// Election timeouts a removed member keeps running without leading, and without word from a
/// leader that the removal is committed, before it stops anyway (the others applied the removal
/// and no longer talk to it, or it is cut off). A member that may hold the only copy of some
/// entries (retiring) never stops by this timeout.
pub const RETIRING_TIMEOUTS: u64 = 5;

/// What a member knows of its own removal (process memory: a restarted member has forgotten
/// it, as it has forgotten the applied entries it does not replay).
#[derive(Debug, Default)]
pub struct Removal {
    /// Since the member applied its own removal (or last led): its ticks.
    ticks: Option<u64>,
    /// The index of the entry that removed it.
    index: u64,
}

impl Removal {
    /// The member applied the configuration change at `index`, which removes it.
    pub fn applied_own_removal(&mut self, index: u64) {
        self.ticks.get_or_insert(0);
        self.index = self.index.max(index);
    }

    /// One tick of the member's clock.
    pub fn tick(&mut self) {
        if let Some(t) = self.ticks.as_mut() {
            *t += 1;
        }
    }

    /// After a turn of the loop: whether the member stops now. It does once it no longer
    /// leads, its log strands nothing ([`Raft::retiring`]), and another member leads that
    /// announced a commit index covering the removal; or after [`RETIRING_TIMEOUTS`] election
    /// timeouts without leading (the others applied the removal and no longer talk to it, or it
    /// is cut off).
    ///
    /// Without the leader's word, a removed leader that handed over stopped at once and could
    /// strand the others: the new leader, not yet knowing the removal committed, still counts
    /// the removed member in its configuration, and cannot commit (so cannot apply the removal)
    /// without it (`raft-sim --start 1360 --seeds 1 --regular 2 --witness` did).
    pub fn should_stop(&mut self, raft: &Raft) -> bool {
        let Some(ticks) = self.ticks.as_mut() else {
            return false;
        };
        if raft.role() == Role::Leader {
            *ticks = 0;
            return false;
        }
        let known = raft.leader() != NONE
            && raft.leader() != raft.id()
            && raft.leader_commit() >= self.index;
        !raft.retiring() && (known || *ticks >= RETIRING_TIMEOUTS * raft.election_tick())
    }
}
