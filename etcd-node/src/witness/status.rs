//! `etcdutl witness status`: what the witness holds, read without changing anything.

use serde::Serialize;
use witness_core::{Error, Result, WitnessUrl};

use super::backend::open_store;

/// A witness's state as shown to an operator. Ids are hex, as etcd prints member ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub name: String,
    pub peer_url: String,
    /// Empty until the witness's cluster first contacts it.
    pub member_id: String,
    pub cluster_id: String,
    pub term: u64,
    /// Empty when the witness has not voted in `term`.
    pub vote: String,
    pub last_log_term: u64,
    pub last_log_subterm: u64,
    pub last_log_index: u64,
    /// The replication set recorded by the last witness write (see [`REPLICATION_SET_NOTE`]).
    pub replication_set: Vec<String>,
    pub replication_set_outgoing: Vec<String>,
    /// What the two replication sets are (they are easily mistaken for the leader's).
    pub replication_set_note: &'static str,
    /// The identity `witness init` gave this record (members refuse any other).
    pub generation: String,
    pub storage_version: String,
    pub location: String,
}

/// The witness records a replication set only when it is written (a leader needs it after a
/// member failed); the leader's current set changes without writing the witness.
pub const REPLICATION_SET_NOTE: &str = "the replication sets are those of the last witness \
     write, not necessarily the leader's current ones (the leader changes its set without \
     writing the witness; its etcd_witness_in_replication_set metric shows the current one)";

fn id(v: u64) -> String {
    if v == 0 {
        String::new()
    } else {
        format!("{v:x}")
    }
}

/// Reads the witness at `url`.
pub async fn status(url: &WitnessUrl) -> Result<StatusReport> {
    let store = open_store(url)?;
    let location = store.location();
    let loaded = store.load().await?.ok_or_else(|| Error::NotInitialised {
        location: location.clone(),
    })?;
    let s = loaded.state;
    Ok(StatusReport {
        name: s.name,
        peer_url: s.peer_url,
        member_id: id(s.member_id),
        cluster_id: id(s.cluster_id),
        term: s.term,
        vote: id(s.voted_for),
        last_log_term: s.last_log_term,
        last_log_subterm: s.last_log_subterm,
        last_log_index: s.last_log_index,
        replication_set: s.replication_set.into_iter().map(id).collect(),
        replication_set_outgoing: s.replication_set_outgoing.into_iter().map(id).collect(),
        replication_set_note: REPLICATION_SET_NOTE,
        generation: format!("{:x}", s.generation),
        storage_version: loaded.version.to_string(),
        location,
    })
}

impl StatusReport {
    /// Rows for a two-column table.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let or_none = |s: &str, none: &str| {
            if s.is_empty() {
                none.to_string()
            } else {
                s.to_string()
            }
        };
        vec![
            ("name", self.name.clone()),
            ("peer url", self.peer_url.clone()),
            ("member id", or_none(&self.member_id, "(not bound yet)")),
            ("cluster id", or_none(&self.cluster_id, "(not bound yet)")),
            ("term", self.term.to_string()),
            ("vote", or_none(&self.vote, "(none)")),
            ("last log term", self.last_log_term.to_string()),
            ("last log subterm", self.last_log_subterm.to_string()),
            ("last log index", self.last_log_index.to_string()),
            (
                "replication set (last write)*",
                or_none(&self.replication_set.join(","), "(empty)"),
            ),
            (
                "outgoing replication set (last write)*",
                or_none(&self.replication_set_outgoing.join(","), "(none)"),
            ),
            ("generation", self.generation.clone()),
            ("storage version", self.storage_version.clone()),
            ("location", self.location.clone()),
        ]
    }

    /// An etcdctl-style table.
    pub fn table(&self) -> String {
        let rows = self.rows();
        let w0 = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let w1 = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        let line = format!("+-{}-+-{}-+\n", "-".repeat(w0), "-".repeat(w1));
        let mut out = line.clone();
        for (k, v) in rows {
            out.push_str(&format!("| {k:<w0$} | {v:<w1$} |\n"));
        }
        out.push_str(&line);
        out.push_str(&format!("* {}\n", self.replication_set_note));
        out
    }
}
