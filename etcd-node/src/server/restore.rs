//! `etcdutl snapshot restore`: a new member's data directory from a snapshot file, for a new
//! cluster whose membership is given by etcd's flags (`--initial-cluster` and friends). The
//! file is etcd-node's, or etcd's own (a bbolt database, converted by `mvcc::etcd`: moving an
//! etcd cluster to etcd-node).
//!
//! Invariants: the data directory is built aside and renamed into place only when complete, so
//! a failed restore leaves nothing a member could start from; every member restored from the
//! same file with the same flags starts from the same committed position holding the same key
//! space (at index 1, durable, the starting snapshot in place); an existing data directory is never
//! touched; a witness that still holds another cluster's (or the old cluster's) state is
//! refused, because its term and log position would outvote the restored members' logs.
//!
//! The restored cluster's id is etcd's (from the member ids) mixed with a SHA-256 of the
//! restored key space. So members restored from different files, or with different
//! `--bump-revision`, belong to different clusters and refuse each other's messages; and a
//! witness bound to this very restore (another member of it already started) is told apart from
//! one bound to the old cluster, even when the old cluster had the same token and peer URLs.
//! Neither is accepted: a restore needs a fresh witness, so every member of a restore is
//! restored before any of them starts. (A witness bound to this restore holds terms and
//! subterms of a history that the restored member does not have, or that a started member has
//! moved past; reusing those numbers in a new history could lose acknowledged writes.)

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use etcd_client::proto::PbMember;
use sha2::{Digest, Sha256};
use witness_core::{Seen, WitnessState, WitnessUrl};

use super::bootstrap::{initial_members, initial_membership};
use crate::config::ServerConfig;
use crate::mvcc::etcd::EtcdFileSummary;
use crate::mvcc::{self, Commits, DumpSummary, Hashing, Mvcc};
use crate::raft::KnownWitness;
use crate::storage::backup;
use crate::storage::disk::{BootKeySpace, DiskStorage};
use crate::witness::open_store;

/// How to restore.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Restore even when the file's SHA-256 does not match.
    pub skip_hash_check: bool,
    /// Raise the restored revision by this much (etcd's `--bump-revision`).
    pub bump_revision: u64,
    /// Compact everything before the restored revision (etcd's `--mark-compacted`).
    pub mark_compacted: bool,
}

/// What a restore produced.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    pub data_dir: PathBuf,
    pub member_id: u64,
    pub cluster_id: u64,
    /// The restored key space (after any bump).
    pub summary: DumpSummary,
    /// What the file held, when it was an etcd (bbolt) snapshot.
    pub imported: Option<EtcdFileSummary>,
}

/// A snapshot file, opened.
enum Source {
    /// etcd-node's: its dump.
    Node(std::io::Take<BufReader<std::fs::File>>),
    /// etcd's: the file, the database's length and SHA-256 (checked as asked).
    Etcd(std::fs::File, u64, [u8; 32]),
}

/// Builds `cfg.data_dir` for member `cfg.name` from the snapshot file `file`. The file is read
/// a piece at a time: memory does not grow with the key space.
pub async fn restore(
    cfg: &ServerConfig,
    file: &Path,
    opts: &RestoreOptions,
) -> anyhow::Result<RestoreReport> {
    if opts.bump_revision > 0 && !opts.mark_compacted {
        bail!(
            "--bump-revision needs --mark-compacted: readers and watchers of a revision from \
             before the restore must be told it is gone, not shown a different history"
        );
    }
    let dir = &cfg.data_dir;
    if dir.exists() && std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_some()) {
        bail!(
            "--data-dir {} already exists and is not empty; restore into a new directory (a \
             restore never overwrites a member's data)",
            dir.display()
        );
    }
    let wal_dir = dedicated_wal_dir(cfg);
    if let Some(wal) = wal_dir
        && wal.exists()
    {
        bail!(
            "--wal-dir {} already exists; restore into a new directory, which the restore \
             creates (a restore never overwrites a member's WAL; on a disk mounted for the WAL, \
             name a directory inside the mount point, such as {}). A restore cut short between \
             its last two steps leaves the restored WAL there and no --data-dir {}: only then \
             does it hold nothing else, and it can be removed",
            wal.display(),
            wal.join("wal").display(),
            dir.display()
        );
    }
    let mut opened = std::fs::File::open(file)
        .with_context(|| format!("reading the snapshot file {}", file.display()))?;
    let check = !opts.skip_hash_check;
    // An etcd-node file's SHA-256 is checked on a thread of its own while the restore reads the
    // file (a second pass over it, from the page cache, on the core the restore leaves idle):
    // nothing is renamed into place before it matched. (An etcd file's is needed first: the
    // conversion is made of it.)
    let (source, hash_check) = if backup::is_etcd(&mut opened)? {
        let (len, sha) = backup::check_etcd(&mut opened, check).map_err(anyhow::Error::msg)?;
        (Source::Etcd(opened, len, sha), None)
    } else {
        let dump = backup::open(BufReader::new(opened), false).map_err(anyhow::Error::msg)?;
        let checked = check.then(|| {
            let file = file.to_owned();
            tokio::task::spawn_blocking(move || backup::check_hash(&file))
        });
        (Source::Node(dump), checked)
    };
    let aside = aside_path(dir);
    // The WAL is built aside too: in the data directory, or next to --wal-dir.
    let wal_aside = match wal_dir {
        Some(wal) => aside_path(wal),
        None => aside.join("member").join("wal"),
    };
    for unfinished in [&aside, &wal_aside] {
        if unfinished.exists() {
            // A restore that failed earlier: nothing could have used it.
            std::fs::remove_dir_all(unfinished).with_context(|| {
                format!("removing the unfinished restore {}", unfinished.display())
            })?;
        }
    }
    let mut built = build_aside(cfg, &aside, &wal_aside, source, opts).await;
    if let Some(checked) = hash_check {
        // (a damaged file's restore may have failed on what it read: the hash says why)
        match checked.await.context("checking the snapshot's SHA-256")? {
            Ok(()) => {}
            Err(e) => built = Err(anyhow::Error::msg(e)),
        }
    }
    let (summary, cluster_id, imported) = match built {
        Ok(done) => done,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&aside);
            let _ = std::fs::remove_dir_all(&wal_aside);
            return Err(e);
        }
    };
    // The WAL first: a data directory in place without its WAL refuses to start, saying so.
    if let Some(wal) = wal_dir {
        rename_into(&wal_aside, wal)?;
    }
    rename_into(&aside, dir)?;
    Ok(RestoreReport {
        data_dir: dir.clone(),
        member_id: cfg.member_id,
        cluster_id,
        summary,
        imported,
    })
}

/// Writes the restored member's data directory at `aside` (its WAL at `wal_aside`): an etcd
/// file converted to a dump (in a file of its own), the witness read (one with a past is
/// refused before anything else is written), the dump rewritten for the new cluster straight
/// into the key space (its SHA-256, which the cluster id is made of, computed on the way), the
/// witness read again, then the rest of the member's storage. Returns the summary, the
/// cluster id and what an etcd file held.
async fn build_aside(
    cfg: &ServerConfig,
    aside: &Path,
    wal_aside: &Path,
    source: Source,
    opts: &RestoreOptions,
) -> anyhow::Result<(DumpSummary, u64, Option<EtcdFileSummary>)> {
    std::fs::create_dir_all(aside).with_context(|| format!("creating {}", aside.display()))?;
    let converted = aside.join("etcd.dump");
    let (dump, imported): (Box<dyn Read>, _) = match source {
        Source::Node(dump) => (Box::new(dump), None),
        Source::Etcd(file, len, sha) => {
            let mut out = BufWriter::new(
                std::fs::File::create(&converted)
                    .with_context(|| format!("creating {}", converted.display()))?,
            );
            let imported = mvcc::etcd::import(file, len, &sha, aside, &mut out)
                .map_err(anyhow::Error::msg)
                .context("reading the etcd snapshot")?;
            out.flush()
                .with_context(|| format!("writing {}", converted.display()))?;
            let dump = BufReader::new(std::fs::File::open(&converted)?);
            (Box::new(dump), Some(imported))
        }
    };
    let members = initial_members(cfg);
    let rewrite = |dump, out| rewritten(dump, out, &members, opts);
    // A witness with a past is refused whatever this restore makes, but which words say why
    // depends on the restored cluster's id: the rewrite alone gives it, nothing is written.
    let witness = match cfg.witness() {
        Some((member, url)) => Some((member, url, read_witness(&member.name, url).await?)),
        None => None,
    };
    if let Some((member, url, state)) = &witness
        && !is_fresh(state)
    {
        let (_, sha) = rewrite(dump, Box::new(std::io::sink()))?;
        let cluster_id = restored_cluster_id(cfg.cluster_id, &sha);
        return Err(refused_witness(&member.name, url, state, cluster_id));
    }
    let member_dir = aside.join("member");
    std::fs::create_dir_all(&member_dir)
        .with_context(|| format!("creating {}", member_dir.display()))?;
    let mvcc = Mvcc::open(&member_dir.join("kv.redb"))?;
    let (summary, sha) = rewrite_into(&mvcc, dump, rewrite)?;
    if imported.is_some() {
        // (read whole: its disk is needed for what comes)
        std::fs::remove_file(&converted)
            .with_context(|| format!("removing {}", converted.display()))?;
    }
    let cluster_id = restored_cluster_id(cfg.cluster_id, &sha);
    let witness = match witness {
        Some((member, url, _)) => {
            // (read again: a member of this very restore may have started meanwhile)
            let state = read_witness(&member.name, url).await?;
            if !is_fresh(&state) {
                return Err(refused_witness(&member.name, url, &state, cluster_id));
            }
            Some(KnownWitness {
                id: member.id,
                seen: Seen::of(&state),
            })
        }
        None => None,
    };
    build(cfg, cluster_id, &mvcc, &member_dir, wal_aside, witness)
        .with_context(|| format!("restoring into {}", aside.display()))?;
    Ok((summary, cluster_id, imported))
}

/// The dump `dump` rewritten for the new cluster into `out` (`--initial-cluster`'s members,
/// `--bump-revision`, `--mark-compacted`): what it holds, and the SHA-256 of what was written.
fn rewritten(
    dump: Box<dyn Read + '_>,
    out: Box<dyn Write + '_>,
    members: &[PbMember],
    opts: &RestoreOptions,
) -> anyhow::Result<(DumpSummary, Vec<u8>)> {
    let mut out = Hashing {
        out: BufWriter::with_capacity(PIPE_BUFFER, out),
        sha: Sha256::new(),
    };
    let summary = mvcc::rewrite(
        dump,
        &mut out,
        members,
        opts.bump_revision,
        opts.mark_compacted,
    )
    .map_err(anyhow::Error::msg)?;
    out.flush().context("writing the rewritten dump")?;
    Ok((summary, out.sha.finalize().to_vec()))
}

/// Buffers on both ends of the pipe between the rewrite and the key space.
const PIPE_BUFFER: usize = 1 << 20;

/// Restores the key space `mvcc` from `dump` as `rewrite` rewrites it, durably at the starting
/// index (1), the rewrite on this thread and the key space on another, through a pipe: the
/// rewritten dump is never written to a file (at 2M keys that was 600 MB written and read
/// back). Returns what `rewrite` returns.
fn rewrite_into<'a>(
    mvcc: &Mvcc,
    dump: Box<dyn Read + 'a>,
    rewrite: impl FnOnce(
        Box<dyn Read + 'a>,
        Box<dyn Write + 'a>,
    ) -> anyhow::Result<(DumpSummary, Vec<u8>)>,
) -> anyhow::Result<(DumpSummary, Vec<u8>)> {
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    std::thread::scope(|scope| {
        let restoring = std::thread::Builder::new()
            .name("restore".into())
            .spawn_scoped(scope, move || {
                mvcc.restore(
                    BufReader::with_capacity(PIPE_BUFFER, reader),
                    1,
                    Commits::Chunked,
                )
            })
            .context("starting the restore thread")?;
        // (`writer` is closed when `rewrite` returns: the key space sees the dump's end)
        let written = rewrite(dump, Box::new(writer));
        let restored = restoring
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match (written, restored) {
            (Ok(done), Ok(())) => Ok(done),
            (Ok(_), Err(e)) => Err(e.into()),
            // (a pipe the key space stopped reading: its error says why)
            (Err(w), Err(e)) if broke_the_pipe(&w) => Err(e.into()),
            (Err(w), _) => Err(w),
        }
    })
}

/// Whether the rewrite stopped because the pipe's reader went away.
fn broke_the_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The restored member's `--wal-dir`, when it has one (None: its WAL is in the data directory).
fn dedicated_wal_dir(cfg: &ServerConfig) -> Option<&Path> {
    let wal = cfg.wal_dir.as_path();
    (wal != cfg.data_dir.join("member").join("wal")).then_some(wal)
}

/// Renames `from` to `to` durably, creating `to`'s directory if needed.
fn rename_into(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(parent) = crate::storage::parent_dir(to) {
        crate::storage::create_dir_durably(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    crate::storage::rename_durably(from, to)
        .with_context(|| format!("renaming {} to {}", from.display(), to.display()))
}

/// `<dir>.restoring`, next to the directory `dir` (same file system, so the rename is
/// atomic).
fn aside_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".restoring");
    dir.with_file_name(name)
}

/// Writes the rest of the member's storage in `member_dir` (its WAL in `wal_dir`), its key
/// space `mvcc` restored durably at the starting index: its ids, then the starting snapshot in
/// place (the key space file is its data), bound to the generation of its fresh witness.
fn build(
    cfg: &ServerConfig,
    cluster_id: u64,
    mvcc: &Mvcc,
    member_dir: &Path,
    wal_dir: &Path,
    witness: Option<KnownWitness>,
) -> anyhow::Result<()> {
    mvcc.set_identity(cfg.member_id, cluster_id)?;
    let (mut disk, _) = DiskStorage::open(member_dir, wal_dir)?;
    disk.bootstrap(initial_membership(cfg)?, witness, BootKeySpace::InPlace)?;
    crate::storage::sync_member_dir(member_dir)?;
    Ok(())
}

/// The id of the cluster restored from the rewritten dump whose SHA-256 is `dump_sha` and
/// whose flags give `flags_id`: the first 8 bytes of SHA-256 over both, never 0 (a witness's
/// "not bound yet").
fn restored_cluster_id(flags_id: u64, dump_sha: &[u8]) -> u64 {
    let digest = Sha256::new()
        .chain_update(flags_id.to_be_bytes())
        .chain_update(dump_sha)
        .finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes")).max(1)
}

/// What the witness named in `--initial-cluster` holds (refusing one never initialised).
async fn read_witness(name: &str, url: &WitnessUrl) -> anyhow::Result<WitnessState> {
    let store = open_store(url).with_context(|| format!("--initial-cluster {name}={url}"))?;
    let loaded = store
        .load()
        .await
        .with_context(|| format!("reading the witness {name}={url}"))?;
    match loaded {
        Some(loaded) => Ok(loaded.state),
        None => bail!(
            "the witness {name}={url} is not initialised: run `etcdutl witness init --name \
             {name} --advertise-peer-url '{url}'` first"
        ),
    }
}

/// The restored cluster needs a witness with no past: any witness state comes from a log the
/// restored members do not have (the old cluster's, or a started member's of this same
/// restore), so its term and log position would outvote them, or its term and subterm numbers
/// would be reused for other entries.
fn is_fresh(s: &WitnessState) -> bool {
    s.cluster_id == 0 && s.term == 0 && s.last_log_term == 0
}

/// Why the witness `name`, whose state `s` is not fresh ([`is_fresh`]), is refused for the
/// restored cluster `cluster_id`, and what to do.
fn refused_witness(
    name: &str,
    url: &WitnessUrl,
    s: &WitnessState,
    cluster_id: u64,
) -> anyhow::Error {
    let clean = format!(
        "initialise a witness at a new location (`etcdutl witness init`) and name that in \
         --initial-cluster, or, once no member of any cluster that uses this witness is running \
         any more, clean it with `etcdutl witness init --force --name {name} \
         --advertise-peer-url '{url}'` (a cluster still using it would refuse the cleaned \
         witness and lose its vote)"
    );
    if s.cluster_id == cluster_id {
        return anyhow::anyhow!(
            "the witness {name}={url} is already bound to this restored cluster {cluster_id:x} \
             (term {}): a member restored from the same file has started, so the cluster has \
             moved on from the snapshot. Restore every member before starting any. To add this \
             member now, replace it as a lost member instead (`etcdctl member remove`, `member \
             add`, then start it with an empty --data-dir and --initial-cluster-state \
             existing); to start the restore over, stop every member, discard their restored \
             data directories, and {clean}",
            s.term
        );
    }
    anyhow::anyhow!(
        "the witness {name}={url} holds another cluster's state (cluster {:x}, term {}, last \
         entry term {}; this restore makes cluster {cluster_id:x}): {clean}",
        s.cluster_id,
        s.term,
        s.last_log_term
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rewrite and the key space's restore run on two threads through a pipe: what the
    /// rewrite wrote is what the key space holds, with the same SHA-256; a dump that is not one
    /// fails with the rewrite's own error, not the pipe's or the key space's.
    #[test]
    fn the_rewritten_dump_streams_into_the_key_space() {
        let dir = tempfile::tempdir().unwrap();
        let source = Mvcc::open(&dir.path().join("source.redb")).unwrap();
        let dump = source.dump().unwrap();
        let members = vec![PbMember {
            id: 42,
            name: "fresh".into(),
            ..Default::default()
        }];
        let opts = RestoreOptions::default();
        let mut copy = Vec::new();
        let (_, want_sha) = rewritten(
            Box::new(dump.as_slice()),
            Box::new(&mut copy),
            &members,
            &opts,
        )
        .unwrap();
        let restored = Mvcc::open(&dir.path().join("restored.redb")).unwrap();
        let (summary, sha) = rewrite_into(&restored, Box::new(dump.as_slice()), |d, o| {
            rewritten(d, o, &members, &opts)
        })
        .unwrap();
        assert_eq!(sha, want_sha);
        assert_eq!(summary.revision, restored.position().unwrap().revision);
        assert_eq!(restored.position().unwrap().applied, 1);
        assert_eq!(restored.members().unwrap(), members);
        let held = mvcc::summarize(restored.dump().unwrap().as_slice()).unwrap();
        assert_eq!(held, mvcc::summarize(copy.as_slice()).unwrap());

        let other = Mvcc::open(&dir.path().join("other.redb")).unwrap();
        let err = rewrite_into(&other, Box::new(&b"\xff\xff"[..]), |d, o| {
            rewritten(d, o, &members, &opts)
        })
        .unwrap_err();
        let want = rewritten(
            Box::new(&b"\xff\xff"[..]),
            Box::new(std::io::sink()),
            &members,
            &opts,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), want.to_string());
    }

    #[test]
    fn a_restored_cluster_id_depends_on_the_flags_and_on_the_restored_key_space() {
        let id = restored_cluster_id(7, b"dump");
        assert_eq!(id, restored_cluster_id(7, b"dump"), "every member agrees");
        assert_ne!(
            id, 7,
            "not the old cluster's id, even with the old token and URLs"
        );
        assert_ne!(id, restored_cluster_id(8, b"dump"));
        assert_ne!(id, restored_cluster_id(7, b"dump2"));
        assert_ne!(id, 0);
    }
}
