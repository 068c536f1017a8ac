//! `--force-new-cluster`: the last resort when a cluster lost a member for good and cannot
//! elect a leader (the other member gone, the witness lost or refusing). As etcd does, the
//! member restarts as the only voter of its cluster (same cluster and member ids, no witness),
//! keeping its data; members and a witness are then added again at run time.
//!
//! Invariants:
//! - a member that is provably behind is refused and nothing is changed: the witness
//!   acknowledged a log position this member's log does not reach (what this member saw of the
//!   witness, or the witness's own record when it can still be read), so the writes the other
//!   member holds would be lost;
//! - every entry in this member's log is kept and applied (etcd drops the uncommitted tail; an
//!   entry here may have been acknowledged by the lost leader, so it is kept: an entry nobody
//!   acknowledged costs nothing);
//! - the change is the key space's (removals applied, made durable), then one snapshot in
//!   place saying so, written through the member's own storage: nothing is copied, whatever
//!   the key space's size. A crash between the two leaves the old snapshot and log with the
//!   key space ahead of them; the next start with the flag finds nobody left to remove and
//!   writes the snapshot at the key space's index, never below it (entries after it would be
//!   taken as applied already).

use witness_core::WitnessUrl;

use super::contract::witness_member;
use super::node::command_of;
use super::witness_slot::Credentials;
use crate::mvcc::{Command, MemberChange, Mvcc};
use crate::raft::{HardState, Membership, NodeId, Ready, SnapshotMeta, Storage};
use crate::storage::disk::DiskStorage;
use crate::witness::load_within;

/// Makes this member the only voter of its cluster. See the module invariants.
pub async fn force_new_cluster(
    disk: &mut DiskStorage,
    mvcc: &Mvcc,
    me: NodeId,
    credentials: &Credentials,
) -> anyhow::Result<()> {
    let hs = disk.hard_state();
    let snapshot = disk.snapshot();
    let entries = disk.entries();
    let (last_index, last_term, last_subterm) = entries.last().map_or(
        (
            snapshot.meta.index,
            snapshot.meta.term,
            snapshot.meta.subterm,
        ),
        |e| (e.index, e.term, e.subterm),
    );
    let mine = (last_term, last_subterm);
    let refuse = |what: String| {
        anyhow::anyhow!(
            "--force-new-cluster refused: this member's log ends at term {last_term} subterm \
             {last_subterm} (index {last_index}), but {what}; those writes were acknowledged \
             and only the other member holds them. Start the other member (with the flag, if it \
             must be forced) instead; nothing was changed"
        )
    };
    if let Some(k) = hs.witness
        && (k.seen.log_term, k.seen.log_subterm) > mine
    {
        return Err(refuse(format!(
            "this member saw the witness acknowledge term {} subterm {}",
            k.seen.log_term, k.seen.log_subterm
        )));
    }
    if let Some(record) = read_witness(mvcc, credentials).await
        && hs
            .witness
            .is_none_or(|k| k.seen.generation == record.generation)
        && (record.last_log_term, record.last_log_subterm) > mine
    {
        return Err(refuse(format!(
            "the witness's record holds term {} subterm {} (index {})",
            record.last_log_term, record.last_log_subterm, record.last_log_index
        )));
    }

    // Apply the whole log: whatever the key space has not applied yet.
    let batch: Vec<(u64, Command)> = entries.iter().map(|e| (e.index, command_of(e))).collect();
    mvcc.apply(&batch, true)?;
    // Every other member (the witness included) leaves the member list.
    let mut index = last_index.max(mvcc.position()?.applied);
    let others: Vec<_> = mvcc.members()?.into_iter().filter(|m| m.id != me).collect();
    if others.is_empty() && snapshot.meta.membership.voters.len() == 1 {
        tracing::warn!(
            "--force-new-cluster: this member is already the only one of its cluster; nothing \
             to do. Remove the flag: with it, every restart would remove members added since"
        );
        return Ok(());
    }
    let removals: Vec<(u64, Command)> = others
        .into_iter()
        .map(|m| {
            index += 1;
            let change = MemberChange {
                id: 0,
                member: Some(m),
                remove: true,
                witness_generation: 0,
            };
            (index, Command::Member(change))
        })
        .collect();
    mvcc.apply(&removals, true)?;
    mvcc.sync()?;
    crate::crash!("force-before-snapshot");

    // One snapshot: the key space as it is now, this member the only voter, in a term above
    // every term this member has seen.
    let term = hs.term.max(last_term) + 1;
    let membership = Membership::new(std::collections::BTreeSet::from([me]), None)?;
    let forced = SnapshotMeta {
        index,
        term,
        subterm: 0,
        membership,
    };
    disk.install_in_place(&forced)?;
    crate::crash!("force-before-hard-state");
    let ready = Ready {
        hard_state: Some(HardState {
            term,
            vote: me,
            commit: index,
            witness: None,
        }),
        ..Ready::default()
    };
    disk.persist(&ready)?;
    tracing::warn!(
        index,
        term,
        "--force-new-cluster: this member is now the only voter of its cluster (same ids, no \
         witness). Remove the flag before the next restart, then add a member and a witness \
         at run time (docs/operations.md, \"Forcing a new cluster\")"
    );
    Ok(())
}

/// The witness record of the stored member list, if it can be read (a lost witness cannot).
async fn read_witness(
    mvcc: &Mvcc,
    credentials: &Credentials,
) -> Option<witness_core::WitnessState> {
    let members = mvcc.members().ok()?;
    let (_, url) = witness_member(&members)?;
    let url = credentials.resolve(&WitnessUrl::parse(url).ok()?).ok()?;
    let (_, loaded) = load_within(&url, std::time::Duration::from_secs(10))
        .await
        .ok()?;
    Some(loaded?.state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Entry, EntryData};

    /// A forced start that crashed after changing the key space and before its snapshot (the
    /// key space applied past the log's end) is run again: the snapshot goes at the key
    /// space's index, not the log's end, so the entries a leader appends next are applied,
    /// not taken as applied already.
    #[tokio::test]
    async fn a_forced_start_run_again_after_a_crash_snapshots_where_the_key_space_is() {
        let dir = tempfile::tempdir().unwrap();
        let member = dir.path().join("member");
        let (mut disk, _) = DiskStorage::open(&member, &member.join("wal")).unwrap();
        let members = Membership::new([1, 2], Some(3)).unwrap();
        disk.bootstrap(members, None, crate::storage::BootKeySpace::Empty)
            .unwrap();
        let entries: Vec<Entry> = (2..=5)
            .map(|index| Entry {
                term: 2,
                subterm: 1,
                index,
                data: EntryData::Empty,
            })
            .collect();
        let ready = Ready {
            hard_state: Some(HardState {
                term: 2,
                vote: 1,
                commit: 5,
                witness: None,
            }),
            entries,
            ..Ready::default()
        };
        disk.persist(&ready).unwrap();
        // What the first forced start left: the log applied and two removals after it, durable.
        let mvcc = Mvcc::open(&dir.path().join("kv.redb")).unwrap();
        let applied: Vec<(u64, Command)> = (2..=7).map(|i| (i, Command::Noop)).collect();
        mvcc.apply(&applied, true).unwrap();

        force_new_cluster(&mut disk, &mvcc, 1, &Credentials::default())
            .await
            .unwrap();
        let snapshot = disk.snapshot().meta;
        assert_eq!(
            snapshot.index, 7,
            "at the key space's index, past the log's end (5)"
        );
        assert_eq!(snapshot.membership.voters.len(), 1);
        assert_eq!(disk.hard_state().commit, 7);
    }
}
