//! When leases expire: the leader's business, in memory (as etcd's lessor). Every member
//! follows the leases granted and revoked through the log; only the leader keeps deadlines that
//! mean anything. A new leader gives every lease its whole TTL again plus an election timeout
//! (etcd's `Promote`), keep-alives reach the leader, and an expired lease is revoked through
//! Raft (its keys deleted in one revision) like a client's revoke.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Timer {
    /// Granted TTL in seconds.
    ttl: i64,
    expiry: Instant,
    /// When its revoke was proposed (none yet).
    revoking: Option<Instant>,
}

/// The leases of the cluster and, on the leader, their deadlines.
#[derive(Debug, Default)]
pub struct Lessor {
    leases: HashMap<i64, Timer>,
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

impl Lessor {
    /// The leases in the store, each with its whole TTL from `now`.
    pub fn load(leases: &[(i64, i64)], now: Instant) -> Self {
        let mut l = Lessor::default();
        for &(id, ttl) in leases {
            l.granted(id, ttl, now);
        }
        l
    }

    /// A grant was applied.
    pub fn granted(&mut self, id: i64, ttl: i64, now: Instant) {
        self.leases.insert(
            id,
            Timer {
                ttl,
                expiry: now + secs(ttl),
                revoking: None,
            },
        );
    }

    /// A revoke was applied.
    pub fn revoked(&mut self, id: i64) {
        self.leases.remove(&id);
    }

    /// This member just became the leader: every lease gets its whole TTL plus `extend`.
    pub fn promote(&mut self, now: Instant, extend: Duration) {
        for t in self.leases.values_mut() {
            t.expiry = now + extend + secs(t.ttl);
            t.revoking = None;
        }
    }

    /// A keep-alive on the leader: the granted TTL, None when there is no such lease.
    pub fn renew(&mut self, id: i64, now: Instant) -> Option<i64> {
        let t = self.leases.get_mut(&id)?;
        t.expiry = now + secs(t.ttl);
        Some(t.ttl)
    }

    /// (remaining TTL in whole seconds, rounded down as etcd does; granted TTL), None when
    /// there is no such lease.
    pub fn remaining(&self, id: i64, now: Instant) -> Option<(i64, i64)> {
        let t = self.leases.get(&id)?;
        let left = t.expiry.saturating_duration_since(now);
        Some((i64::try_from(left.as_secs()).unwrap_or(i64::MAX), t.ttl))
    }

    /// The leases to revoke now, at most `limit`, the longest expired first: expired, and not
    /// already being revoked (or their revoke was proposed more than `retry` ago and did not
    /// apply: lost with a leader change). The rest wait for a later call.
    pub fn expired(&mut self, now: Instant, retry: Duration, limit: usize) -> Vec<i64> {
        let mut due: Vec<(Instant, i64)> = self
            .leases
            .iter()
            .filter(|(_, t)| t.expiry <= now && t.revoking.is_none_or(|at| now - at >= retry))
            .map(|(&id, t)| (t.expiry, id))
            .collect();
        due.sort_unstable();
        due.truncate(limit);
        let mut out: Vec<i64> = due.into_iter().map(|(_, id)| id).collect();
        for id in &out {
            if let Some(t) = self.leases.get_mut(id) {
                t.revoking = Some(now);
            }
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_renewals_promotion_and_revokes() {
        let t0 = Instant::now();
        let mut l = Lessor::load(&[(1, 5), (2, 10)], t0);
        assert_eq!(l.remaining(1, t0), Some((5, 5)));
        assert_eq!(
            l.remaining(1, t0 + Duration::from_millis(1500)),
            Some((3, 5)),
            "rounded down, as etcd"
        );
        assert_eq!(l.remaining(3, t0), None);
        let retry = Duration::from_millis(500);
        assert!(l.expired(t0 + Duration::from_secs(4), retry, 10).is_empty());
        assert_eq!(l.renew(1, t0 + Duration::from_secs(4)), Some(5));
        assert_eq!(l.renew(3, t0), None);
        assert!(l.expired(t0 + Duration::from_secs(6), retry, 10).is_empty());
        let at = t0 + Duration::from_secs(9);
        assert_eq!(l.expired(at, retry, 10), [1]);
        assert!(l.expired(at, retry, 10).is_empty(), "proposed once");
        assert_eq!(
            l.expired(at + retry, retry, 10),
            [1],
            "again when it did not apply"
        );
        l.revoked(1);
        assert_eq!(l.remaining(1, at), None);
        // A new leader: whole TTLs again, plus the extension.
        l.promote(at, Duration::from_secs(1));
        assert_eq!(l.remaining(2, at), Some((11, 10)));
        assert!(
            l.expired(at + Duration::from_secs(10), retry, 10)
                .is_empty()
        );
        assert_eq!(l.expired(at + Duration::from_secs(11), retry, 10), [2]);
    }

    #[test]
    fn revokes_come_at_most_limit_at_a_time_the_longest_expired_first() {
        let t0 = Instant::now();
        // Lease i expires at t0 + (10 - i) s: lease 9 first.
        let mut l = Lessor::default();
        for i in 0..10 {
            l.granted(i, 10 - i, t0);
        }
        let (at, retry) = (t0 + Duration::from_secs(20), Duration::from_secs(60));
        assert_eq!(l.expired(at, retry, 3), [7, 8, 9]);
        assert_eq!(l.expired(at, retry, 3), [4, 5, 6]);
        assert_eq!(l.expired(at, retry, 100), [0, 1, 2, 3]);
        assert!(l.expired(at, retry, 100).is_empty());
    }
}
