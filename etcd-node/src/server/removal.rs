//! When a member that applied its own removal stops. The server's loop and the simulator both
//! run this rule, so the simulator stops removed nodes exactly when real members stop (a rule
//! that stopped one too early could strand entries only it holds: docs/raft.md, "Leader
//! transfer").

use crate::raft::{Raft, Role};

/// Election timeouts a removed member that may hold the only copy of some entries keeps
/// running without leading before it stops anyway (cut off, or the others elected a leader
/// without it: a leaderless cluster that needs it grants its campaign well before).
pub const RETIRING_TIMEOUTS: u64 = 5;

/// What a member knows of its own removal (process memory: a restarted member has forgotten
/// it, as it has forgotten the applied entries it does not replay).
#[derive(Debug, Default)]
pub struct Removal {
    /// Since the member applied its own removal (or last led): its ticks.
    ticks: Option<u64>,
}

impl Removal {
    /// The member applied a configuration change that removes it.
    pub fn applied_own_removal(&mut self) {
        self.ticks.get_or_insert(0);
    }

    /// One tick of the member's clock.
    pub fn tick(&mut self) {
        if let Some(t) = self.ticks.as_mut() {
            *t += 1;
        }
    }

    /// After a turn of the loop: whether the member stops now. It does once it no longer
    /// leads and its log strands nothing ([`Raft::retiring`]), or after
    /// [`RETIRING_TIMEOUTS`] election timeouts without leading.
    pub fn should_stop(&mut self, raft: &Raft) -> bool {
        let Some(ticks) = self.ticks.as_mut() else {
            return false;
        };
        if raft.role() == Role::Leader {
            *ticks = 0;
            return false;
        }
        !raft.retiring() || *ticks >= RETIRING_TIMEOUTS * raft.election_tick()
    }
}
