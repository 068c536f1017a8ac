//! Watchers for the fault campaign, and the checks of etcd's watch guarantees on what they
//! received: each member's watcher sees every event of the run's prefix exactly once, in
//! revision order, with no gap (a watcher whose stream breaks resumes from the revision after
//! the last event it got, as etcd's clients do); both members deliver the same events, and the
//! same as a replay of the history afterwards; every acknowledged write shows as exactly one
//! event, and no event comes from a write nobody made.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};

use crate::linearizable::{Event, Op};

/// One event as a watcher got it: revision, key, value (None: deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub revision: i64,
    pub key: String,
    pub value: Option<u64>,
}

/// What one watcher received until the end marker.
#[derive(Debug, Default)]
pub struct Received {
    pub events: Vec<Seen>,
    /// Times the stream broke and the watcher resumed.
    pub resumed: u64,
}

/// Watches `prefix` on `endpoint` from revision `from` until it sees `end_key` (or `give_up`
/// is set). A stream that fails or ends is opened again from the revision after the last event
/// received. Events out of revision order are an error at once.
pub async fn watch_until(
    endpoint: String,
    prefix: String,
    from: i64,
    end_key: String,
    into: Arc<Mutex<Received>>,
    give_up: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut next = from;
    let mut first = true;
    while !give_up.load(Ordering::SeqCst) {
        if !first {
            into.lock().unwrap_or_else(|e| e.into_inner()).resumed += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first = false;
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
        let Ok(mut client) = Client::connect([endpoint.as_str()], Some(options)).await else {
            continue;
        };
        let watch = WatchOptions::new().with_prefix().with_start_revision(next);
        let opened = tokio::time::timeout(
            Duration::from_secs(2),
            client.watch(prefix.as_str(), Some(watch)),
        );
        let Ok(Ok(mut stream)) = opened.await else {
            continue;
        };
        loop {
            if give_up.load(Ordering::SeqCst) {
                return Ok(());
            }
            let got = tokio::time::timeout(Duration::from_secs(1), stream.message()).await;
            let response = match got {
                Err(_) => continue, // (nothing yet: look at give_up again)
                Ok(Ok(Some(r))) => r,
                Ok(_) => break, // ended or failed: resume
            };
            if response.canceled() {
                return Err(format!(
                    "the watch on {endpoint} from revision {next} was cancelled: {:?}",
                    response.cancel_reason()
                ));
            }
            for e in response.events() {
                let Some(kv) = e.kv() else {
                    return Err(format!("an event without a key from {endpoint}"));
                };
                let seen = Seen {
                    revision: kv.mod_revision(),
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    value: match e.event_type() {
                        EventType::Put => kv.value_str().ok().and_then(|v| v.parse().ok()),
                        EventType::Delete => None,
                    },
                };
                if seen.revision < next {
                    return Err(format!(
                        "the watcher on {endpoint} got revision {} after asking for {next} \
                         onwards (out of order, or delivered twice): {seen:?}",
                        seen.revision
                    ));
                }
                // (one revision may hold several events: a transaction)
                next = seen.revision;
                let done = seen.key == end_key;
                into.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .events
                    .push(seen);
                if done {
                    return Ok(());
                }
            }
            // Every event of `next` was in this response (etcd never splits a revision).
            if let Some(last) = response.events().last().and_then(|e| e.kv()) {
                next = last.mod_revision() + 1;
            }
        }
    }
    Err(format!(
        "the watcher on {endpoint} did not see the end marker {end_key} (last revision asked \
         for: {next})"
    ))
}

/// Checks what the watchers of the members received (`live`, by endpoint) against each other,
/// against a `replay` of the history after the run, and against the clients' `history`.
pub fn check(
    live: &[(String, Vec<Seen>)],
    replay: &[Seen],
    history: &BTreeMap<String, Vec<Event>>,
) -> Result<(), String> {
    for (endpoint, events) in live {
        if let Some(w) = events.windows(2).find(|w| w[1].revision <= w[0].revision) {
            return Err(format!(
                "the watcher on {endpoint} got revision {} after {} (each write makes one event \
                 per revision here)",
                w[1].revision, w[0].revision
            ));
        }
        if events != replay {
            let at = events
                .iter()
                .zip(replay)
                .position(|(a, b)| a != b)
                .unwrap_or(events.len().min(replay.len()));
            return Err(format!(
                "the watcher on {endpoint} got {} events, the replay of the history {}; first \
                 difference at event {at}: live {:?}, replay {:?}",
                events.len(),
                replay.len(),
                events.get(at),
                replay.get(at)
            ));
        }
    }
    // Each write's value is unique: an acknowledged one shows exactly once, any other at most
    // once, and every put event comes from a write some client made.
    let mut made: BTreeMap<(&str, u64), bool> = BTreeMap::new();
    for (key, events) in history {
        for e in events {
            let acknowledged = e.ret.is_some();
            match e.op {
                Op::Put(v) => {
                    made.insert((key, v), acknowledged);
                }
                Op::Cas { new, ok, .. } => {
                    made.insert((key, new), acknowledged && ok);
                }
                Op::Get(_) | Op::Delete => {}
            }
        }
    }
    let mut shown: BTreeMap<(&str, u64), u32> = BTreeMap::new();
    for s in replay {
        let Some(v) = s.value else { continue };
        if s.key.ends_with(PROBE) {
            continue; // the campaign's own writes
        }
        if !made.contains_key(&(s.key.as_str(), v)) {
            return Err(format!(
                "a put event no client made: {s:?} (a write applied twice, or a phantom)"
            ));
        }
        *shown.entry((s.key.as_str(), v)).or_default() += 1;
    }
    if let Some(((key, v), n)) = shown.iter().find(|&(_, &n)| n > 1) {
        return Err(format!("the write of {v} to {key} shows as {n} events"));
    }
    if let Some(((key, v), _)) = made
        .iter()
        .find(|&(k, &acknowledged)| acknowledged && !shown.contains_key(k))
    {
        return Err(format!(
            "the acknowledged write of {v} to {key} has no event in the history"
        ));
    }
    Ok(())
}

/// Keys of the campaign's own writes (the recovery probe, the end marker): no client history.
pub const PROBE: &str = "probe";

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(revision: i64, key: &str, value: Option<u64>) -> Seen {
        Seen {
            revision,
            key: key.into(),
            value,
        }
    }

    fn put(v: u64, acknowledged: bool) -> Event {
        Event {
            op: Op::Put(v),
            call: 0,
            ret: acknowledged.then_some(1),
        }
    }

    #[test]
    fn the_watch_checks_can_fail() {
        let history = BTreeMap::from([("k".to_string(), vec![put(1, true), put(2, false)])]);
        let replay = vec![seen(5, "k", Some(1)), seen(6, "end-probe", Some(0))];
        let live = |events: Vec<Seen>| vec![("a".to_string(), events)];
        check(&live(replay.clone()), &replay, &history).expect("complete and in order");

        let gap = vec![replay[1].clone()];
        let err = check(&live(gap), &replay, &history).expect_err("a missed event");
        assert!(err.contains("first difference at event 0"), "{err}");

        let twice = vec![replay[0].clone(), replay[0].clone(), replay[1].clone()];
        let err = check(&live(twice), &replay, &history).expect_err("a duplicate");
        assert!(err.contains("revision 5 after 5"), "{err}");

        let lost = vec![replay[1].clone()];
        let err = check(&live(lost.clone()), &lost, &history).expect_err("lost write");
        assert!(err.contains("acknowledged write of 1"), "{err}");

        let doubled = vec![seen(5, "k", Some(1)), seen(7, "k", Some(1))];
        let err = check(&live(doubled.clone()), &doubled, &history).expect_err("applied twice");
        assert!(err.contains("shows as 2 events"), "{err}");

        let phantom = vec![seen(5, "k", Some(1)), seen(6, "k", Some(9))];
        let err = check(&live(phantom.clone()), &phantom, &history).expect_err("phantom");
        assert!(err.contains("no client made"), "{err}");
    }
}
