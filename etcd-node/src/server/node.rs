//! The Raft loop: one thread that owns the Raft core, the durable log and the key space's
//! writer. It ticks, takes inputs (client proposals and reads, peer envelopes, witness
//! answers), and processes each `Ready` in the order the core asks: send a leader's appends,
//! persist (one fsync per batch), send the rest, run witness steps, apply, answer. Witness steps run on the async runtime
//! against the witness's storage, right here in this process: no witness server exists.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::sync::{oneshot, watch};
use witness_core::rules::Refusal;

use super::applier::Applier;
use super::contract::{
    Input, LeaseAnswer, LeaseApplied, SavedSnapshot, SnapshotError, Status, refused,
    regular_peer_url,
};
use super::driver::{Driver, World};
use super::lessor::Lessor;
use super::metrics::Metrics;
use super::peer::Peers;
use super::proposals::Proposals;
use super::watch_hub::WatchHub;
use super::wire::Envelope;
use super::witness_slot::WitnessSlot;
use crate::errors::{Code, EtcdError};
use crate::mvcc::{Command, Commits, MemberChange, Mvcc, Op, Proposal, Response};
use crate::raft::{
    Body, Change, ChangeKind, ConfChange, Entry, EntryData, Message, NONE, NodeId, Raft, Ready,
    Refused, Role, Snapshot, Storage, WitnessRequest, WitnessResponse, apply_rule,
};
use crate::storage::disk::{DiskStorage, save_in_place, save_streamed};
use crate::storage::snap::DataReader;
use etcd_client::proto::PbLeaseRevokeRequest;

/// Who waits for a client write: its gRPC handler.
pub type WriteWaiter = oneshot::Sender<Result<Response, EtcdError>>;
/// Who waits for a linearizable read's index: its gRPC handler.
pub type ReadWaiter = oneshot::Sender<Result<u64, EtcdError>>;

/// Everything the loop owns.
#[derive(Debug)]
pub struct RaftLoop {
    /// The Raft core and the client writes and reads in flight, driven as the simulator drives
    /// them ([`Driver`]).
    pub member: Driver<WriteWaiter, ReadWaiter>,
    /// What carrying out a `Ready` touches (the [`World`] side).
    pub fx: Effects,
    pub inputs: Receiver<Input>,
    /// Published after every turn (its applied index by the applier).
    pub status: Arc<watch::Sender<Status>>,
    pub tick: Duration,
    pub snapshot_count: u64,
    pub election_timeout: Duration,
}

/// The log storage, the key space and the links of a member: what its `Ready`s act on.
#[derive(Debug)]
pub struct Effects {
    pub disk: DiskStorage,
    pub mvcc: Arc<Mvcc>,
    pub peers: Peers,
    /// The witness of the applied configuration (it changes at run time).
    pub witness: Arc<WitnessSlot>,
    /// Where witness steps run: the peer thread's runtime (`super::peer_thread`).
    pub runtime: tokio::runtime::Handle,
    /// Where witness answers come back.
    pub feedback: Sender<Input>,
    pub metrics: Arc<Metrics>,
    /// Where applied changes go to the watchers.
    pub watches: WatchHub,
    pub lessor: Lessor,
    /// Applies committed entries on a thread of its own.
    pub applier: Applier,
    pub pending: Pending,
}

/// What the loop keeps besides client writes and reads (lost when the process stops).
#[derive(Debug, Default)]
pub struct Pending {
    /// Membership changes asked by clients here, by change id.
    member_waiters: HashMap<u64, oneshot::Sender<Result<(), EtcdError>>>,
    /// Lease questions forwarded to the leader, by context.
    lease_asks: HashMap<u64, oneshot::Sender<LeaseAnswer>>,
    /// Context of the next lease question.
    next_ctx: u64,
    /// The index of the last snapshot of the key space (taken or installed).
    last_snapshot: u64,
    /// Why the applier failed, once it did.
    apply_failed: Option<crate::mvcc::StoreError>,
    /// A member that refused this member's messages, as removed.
    removed_by: Option<NodeId>,
    /// The thread saving a snapshot of the key space, while it runs.
    snapshotting: Option<std::thread::JoinHandle<()>>,
    /// What it saved, or why it failed.
    snapshot_saved: Option<Result<SavedSnapshot, SnapshotError>>,
    /// The leader and term last logged (a change is logged once, as etcd does).
    seen_leader: (NodeId, u64),
    /// A change removing this member, asked while it led: it handed leadership over and
    /// forwards the change to the next leader until it is applied or the deadline passes.
    own_removal: Option<OwnRemoval>,
    /// Where this turn's time went so far.
    spent: Spent,
    /// Turns longer than the heartbeat interval, for their log.
    slow: SlowTurns,
}

/// Where a turn of the loop spent its time, for the log of a slow one.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    /// Writing the WAL and fsyncing it.
    wal: Duration,
    /// Handing committed entries to the applier (the loop waits once it is 256 batches
    /// behind) and waiting for it to catch up (before a membership change goes on, before a
    /// snapshot of the leader's is installed).
    applier: Duration,
    /// Installing the leader's snapshot of the key space, and starting a snapshot of its own.
    snapshot: Duration,
}

/// The turns longer than the heartbeat interval since the last one logged.
#[derive(Debug, Default)]
struct SlowTurns {
    /// When the last one was logged, and how long it took.
    logged: Option<(Instant, Duration)>,
    since: u64,
    /// The loop thread's CPU time when the last turn ended: a turn's own CPU time is the
    /// difference at its end (the wait for inputs between turns costs next to none).
    cpu_at_turn_end: Duration,
}

/// The CPU time the calling thread has used (zero where the clock cannot be read).
fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// A slow turn is logged at most this often (the count of the others goes with it: a disk too
/// slow for the WAL makes every turn slow), unless it took more than twice the last one logged.
const SLOW_TURN_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long a leader asked to remove itself keeps forwarding the change (the client's own wait
/// is the request timeout).
const OWN_REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// How often it forwards the change again: a new leader refuses a change until it has heard
/// from enough members to pass the strict reconfiguration check, which takes a heartbeat or two.
const OWN_REMOVAL_RETRY: Duration = Duration::from_millis(200);

/// A removal of this member that it hands to the next leader.
#[derive(Debug)]
struct OwnRemoval {
    change: Vec<u8>,
    deadline: Instant,
    sent: Option<Instant>,
}

/// Expired leases revoked per second at most (etcd's `leaseRevokeRate`): a mass expiry becomes
/// a steady stream of revokes instead of a burst of entries that holds up the writes.
const LEASE_REVOKE_RATE: u128 = 1000;

/// Why the Raft loop stopped: this member's own storage failed. Nothing more is acknowledged;
/// what was acknowledged is durable (the caller says so, and stops the member).
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("the Raft log: {0}")]
    Log(#[from] crate::storage::StorageError),
    #[error("the key space: {0}")]
    KeySpace(#[from] crate::mvcc::StoreError),
    #[error("a snapshot of the key space: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("applying to the key space: {0}")]
    Applier(#[from] ApplierError),
    /// Not a storage failure: member `by` applied this member's removal and refuses its
    /// messages.
    #[error("member {by:x} refuses this member's messages: it was removed from the cluster")]
    Removed { by: NodeId },
}

/// Why the applier failed, or could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ApplierError {
    #[error(transparent)]
    KeySpace(#[from] crate::mvcc::StoreError),
    #[error("cannot start its thread: {0}")]
    Thread(std::io::Error),
    #[error("the applier stopped")]
    Stopped,
}

impl RaftLoop {
    /// Runs until [`Input::Stop`] or a storage failure (returned: the node must stop).
    pub fn run(mut self) -> Result<(), LoopError> {
        let stopped = self.turns();
        // (what was handed over is applied: the answers go out, the key space is current)
        self.fx.applier.stop();
        // (the snapshot thread holds the key space open: the member is stopped once it ends)
        if let Some(saving) = self.fx.pending.snapshotting.take() {
            let _ = saving.join();
        }
        stopped
    }

    fn turns(&mut self) -> Result<(), LoopError> {
        self.fx.pending.last_snapshot = self.fx.disk.snapshot().meta.index;
        self.fx.applier.restored(self.member.raft.applied());
        let mut next_id = rand::random::<u64>() >> 1;
        // Whether this member led at the end of the last turn (to notice it starts leading).
        let mut leading = false;
        let mut next_tick = Instant::now() + self.tick;
        self.fx.pending.slow.cpu_at_turn_end = thread_cpu_time();
        loop {
            let now = Instant::now();
            if now >= next_tick {
                self.member.tick();
                next_tick = now + self.tick;
                self.member.forget_closed();
                let pending = &mut self.fx.pending;
                pending.member_waiters.retain(|_, w| !w.is_closed());
                pending.lease_asks.retain(|_, w| !w.is_closed());
                self.revoke_expired();
            }
            match self
                .inputs
                .recv_timeout(next_tick.saturating_duration_since(now))
            {
                Ok(Input::Stop) => return Ok(()),
                Ok(input) => {
                    self.handle(&mut next_id, input);
                    // Take everything already queued: one fsync for the lot.
                    while let Ok(input) = self.inputs.try_recv() {
                        if matches!(input, Input::Stop) {
                            return Ok(());
                        }
                        self.handle(&mut next_id, input);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            if let Some(why) = self.fx.pending.apply_failed.take() {
                return Err(ApplierError::KeySpace(why).into());
            }
            if let Some(by) = self.fx.pending.removed_by {
                // A member that applied our removal holds every entry before it, and entries
                // after it commit without us: no entry is only here, retiring or not. A leader
                // hands over first; the word stays until it has. (Ignoring the word while
                // retiring left a removed leader running for good once the others stopped
                // talking to it: `cluster::the_leader_is_removed_through_a_follower`, 1 run in 3.)
                if self.member.raft.role() != Role::Leader {
                    return Err(LoopError::Removed { by });
                }
            }
            let turn = Instant::now();
            self.fx.pending.spent = Spent::default();
            let removed = self.member.turn(&mut self.fx)?;
            let snapshotting = Instant::now();
            self.maybe_snapshot()?;
            self.fx.pending.spent.snapshot += snapshotting.elapsed();
            let took = turn.elapsed();
            self.fx.metrics.loop_turn(took);
            let cpu = thread_cpu_time();
            let on_cpu = cpu.saturating_sub(self.fx.pending.slow.cpu_at_turn_end);
            self.fx.pending.slow.cpu_at_turn_end = cpu;
            if took > self.tick {
                self.slow_turn(took, on_cpu);
            }
            // The snapshot files hold the key space; the transport reads them when it sends.
            self.member.raft.release_snapshot_data();
            self.fx.disk.release_snapshot_data();
            let leads = self.member.raft.role() == Role::Leader;
            if leads && !leading {
                self.fx
                    .lessor
                    .promote(Instant::now(), self.election_timeout);
            }
            leading = leads;
            self.publish_status();
            if removed {
                tracing::warn!(
                    "this member was removed from the cluster; stopping (its data directory \
                     must not be started again)"
                );
                return Ok(());
            }
        }
    }

    /// Logs a turn longer than the heartbeat interval (at most once per
    /// [`SLOW_TURN_LOG_EVERY`], or one more than twice as long) with where its time went.
    /// This member's heartbeats, appends, acknowledgements and votes waited that long; a turn
    /// longer than the election timeout costs an election (etcd logs a leader's "failed to
    /// send out heartbeat on time").
    /// `on_cpu`: the loop thread's CPU time in the turn. A turn mostly off the CPU and not in
    /// the WAL waited for a core (an overloaded machine) or for the applier.
    fn slow_turn(&mut self, took: Duration, on_cpu: Duration) {
        let p = &mut self.fx.pending;
        p.slow.since += 1;
        let now = Instant::now();
        if p.slow.logged.is_some_and(|(at, last)| {
            now.duration_since(at) < SLOW_TURN_LOG_EVERY && took <= 2 * last
        }) {
            return;
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(
            took_ms = ms(took),
            on_cpu_ms = ms(on_cpu),
            heartbeat_interval_ms = ms(self.tick),
            wal_write_and_fsync_ms = ms(p.spent.wal),
            applier_ms = ms(p.spent.applier),
            snapshot_ms = ms(p.spent.snapshot),
            slow_turns = p.slow.since,
            "a turn of the Raft loop took longer than the heartbeat interval: this member's \
             heartbeats, appends and votes waited (slow_turns: how many since the last such \
             line); a disk too slow for the WAL, or an overloaded machine? (docs/operations.md, \
             \"A slow disk\")"
        );
        p.slow.logged = Some((now, took));
        p.slow.since = 0;
    }

    fn publish_status(&self) {
        let raft = &self.member.raft;
        let s = Status {
            leader: raft.leader(),
            term: raft.term(),
            commit: raft.commit(),
            // (the applier's to publish)
            applied: self.status.borrow().applied,
            is_leader: raft.role() == Role::Leader,
            commit_in_term: raft.log().term(raft.commit()) == Some(raft.term()),
            is_learner: raft.membership().learners.contains(&raft.id()),
            witness: raft.witness_caller(),
        };
        let proposals = &self.member.proposals;
        self.fx
            .metrics
            .turned(&s, proposals.waiting(), proposals.failed());
        let witness = raft.membership().witness();
        self.fx.metrics.set_leader_view(
            raft.leader_view()
                .map(|(subterm, rset)| (subterm, witness.is_some_and(|w| rset.contains(&w)))),
        );
        self.status.send_if_modified(|old| {
            let new = Status {
                applied: old.applied,
                ..s
            };
            let changed = *old != new;
            *old = new;
            changed
        });
    }

    /// One input; `next_id` numbers this member's proposals.
    fn handle(&mut self, next_id: &mut u64, input: Input) {
        let raft = &mut self.member.raft;
        match input {
            Input::Propose {
                mut proposal,
                reply,
            } => {
                *next_id = next_id.wrapping_add(1);
                proposal.id = *next_id;
                let data = proposal.encode_to_vec();
                self.member.submit(&mut self.fx, proposal.id, data, reply);
            }
            Input::ProposeMember { mut change, reply } => {
                *next_id = next_id.wrapping_add(1);
                change.id = *next_id;
                let data = change.encode_to_vec();
                if raft.role() == Role::Leader {
                    if let Err(e) = self.fx.propose_member(raft, data) {
                        let _ = reply.send(Err(e));
                        return;
                    }
                } else if raft.leader() != NONE {
                    self.fx
                        .peers
                        .send(raft.leader(), Envelope::ForwardMember(data));
                } else {
                    let _ = reply.send(Err(EtcdError::NO_LEADER));
                    return;
                }
                self.fx.pending.member_waiters.insert(change.id, reply);
            }
            Input::Read { reply } => self.member.read(reply),
            Input::TransferLeader { to, reply } => {
                let answer = match raft.transfer_leader(to) {
                    Ok(()) => Ok(()),
                    Err(Refused::NotLeader { .. }) => Err(EtcdError::NOT_LEADER),
                    Err(r @ (Refused::TransferToWitness { .. } | Refused::NotAVoter { .. })) => {
                        Err(EtcdError::new(
                            Code::FailedPrecondition,
                            format!("etcdserver: bad leader transferee: {r}"),
                        ))
                    }
                    Err(r) => Err(refused(&r)),
                };
                let _ = reply.send(answer);
            }
            Input::Lease { id, renew, reply } => {
                if raft.role() == Role::Leader {
                    let _ = reply.send(Ok(self.fx.answer_lease(id, renew)));
                } else if raft.leader() != NONE {
                    let pending = &mut self.fx.pending;
                    let ctx = pending.next_ctx;
                    pending.next_ctx += 1;
                    pending.lease_asks.insert(ctx, reply);
                    self.fx
                        .peers
                        .send(raft.leader(), Envelope::LeaseAsk { ctx, id, renew });
                } else {
                    let _ = reply.send(Err(EtcdError::NO_LEADER));
                }
            }
            Input::Peer { from, envelope } => {
                if let Envelope::Raft(m) = &envelope
                    && matches!(m.body, Body::HeartbeatResp { .. })
                {
                    self.fx.metrics.heartbeat_answered(from);
                }
                self.member.receive(&mut self.fx, from, envelope)
            }
            Input::Witness(r) => raft.step_witness(r),
            Input::SnapshotSaved(saved) => self.fx.pending.snapshot_saved = Some(saved),
            Input::LeasesApplied(changes) => {
                let now = Instant::now();
                for change in changes {
                    match change {
                        LeaseApplied::Granted { id, ttl } => self.fx.lessor.granted(id, ttl, now),
                        LeaseApplied::Revoked { id } => self.fx.lessor.revoked(id),
                    }
                }
            }
            Input::ApplyFailed(why) => self.fx.pending.apply_failed = Some(why),
            Input::RemovedByPeer { by } => self.fx.pending.removed_by = Some(by),
            Input::PeerDown { id } => {
                let following = raft.leader() == id && raft.role() == Role::Follower;
                raft.report_unreachable(id);
                if following && raft.role() != Role::Follower {
                    tracing::info!(
                        leader = format!("{id:x}"),
                        "a dial to the leader's peer port failed: campaigning without waiting for the election timeout"
                    );
                }
            }
            Input::SnapshotSent {
                to,
                index,
                delivered,
            } => {
                if delivered {
                    self.fx.metrics.snapshot_sent();
                } else {
                    self.fx.metrics.snapshot_send_failed();
                }
                raft.report_snapshot(to, index, delivered);
            }
            Input::Stop => {}
        }
    }

    /// On the leader: proposes the revoke of the expired leases, at most
    /// [`LEASE_REVOKE_RATE`] per second (at least one per tick).
    fn revoke_expired(&mut self) {
        if self.member.raft.role() != Role::Leader {
            return;
        }
        let per_tick = (LEASE_REVOKE_RATE * self.tick.as_millis() / 1000).max(1);
        let limit = usize::try_from(per_tick).unwrap_or(usize::MAX);
        for id in self
            .fx
            .lessor
            .expired(Instant::now(), 2 * self.election_timeout, limit)
        {
            let data = Proposal {
                id: 0,
                op: Some(Op::LeaseRevoke(PbLeaseRevokeRequest { id })),
            }
            .encode_to_vec();
            if let Err(r) = self.member.propose(data) {
                tracing::info!(lease = id, error = %r, "could not propose an expired lease's revoke");
            }
        }
    }

    /// Every `--snapshot-count` applied entries a snapshot in place: once the key space is
    /// durable at its index, a file that says so, and the log is compacted up to it (the key
    /// space file is the data: nothing is copied). When a follower needs a snapshot
    /// ([`Raft::snapshot_wanted`]), one with data: a dump of the key space, which the
    /// transport sends from its file. Both are saved by a thread of their own (a dump of a
    /// large key space takes seconds: the loop goes on meanwhile).
    fn maybe_snapshot(&mut self) -> Result<(), LoopError> {
        if let Some(saved) = self.fx.pending.snapshot_saved.take() {
            if let Some(saving) = self.fx.pending.snapshotting.take() {
                let _ = saving.join();
            }
            let SavedSnapshot { meta, in_place } = saved?;
            let snapshot = Snapshot {
                meta,
                data: bytes::Bytes::new(),
            };
            let raft = &mut self.member.raft;
            let compacted = if in_place {
                raft.compact_in_place(snapshot.meta.clone())
            } else {
                raft.compact_with(snapshot.clone())
            };
            if compacted {
                self.fx.disk.adopt(&snapshot)?;
                self.fx.pending.last_snapshot = snapshot.meta.index;
                tracing::info!(
                    index = snapshot.meta.index,
                    in_place,
                    "saved snapshot, compacted the log"
                );
            }
        }
        let applied = self.member.raft.applied();
        let wanted = self.member.raft.snapshot_wanted();
        // (a dump taken for a follower that has caught up: a snapshot in place replaces it,
        // rather than the key space's copy staying beside it until the next one)
        let outlived = self.member.raft.snapshot_outlived();
        let pending = &mut self.fx.pending;
        if pending.snapshotting.is_some()
            || (applied < pending.last_snapshot + self.snapshot_count && !wanted && !outlived)
        {
            return Ok(());
        }
        let Some(meta) = self.member.raft.snapshot_meta() else {
            return Ok(());
        };
        if wanted {
            tracing::info!(
                index = meta.index,
                "a follower needs entries older than this member keeps in memory: taking a snapshot for it"
            );
        }
        // The thread takes the key space as the applier leaves it at `meta` (everything
        // handed over so far, nothing after): the applier tells it when it gets there, and
        // waits only until a dump's view is open. The loop does not wait at all.
        let (mvcc, snaps) = (self.fx.mvcc.clone(), self.fx.disk.snap_files());
        let feedback = self.fx.feedback.clone();
        let (reached_tx, reached) = std::sync::mpsc::sync_channel(1);
        let (opened_tx, opened) = std::sync::mpsc::sync_channel(1);
        let (synced_tx, synced) = std::sync::mpsc::sync_channel(1);
        // (the log is compacted behind a durable key space only)
        let durable = move || {
            synced
                .recv()
                .map_err(|_| SnapshotError::ApplierStopped("the key space was durable"))
        };
        let in_place = !wanted;
        let saving = std::thread::Builder::new()
            .name("snapshot".into())
            .spawn(move || {
                let saved = if reached.recv().is_err() {
                    Err(SnapshotError::ApplierStopped(
                        "it reached the snapshot's index",
                    ))
                } else if in_place {
                    let _ = opened_tx.send(());
                    durable().and_then(|()| {
                        crate::crash!("snapshot-before-save");
                        Ok(save_in_place(&snaps, &meta)?)
                    })
                } else {
                    // The dump goes straight into the file: memory does not grow with the key
                    // space.
                    save_streamed(&snaps, &meta, |out| {
                        let fixed = || {
                            let _ = opened_tx.send(());
                            crate::crash!("snapshot-before-save");
                        };
                        mvcc.dump_to(out, fixed)
                            .map(drop)
                            .map_err(std::io::Error::other)
                    })
                    .map_err(SnapshotError::from)
                    .and_then(|()| durable())
                };
                let saved = saved.map(|()| SavedSnapshot { meta, in_place });
                let _ = feedback.send(Input::SnapshotSaved(saved));
            })
            .map_err(SnapshotError::Thread)?;
        self.fx
            .applier
            .snapshot_here(reached_tx, opened, synced_tx)?;
        pending.snapshotting = Some(saving);
        Ok(())
    }
}

impl Effects {
    /// [`World::install`]'s work once the applier has caught up.
    fn install_applied(&mut self, snapshot: &Snapshot) -> Result<(), LoopError> {
        // (received, its data is in its file: read a piece at a time)
        let data = DataReader::open(self.disk.snap_dir(), &snapshot.meta)
            .map_err(SnapshotError::Reading)?;
        if data.data_len == 0 {
            return Ok(()); // (a new member's empty starting point)
        }
        // (a crash here: the snapshot is this member's, the key space is restored at start)
        crate::crash!("install-before-restore");
        self.mvcc.restore(
            std::io::BufReader::new(data),
            snapshot.meta.index,
            Commits::One,
        )?;
        // The key space is durable at the snapshot's index (a restore commits durably): the
        // dump is not needed any more, a snapshot in place replaces it (the Raft core does not
        // send a received snapshot on).
        save_in_place(&self.disk.snap_files(), &snapshot.meta)?;
        self.applier.restored(snapshot.meta.index);
        self.pending.last_snapshot = snapshot.meta.index;
        let revision = self.mvcc.position()?.revision;
        self.watches.reset(revision);
        let leases = self.mvcc.leases()?;
        self.lessor = Lessor::load(&leases, Instant::now());
        self.metrics.snapshot_received();
        self.follow_members()?;
        tracing::info!(
            index = snapshot.meta.index,
            "installed the leader's snapshot of the key space"
        );
        Ok(())
    }

    /// [`World::apply`]'s work.
    fn hand_to_applier(
        &mut self,
        committed: &[Entry],
        writes: &mut Proposals<WriteWaiter>,
    ) -> Result<(), LoopError> {
        if committed.is_empty() {
            return Ok(());
        }
        let batch: Vec<(u64, Command)> =
            committed.iter().map(|e| (e.index, command_of(e))).collect();
        let mut waiters = Vec::new();
        let mut members = Vec::new();
        for (at, (_, c)) in batch.iter().enumerate() {
            match c {
                Command::Kv(p) => waiters.extend(writes.applied(p.id).map(|w| (at, w))),
                Command::Member(c) => members.push(c.clone()),
                Command::Noop => {}
            }
        }
        self.applier.apply(batch, waiters)?;
        if !members.is_empty() {
            self.applier.barrier()?;
            for c in &members {
                self.member_changed(c);
            }
        }
        Ok(())
    }

    /// A keep-alive or time-to-live question, on the leader.
    fn answer_lease(&mut self, id: i64, renew: bool) -> Option<(i64, i64)> {
        let now = Instant::now();
        if renew {
            self.lessor.renew(id, now)?;
        }
        self.lessor.remaining(id, now)
    }

    /// Proposes the configuration change an encoded [`MemberChange`] asks for (leader only).
    fn propose_member(&mut self, raft: &mut Raft, data: Vec<u8>) -> Result<(), EtcdError> {
        let change = MemberChange::decode(data.as_slice())
            .map_err(|e| EtcdError::invalid(format!("membership change: {e}")))?;
        let Some(m) = &change.member else {
            return Err(EtcdError::invalid("membership change without a member"));
        };
        let kind = if change.remove {
            ChangeKind::Remove
        } else if regular_peer_url(m).is_none() {
            ChangeKind::AddWitness
        } else if m.is_learner {
            ChangeKind::AddLearner
        } else {
            ChangeKind::AddVoter
        };
        let cc = ConfChange {
            changes: vec![Change { kind, node: m.id }],
            witness_generation: change.witness_generation,
            context: data,
        };
        let usable = raft
            .membership()
            .witness()
            .is_some_and(|w| self.witness.usable(w));
        let refusal = |r| match r {
            Refused::InvalidConfChange(why) => {
                EtcdError::new(Code::FailedPrecondition, format!("etcdserver: {why}"))
            }
            other => refused(&other),
        };
        raft.check_reconfig_quorum(&cc, usable).map_err(refusal)?;
        if change.remove && m.id == raft.id() && raft.role() == Role::Leader {
            // etcd's leader proposes its own removal; this one hands leadership over first and
            // has the next leader propose it (docs/raft.md, "Removing the leader").
            let to = raft.hand_over_before_removal(&cc).map_err(refusal)?;
            tracing::info!(
                to = format!("{to:x}"),
                "asked to remove this member, the leader: handing leadership over first"
            );
            self.pending.own_removal = Some(OwnRemoval {
                change: cc.context,
                deadline: Instant::now() + OWN_REMOVAL_WAIT,
                sent: None,
            });
            return Ok(());
        }
        raft.propose_conf_change(cc).map(|_| ()).map_err(refusal)
    }

    /// After a membership change is applied here: answers its client, links to an added member,
    /// unlinks a removed one. Idempotent (replayed after a restart).
    fn member_changed(&mut self, c: &MemberChange) {
        if let Some(w) = self.pending.member_waiters.remove(&c.id) {
            let _ = w.send(Ok(()));
        }
        let Some(m) = &c.member else {
            return;
        };
        if c.remove {
            self.peers.remove(m.id);
        } else if let Some(url) = regular_peer_url(m) {
            self.peers.add(m.id, url);
        }
        if regular_peer_url(m).is_none() {
            self.follow_witness();
        }
    }

    /// Points the witness slot at the witness of the applied member list.
    fn follow_witness(&self) {
        match self.mvcc.members() {
            Ok(members) => self.witness.follow(&members),
            Err(e) => tracing::error!(error = %e, "reading the member list to follow the witness"),
        }
    }

    /// After a snapshot replaced the member list: links to every member it names, none to the
    /// others (entries after the snapshot change them further). A snapshot older than this
    /// member's own addition does not name it, so it says nothing about a removal.
    fn follow_members(&mut self) -> Result<(), LoopError> {
        let members = self.mvcc.members()?;
        self.witness.follow(&members);
        self.peers.retain(|id| members.iter().any(|m| m.id == id));
        for m in &members {
            if let Some(url) = regular_peer_url(m) {
                self.peers.add(m.id, url);
            }
        }
        Ok(())
    }

    /// The other regular members, by name, for messages ("infra1" or "infra1, infra3").
    fn others_named(&self, raft: &Raft) -> String {
        let me = raft.id();
        let voters = &raft.membership().voters.regular;
        let members = self.mvcc.members().unwrap_or_default();
        let names: Vec<String> = voters
            .iter()
            .filter(|&&id| id != me)
            .map(|&id| match members.iter().find(|m| m.id == id) {
                Some(m) if !m.name.is_empty() => format!("member {} ({id:x})", m.name),
                _ => format!("member {id:x}"),
            })
            .collect();
        if names.is_empty() {
            "the other members".into()
        } else {
            names.join(", ")
        }
    }

    /// Runs a witness step against this node's witness storage; the answer comes back as input.
    fn run_witness_step(&self, raft: &Raft, request: WitnessRequest) {
        let feedback = self.feedback.clone();
        let slot = self.witness.clone();
        let id = request.witness_id();
        let metrics = self.metrics.clone();
        let seen = request.caller().seen;
        let others = self.others_named(raft);
        let io = match slot.begin_io() {
            Ok(permit) => permit,
            Err(why) => {
                metrics.witness_unavailable(why.to_string());
                let _ = feedback.send(Input::Witness(WitnessResponse::Failed { request }));
                return;
            }
        };
        self.runtime.spawn(async move {
            // (held until the step returns, however long a hung share takes)
            let _io = io;
            // (opening the storage may block: a stat of the mount, the SAS file)
            let got = tokio::task::spawn_blocking(move || slot.get()).await.ok().flatten();
            let witness = match got {
                Some((w, Ok(client))) if w == id => client,
                Some((w, Err(why))) if w == id => {
                    metrics.witness_unavailable(why.to_string());
                    let _ = feedback.send(Input::Witness(WitnessResponse::Failed { request }));
                    return;
                }
                // The witness left the configuration meanwhile.
                _ => {
                    let _ = feedback.send(Input::Witness(WitnessResponse::Failed { request }));
                    return;
                }
            };
            let name = match &request {
                WitnessRequest::Append(_) => "append",
                WitnessRequest::Vote { pre: true, .. } => "pre-vote",
                WitnessRequest::Vote { pre: false, .. } => "vote",
                WitnessRequest::ReadTerm { .. } => "read-term",
            };
            let started = Instant::now();
            let stepped = witness
                .step(name, |state, location| apply_rule(state, &request, location))
                .await
                .map_err(|e| e.for_member(&seen));
            metrics.witness_step(name, started.elapsed(), &stepped);
            let response = match stepped {
                Ok(s) => {
                    tracing::debug!(step = name, reply = ?s.reply, "witness step");
                    if let Some(why) = refused_as_behind(&s.reply, &others) {
                        tracing::warn!("{why}");
                        metrics.witness_unavailable(why);
                    }
                    s.reply
                }
                Err(e) => {
                    tracing::warn!(witness = format!("{id:x}"), step = name, error = %e, "witness step failed");
                    WitnessResponse::Failed { request }
                }
            };
            let _ = feedback.send(Input::Witness(response));
        });
    }
}

impl World for Effects {
    type Error = LoopError;
    type Write = WriteWaiter;

    fn send_raft(&mut self, _: &Raft, messages: &[Message]) {
        for m in messages {
            if matches!(m.body, Body::Heartbeat { .. }) {
                self.metrics.heartbeat_sent(m.to);
            }
            self.peers.send(m.to, Envelope::Raft(m.clone()));
        }
    }

    fn send(&mut self, to: NodeId, envelope: Envelope) {
        self.peers.send(to, envelope);
    }

    fn persist(&mut self, _: &Raft, ready: &Ready) -> Result<(), LoopError> {
        let started = Instant::now();
        let synced = self.disk.persist(ready)?;
        let took = started.elapsed();
        self.pending.spent.wal += took;
        if synced {
            self.metrics.wal_fsync(took);
        }
        Ok(())
    }

    fn step_witness(&mut self, raft: &Raft, request: WitnessRequest) {
        self.run_witness_step(raft, request);
    }

    fn install(&mut self, _: &Raft, snapshot: &Snapshot) -> Result<(), LoopError> {
        // (what was handed over before the snapshot is applied first: then it is replaced)
        let waiting = Instant::now();
        self.applier.barrier()?;
        self.pending.spent.applier += waiting.elapsed();
        let installing = Instant::now();
        let installed = self.install_applied(snapshot);
        self.pending.spent.snapshot += installing.elapsed();
        installed
    }

    /// Hands committed entries, with the waiters of the client writes among them, to the
    /// applier. A membership change is applied before the loop goes on: the links and the
    /// witness follow the key space's member list.
    fn apply(
        &mut self,
        _: &Raft,
        committed: &[Entry],
        writes: &mut Proposals<WriteWaiter>,
    ) -> Result<(), LoopError> {
        let handing = Instant::now();
        let handed = self.hand_to_applier(committed, writes);
        self.pending.spent.applier += handing.elapsed();
        handed
    }

    fn receive(&mut self, raft: &mut Raft, from: NodeId, envelope: Envelope) {
        match envelope {
            Envelope::ForwardMember(data) => {
                if let Err(e) = self.propose_member(raft, data) {
                    tracing::info!(error = %e, "refused a forwarded membership change");
                }
            }
            Envelope::LeaseAsk { ctx, id, renew } => {
                let leader = raft.role() == Role::Leader;
                let answer = if leader {
                    self.answer_lease(id, renew)
                } else {
                    None
                };
                let (ttl, granted) = answer.unwrap_or((-1, 0));
                self.peers.send(
                    from,
                    Envelope::LeaseAnswer {
                        ctx,
                        leader,
                        ttl,
                        granted,
                    },
                );
            }
            Envelope::LeaseAnswer {
                ctx,
                leader,
                ttl,
                granted,
            } => {
                if let Some(w) = self.pending.lease_asks.remove(&ctx) {
                    let _ = w.send(match (leader, ttl) {
                        (false, _) => Err(EtcdError::LEADER_CHANGED),
                        (true, -1) => Ok(None),
                        (true, _) => Ok(Some((ttl, granted))),
                    });
                }
            }
            // (the driver handles the others)
            Envelope::Raft(_)
            | Envelope::Forward { .. }
            | Envelope::ReadIndex { .. }
            | Envelope::ReadIndexResp { .. } => {}
        }
    }

    /// Logs a change of leader (once, as etcd does), and forwards this member's own removal
    /// to the leader it handed over to.
    fn after_ready(&mut self, raft: &Raft) {
        let seen = (raft.leader(), raft.term());
        if seen != self.pending.seen_leader {
            self.pending.seen_leader = seen;
            match seen.0 {
                NONE => tracing::info!(term = seen.1, "no leader"),
                id => tracing::info!(leader = format!("{id:x}"), term = seen.1, "leader elected"),
            }
        }
        if let Some(mut removal) = self.pending.own_removal.take() {
            let now = Instant::now();
            if !raft.membership().voters.contains(raft.id()) {
                return; // (applied)
            }
            if now >= removal.deadline {
                tracing::warn!(
                    waited = ?OWN_REMOVAL_WAIT,
                    "gave up this member's removal: no new leader took it"
                );
                return;
            }
            let due = removal.sent.is_none_or(|t| now >= t + OWN_REMOVAL_RETRY);
            if due && ![NONE, raft.id()].contains(&raft.leader()) {
                let forward = Envelope::ForwardMember(removal.change.clone());
                self.peers.send(raft.leader(), forward);
                removal.sent = Some(now);
            }
            self.pending.own_removal = Some(removal);
        }
    }
}

/// What applying a committed entry does to the key space. Data that does not decode was
/// refused by every member alike: a no-op.
pub fn command_of(e: &Entry) -> Command {
    let c = match &e.data {
        EntryData::Normal(d) => Proposal::decode(d.as_slice()).map(Command::Kv),
        EntryData::ConfChange(cc) => {
            MemberChange::decode(cc.context.as_slice()).map(Command::Member)
        }
        EntryData::Empty => Ok(Command::Noop),
    };
    c.unwrap_or(Command::Noop)
}

/// When the witness refused this member's vote because its log is behind what the witness
/// acknowledged (the known, correct unavailability of the design): what to tell the operator.
fn refused_as_behind(reply: &WitnessResponse, others: &str) -> Option<String> {
    let WitnessResponse::Vote {
        pre,
        request,
        reply,
        seen,
    } = reply
    else {
        return None;
    };
    let (Some(Refusal::LogBehind | Refusal::OutsideReplicationSet { .. }), false) =
        (reply.refusal, reply.granted)
    else {
        return None;
    };
    Some(format!(
        "the witness refused this member's {}vote: its log ends at term {} subterm {}, but the \
         witness acknowledged writes up to term {} subterm {} that only {others} holds; this \
         member cannot be elected without them (acknowledged writes would be lost). If \
         {others} is down, start it again; if it runs, it leads and this member has not heard \
         from it yet: check the network between the two (this member follows as soon as its \
         messages arrive). This is expected and safe; do not wipe this member or force a new \
         cluster from it (docs/operations.md, \"What happens when something fails\": one \
         member and the witness are up, but no leader)",
        if *pre { "pre-" } else { "" },
        request.last_log_term,
        request.last_log_subterm,
        seen.log_term,
        seen.log_subterm,
    ))
}
