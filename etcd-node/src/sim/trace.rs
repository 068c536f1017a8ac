//! A readable record of what a simulated cluster did, one line per event: the messages
//! delivered (heartbeats that confirm no read round left out: they repeat every tick and say
//! nothing new), what each node persisted and applied, each witness step with its answer, and
//! each change of a node's role, term or leader. The scenario tests keep each scenario's trace
//! as a golden file, so a change of behaviour shows as a diff (etcd-io/raft's `testdata`).

use std::collections::BTreeMap;

use crate::raft::{
    Body, Entry, Message, NodeId, Raft, Ready, Role, WitnessRequest, WitnessResponse,
};

/// The lines so far, and what was last said of each node's role.
#[derive(Debug, Default)]
pub struct Trace {
    lines: Vec<String>,
    roles: BTreeMap<NodeId, (Role, u64, NodeId)>,
}

/// A line with its numbers hidden: lines of one shape say the same thing of other entries.
fn shape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        match c {
            '0'..='9' if out.ends_with('#') => {}
            '0'..='9' => out.push('#'),
            c => out.push(c),
        }
    }
    out
}

/// Folds a stretch where a cycle of 1 to 4 lines repeats (in shape) 4 times or more, as a
/// burst of proposals makes: its first and last cycles stay, with a line counting the rest.
pub fn fold(lines: Vec<String>) -> Vec<String> {
    let shapes: Vec<String> = lines.iter().map(|l| shape(l)).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut best: Option<(usize, usize)> = None;
        for k in 1..=4 {
            let mut reps = 1;
            while i + (reps + 1) * k <= lines.len()
                && (0..k).all(|j| shapes[i + reps * k + j] == shapes[i + j])
            {
                reps += 1;
            }
            if reps >= 4 && best.is_none_or(|(bk, br)| reps * k > bk * br) {
                best = Some((k, reps));
            }
        }
        match best {
            Some((k, reps)) => {
                out.extend_from_slice(&lines[i..i + k]);
                out.push(format!(
                    "          ... the same {} more times ...",
                    reps - 2
                ));
                out.extend_from_slice(&lines[i + (reps - 1) * k..i + reps * k]);
                i += reps * k;
            }
            None => {
                out.push(lines[i].clone());
                i += 1;
            }
        }
    }
    out
}

fn outgoing(set: &[u64]) -> String {
    if set.is_empty() {
        String::new()
    } else {
        format!(" outgoing {set:?}")
    }
}

fn span(entries: &[Entry]) -> String {
    match (entries.first(), entries.last()) {
        (Some(a), Some(b)) if a.index == b.index => format!("{}", a.index),
        (Some(a), Some(b)) => format!("{}..{}", a.index, b.index),
        _ => "-".into(),
    }
}

/// A message in a few words; None for a heartbeat (or its answer) outside a read round.
fn said(m: &Message) -> Option<String> {
    let what = match &m.body {
        Body::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => format!(
            "append after {prev_index}/{prev_term} entries {} commit {commit}",
            span(entries)
        ),
        Body::AppendResp { index, reject } => {
            format!(
                "append-resp {index}{}",
                if *reject { " reject" } else { "" }
            )
        }
        Body::Heartbeat { read: 0, .. } | Body::HeartbeatResp { read: 0 } => return None,
        Body::Heartbeat { commit, read, .. } => format!("heartbeat commit {commit} read {read}"),
        Body::HeartbeatResp { read } => format!("heartbeat-resp read {read}"),
        Body::Snapshot { snapshot } => {
            format!("snapshot {}/{}", snapshot.meta.index, snapshot.meta.term)
        }
        Body::TimeoutNow => "timeout-now".into(),
        Body::Vote {
            pre,
            last_index,
            last_term,
            transfer,
        } => format!(
            "{}vote last {last_index}/{last_term}{}",
            if *pre { "pre-" } else { "" },
            if *transfer { " transfer" } else { "" }
        ),
        Body::VoteResp { pre, granted } => format!(
            "{}vote-resp {}",
            if *pre { "pre-" } else { "" },
            if *granted { "granted" } else { "refused" }
        ),
    };
    Some(format!("{}->{} term {} {what}", m.from, m.to, m.term))
}

impl Trace {
    /// The lines recorded so far, emptied, with repetitions folded (see [`fold`]).
    pub fn take(&mut self) -> Vec<String> {
        fold(std::mem::take(&mut self.lines))
    }

    /// A line of the test's own (a scenario command).
    pub fn note(&mut self, now: u64, what: &str) {
        self.lines.push(format!("{now:>5} > {what}"));
    }

    pub fn delivered(&mut self, now: u64, m: &Message) {
        if let Some(s) = said(m) {
            self.lines.push(format!("{now:>5}   {s}"));
        }
    }

    pub fn persisted(&mut self, now: u64, id: NodeId, ready: &Ready) {
        let mut parts = Vec::new();
        if let Some(s) = &ready.snapshot {
            parts.push(format!("snapshot {}/{}", s.meta.index, s.meta.term));
        }
        if !ready.entries.is_empty() {
            parts.push(format!("entries {}", span(&ready.entries)));
        }
        if let Some(hs) = ready.hard_state {
            parts.push(format!(
                "term {} vote {} commit {}",
                hs.term, hs.vote, hs.commit
            ));
        }
        if !parts.is_empty() {
            self.lines
                .push(format!("{now:>5}   {id} persists {}", parts.join(", ")));
        }
    }

    pub fn applied(&mut self, now: u64, id: NodeId, committed: &[Entry]) {
        if !committed.is_empty() {
            self.lines
                .push(format!("{now:>5}   {id} applies {}", span(committed)));
        }
    }

    pub fn witness(
        &mut self,
        now: u64,
        node: NodeId,
        request: &WitnessRequest,
        response: &WitnessResponse,
        wrote: bool,
    ) {
        let asked = match request {
            WitnessRequest::Append(r) => format!(
                "append term {} entry {}/{}/{} rset {:?}{}",
                r.term,
                r.index,
                r.entry_term,
                r.entry_subterm,
                r.replication_set,
                outgoing(&r.replication_set_outgoing)
            ),
            WitnessRequest::Vote { pre, request: r } => format!(
                "{}vote term {} last {}/{} granted {:?}{}",
                if *pre { "pre-" } else { "" },
                r.term,
                r.last_log_term,
                r.last_log_subterm,
                r.granted,
                outgoing(&r.granted_outgoing)
            ),
            WitnessRequest::ReadTerm { term, round, .. } => {
                format!("read-term {term} round {round}")
            }
        };
        let answer = match response {
            WitnessResponse::Append { reply, .. } => format!("{reply:?}"),
            WitnessResponse::Vote { reply, .. } => match reply.refusal {
                None if reply.granted => format!("granted in term {}", reply.term),
                refusal => format!("refused in term {} ({refusal:?})", reply.term),
            },
            WitnessResponse::ReadTerm { witness_term, .. } => format!("term {witness_term}"),
            WitnessResponse::Failed { .. } => "failed".into(),
        };
        self.lines.push(format!(
            "{now:>5}   {node}->witness {asked} => {answer}{}",
            if wrote { " (written)" } else { "" }
        ));
    }

    /// Notes a change of `raft`'s role, term or leader since it was last noted.
    pub fn role(&mut self, now: u64, raft: &Raft) {
        let seen = (raft.role(), raft.term(), raft.leader());
        if self.roles.insert(raft.id(), seen) != Some(seen) {
            self.lines.push(format!(
                "{now:>5}   {} is {:?} in term {}, leader {}",
                raft.id(),
                seen.0,
                seen.1,
                seen.2
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_cycles_fold_to_their_first_and_last() {
        let mut lines = vec!["> propose 10".to_string()];
        for i in 1..=10 {
            lines.push(format!("1 persists entries {i}"));
            lines.push(format!("1 applies {i}"));
        }
        lines.push("> expect leader 1".into());
        let folded = fold(lines);
        assert_eq!(
            folded,
            [
                "> propose 10",
                "1 persists entries 1",
                "1 applies 1",
                "          ... the same 8 more times ...",
                "1 persists entries 10",
                "1 applies 10",
                "> expect leader 1",
            ]
        );
        let short: Vec<String> = (1..=3).map(|i| format!("1 applies {i}")).collect();
        assert_eq!(fold(short.clone()), short, "fewer than 4 repetitions stay");
    }
}
