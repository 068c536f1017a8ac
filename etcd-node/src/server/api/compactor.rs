//! Auto compaction, as etcd's `--auto-compaction-mode`/`--auto-compaction-retention`: the
//! leader compacts the key space's history through Raft (an ordinary Compaction request, so
//! every member compacts at the same revision).
//!
//! - `periodic` with retention R: every R/10 the leader notes the current revision; it
//!   compacts to the newest noted revision that is at least R old, so at least R of history
//!   is always kept (etcd: "10h retention, compaction every hour").
//! - `revision` with retention N: every 5 minutes (etcd's interval) the leader compacts to
//!   the current revision minus N.
//!
//! A member that is not the leader does nothing, and forgets its notes (a new leader starts
//! its own, so it compacts only after it has led for R).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use etcd_client::proto::PbCompactionRequest;

use super::handle::Api;
use crate::config::AutoCompaction;
use crate::mvcc::Op;

/// How often the revision mode looks (etcd's).
const REVISION_EVERY: Duration = Duration::from_secs(300);

/// How often the leader looks at the revision under `mode`.
pub fn interval(mode: AutoCompaction) -> Duration {
    match mode {
        AutoCompaction::Periodic(r) => (r / 10).max(Duration::from_millis(10)),
        AutoCompaction::Revision(_) => REVISION_EVERY,
    }
}

/// The revisions a leader noted, oldest first.
#[derive(Debug, Default)]
pub struct Notes(VecDeque<(Instant, u64)>);

impl Notes {
    /// Notes `revision` at `now`; the revision to compact to, if any is due (above
    /// `compacted`, below `revision`).
    pub fn next(
        &mut self,
        mode: AutoCompaction,
        now: Instant,
        revision: u64,
        compacted: u64,
    ) -> Option<u64> {
        let target = match mode {
            AutoCompaction::Revision(keep) => revision.saturating_sub(keep),
            AutoCompaction::Periodic(keep) => {
                self.0.push_back((now, revision));
                let old_enough = |at: &Instant| now.saturating_duration_since(*at) >= keep;
                // Keep the newest old-enough note (the target) and everything after it.
                while self.0.len() > 1 && old_enough(&self.0[1].0) {
                    self.0.pop_front();
                }
                match self.0.front() {
                    Some((at, rev)) if old_enough(at) => *rev,
                    _ => 0,
                }
            }
        };
        (target > compacted && target < revision).then_some(target)
    }
}

/// Runs auto compaction until the task is dropped.
pub async fn run(api: Api, mode: AutoCompaction) {
    let mut tick = tokio::time::interval(interval(mode));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut notes = Notes::default();
    loop {
        tick.tick().await;
        if api.status.borrow().leader != api.member_id {
            notes = Notes::default();
            continue;
        }
        let position = match api.mvcc.position() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "auto compaction: cannot read the revision");
                continue;
            }
        };
        let Some(revision) =
            notes.next(mode, Instant::now(), position.revision, position.compacted)
        else {
            continue;
        };
        let request = PbCompactionRequest {
            revision: revision as i64,
            physical: false,
        };
        match api.propose(Op::Compaction(request)).await {
            Ok(_) => tracing::info!(revision, "auto compaction: compacted"),
            Err(e) => tracing::warn!(revision, error = %e.message(), "auto compaction failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_keeps_at_least_the_retention() {
        let keep = Duration::from_secs(100);
        let mode = AutoCompaction::Periodic(keep);
        assert_eq!(interval(mode), Duration::from_secs(10));
        let start = Instant::now();
        let mut notes = Notes::default();
        let mut compacted = 0;
        // One note every 10 s; the revision grows by 50 per note.
        for i in 0..40u64 {
            let now = start + Duration::from_secs(10 * i);
            let revision = 1 + 50 * i;
            if let Some(to) = notes.next(mode, now, revision, compacted) {
                // The target was noted at least 100 s ago, and is the newest such note.
                let noted_at = (to - 1) / 50 * 10;
                assert!(
                    10 * i - noted_at >= 100,
                    "step {i}: compacted to {to} too soon"
                );
                assert!(
                    10 * i - noted_at < 110,
                    "step {i}: compacted to {to}, kept too much"
                );
                compacted = to;
            }
            assert!(notes.0.len() <= 12, "notes are bounded");
        }
        assert_eq!(compacted, 1 + 50 * 29);
    }

    #[test]
    fn revision_keeps_the_last_n() {
        let mode = AutoCompaction::Revision(1000);
        let mut notes = Notes::default();
        let now = Instant::now();
        assert_eq!(notes.next(mode, now, 500, 0), None);
        assert_eq!(notes.next(mode, now, 1500, 0), Some(500));
        assert_eq!(notes.next(mode, now, 1500, 500), None, "already there");
    }
}
