//! Fewer messages per Ready: a leader sends an append for every proposal and a heartbeat for
//! every advance of its commit index (so a follower that forwarded a write learns at once that
//! it is committed). Under load a Raft loop turn takes several proposals and several append
//! responses, and each became a message of its own: about four peer messages per write across
//! a pair of members, each encoded, framed, written and woken up for (docs/benchmarks.md).
//!
//! Before a Ready leaves, a peer's appends that continue each other become one append, and its
//! heartbeats one heartbeat. What a follower learns is the same, sooner or at once:
//! - an append is merged into the peer's previous append only if its entries follow that one's
//!   last entry (same term of the message, `prev_index`/`prev_term` = that entry), and both
//!   carry entries; the merged append carries the later commit index and at most `max_batch`
//!   entries. The leader's progress tracking already treats an answer for the last index as
//!   an answer for every append before it;
//! - a heartbeat is merged into the peer's previous heartbeat of the same term, taking the
//!   greater commit index, read round and held index: each only grows within a term, and a
//!   follower echoes the read round it got, which the leader counts for every round up to it;
//! - any other message to that peer (a snapshot, a vote, TimeoutNow...) ends the merging for
//!   it: nothing is moved across it. Otherwise each peer's messages keep their order, a merged
//!   one leaving at the place of its first part: an append may then pass a heartbeat, or a
//!   heartbeat an append, to the same peer, which no rule depends on (a heartbeat's commit
//!   index is at most what the peer acknowledged holding).

use super::{Body, Message};

/// `messages` with each peer's consecutive appends and heartbeats merged (see the module).
pub(super) fn coalesce(messages: Vec<Message>, max_batch: usize) -> Vec<Message> {
    if messages.len() < 2 {
        return messages;
    }
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    // per peer: where its latest append and heartbeat are in `out`, while they can take more
    let mut open: Vec<(u64, Option<usize>, Option<usize>)> = Vec::new();
    for m in messages {
        let slot = match open.iter().position(|(to, ..)| *to == m.to) {
            Some(i) => i,
            None => {
                open.push((m.to, None, None));
                open.len() - 1
            }
        };
        let (_, append, heartbeat) = &mut open[slot];
        let target = match m.body {
            Body::Append { .. } => append,
            Body::Heartbeat { .. } => heartbeat,
            _ => {
                (*append, *heartbeat) = (None, None);
                out.push(m);
                continue;
            }
        };
        let m = match *target {
            Some(at) => match merge(&mut out[at], m, max_batch) {
                None => continue,
                Some(m) => m,
            },
            None => m,
        };
        *target = Some(out.len());
        out.push(m);
    }
    out
}

/// Merges `next` into `into` if it may (see the module); otherwise gives it back.
fn merge(into: &mut Message, next: Message, max_batch: usize) -> Option<Message> {
    if (into.from, into.term, into.witness) != (next.from, next.term, next.witness) {
        return Some(next);
    }
    match (&mut into.body, next.body) {
        (
            Body::Append {
                entries, commit, ..
            },
            Body::Append {
                prev_index,
                prev_term,
                entries: more,
                commit: later,
            },
        ) => {
            let follows = entries
                .last()
                .is_some_and(|last| (last.index, last.term) == (prev_index, prev_term));
            if !follows || more.is_empty() || entries.len() + more.len() > max_batch {
                let body = Body::Append {
                    prev_index,
                    prev_term,
                    entries: more,
                    commit: later,
                };
                return Some(Message { body, ..next });
            }
            entries.extend(more);
            *commit = (*commit).max(later);
            None
        }
        (
            Body::Heartbeat { commit, read, held },
            Body::Heartbeat {
                commit: c,
                read: r,
                held: h,
            },
        ) => {
            (*commit, *read, *held) = ((*commit).max(c), (*read).max(r), (*held).max(h));
            None
        }
        (_, body) => Some(Message { body, ..next }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Entry, EntryData};

    fn to(to: u64, term: u64, body: Body) -> Message {
        Message {
            from: 1,
            to,
            term,
            body,
            witness: None,
        }
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            term,
            subterm: 0,
            index,
            data: EntryData::Normal(vec![index as u8]),
        }
    }

    /// An append to `peer` of entries `from..=to` (of term 2), after entry `from - 1`.
    fn append(peer: u64, from: u64, to_index: u64, commit: u64) -> Message {
        to(
            peer,
            2,
            Body::Append {
                prev_index: from - 1,
                prev_term: 2,
                entries: (from..=to_index).map(|i| entry(i, 2)).collect(),
                commit,
            },
        )
    }

    fn heartbeat(peer: u64, commit: u64, read: u64, held: u64) -> Message {
        to(peer, 2, Body::Heartbeat { commit, read, held })
    }

    #[test]
    fn a_peers_appends_that_follow_each_other_and_its_heartbeats_become_one_each() {
        let sent = vec![
            append(2, 5, 5, 4),
            append(3, 5, 5, 4),
            heartbeat(2, 4, 0, 4),
            append(2, 6, 6, 4),
            heartbeat(2, 5, 7, 5),
            append(2, 7, 8, 5),
            append(3, 6, 6, 4),
        ];
        assert_eq!(
            coalesce(sent, 64),
            vec![
                to(
                    2,
                    2,
                    Body::Append {
                        prev_index: 4,
                        prev_term: 2,
                        entries: (5..=8).map(|i| entry(i, 2)).collect(),
                        commit: 5,
                    }
                ),
                append(3, 5, 6, 4),
                heartbeat(2, 5, 7, 5),
            ]
        );
    }

    #[test]
    fn appends_that_do_not_follow_or_would_pass_max_batch_stay_apart() {
        // a gap; a resend of the same entry (a probe answered); another term's entries;
        // empty appends (probes); past max_batch
        let gap = vec![append(2, 5, 5, 4), append(2, 7, 7, 4)];
        assert_eq!(coalesce(gap.clone(), 64), gap);
        let again = vec![append(2, 5, 5, 4), append(2, 5, 5, 4)];
        assert_eq!(coalesce(again.clone(), 64), again);
        let mut newer = append(2, 6, 6, 4);
        newer.term = 3;
        let terms = vec![append(2, 5, 5, 4), newer];
        assert_eq!(coalesce(terms.clone(), 64), terms);
        let probe = to(
            2,
            2,
            Body::Append {
                prev_index: 5,
                prev_term: 2,
                entries: Vec::new(),
                commit: 4,
            },
        );
        let probes = vec![append(2, 5, 5, 4), probe.clone(), append(2, 6, 6, 4)];
        assert_eq!(
            coalesce(probes, 64),
            vec![append(2, 5, 5, 4), probe, append(2, 6, 6, 4)]
        );
        let big = vec![
            append(2, 1, 40, 0),
            append(2, 41, 64, 0),
            append(2, 65, 70, 0),
        ];
        assert_eq!(
            coalesce(big, 64),
            vec![append(2, 1, 64, 0), append(2, 65, 70, 0)]
        );
    }

    #[test]
    fn another_kind_of_message_to_the_peer_ends_the_merging_for_it() {
        let sent = vec![
            append(2, 5, 5, 4),
            heartbeat(2, 4, 0, 4),
            to(2, 2, Body::TimeoutNow),
            append(2, 6, 6, 4),
            heartbeat(2, 5, 0, 5),
            append(3, 5, 5, 4),
            to(3, 2, Body::TimeoutNow),
        ];
        assert_eq!(coalesce(sent.clone(), 64), sent);
    }
}
