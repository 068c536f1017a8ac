//! Unit tests of the Raft node (the simulator and the scenarios test it as a whole).

use super::*;
use crate::raft::{Change, MemStorage, Voters};

/// docs/raft.md, "Bugs the simulator must catch": with four or more regular voters only the
/// outgoing half's granting voters keep the witness from electing a candidate that misses a
/// committed entry, and the simulator's joint changes cannot show it. The request must
/// carry them.
#[test]
fn joint_witness_vote_lists_both_halves() {
    let half = |regular: [NodeId; 2]| Voters {
        regular: regular.into_iter().collect(),
        witness: Some(4),
    };
    let joint = Membership {
        voters: half([1, 2]),
        outgoing: Some(half([1, 3])),
        learners: BTreeSet::new(),
    };
    let mut cfg = Config::new(1);
    cfg.pre_vote = false;
    let mut raft = Raft::new(cfg, &MemStorage::bootstrap(joint, None)).expect("a valid node");
    raft.campaign();
    let ready = raft.ready();
    let vote = ready.witness_requests.iter().find_map(|r| match r {
        WitnessRequest::Vote { request, .. } => Some(request),
        _ => None,
    });
    let vote = vote.expect("the witness's vote completes both halves at once");
    assert_eq!(vote.granted, vec![1]);
    assert_eq!(vote.granted_outgoing, vec![1]);
}

/// `member promote` of a learner that holds less than 90% of the leader's log is refused
/// with etcd's message; once it caught up, it is accepted.
#[test]
fn a_learner_is_promoted_only_once_in_sync() {
    let members = Membership {
        voters: Voters {
            regular: [1].into_iter().collect(),
            witness: None,
        },
        outgoing: None,
        learners: [2].into_iter().collect(),
    };
    let mut cfg = Config::new(1);
    cfg.pre_vote = false;
    let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
    raft.campaign();
    turn(&mut raft);
    assert_eq!(raft.role(), Role::Leader);
    for i in 0..20 {
        raft.propose(vec![i]).unwrap();
        turn(&mut raft);
    }
    let last = raft.log().last_index();
    let promote = ConfChange {
        changes: vec![Change {
            kind: ChangeKind::AddVoter,
            node: 2,
        }],
        witness_generation: 0,
        context: Vec::new(),
    };
    let behind = last * LEARNER_READY_PERCENT / 100 - 1;
    raft.step(from_2(
        raft.term(),
        Body::AppendResp {
            index: behind,
            reject: false,
        },
    ));
    turn(&mut raft);
    match raft.check_reconfig_quorum(&promote, false) {
        Err(Refused::InvalidConfChange(why)) => assert_eq!(
            why,
            "can only promote a learner member which is in sync with leader"
        ),
        other => panic!("a learner at {behind} of {last} was promotable: {other:?}"),
    }
    raft.step(from_2(
        raft.term(),
        Body::AppendResp {
            index: last,
            reject: false,
        },
    ));
    turn(&mut raft);
    raft.check_reconfig_quorum(&promote, false)
        .expect("a learner holding the whole log is promoted");
}

/// Node 1 of three regular voters, without pre-vote.
fn one_of_three() -> Raft {
    let mut cfg = Config::new(1);
    cfg.pre_vote = false;
    let members = Membership::new([1, 2, 3], None).unwrap();
    Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap()
}

/// Node 1 campaigns and leads with node 3's vote.
fn elect_with_3(raft: &mut Raft) {
    raft.campaign();
    turn(raft);
    let granted = Body::VoteResp {
        pre: false,
        granted: true,
    };
    raft.step(from(3, raft.term(), granted));
    assert_eq!(raft.role(), Role::Leader);
    turn(raft);
}

/// Carries out a Ready as a host whose disk and sends never fail; returns what it sent.
fn turn(raft: &mut Raft) -> Vec<Message> {
    let ready = raft.ready();
    let mut sent = ready.early_messages.clone();
    sent.extend(ready.messages.iter().cloned());
    raft.advance(&ready);
    sent
}

fn from_2(term: u64, body: Body) -> Message {
    from(2, term, body)
}

fn from(from: NodeId, term: u64, body: Body) -> Message {
    Message {
        from,
        to: 1,
        term,
        body,
        witness: None,
    }
}

fn snapshots_to_2(sent: &[Message]) -> usize {
    sent.iter()
        .filter(|m| m.to == 2 && matches!(m.body, Body::Snapshot { .. }))
        .count()
}

/// A new leader elected with the witness's vote before the other member's (a leadership
/// transfer over a WAN slower than the witness's storage) keeps that member in R when it
/// heard from it lately: it does not make the cluster depend on the witness for nothing (a
/// loss of its own site would then leave the other member unable to lead). One it did not
/// hear from (down) is replaced as it takes office, as before.
#[test]
fn a_new_leader_keeps_a_member_it_heard_from_lately() {
    for heard in [true, false] {
        let mut cfg = Config::new(1);
        cfg.pre_vote = false;
        let members = Membership::new([1, 2], Some(3)).unwrap();
        let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
        // (a liveness window into its life, short of its election timeout)
        for _ in 0..=raft.cfg.liveness_ticks() {
            raft.tick();
        }
        assert_eq!(raft.role(), Role::Follower);
        if heard {
            raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
        }
        raft.campaign();
        let ready = raft.ready();
        let request = ready
            .witness_requests
            .iter()
            .find_map(|r| match r {
                WitnessRequest::Vote { request, .. } => Some(request.clone()),
                _ => None,
            })
            .expect("the witness is asked for its vote");
        raft.advance(&ready);
        let reply = witness_core::VoteReply {
            term: raft.term(),
            granted: true,
            refusal: None,
        };
        raft.step_witness(WitnessResponse::Vote {
            pre: false,
            request,
            reply,
            seen: Seen::default(),
        });
        assert_eq!(raft.role(), Role::Leader, "elected with the witness's vote");
        turn(&mut raft);
        let rset = &raft.lead.as_ref().expect("leading").rset;
        assert_eq!(
            rset.contains(&2),
            heard,
            "heard lately: {heard}, R: {rset:?}"
        );
        assert_eq!(rset.contains(&3), !heard, "R: {rset:?}");
    }
}

/// A follower that was paused answers, when it resumes, every Append it missed with a
/// rejection. Each used to make the leader probe again and send its snapshot again: a
/// leader of an 800 MB key space queued one copy per answer and was OOM-killed. One
/// snapshot is outstanding at a time; the transport's report decides when to send another.
/// A snapshot taken in the background: its position is fixed when it starts, more entries
/// apply meanwhile, and the log is compacted to that position (not to the applied index)
/// when it is saved; a second one for the same position changes nothing.
#[test]
fn a_snapshot_saved_later_compacts_to_where_it_was_taken() {
    // Node 2 hears nothing: the leader keeps its log in memory for it.
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    let term = raft.term();
    let propose = |raft: &mut Raft| {
        raft.propose(b"x".to_vec()).unwrap();
        turn(raft);
        let index = raft.log().last_index();
        raft.step(from(
            3,
            term,
            Body::AppendResp {
                index,
                reject: false,
            },
        ));
        turn(raft);
        turn(raft);
        assert_eq!(raft.applied(), index);
    };
    propose(&mut raft);
    let meta = raft
        .snapshot_meta()
        .expect("entries applied past the snapshot");
    assert_eq!(meta.index, raft.applied());
    propose(&mut raft);
    propose(&mut raft);
    let applied = raft.applied();
    assert!(applied > meta.index);
    let snapshot = Snapshot {
        meta: meta.clone(),
        data: bytes::Bytes::new(),
    };
    assert!(raft.compact_with(snapshot.clone()));
    assert_eq!(raft.log().snapshot_index(), meta.index);
    assert_eq!(raft.log().last_index(), applied, "later entries kept");
    assert!(!raft.compact_with(snapshot), "already compacted that far");
}

/// The leader proposes an entry, both followers acknowledge it, and it is applied.
fn propose_acked(raft: &mut Raft) {
    let term = raft.term();
    raft.propose(b"x".to_vec()).unwrap();
    turn(raft);
    let index = raft.log().last_index();
    for f in [2, 3] {
        raft.step(from(
            f,
            term,
            Body::AppendResp {
                index,
                reject: false,
            },
        ));
    }
    turn(raft);
    turn(raft);
}

/// The leader goes through a new term (it knows nothing of its followers until they
/// answer), and node 2 answers that it needs everything.
fn node_2_needs_everything(raft: &mut Raft) {
    let heartbeat = Body::Heartbeat {
        commit: 0,
        read: 0,
        held: 0,
    };
    raft.step(from_2(raft.term() + 1, heartbeat));
    turn(raft);
    elect_with_3(raft);
    let reject = Body::AppendResp {
        index: 0,
        reject: true,
    };
    raft.step(from_2(raft.term(), reject));
}

/// A snapshot started before the log was trimmed past it (`--snapshot-count`) and saved
/// after: it becomes the latest, the log is not touched, and a follower that waits for a
/// newer one still does.
#[test]
fn a_snapshot_older_than_the_log_start_does_not_end_the_wait() {
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    propose_acked(&mut raft);
    let early = raft.snapshot_meta().expect("entries applied");
    for _ in 0..5 {
        propose_acked(&mut raft);
    }
    let start = raft.log().snapshot_index();
    assert!(start > early.index, "trimmed past the early snapshot");
    // A new term, and node 2 needs everything: a snapshot is wanted.
    node_2_needs_everything(&mut raft);
    turn(&mut raft);
    assert!(raft.snapshot_wanted());
    let saved = Snapshot {
        meta: early.clone(),
        data: bytes::Bytes::new(),
    };
    assert!(
        raft.compact_with(saved),
        "newer than the bootstrap snapshot"
    );
    assert_eq!(raft.snapshot.meta.index, early.index);
    assert_eq!(raft.log().snapshot_index(), start, "the log is not touched");
    assert!(raft.snapshot_wanted(), "it does not do for node 2");
    raft.compact(bytes::Bytes::from_static(b"state"));
    assert!(!raft.snapshot_wanted());
}

/// A snapshot in place (`--snapshot-count`'s: the host keeps no data of it) compacts the
/// log but is never sent: a follower that needs one waits for a new one with data, which
/// may be at the same index when nothing was applied since. Once every member holds
/// entries after that copy, it is outlived, and a snapshot in place may replace it.
#[test]
fn a_snapshot_in_place_is_never_sent_a_new_one_is_taken_instead() {
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    for _ in 0..3 {
        propose_acked(&mut raft);
    }
    let meta = raft.snapshot_meta().expect("entries applied");
    assert!(raft.compact_in_place(meta.clone()));
    assert_eq!(raft.log().snapshot_index(), meta.index);
    assert!(!raft.compact_in_place(meta.clone()), "already there");
    node_2_needs_everything(&mut raft);
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "it has no data");
    assert!(raft.snapshot_wanted());
    raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "still waiting for one");

    let again = raft
        .snapshot_meta()
        .expect("the one in place can be replaced");
    assert_eq!(again.index, meta.index, "nothing applied since");
    let taken = raft.compact(bytes::Bytes::from_static(b"state"));
    assert_eq!(taken.meta, again);
    assert!(!raft.snapshot_wanted());
    assert_eq!(raft.snapshot_meta(), None, "this one can be sent");
    raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
    let sent = turn(&mut raft);
    assert!(sent.iter().any(|m| matches!(&m.body,
        Body::Snapshot { snapshot } if m.to == 2 && snapshot.data == taken.data)));

    // Node 2 installs it; once it (and node 3) hold a later entry, the copy is not needed.
    let installed = Body::AppendResp {
        index: taken.meta.index,
        reject: false,
    };
    raft.step(from_2(raft.term(), installed));
    turn(&mut raft);
    assert!(!raft.snapshot_outlived(), "nothing after it yet");
    propose_acked(&mut raft);
    assert!(raft.snapshot_outlived(), "every member holds a later entry");
    let in_place = raft.snapshot_meta().expect("entries applied since");
    assert!(raft.compact_in_place(in_place));
    assert!(!raft.snapshot_outlived(), "a snapshot in place is no copy");
}

/// A leader keeps in memory only the entries some follower may still ask for, and a
/// follower that asks for dropped ones (here: after a new term reset what the leader knows
/// of it) waits for a snapshot taken for it, newer than the dropped entries.
#[test]
fn entries_every_follower_holds_leave_memory_and_a_late_one_gets_a_new_snapshot() {
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    let term = raft.term();
    for i in 0..10 {
        raft.propose(vec![i]).unwrap();
    }
    turn(&mut raft);
    let last = raft.log().last_index();
    let ack = Body::AppendResp {
        index: last,
        reject: false,
    };
    raft.step(from(3, term, ack.clone()));
    turn(&mut raft);
    turn(&mut raft);
    assert_eq!(raft.applied(), last);
    assert_eq!(
        raft.log().snapshot_index(),
        1,
        "kept for node 2, which has none"
    );
    raft.step(from_2(term, ack));
    turn(&mut raft);
    assert_eq!(
        raft.log().snapshot_index(),
        last,
        "every follower holds them"
    );
    assert_eq!(raft.snapshot.meta.index, 1, "no snapshot was taken");
    assert!(!raft.snapshot_wanted());

    // A new term: the leader knows nothing of its followers until they answer.
    raft.step(from_2(
        term + 1,
        Body::Heartbeat {
            commit: 0,
            read: 0,
            held: 0,
        },
    ));
    assert_eq!(raft.role(), Role::Follower);
    turn(&mut raft);
    elect_with_3(&mut raft);
    let term = raft.term();
    let reject = Body::AppendResp {
        index: 0,
        reject: true,
    };
    raft.step(from_2(term, reject));
    assert_eq!(
        snapshots_to_2(&turn(&mut raft)),
        0,
        "the old snapshot would not do"
    );
    assert!(raft.snapshot_wanted());
    raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "still waiting for one");

    let taken = raft.compact(bytes::Bytes::from_static(b"state")).meta.index;
    assert!(taken >= last && !raft.snapshot_wanted());
    raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
    let sent = turn(&mut raft);
    assert_eq!(snapshots_to_2(&sent), 1);
    assert!(sent.iter().any(|m| matches!(&m.body,
        Body::Snapshot { snapshot } if m.to == 2 && snapshot.meta.index == taken)));
}

/// A follower drops applied entries only once its leader says every member holds them: a
/// member restarted as a follower may lead next, and one that was down then catches up from
/// its log (scenario 05 sent it a snapshot when followers dropped what they applied).
#[test]
fn a_follower_drops_entries_only_once_its_leader_says_every_member_holds_them() {
    let members = Membership::new([1, 2, 3], None).unwrap();
    let mut raft = Raft::new(Config::new(1), &MemStorage::bootstrap(members, None)).unwrap();
    let term = 2;
    let entries: Vec<Entry> = (2..=11)
        .map(|index| Entry {
            term,
            subterm: 0,
            index,
            data: EntryData::Normal(vec![index as u8]),
        })
        .collect();
    let append = Body::Append {
        prev_index: 1,
        prev_term: 1,
        entries,
        commit: 11,
    };
    raft.step(from_2(term, append));
    turn(&mut raft);
    turn(&mut raft);
    assert_eq!(raft.applied(), 11);
    assert_eq!(raft.log().snapshot_index(), 1, "node 3 may lack them");
    let heartbeat = Body::Heartbeat {
        commit: 11,
        read: 0,
        held: 8,
    };
    raft.step(from_2(term, heartbeat));
    turn(&mut raft);
    assert_eq!(raft.log().snapshot_index(), 8);
    assert_eq!(raft.log().last_index(), 11);
}

#[test]
fn a_leader_sends_one_snapshot_until_the_transport_reports() {
    let mut cfg = Config::new(1);
    cfg.pre_vote = false;
    let members = Membership::new([1, 2, 3], None).unwrap();
    let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
    raft.campaign();
    turn(&mut raft);
    let term = raft.term();
    let granted = Body::VoteResp {
        pre: false,
        granted: true,
    };
    // Node 3 votes and acknowledges; node 2 is paused and hears nothing.
    raft.step(from(3, term, granted));
    assert_eq!(raft.role(), Role::Leader);
    for _ in 0..3 {
        raft.propose(b"x".to_vec()).unwrap();
    }
    turn(&mut raft);
    let last = raft.log().last_index();
    let ack = Body::AppendResp {
        index: last,
        reject: false,
    };
    raft.step(from(3, term, ack));
    turn(&mut raft);
    assert_eq!(raft.applied(), last);
    let index = raft.compact(bytes::Bytes::from_static(b"state")).meta.index;

    // Node 2 resumes and rejects what it missed; the leader has only the snapshot for it.
    let reject = Body::AppendResp {
        index: 0,
        reject: true,
    };
    raft.step(from_2(term, reject.clone()));
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 1);
    for _ in 0..5 {
        raft.step(from_2(term, reject.clone()));
    }
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "stale rejections");

    // Not delivered: nothing more until the follower is heard from, then once.
    raft.report_snapshot(2, index, false);
    raft.propose(b"y".to_vec()).unwrap();
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "unreachable follower");
    raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 1);

    // Delivered: the follower may take its time installing it.
    raft.report_snapshot(2, index, true);
    for _ in 0..raft.election_tick() {
        raft.tick();
        raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "installing");
    }
    // ... but an election timeout after the delivery, with no answer, it was lost.
    raft.tick();
    raft.tick();
    raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
    assert_eq!(snapshots_to_2(&turn(&mut raft)), 1, "lost after delivery");

    // The follower's answer ends it: appends follow.
    let installed = Body::AppendResp {
        index,
        reject: false,
    };
    raft.step(from_2(term, installed));
    let sent = turn(&mut raft);
    assert_eq!(snapshots_to_2(&sent), 0);
    assert!(
        sent.iter()
            .any(|m| m.to == 2 && matches!(m.body, Body::Append { .. }))
    );
}

/// Asked to remove itself, a leader does not propose the change: it checks it and hands
/// leadership to the voter holding the most of its log (node 3 here), which then proposes it.
#[test]
fn a_leader_asked_to_remove_itself_hands_over_to_the_most_up_to_date_voter() {
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    let last = raft.last_index();
    let acked = Body::AppendResp {
        index: last,
        reject: false,
    };
    raft.step(from(3, raft.term(), acked));
    turn(&mut raft);
    let remove = |node| ConfChange {
        changes: vec![Change {
            kind: ChangeKind::Remove,
            node,
        }],
        witness_generation: 0,
        context: Vec::new(),
    };
    for refused in [
        raft.propose_conf_change(remove(1)),
        raft.hand_over_before_removal(&remove(2)),
    ] {
        assert!(matches!(refused, Err(Refused::InvalidConfChange(_))));
    }
    assert_eq!(raft.hand_over_before_removal(&remove(1)), Ok(3));
    let sent = turn(&mut raft);
    assert!(
        sent.iter()
            .any(|m| m.to == 3 && matches!(m.body, Body::TimeoutNow)),
        "{sent:?}"
    );
}

/// A commit index that newly covers a configuration change leaves the leader only after the
/// leader persisted it: a member that applied its own removal on that word stops, and a leader
/// that crashed before its fsync would restart not knowing the change committed, needing the
/// stopped member's vote. Any other commit index goes out while the leader's fsync runs.
#[test]
fn a_commit_covering_a_conf_change_waits_for_the_leaders_fsync() {
    let mut raft = one_of_three();
    elect_with_3(&mut raft);
    propose_acked(&mut raft);
    let commit_of = |m: &Message| match m.body {
        Body::Append { commit, .. } | Body::Heartbeat { commit, .. } => Some(commit),
        _ => None,
    };
    let remove_2 = ConfChange {
        changes: vec![Change {
            kind: ChangeKind::Remove,
            node: 2,
        }],
        witness_generation: 0,
        context: Vec::new(),
    };
    for conf_change in [false, true] {
        let term = raft.term();
        let index = if conf_change {
            raft.propose_conf_change(remove_2.clone()).unwrap()
        } else {
            raft.propose(b"y".to_vec()).unwrap()
        };
        turn(&mut raft);
        let acked = Body::AppendResp {
            index,
            reject: false,
        };
        raft.step(from(3, term, acked));
        let ready = raft.ready();
        assert_eq!(ready.hard_state.map(|hs| hs.commit), Some(index));
        let (early, late) = (&ready.early_messages, &ready.messages);
        let carried = |sent: &[Message]| sent.iter().filter_map(commit_of).max();
        if conf_change {
            assert_eq!((carried(early), carried(late)), (None, Some(index)));
        } else {
            assert_eq!(carried(early), Some(index), "{early:?}");
        }
        raft.advance(&ready);
        turn(&mut raft);
    }
}

/// Node 1 leads `members` with node 2's vote; its first entry is not committed yet.
fn elected_by_2(members: Membership) -> Raft {
    let mut cfg = Config::new(1);
    cfg.pre_vote = false;
    let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
    raft.campaign();
    turn(&mut raft);
    let granted = Body::VoteResp {
        pre: false,
        granted: true,
    };
    raft.step(from_2(raft.term(), granted));
    assert_eq!(raft.role(), Role::Leader);
    turn(&mut raft);
    raft
}

/// Node 1 leads `members` with node 2's vote, and its first entry is committed with node 2's
/// acknowledgement (its commit index is of its term: reads may be answered).
fn leading_with_2(members: Membership) -> Raft {
    let mut raft = elected_by_2(members);
    let index = raft.log().last_index();
    let ack = Body::AppendResp {
        index,
        reject: false,
    };
    raft.step(from_2(raft.term(), ack));
    turn(&mut raft);
    assert_eq!(
        raft.term_at(raft.commit),
        Some(raft.term()),
        "commit current"
    );
    raft
}

/// A read forwarded by the other regular voter of two (with a witness) is answered at the
/// leader's commit index without a heartbeat round: the request confirmed the leader as the
/// round would (docs/raft.md, "Reads"). With three regular voters, or forwarded
/// by a member that is not the other voter, it takes a round as before.
#[test]
fn a_read_forwarded_by_the_other_of_two_voters_is_answered_without_a_round() {
    // (carries out a Ready: the read states it held, and how many read rounds it started)
    let read_turn = |raft: &mut Raft| {
        let ready = raft.ready();
        let reads = ready.read_states.clone();
        raft.advance(&ready);
        let rounds = ready
            .early_messages
            .iter()
            .chain(&ready.messages)
            .filter(|m| matches!(m.body, Body::Heartbeat { read, .. } if read > 0))
            .count();
        (reads, rounds)
    };
    let pair = Membership::new([1, 2], Some(3)).unwrap();
    let mut raft = leading_with_2(pair.clone());
    raft.read_index_for(b"f".to_vec(), 2).unwrap();
    let answered = vec![ReadState {
        index: raft.commit,
        ctx: b"f".to_vec(),
    }];
    assert_eq!(
        read_turn(&mut raft),
        (answered, 0),
        "answered at once, no round"
    );

    // A local read still takes a round.
    raft.read_index(b"l".to_vec()).unwrap();
    assert_eq!(
        read_turn(&mut raft),
        (vec![], 1),
        "the local read waits for its round"
    );

    let three = Membership::new([1, 2, 4], None).unwrap();
    let mut raft = leading_with_2(three);
    raft.read_index_for(b"f".to_vec(), 2).unwrap();
    assert_eq!(read_turn(&mut raft).0, vec![], "three voters: a round");

    let mut raft = leading_with_2(pair.clone());
    raft.read_index_for(b"f".to_vec(), 9).unwrap();
    assert_eq!(
        read_turn(&mut raft).0,
        vec![],
        "asked by a non-voter: a round"
    );

    // A new leader whose commit index is not of its term yet: the read waits for its first
    // commit (the index it would answer may miss writes the previous leader acknowledged).
    // Two guards hold it back, each enough alone: the commit index's term, and the entry a new
    // leader appends counting as a configuration change until it is applied.
    let mut raft = elected_by_2(pair);
    assert_ne!(
        raft.term_at(raft.commit),
        Some(raft.term()),
        "not current yet"
    );
    raft.read_index_for(b"f".to_vec(), 2).unwrap();
    assert_eq!(
        read_turn(&mut raft).0,
        vec![],
        "answered before the first commit"
    );
}
