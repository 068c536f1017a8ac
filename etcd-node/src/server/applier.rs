//! The key space's applier: a thread of its own that applies the entries the Raft loop hands it,
//! in the order committed, answers the clients of the writes among them, and publishes what
//! changed (to the watchers, the lessor, and the applied index readers wait for).
//!
//! So the Raft loop does not wait for the key space: it goes on replicating, fsyncing its WAL
//! and voting while a batch is applied, including the durable commits of the key space, which
//! take a few hundred milliseconds with a large key space.
//!
//! Batches are committed without an fsync (the WAL holds every acknowledged write), and a few
//! at a time: the key space keeps its transaction open for the next batches a few
//! milliseconds, and any reader commits it first ([`Mvcc::apply`]). The key
//! space is made durable once `--backend-batch-limit` entries ([`SYNC_EVERY`](crate::config::SYNC_EVERY) by default),
//! [`SYNC_AFTER_COMMITS`] commits or, when it is set, `--backend-batch-interval` have gone by
//! since it last was, whichever comes first, and after the answers of the batch that reached it
//! are sent: no client waits for that fsync unless its entry comes in while it runs.
//!
//! The queue between the loop and the applier is bounded ([`QUEUE`] batches): a key space that
//! cannot keep up slows the loop down instead of filling memory.
//!
//! Batches that queued up while the applier was busy are applied together, in one transaction
//! ([`MERGE`] entries at most): a key space that fell behind catches up with fewer commits.
//!
//! Invariants:
//! - entries are applied in index order, each once (the key space skips what it applied before
//!   a restart);
//! - a client's write is answered after its entry is applied, with its result; the applied index
//!   readers wait for ([`Status::applied`]) is published before the answers, so a read that
//!   follows an answered write sees it;
//! - the lessor learns of a grant or a revoke (an input to the loop) before the client of that
//!   grant is answered and before watchers see its events: a keep-alive sent after the answer
//!   finds the lease, and a TimeToLive asked on seeing a revoke's deletions finds it gone;
//! - [`Applier::barrier`] returns once everything handed over is applied: the loop calls it
//!   before what reads the key space as of the Raft applied index (a membership change's links,
//!   installing a leader's snapshot);
//! - a snapshot of the key space is dumped as the applier leaves it at the snapshot's index
//!   ([`Applier::snapshot_here`]), without the loop waiting;
//! - a failure of the key space stops the applier and, through [`Input::ApplyFailed`], the
//!   member: nothing is acknowledged after it.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::contract::{Input, LeaseApplied, Status};
use super::metrics::Metrics;
use super::node::{ApplierError, LoopError, WriteWaiter};
use super::reads::Waiter as _;
use super::watch_hub::WatchHub;
use crate::config::SyncPolicy;
use crate::errors::EtcdError;
use crate::mvcc::{Command, Mvcc, Op, Outcome, StoreError};

/// Batches handed over and not applied yet, at most.
const QUEUE: usize = 256;

/// Entries applied in one transaction, at most, when batches queued behind each other are
/// merged (a merged batch reaches a little past it: batches are not split).
const MERGE: usize = 1024;

/// An applied batch slower than this is logged (etcd's "apply request took too long").
const SLOW_APPLY: Duration = Duration::from_millis(100);

/// Commits without an fsync after which the key space is made durable, whatever
/// `--backend-batch-limit` says. redb reuses the pages a commit frees only after the next
/// durable commit, so the file grows with the commits between two of those, not with the
/// entries: under puts alone the applier commits every few dozen entries (about 200 commits per
/// 10,000), but when reads come between the writes each read commits what the applier holds,
/// every 5 entries or so, and 10,000 entries made 2,000 commits. After 200,000 puts, 24,000
/// more among 96,000 gets grew `kv.redb` by 24 MB without this bound and by 11 with it, the
/// latency unchanged; a bound of 256 matched etcd's file but tripled the p99 of a load of half
/// puts and half gets (docs/runs/benchmarks-2026-12-01.md, "The key-space file under reads").
pub const SYNC_AFTER_COMMITS: u64 = 1024;

/// A durable commit slower than this is logged (as etcd logs a slow WAL fsync): one every
/// `--backend-batch-interval` would flood the log at [`SLOW_APPLY`] on a slow disk.
const SLOW_SYNC: Duration = Duration::from_secs(1);

/// What the loop hands the applier.
enum Work {
    /// Committed entries, and the waiters of the client writes among them (by position).
    Apply {
        batch: Vec<(u64, Command)>,
        waiters: Vec<(usize, WriteWaiter)>,
    },
    /// Answered once everything before it is applied.
    Barrier { done: SyncSender<()> },
    /// A snapshot is taken here: `reached` tells its thread the key space is there; the
    /// applier goes on once `opened` says the thread's view of it is fixed, then makes the key
    /// space durable and says so on `synced`.
    Snapshot {
        reached: SyncSender<()>,
        opened: Receiver<()>,
        synced: SyncSender<()>,
    },
}

/// The loop's handle on the applier thread.
#[derive(Debug)]
pub struct Applier {
    work: Option<SyncSender<Work>>,
    thread: Option<JoinHandle<()>>,
    status: Arc<watch::Sender<Status>>,
}

/// What the applier thread owns.
struct Thread {
    mvcc: Arc<Mvcc>,
    watches: WatchHub,
    status: Arc<watch::Sender<Status>>,
    feedback: Sender<Input>,
    /// Entries applied since the key space was last made durable.
    unsynced: u64,
    /// When the oldest of them was applied.
    unsynced_since: Instant,
    sync: SyncPolicy,
}

impl Applier {
    /// Starts the applier of `mvcc`; `status` gets the applied index, `feedback` (the loop's
    /// inputs) the lease changes and a failure, `metrics` the key space's commits; the key
    /// space is made durable as `sync` says.
    pub fn start(
        mvcc: Arc<Mvcc>,
        watches: WatchHub,
        metrics: Arc<Metrics>,
        status: Arc<watch::Sender<Status>>,
        feedback: Sender<Input>,
        sync: SyncPolicy,
    ) -> Result<Applier, LoopError> {
        let (work, queue) = sync_channel(QUEUE);
        mvcc.observe_commits(move |took| metrics.backend_commit(took));
        let mut t = Thread {
            mvcc,
            watches,
            status: status.clone(),
            feedback,
            unsynced: 0,
            unsynced_since: Instant::now(),
            sync: SyncPolicy {
                every: sync.every.max(1),
                ..sync
            },
        };
        let thread = std::thread::Builder::new()
            .name("apply".into())
            .spawn(move || t.run(queue))
            .map_err(ApplierError::Thread)?;
        Ok(Applier {
            work: Some(work),
            thread: Some(thread),
            status,
        })
    }

    fn send(&self, work: Work) -> Result<(), LoopError> {
        self.work
            .as_ref()
            .and_then(|w| w.send(work).ok())
            .ok_or(ApplierError::Stopped.into())
    }

    /// Hands over committed entries (waits while the queue is full).
    pub fn apply(
        &self,
        batch: Vec<(u64, Command)>,
        waiters: Vec<(usize, WriteWaiter)>,
    ) -> Result<(), LoopError> {
        self.send(Work::Apply { batch, waiters })
    }

    /// Returns once everything handed over is applied.
    pub fn barrier(&self) -> Result<(), LoopError> {
        let (done, wait) = sync_channel(1);
        self.send(Work::Barrier { done })?;
        wait.recv().map_err(|_| ApplierError::Stopped.into())
    }

    /// Has the snapshot thread of `reached` and `opened` dump the key space as it is once
    /// everything handed over so far is applied (the loop does not wait). Then the key space is
    /// made durable, off the loop, and `synced` says so: the thread reports the snapshot saved
    /// (and the loop compacts the log behind it) only after that.
    pub fn snapshot_here(
        &self,
        reached: SyncSender<()>,
        opened: Receiver<()>,
        synced: SyncSender<()>,
    ) -> Result<(), LoopError> {
        self.send(Work::Snapshot {
            reached,
            opened,
            synced,
        })
    }

    /// The key space was replaced up to `index` (a snapshot installed; the applier is idle).
    pub fn restored(&self, index: u64) {
        publish_applied(&self.status, index);
    }

    /// Applies what is queued, then stops the thread.
    pub fn stop(&mut self) {
        self.work = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Publishes `index` as the applied index (never backwards).
pub fn publish_applied(status: &watch::Sender<Status>, index: u64) {
    status.send_if_modified(|s| {
        let moved = index > s.applied;
        s.applied = s.applied.max(index);
        moved
    });
}

/// Appends to `batch` (and `waiters`) the batches queued behind it, up to [`MERGE`] entries, so
/// a key space that fell behind catches up in fewer, larger transactions (each costs a commit
/// and a copy of the pages it changes, whatever its size). Returns the first other work taken.
fn merge_queued(
    queue: &Receiver<Work>,
    batch: &mut Vec<(u64, Command)>,
    waiters: &mut Vec<(usize, WriteWaiter)>,
) -> Option<Work> {
    while batch.len() < MERGE {
        match queue.try_recv() {
            Ok(Work::Apply {
                batch: more,
                waiters: theirs,
            }) => {
                let base = batch.len();
                waiters.extend(theirs.into_iter().map(|(at, w)| (base + at, w)));
                batch.extend(more);
            }
            Ok(other) => return Some(other),
            Err(_) => return None,
        }
    }
    None
}

impl Thread {
    fn run(&mut self, queue: Receiver<Work>) {
        if let Err(why) = self.serve(&queue) {
            tracing::error!(error = %why, "applying to the key space failed");
            let _ = self.feedback.send(Input::ApplyFailed(why));
        }
    }

    /// Does the work handed over until the loop lets go of the queue.
    fn serve(&mut self, queue: &Receiver<Work>) -> Result<(), StoreError> {
        // (work taken from the queue while merging batches, and not a batch)
        let mut next = None;
        loop {
            let work = match next.take() {
                Some(work) => work,
                None => match self.next_work(queue)? {
                    Some(work) => work,
                    None => return Ok(()),
                },
            };
            match work {
                Work::Apply {
                    mut batch,
                    mut waiters,
                } => {
                    next = merge_queued(queue, &mut batch, &mut waiters);
                    self.apply(batch, waiters)?;
                }
                Work::Barrier { done } => {
                    let _ = done.send(());
                }
                Work::Snapshot {
                    reached,
                    opened,
                    synced,
                } => {
                    // (an error: the thread failed, and says so to the loop)
                    if reached.send(()).is_ok() {
                        let _ = opened.recv();
                    }
                    self.make_durable()?;
                    let _ = synced.send(());
                }
            }
        }
    }

    /// The next work handed over (`None`: the loop let go of the queue). While applied entries
    /// wait for a durable commit, none comes before their interval runs out: the key space is
    /// made durable then, as etcd commits its backend on a quiet cluster too.
    fn next_work(&mut self, queue: &Receiver<Work>) -> Result<Option<Work>, StoreError> {
        loop {
            let Some(interval) = self.sync.interval.filter(|_| self.unsynced > 0) else {
                return Ok(queue.recv().ok());
            };
            let left = interval.saturating_sub(self.unsynced_since.elapsed());
            match queue.recv_timeout(left) {
                Ok(work) => return Ok(Some(work)),
                Err(RecvTimeoutError::Timeout) => self.make_durable()?,
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Commits the key space with an fsync: what was applied before survives a crash without
    /// the WAL's entries being applied again.
    fn make_durable(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        self.mvcc.sync()?;
        let took = started.elapsed();
        if took > SLOW_SYNC {
            tracing::warn!(
                took = ?took,
                entries = self.unsynced,
                "making the key space durable took too long (disk slow or overloaded?)"
            );
        }
        self.unsynced = 0;
        Ok(())
    }

    fn apply(
        &mut self,
        batch: Vec<(u64, Command)>,
        waiters: Vec<(usize, WriteWaiter)>,
    ) -> Result<(), StoreError> {
        let Some(&(last, _)) = batch.last() else {
            return Ok(());
        };
        let started = Instant::now();
        let outcome = self.mvcc.apply(&batch, false)?;
        let took = started.elapsed();
        if took > SLOW_APPLY {
            tracing::warn!(
                took = ?took,
                entries = batch.len(),
                "applying a batch took too long (disk slow or overloaded?)"
            );
        }
        let Outcome {
            results,
            events,
            revision,
        } = outcome;
        let leases: Vec<LeaseApplied> = batch
            .iter()
            .zip(&results)
            .filter_map(|((_, c), r)| match (c, r) {
                (Command::Kv(p), Some(Ok(_))) => match &p.op {
                    Some(Op::LeaseGrant(g)) => Some(LeaseApplied::Granted {
                        id: g.id,
                        ttl: g.ttl,
                    }),
                    Some(Op::LeaseRevoke(v)) => Some(LeaseApplied::Revoked { id: v.id }),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        if !leases.is_empty() {
            let _ = self.feedback.send(Input::LeasesApplied(leases));
        }
        // (after the lessor's input: a client that acts on a revoke's events, asking for the
        // lease's TTL, finds its question queued behind the revoke and hears the lease is gone)
        self.watches.publish(events, revision);
        publish_applied(&self.status, last);
        let mut results: Vec<_> = results.into_iter().map(Some).collect();
        for (at, waiter) in waiters {
            // (no result: the entry was applied before a restart, which no waiter here saw)
            let result = results.get_mut(at).and_then(Option::take).flatten();
            waiter.answer(result.unwrap_or(Err(EtcdError::TIMEOUT)));
        }
        // (after the answers: the fsync holds up only the entries that come in while it runs)
        if self.unsynced == 0 {
            self.unsynced_since = started;
        }
        self.unsynced += batch.len() as u64;
        let waited = self.unsynced_since.elapsed();
        if self.unsynced >= self.sync.every
            || self.sync.interval.is_some_and(|i| waited >= i)
            || self.mvcc.unsynced_commits() >= SYNC_AFTER_COMMITS
        {
            self.make_durable()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn entries(indexes: std::ops::RangeInclusive<u64>) -> Vec<(u64, Command)> {
        indexes.map(|i| (i, Command::Noop)).collect()
    }

    /// Reads between the batches commit each one: after [`SYNC_AFTER_COMMITS`] such commits
    /// the key space is made durable, although `--backend-batch-limit` is far off.
    #[test]
    fn many_commits_make_the_key_space_durable_before_the_batch_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mvcc = Arc::new(Mvcc::open(&dir.path().join("kv.redb")).unwrap());
        let (feedback, _inputs) = std::sync::mpsc::channel();
        let mut thread = Thread {
            mvcc: mvcc.clone(),
            watches: WatchHub::default(),
            status: Arc::new(watch::channel(Status::default()).0),
            feedback,
            unsynced: 0,
            unsynced_since: Instant::now(),
            sync: SyncPolicy {
                every: 1_000_000,
                interval: None,
            },
        };
        let put = |i: u64| {
            let op = Op::Put(etcd_client::proto::PbPutRequest {
                key: format!("k{i}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            });
            Command::Kv(crate::mvcc::Proposal {
                id: i,
                op: Some(op),
            })
        };
        let mut most = 0;
        for i in 1..=2 * SYNC_AFTER_COMMITS {
            thread.apply(vec![(i, put(i))], vec![]).unwrap();
            // (a reader commits what the applier holds)
            mvcc.position().unwrap();
            most = most.max(mvcc.unsynced_commits());
        }
        assert!(
            most <= SYNC_AFTER_COMMITS,
            "{most} commits without an fsync"
        );
        assert!(
            thread.unsynced < SYNC_AFTER_COMMITS,
            "{} entries not durable",
            thread.unsynced
        );
    }

    /// Batches queued behind each other become one, each waiter still at its own entry; a
    /// barrier (or a snapshot) is not merged past, and a full batch takes nothing more.
    #[test]
    fn queued_batches_merge_up_to_the_next_other_work() {
        let (work, queue) = sync_channel(8);
        let (first, first_answer) = oneshot::channel();
        let (second, mut second_answer) = oneshot::channel();
        let (third, mut third_answer) = oneshot::channel();
        let apply = |batch, waiters| Work::Apply { batch, waiters };
        let (done, _) = sync_channel(1);
        for w in [
            apply(entries(1..=3), vec![(0, first), (2, second)]),
            apply(entries(4..=5), vec![(1, third)]),
            Work::Barrier { done },
            apply(entries(6..=6), vec![]),
        ] {
            work.send(w).unwrap();
        }
        let Ok(Work::Apply {
            mut batch,
            mut waiters,
        }) = queue.recv()
        else {
            panic!("the first work is a batch");
        };
        let next = merge_queued(&queue, &mut batch, &mut waiters);
        assert!(
            matches!(next, Some(Work::Barrier { .. })),
            "stops at the barrier"
        );
        let indexes: Vec<u64> = batch.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, [1, 2, 3, 4, 5]);
        let at: Vec<usize> = waiters.iter().map(|(at, _)| *at).collect();
        assert_eq!(
            at,
            [0, 2, 4],
            "the second batch's waiter moved by its first's length"
        );
        // (the waiter at entry 4, index 5, is the second batch's)
        let (_, waiter) = waiters.pop().unwrap();
        waiter.send(Err(EtcdError::TIMEOUT)).unwrap();
        assert!(third_answer.try_recv().is_ok());
        assert!(second_answer.try_recv().is_err());
        assert!(first_answer.is_empty());

        let Ok(Work::Apply {
            batch: mut full, ..
        }) = queue.recv()
        else {
            panic!("the batch after the barrier stays queued");
        };
        full.extend(entries(100..=99 + MERGE as u64));
        work.send(apply(entries(7..=7), vec![])).unwrap();
        assert!(merge_queued(&queue, &mut full, &mut Vec::new()).is_none());
        assert_eq!(full.len(), MERGE + 1, "a full batch takes nothing more");
        assert!(
            queue.try_recv().is_ok(),
            "what it did not take stays queued"
        );
    }
}
