//! Starting and stopping a member: opens its storage (WAL, snapshots, key space), joins or
//! bootstraps the cluster, starts the Raft loop thread, the peer transport and the client API
//! on the client URLs (gRPC plus `/health` and `/metrics`), and stops them on shutdown.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use axum::routing::get;
use etcd_client::proto::PbMember;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;

use super::api::{self, Api};
use super::applier::Applier;
use super::contract::{self, Announced, Input, Status};
use super::driver::Driver;
use super::lessor::Lessor;
use super::metrics::Metrics;
use super::node::{Effects, LoopError, Pending, RaftLoop};
use super::peer::{self, Identity, MAX_FRAME_BYTES, PeerService, Peers};
use super::peer_thread::PeerThread;
use super::watch_hub::WatchHub;
use super::witness_probe;
use super::witness_slot::{Credentials, WitnessSlot};
use crate::config::{ClusterState, HttpUrl, PeerUrls, ServerConfig};
use crate::mvcc::{Commits, Mvcc};
use crate::raft::{self, KnownWitness, Membership, Raft, Storage};
use crate::storage::disk::{BootKeySpace, DiskStorage, save_in_place};
use crate::storage::snap::DataReader;
use crate::tls::{self, Dialer, ServerTls};
use crate::witness::{Unread, load_within};

/// Accepted connections without Nagle's algorithm: a small response must not wait for the
/// peer's delayed ACK (40-200 ms per request for a lone client otherwise).
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Binds every address of every URL of `flag`; each listener with whether it is TLS.
async fn bind(flag: &str, urls: &[HttpUrl]) -> anyhow::Result<Vec<(TcpListener, bool)>> {
    let mut listeners = Vec::new();
    for url in urls {
        let addrs: Vec<SocketAddr> = url.socket_addrs().map_err(anyhow::Error::msg)?;
        for addr in addrs {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("{flag} {}: cannot listen on {addr}", url.text))?;
            listeners.push((l, url.tls));
        }
    }
    Ok(listeners)
}

/// A member's TLS: what its TLS listeners serve, and how it dials other members.
#[derive(Debug)]
struct Tls {
    client: Option<Arc<ServerTls>>,
    peer: Option<Arc<ServerTls>>,
    client_dialer: Dialer,
    peer_dialer: Dialer,
}

/// Reads the certificates (making the auto-TLS ones first): a file that is missing or does
/// not fit refuses the start, naming its flag.
fn setup_tls(cfg: &ServerConfig) -> anyhow::Result<Tls> {
    let side = |side: &tls::Side, listen: &[&[HttpUrl]], advertise: &[HttpUrl]| {
        let mut side = side.clone();
        if side.auto_tls && side.cert_file.is_none() {
            let mut hosts: Vec<String> = listen
                .iter()
                .flat_map(|urls| urls.iter())
                .chain(advertise)
                .map(|u| u.host.clone())
                .collect();
            hosts.sort();
            hosts.dedup();
            let dir = cfg.data_dir.join("fixtures").join(side.name);
            let (cert, key) = tls::self_signed(&dir, &hosts, cfg.self_signed_cert_validity)
                .map_err(|e| anyhow::anyhow!("--{}auto-tls: {e}", side.prefix))?;
            (side.cert_file, side.key_file) = (Some(cert), Some(key));
        }
        anyhow::Ok(side)
    };
    let client = side(
        &cfg.client_tls,
        &[&cfg.listen_client_urls, &cfg.listen_metrics_urls],
        &cfg.advertise_client_urls,
    )?;
    let peer = side(
        &cfg.peer_tls,
        &[&cfg.listen_peer_urls],
        &cfg.initial_advertise_peer_urls,
    )?;
    let serves = |urls: &[&[HttpUrl]]| urls.iter().any(|u| u.iter().any(|u| u.tls));
    let policy = &cfg.tls_policy;
    let listener = |side: &tls::Side, alpn: &[&[u8]]| {
        ServerTls::new(side, policy, alpn, tls::RECHECK)
            .map(Arc::new)
            .map_err(anyhow::Error::msg)
    };
    Ok(Tls {
        client: serves(&[&cfg.listen_client_urls, &cfg.listen_metrics_urls])
            .then(|| listener(&client, &[b"h2", b"http/1.1"]))
            .transpose()?,
        peer: serves(&[&cfg.listen_peer_urls])
            .then(|| listener(&peer, &[b"h2"]))
            .transpose()?,
        client_dialer: Dialer::new(&client, policy, tls::RECHECK).map_err(anyhow::Error::msg)?,
        peer_dialer: Dialer::new(&peer, policy, tls::RECHECK).map_err(anyhow::Error::msg)?,
    })
}

/// The error of a key space file behind this member's snapshot in place: the file is not the
/// one that snapshot vouched for, and the WAL no longer holds what lies between.
fn behind_in_place(data_dir: &std::path::Path, applied: u64, index: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "the key space file {} has applied the log up to index {applied}, but this member's \
         snapshot says that file was durable at index {index}, and the WAL no longer holds \
         the entries between: the file was lost, or replaced by an older copy. Nothing was \
         changed. Put back the member's whole data directory from one backup (not the file \
         alone), or {}",
        data_dir.join("member/kv.redb").display(),
        replace_member(data_dir)
    )
}

/// How to replace a member whose data directory `data_dir` cannot be used (it receives the
/// leader's key space; the directory is kept, moved aside).
fn replace_member(data_dir: &std::path::Path) -> String {
    format!(
        "replace the member: move {} aside and follow \"Replacing a member whose machine is \
         gone\" in docs/operations.md (`etcdctl member add --learner`, start on an empty data \
         directory with --initial-cluster-state existing, promote, then remove the old id)",
        data_dir.display()
    )
}

/// The error of a key-space file that cannot be opened because it is damaged (`e`). A member
/// that never wrote its WAL (`never_started`: a crash in its first start) holds nothing else,
/// and its data directory may go; any other member's vote and log are in its WAL, which a key
/// space made afresh would not match, so the member is replaced or its directory put back.
fn damaged_key_space(
    data_dir: &std::path::Path,
    e: crate::mvcc::StoreError,
    never_started: bool,
) -> anyhow::Error {
    let advice = if never_started {
        format!(
            "nothing was ever written to this member's WAL (it never finished its first \
             start), so its data directory holds nothing a cluster needs: remove {} (and the \
             --wal-dir, if one is set) and start the member again with the flags of its first \
             start",
            data_dir.display()
        )
    } else {
        format!(
            "do not edit or remove the file alone: put back the member's whole data directory \
             from one backup, or {}",
            replace_member(data_dir)
        )
    };
    anyhow::anyhow!("{e}: the file is damaged or is not a key space; {advice}")
}

/// Refuses, before anything is read or changed, a start whose WAL directory is not the one
/// this data directory's member wrote its log to: a member started on its snapshot without its
/// log would have forgotten its vote and its acknowledged entries (a `--wal-dir` left out, or
/// changed, between two starts), and a member with a WAL in both places has two histories.
fn check_wal_location(cfg: &ServerConfig, member_dir: &std::path::Path) -> anyhow::Result<()> {
    let holds = |dir: &std::path::Path| {
        crate::storage::wal::holds_segments(dir)
            .with_context(|| format!("reading the WAL directory {}", dir.display()))
    };
    let (wal, default) = (&cfg.wal_dir, member_dir.join("wal"));
    if member_dir.is_dir() {
        crate::storage::lock_member_dir(member_dir)?;
    }
    for dir in [wal.as_path(), &default] {
        if dir.is_dir() {
            // (a member running on either: say so, rather than how to move its WAL)
            crate::storage::wal::lock_dir(dir)?;
        }
    }
    let here = holds(wal)?;
    let same = |a: &std::path::Path, b: &std::path::Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if *wal != default && !same(wal, &default) && holds(&default)? {
        if here {
            let copies = crate::storage::wal::same_segments(&default, wal).unwrap_or(false);
            let what = if copies {
                format!(
                    "they are copies of each other: you copied the WAL into --wal-dir, so \
                     remove {} and start again",
                    default.display()
                )
            } else {
                format!(
                    "they differ, so the member ran on each: keep the one it last ran with (the \
                     one `etcdutl wal dump --data-dir {} [--wal-dir {}]` shows further on, in \
                     its last entry and hard state) and move the other one out of the way",
                    cfg.data_dir.display(),
                    wal.display()
                )
            };
            bail!(
                "there is a WAL both in {} and in --wal-dir {}: this member has two logs. \
                 Nothing was changed. {what}",
                default.display(),
                wal.display()
            );
        }
        bail!(
            "this member's WAL is in {}, but --wal-dir names {}, which holds none. Nothing was \
             changed. To move the WAL there: with the member stopped, copy it (`mkdir -p '{}' \
             && cp -a '{}/.' '{}/' && sync`), remove {}, and start again; or leave --wal-dir out",
            default.display(),
            wal.display(),
            wal.display(),
            default.display(),
            wal.display(),
            default.display()
        );
    }
    // A member has state once its key space exists: its WAL's first segment is made durable
    // before the key-space file is created.
    let snap = member_dir.join("snap");
    let has_state = crate::storage::snap::holds_snapshot(&snap)
        .with_context(|| format!("reading the snapshot directory {}", snap.display()))?
        || member_dir.join("kv.redb").exists();
    if has_state && !here {
        bail!(
            "{} holds this member's state, but its WAL directory {} holds no WAL: the \
             member's log and vote are somewhere else. Nothing was changed. Start it with the \
             --wal-dir it last ran with (without --wal-dir the WAL is {}); if its WAL is lost, \
             replace the member: move {} aside and follow \"Replacing a member whose machine is \
             gone\" in docs/operations.md",
            cfg.data_dir.display(),
            wal.display(),
            default.display(),
            cfg.data_dir.display()
        );
    }
    if !has_state && here {
        let log = crate::storage::wal::read_only(wal)?.rec;
        if log.hard_state != Default::default() || !log.entries.is_empty() {
            bail!(
                "the WAL directory {} holds a member's log, but {} holds no member: the WAL \
                 belongs to a data directory that is gone. Nothing was changed. If the member \
                 is being replaced, move {} aside too (or give the new member another \
                 --wal-dir); if the data directory was moved, point --data-dir at it",
                wal.display(),
                cfg.data_dir.display(),
                wal.display()
            );
        }
    }
    Ok(())
}

/// This member's and its cluster's ids.
#[derive(Debug, Clone, Copy)]
struct Ids {
    member: u64,
    cluster: u64,
}

/// The member's storage, opened (bootstrapped for a new cluster, or set up to join a running
/// one), the ids it stores, and whether this start bootstrapped a new cluster.
async fn open_storage(
    cfg: &ServerConfig,
    dialer: &Dialer,
) -> anyhow::Result<(DiskStorage, Arc<Mvcc>, Ids, bool)> {
    let member_dir = cfg.data_dir.join("member");
    // (refusals first: a refused start creates nothing)
    if let Ok(why) = std::fs::read_to_string(member_dir.join(REMOVED_MARK)) {
        bail!("{why}");
    }
    check_wal_location(cfg, &member_dir)?;
    let data_dir_is_new = !cfg.data_dir.exists();
    std::fs::create_dir_all(&member_dir)
        .with_context(|| format!("--data-dir: cannot create {}", member_dir.display()))?;
    if data_dir_is_new {
        // Its entry in its parent, so that a power cut does not take the new data directory.
        if let Some(parent) = crate::storage::parent_dir(&cfg.data_dir) {
            crate::storage::sync_dir(parent)
                .with_context(|| format!("--data-dir: fsync of {}", parent.display()))?;
        }
    }
    let (mut disk, report) = DiskStorage::open(&member_dir, &cfg.wal_dir)?;
    if report.torn_bytes > 0 {
        tracing::warn!(
            bytes = report.torn_bytes,
            "discarded a torn WAL tail (a batch never acknowledged)"
        );
    }
    if report.unsynced_bytes > 0 {
        tracing::warn!(
            bytes = report.unsynced_bytes,
            "discarded the WAL bytes a failed fsync left unsynced (never acknowledged)"
        );
    }
    for s in &report.rejected_snapshots {
        tracing::warn!(snapshot = %s, "skipped a snapshot file that failed its checks");
    }
    let kv = member_dir.join("kv.redb");
    let kv_existed = kv.exists();
    let mvcc = match Mvcc::open_with_cache(&kv, cfg.backend_cache_bytes) {
        Ok(mvcc) => Arc::new(mvcc),
        Err(e) if e.damaged && kv_existed => {
            return Err(damaged_key_space(&cfg.data_dir, e, disk.is_empty()));
        }
        Err(e) => return Err(e.into()),
    };
    crate::storage::sync_member_dir(&member_dir)?;
    let bootstrapped_now = disk.is_empty();
    let applied = mvcc.position()?.applied;
    let snapshot = disk.snapshot().meta;
    if !bootstrapped_now
        && applied < snapshot.index
        && let Err(e) = DataReader::open(disk.snap_dir(), &snapshot)
        && e.kind() == std::io::ErrorKind::InvalidData
    {
        // (the data directory is left as it was found)
        drop(mvcc);
        if !kv_existed {
            let _ = std::fs::remove_file(&kv);
        }
        return Err(behind_in_place(&cfg.data_dir, applied, snapshot.index));
    }
    if bootstrapped_now {
        match cfg.initial_cluster_state {
            ClusterState::New => {
                // Everything is checked before anything is written: a start that fails here
                // leaves no bootstrapped data directory behind (the next start, with corrected
                // flags, bootstraps afresh).
                let membership = initial_membership(cfg)?;
                let witness = read_witness_at_bootstrap(cfg, cfg.cluster_id).await?;
                mvcc.seed_members(&initial_members(cfg))?;
                mvcc.set_identity(cfg.member_id, cfg.cluster_id)?;
                disk.bootstrap(membership, witness, BootKeySpace::Empty)?;
                tracing::info!(
                    members = cfg.initial_cluster.len(),
                    "bootstrapped a new cluster"
                );
            }
            ClusterState::Existing => {
                let (ids, members) = join(cfg, dialer).await?;
                mvcc.seed_members(&members)?;
                mvcc.set_identity(ids.member, ids.cluster)?;
                tracing::info!(
                    member = format!("{:x}", ids.member),
                    cluster = format!("{:x}", ids.cluster),
                    "joining a running cluster; waiting for the leader's snapshot"
                );
            }
        }
    }
    let ids = match mvcc.identity()? {
        (0, _) => {
            // A data directory from before the ids were stored: they are the flags' ones.
            mvcc.seed_members(&initial_members(cfg))?;
            mvcc.set_identity(cfg.member_id, cfg.cluster_id)?;
            Ids {
                member: cfg.member_id,
                cluster: cfg.cluster_id,
            }
        }
        (member, cluster) => Ids { member, cluster },
    };
    if !bootstrapped_now {
        warn_if_flags_ignored(cfg, &mvcc.members()?);
    }
    let snapshot = disk.snapshot();
    if mvcc.position()?.applied < snapshot.meta.index {
        // A crash between saving a received snapshot and restoring the key space from it.
        let data = DataReader::open(disk.snap_dir(), &snapshot.meta).with_context(|| {
            format!(
                "reading snapshot {} to restore the key space",
                snapshot.meta.index
            )
        })?;
        if data.data_len > 0 {
            mvcc.restore(
                std::io::BufReader::new(data),
                snapshot.meta.index,
                Commits::One,
            )?;
            // (durable there: the dump gives way to a snapshot in place, as after an install)
            save_in_place(&disk.snap_files(), &snapshot.meta)?;
        }
    }
    if cfg.force_new_cluster {
        if bootstrapped_now {
            bail!(
                "--force-new-cluster restarts an existing member from its data; {} holds none \
                 (point --data-dir at the member's data directory)",
                cfg.data_dir.display()
            );
        }
        super::force::force_new_cluster(&mut disk, &mvcc, ids.member, &credentials(cfg)).await?;
    }
    // Only a key space that has applied everything the log committed knows the final member
    // list (a member whose own addition is still to be replayed is not missing from it); a
    // removal still in the log stops the member when it is replayed.
    let (applied, commit) = (mvcc.position()?.applied, disk.hard_state().commit);
    let caught_up = applied >= commit;
    if !bootstrapped_now {
        // (the key space is durable every --backend-batch-limit entries; the WAL holds the rest)
        tracing::info!(
            applied,
            commit,
            to_apply_again = commit.saturating_sub(applied),
            "opened the key space: it applies the committed entries past its last durable commit"
        );
    }
    if !disk.is_empty() && caught_up && !mvcc.members()?.iter().any(|m| m.id == ids.member) {
        bail!(
            "member {:x} was removed from the cluster; its data directory {} must not be used \
             again (remove it, then `etcdctl member add` and start with \
             --initial-cluster-state existing to rejoin)",
            ids.member,
            cfg.data_dir.display()
        );
    }
    let new_cluster = bootstrapped_now && cfg.initial_cluster_state == ClusterState::New;
    Ok((disk, mvcc, ids, new_cluster))
}

/// The file that marks a data directory whose member was removed while it was away (its own
/// key space never applied the removal): the member refuses to start on it.
const REMOVED_MARK: &str = "removed";

/// Member `member` learned from member `by` that it was removed: marks its data directory so
/// that it is never started again, and says what to do.
fn removed(cfg: &ServerConfig, member: u64, by: u64) -> anyhow::Error {
    let why = format!(
        "member {member:x} was removed from the cluster (member {by:x} refuses its messages: {}); \
         its data directory {} must not be used again (remove it, then `etcdctl member add` and \
         start with --initial-cluster-state existing to rejoin)",
        super::peer::MEMBER_REMOVED,
        cfg.data_dir.display()
    );
    let mark = cfg.data_dir.join("member").join(REMOVED_MARK);
    let written = std::fs::File::create(&mark).and_then(|mut f| {
        std::io::Write::write_all(&mut f, why.as_bytes())?;
        f.sync_all()?;
        // The mark's name too: a power cut must not let the member start again.
        crate::storage::sync_dir(mark.parent().unwrap_or(&cfg.data_dir))
    });
    if let Err(e) = written {
        tracing::error!(path = %mark.display(), error = %e, "could not mark the data directory as removed");
    }
    anyhow::anyhow!(why)
}

/// A new member's first reading of the witness `--initial-cluster` names, before it writes
/// anything: the witness must be initialised, readable and not bound to another cluster. Its
/// generation is what the member is bound to from now on: a witness wiped and initialised again
/// later is refused (`witness_core::rules::check_history`).
pub(crate) async fn read_witness_at_bootstrap(
    cfg: &ServerConfig,
    cluster_id: u64,
) -> anyhow::Result<Option<KnownWitness>> {
    let Some((member, url)) = cfg.witness() else {
        return Ok(None);
    };
    let name = &member.name;
    let nothing_written = format!(
        "nothing was written to --data-dir {}; fix this and start again",
        cfg.data_dir.display()
    );
    let resolved = credentials(cfg)
        .resolve(url)
        .map_err(|e| anyhow::anyhow!("--initial-cluster {name}={url}: {e}; {nothing_written}"))?;
    let (location, loaded) = load_within(&resolved, BOOTSTRAP_WITNESS_TIMEOUT)
        .await
        .map_err(|unread| match unread {
            Unread::TimedOut { .. } => anyhow::anyhow!(
                "--initial-cluster {name}={url}: the witness storage did not answer within {:?} (share not mounted, blob host unreachable?); {nothing_written}",
                BOOTSTRAP_WITNESS_TIMEOUT
            ),
            Unread::Open(e) | Unread::Load(e) => anyhow::Error::from(e)
                .context(format!("--initial-cluster {name}={url}: {nothing_written}")),
        })?;
    let Some(loaded) = loaded else {
        bail!(
            "--initial-cluster {name}={url}: the witness is not initialised; initialise it once, before the cluster's first start: `etcdutl witness init --name {name} --advertise-peer-url '{url}'`; {nothing_written}"
        );
    };
    let state = loaded.state;
    if state.cluster_id != 0 && state.cluster_id != cluster_id {
        bail!(
            "--initial-cluster {name}={url}: {}; {nothing_written}",
            witness_core::Error::WrongCluster {
                location,
                stored: state.cluster_id,
                requested: cluster_id,
            }
        );
    }
    tracing::info!(
        witness = %name,
        generation = format!("{:x}", state.generation),
        "read the witness: this member is bound to its generation"
    );
    Ok(Some(KnownWitness {
        id: member.id,
        seen: witness_core::Seen::of(&state),
    }))
}

/// Opens the client API (`ready`) and logs etcd's "ready to serve client requests" once this
/// member has caught up with the cluster: a leader is known, an entry of its term is committed
/// (so everything committed before, every acknowledged write among it, is known committed
/// here) and applied. etcd serves its client API from the same point (after its member
/// attributes are committed through Raft); scripts and etcd's own test framework wait for that
/// line. Before it, a member restarted after a crash is still replaying its log into a key
/// space that went back to its last durable commit, and its recovered commit index may be older
/// than what it had acknowledged (the commit index is written without an fsync): its Status
/// and serializable reads would show a revision older than one a client already saw.
async fn announce_ready(mut status: watch::Receiver<Status>, ready: watch::Sender<bool>) {
    let caught_up = status
        .wait_for(|s| s.leader != raft::NONE && s.commit_in_term && s.applied >= s.commit)
        .await;
    if caught_up.is_ok() {
        ready.send_replace(true);
        tracing::info!("ready to serve client requests");
    }
}

/// Where this member finds its witness's SAS token (never in the replicated member list).
pub(crate) fn credentials(cfg: &ServerConfig) -> Credentials {
    Credentials {
        sas_file: cfg.witness_sas_file.clone(),
        initial: cfg.witness().map(|(_, u)| u.clone()),
    }
}

/// How long a new member waits for its first reading of the witness.
const BOOTSTRAP_WITNESS_TIMEOUT: Duration = Duration::from_secs(15);

/// A data directory's stored member list wins over `--initial-cluster` (as in etcd): when the
/// flag names other members or URLs, say so, and how to change the members, rather than let a
/// corrected flag be ignored in silence.
fn warn_if_flags_ignored(cfg: &ServerConfig, stored: &[PbMember]) {
    let urls = |members: &[PbMember]| -> BTreeSet<String> {
        members
            .iter()
            .flat_map(|m| {
                m.peer_ur_ls
                    .iter()
                    .map(|u| format!("{}={}", m.name, witness_core::url::redact(u)))
            })
            .collect()
    };
    let (flags, stored) = (urls(&initial_members(cfg)), urls(stored));
    let ignored: Vec<&String> = flags.difference(&stored).collect();
    if ignored.is_empty() {
        return;
    }
    tracing::warn!(
        "--data-dir {} already holds this member's data: its stored member list wins, and \
         --initial-cluster entries it does not hold ({}) are ignored, as etcd does. Change \
         members with `etcdctl member add|remove` (for the witness: docs/operations.md, \
         \"Moving or replacing the witness\"), or start from an empty --data-dir to bootstrap anew",
        cfg.data_dir.display(),
        ignored
            .iter()
            .map(|u| u.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The members `--initial-cluster` names, as the key space stores them.
pub(crate) fn initial_members(cfg: &ServerConfig) -> Vec<PbMember> {
    cfg.initial_cluster
        .iter()
        .map(|m| PbMember {
            id: m.id,
            name: m.name.clone(),
            peer_ur_ls: m.peer_texts.clone(),
            ..Default::default()
        })
        .collect()
}

/// The voters `--initial-cluster` names.
pub(crate) fn initial_membership(cfg: &ServerConfig) -> anyhow::Result<Membership> {
    let regular = cfg
        .initial_cluster
        .iter()
        .filter(|m| matches!(m.peer, PeerUrls::Regular(_)))
        .map(|m| m.id);
    let witness = cfg.witness().map(|(m, _)| m.id);
    Membership::new(regular, witness).map_err(|e| anyhow::anyhow!("--initial-cluster: {e}"))
}

/// For `--initial-cluster-state existing` on an empty data directory: asks the running members
/// named in `--initial-cluster` for the cluster's id and members, and finds this member among
/// them by its peer URLs (it must have been added with `etcdctl member add`).
async fn join(cfg: &ServerConfig, dialer: &Dialer) -> anyhow::Result<(Ids, Vec<PbMember>)> {
    let mine: BTreeSet<&str> = cfg
        .initial_advertise_peer_urls
        .iter()
        .map(|u| u.text.as_str())
        .collect();
    let mut tried = Vec::new();
    for m in &cfg.initial_cluster {
        let PeerUrls::Regular(urls) = &m.peer else {
            continue;
        };
        for url in urls.iter().filter(|u| !mine.contains(u.text.as_str())) {
            match peer::fetch_members(dialer, &url.text).await {
                Ok((cluster, members)) => {
                    let me = members.iter().find(|x| {
                        x.peer_ur_ls
                            .iter()
                            .map(String::as_str)
                            .collect::<BTreeSet<_>>()
                            == mine
                    });
                    let Some(me) = me else {
                        bail!(
                            "--initial-cluster-state existing: the cluster (asked at {}) has no \
                             member with peer URLs {}; add it first on a running member: \
                             etcdctl member add {} --peer-urls={}",
                            url.text,
                            mine.iter().copied().collect::<Vec<_>>().join(","),
                            cfg.name,
                            mine.iter().copied().collect::<Vec<_>>().join(",")
                        );
                    };
                    let ids = Ids {
                        member: me.id,
                        cluster,
                    };
                    return Ok((ids, members));
                }
                Err(e) => tried.push(format!("{} ({e})", url.text)),
            }
        }
    }
    bail!(
        "--initial-cluster-state existing: no running member named in --initial-cluster answered \
         (tried: {}); list the cluster's running members there, or use \
         --initial-cluster-state new for a new cluster",
        if tried.is_empty() {
            "none".to_string()
        } else {
            tried.join(", ")
        }
    )
}

/// Runs the member until `shutdown` completes or the Raft loop stops on a storage failure.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // Every port first: a port in use refuses the start before the data directory is touched.
    let peer_listeners = bind("--listen-peer-urls", &cfg.listen_peer_urls).await?;
    let client_listeners = bind("--listen-client-urls", &cfg.listen_client_urls).await?;
    let metrics_listeners = bind("--listen-metrics-urls", &cfg.listen_metrics_urls).await?;
    let tls = setup_tls(&cfg)?;
    let (mut disk, mvcc, ids, new_cluster) = open_storage(&cfg, &tls.peer_dialer).await?;
    let raft = Raft::new(raft_config(&cfg, ids.cluster, ids.member)?, &disk)?;
    // (the core has the log now: the storage keeps no second copy in memory)
    disk.release_entries();

    let members = mvcc.members()?;
    let own_client_urls: Vec<String> = cfg
        .advertise_client_urls
        .iter()
        .map(|u| u.text.clone())
        .collect();
    let me = Identity {
        cluster_id: ids.cluster,
        member_id: ids.member,
        client_urls: own_client_urls.clone(),
        name: cfg.name.clone(),
        dialer: tls.peer_dialer.clone(),
        attributes: crate::version::own_attributes(&cfg.feature_gates),
        refusals: peer::Refusals::default(),
        key_space: mvcc.clone(),
    };
    let peer_list: Vec<(u64, String)> = members
        .iter()
        .filter(|m| m.id != ids.member)
        .filter_map(|m| Some((m.id, contract::regular_peer_url(m)?.to_string())))
        .collect();
    // (the Raft traffic's runtime: the links, the peer listeners, the witness's storage)
    let peer_thread = PeerThread::start().context("starting the peer thread")?;
    let peer_runtime = peer_thread.handle().clone();
    let (inputs_tx, inputs_rx) = std::sync::mpsc::channel();
    let peers = Peers::start(
        &me,
        &peer_list,
        &peer_runtime,
        inputs_tx.clone(),
        disk.snap_dir(),
    );
    let snaps = disk.snap_files();
    let (status_tx, status_rx) = watch::channel(Status::default());
    let metrics = Arc::new(Metrics::default());
    let witness = Arc::new(WitnessSlot::new(metrics.clone(), credentials(&cfg)));
    witness.follow(&members);
    let client_urls = Arc::new(Mutex::new(Default::default()));
    let watches = WatchHub::default();
    let status_tx = Arc::new(status_tx);
    let applier = Applier::start(
        mvcc.clone(),
        watches.clone(),
        metrics.clone(),
        status_tx.clone(),
        inputs_tx.clone(),
        cfg.backend_sync,
    )?;

    let raft_loop = RaftLoop {
        member: Driver::new(raft, rand::random()),
        fx: Effects {
            disk,
            mvcc: mvcc.clone(),
            peers,
            witness: witness.clone(),
            runtime: peer_runtime.clone(),
            feedback: inputs_tx.clone(),
            metrics: metrics.clone(),
            watches: watches.clone(),
            lessor: Lessor::load(&mvcc.leases()?, std::time::Instant::now()),
            applier,
            pending: Pending::default(),
        },
        inputs: inputs_rx,
        status: status_tx,
        tick: cfg.heartbeat_interval,
        snapshot_count: cfg.snapshot_count.max(1),
        election_timeout: cfg.election_timeout,
    };
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("raft".into())
        .spawn(move || {
            let _ = done_tx.send(raft_loop.run());
        })
        .context("starting the Raft thread")?;

    // etcd serves no client request before it is ready; see `announce_ready`.
    let (ready_tx, ready_rx) = watch::channel(false);
    let api = Api {
        ready: ready_rx,
        inputs: inputs_tx.clone(),
        status: status_rx,
        mvcc: mvcc.clone(),
        cluster_id: ids.cluster,
        member_id: ids.member,
        client_urls: client_urls.clone(),
        own: Announced {
            name: cfg.name.clone(),
            client_urls: own_client_urls,
            attributes: me.attributes.clone(),
        },
        peer_refusals: me.refusals.clone(),
        metrics,
        request_timeout: Duration::from_secs(5) + 2 * cfg.election_timeout,
        watches,
        min_lease_ttl: api::lease::min_lease_ttl(cfg.election_timeout),
        watch_progress: cfg.watch_progress_notify_interval,
        quota_bytes: cfg.quota_backend_bytes,
        election_timeout: cfg.election_timeout,
        credentials: credentials(&cfg),
        max_request_bytes: cfg.max_request_bytes,
        max_learners: cfg.max_learners,
        client_dialer: tls.client_dialer.clone(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut servers = tokio::task::JoinSet::new();
    for (l, secure) in peer_listeners {
        let svc = super::wire::pb::peer_server::PeerServer::new(PeerService {
            me: me.clone(),
            mvcc: mvcc.clone(),
            snaps: snaps.clone(),
            inputs: inputs_tx.clone(),
            client_urls: client_urls.clone(),
        })
        .max_decoding_message_size(MAX_FRAME_BYTES);
        let routes = Routes::new(svc);
        let tls = secure.then(|| tls.peer.clone()).flatten();
        // (the listener moves to the peer runtime's reactor, and so do its connections)
        let l = {
            let _peer = peer_runtime.enter();
            TcpListener::from_std(l.into_std()?)
        }
        .context("moving a peer listener to the peer thread")?;
        servers.spawn_on(serve(l, routes, stopped(), tls, false), &peer_runtime);
    }
    tokio::spawn(announce_ready(api.status.clone(), ready_tx));
    let client_tls = |secure: bool| secure.then(|| tls.client.clone()).flatten();
    for (l, secure) in client_listeners {
        servers.spawn(serve(
            l,
            client_routes(&api),
            stopped(),
            client_tls(secure),
            true,
        ));
    }
    let metrics_routes = || with_http(axum::Router::new(), &api);
    for (l, secure) in metrics_listeners {
        servers.spawn(serve(
            l,
            metrics_routes(),
            stopped(),
            client_tls(secure),
            true,
        ));
    }
    tracing::info!(
        name = %cfg.name,
        member = format!("{:x}", ids.member),
        cluster = format!("{:x}", ids.cluster),
        "serving"
    );
    spawn_background_tasks(&cfg, &api, witness, &peer_runtime);

    let result = tokio::select! {
        () = shutdown => Ok(()),
        why = mixed_protocols(new_cluster, mvcc.clone(), me.refusals.clone()) => Err(why),
        r = done_rx => match r {
            Ok(outcome) => loop_outcome(outcome, &cfg, ids.member),
            Err(_) => Err(anyhow::anyhow!("the Raft thread stopped unexpectedly")),
        },
    };
    let _ = stop_tx.send(true);
    let _ = inputs_tx.send(Input::Stop);
    drain(servers).await;
    result
}

/// The Raft core's configuration from etcd's flags (one tick per heartbeat interval).
fn raft_config(cfg: &ServerConfig, cluster: u64, member: u64) -> anyhow::Result<raft::Config> {
    let tick = cfg.heartbeat_interval;
    let mut rc = raft::Config::new(member);
    rc.cluster_id = cluster;
    rc.heartbeat_tick = 1;
    rc.election_tick = (cfg.election_timeout.as_millis() / tick.as_millis().max(1)) as u64;
    rc.seed = rand::random();
    #[cfg(feature = "mutations")]
    if let Ok(name) = std::env::var("ETCD_NODE_MUTATION") {
        rc.mutation = Some(raft::Mutation::named(&name).ok_or_else(|| {
            anyhow::anyhow!("ETCD_NODE_MUTATION={name}: no such mutation (raft/mutation.rs)")
        })?);
        tracing::warn!("deliberate bug {name} switched on (a test build)");
    }
    Ok(rc)
}

/// The client port's routes: the gRPC services behind etcd's size error, the learner gate and
/// the metrics layer, the JSON gateway, all held until the member is ready, and the health
/// endpoints, which answer at once and say why it is not.
fn client_routes(api: &Api) -> Routes {
    let router = api::routes(api)
        .into_axum_router()
        .layer(axum::middleware::map_response(etcd_size_error))
        .layer(axum::middleware::from_fn_with_state(
            api.status.clone(),
            api::learner_gate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api.metrics.clone(),
            super::metrics::grpc_layer,
        ));
    // (JSON is larger than the protobuf it carries: the gRPC call enforces the real limit)
    let gateway_limit = 2 * (api.max_request_bytes + api::GRPC_OVERHEAD_BYTES);
    let gated = api::gateway::add(router, gateway_limit).layer(
        axum::middleware::from_fn_with_state(api.ready.clone(), api::ready_gate),
    );
    with_http(gated, api)
}

/// The member's background tasks (they end with the runtime): the witness probe (on the peer
/// runtime, beside the witness steps, so that all use of the witness's storage is on one), the
/// cluster's version and features, auto compaction, the corruption check.
fn spawn_background_tasks(
    cfg: &ServerConfig,
    api: &Api,
    witness: Arc<WitnessSlot>,
    peer: &tokio::runtime::Handle,
) {
    if let Some(every) = cfg.witness_probe {
        peer.spawn(witness_probe::run(
            witness,
            api.status.clone(),
            api.metrics.clone(),
            every,
        ));
    }
    tokio::spawn(api::cluster_params::run(api.clone()));
    if let Some(mode) = cfg.auto_compaction {
        tokio::spawn(api::compactor::run(api.clone(), mode));
    }
    if let Some(every) = cfg.corrupt_check {
        tokio::spawn(api::corruption::run(api.clone(), every));
    }
}

/// Why the member stops, from how its Raft loop ended.
fn loop_outcome(
    outcome: Result<(), LoopError>,
    cfg: &ServerConfig,
    member: u64,
) -> anyhow::Result<()> {
    match outcome {
        Ok(()) => Ok(()),
        Err(LoopError::Removed { by }) => Err(removed(cfg, member, by)),
        Err(e) => Err(anyhow::anyhow!(
            "storage failure in --data-dir {}, stopping: {e}. Nothing more is acknowledged; \
             what was acknowledged is durable. Fix the disk and start this member again on the \
             same data directory: it catches up from the others. A full disk: free space on \
             it. An I/O error: check the kernel log (dmesg); if the disk cannot be trusted, \
             replace this member instead (docs/operations.md, \"Replacing a member whose \
             machine is gone\")",
            cfg.data_dir.display()
        )),
    }
}

/// Stops the listeners: requests in flight get a moment to finish; open streams (watches,
/// keep-alives) and idle client connections would hold a graceful stop forever, so they are
/// closed after it.
async fn drain(mut servers: tokio::task::JoinSet<Result<(), tonic::transport::Error>>) {
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(r) = servers.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "a listener stopped with an error");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            grace = ?SHUTDOWN_GRACE,
            "closing the client connections still open after the grace period"
        );
        servers.abort_all();
    }
}

/// A new cluster whose members do not share a peer protocol does not start: while this start
/// bootstrapped a new cluster and the key space holds no write yet (a member may have been
/// elected with the witness's vote alone, but nothing was acknowledged), a peer's refusal of
/// this member's protocol ends the start with the peer's words. Once a write is applied, a
/// refusal is waited out instead, as in a running cluster (the others may be upgraded next;
/// Status shows it). Never ends otherwise.
async fn mixed_protocols(
    new_cluster: bool,
    mvcc: Arc<Mvcc>,
    refusals: peer::Refusals,
) -> anyhow::Error {
    if new_cluster {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if mvcc.position().map_or(true, |p| p.revision > 1) {
                break;
            }
            let refused = refusals
                .lock()
                .ok()
                .and_then(|r| r.values().next().map(|(_, why)| why.clone()));
            if let Some(why) = refused {
                return anyhow::anyhow!(
                    "a new cluster's members must speak a common peer protocol: {why}. \
                     Start this member again, on the same --data-dir, with a release that \
                     shares a protocol with the others (the versions and protocols are in \
                     docs/operations.md, \"Upgrades and going back\")"
                );
            }
        }
    }
    std::future::pending().await
}

/// How long a stopping member waits for its requests in flight before closing its connections.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// etcd (grpc-go) refuses a request over the size limit with RESOURCE_EXHAUSTED "grpc: received
/// message larger than max (N vs. M)"; tonic with OUT_OF_RANGE "Error, decoded message length
/// too large: found N bytes, the limit is: M bytes". Clients act on etcd's code (not retrying a
/// request that cannot fit): the answer is rewritten to etcd's.
async fn etcd_size_error(mut r: axum::response::Response) -> axum::response::Response {
    let Some(status) = tonic::Status::from_header_map(r.headers()) else {
        return r;
    };
    let Some(sizes) = (status.code() == tonic::Code::OutOfRange)
        .then(|| {
            status
                .message()
                .strip_prefix("Error, decoded message length too large: found ")
        })
        .flatten()
    else {
        return r;
    };
    let numbers: Vec<&str> = sizes
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .collect();
    let [found, limit] = numbers[..] else {
        return r;
    };
    let etcd = tonic::Status::resource_exhausted(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    ));
    let _ = etcd.add_header(r.headers_mut());
    r
}

/// What answers a path nothing serves: gRPC's UNIMPLEMENTED to a gRPC call (an unknown service
/// or method, as grpc-go), Go's 404 page to anything else (as etcd's HTTP mux). Without it an
/// HTTP client saw `200 OK` with an empty body for any path.
async fn unknown_path(request: axum::extract::Request) -> axum::response::Response {
    use axum::http::header::{CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
    use axum::response::IntoResponse;
    let grpc = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unimplemented("").into_http();
    }
    let headers = [
        (CONTENT_TYPE, "text/plain; charset=utf-8"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    let body = "404 page not found\n";
    (axum::http::StatusCode::NOT_FOUND, headers, body).into_response()
}

/// Adds the health endpoints, `/metrics` and `/version` to a router, and the answer to paths
/// nothing serves.
fn with_http(router: axum::Router, api: &Api) -> Routes {
    let (b, c) = (api.clone(), api.clone());
    Routes::from(
        api::probes::routes(router, api)
            .fallback(unknown_path)
            .route(
                "/metrics",
                get(move || {
                    let api = b.clone();
                    async move { api.metrics_text() }
                }),
            )
            .route(
                "/version",
                get(move || {
                    let api = c.clone();
                    async move { api::handle::version_json(&api).to_string() }
                }),
            ),
    )
}

/// How many streams a client may reset before the server accepted them, per connection.
/// Clients cancel requests all the time (deadlines): after a pause of this process (SIGSTOP, a
/// VM stall, swapping) every cancellation of the pause arrives at once, and h2's default of 20
/// would answer GOAWAY ENHANCE_YOUR_CALM "too_many_resets", failing every request on the
/// connection. The count drains as streams are accepted, so a flood still costs only this many
/// queued entries; the bound keeps h2's guard against reset floods (CVE-2023-44487) while
/// covering the cancellations of a pause (the fault campaign saw about 100 per pause).
const MAX_PENDING_RESETS: usize = 10_000;

/// The HTTP/2 server every listener (client and peer) uses.
fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
}

/// Serves `routes` on `listener`, over TLS when given its configuration; `http1`: also
/// HTTP/1.1 (client listeners: `/health` and `/metrics` for curl and Prometheus).
async fn serve(
    listener: TcpListener,
    routes: Routes,
    stop: impl std::future::Future<Output = ()>,
    tls: Option<Arc<ServerTls>>,
    http1: bool,
) -> Result<(), tonic::transport::Error> {
    let server = grpc_server().accept_http1(http1).add_routes(routes);
    match tls {
        Some(tls) => {
            server
                .serve_with_incoming_shutdown(tls::incoming(listener, tls), stop)
                .await
        }
        None => {
            server
                .serve_with_incoming_shutdown(incoming(listener), stop)
                .await
        }
    }
}
