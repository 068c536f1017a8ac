#!/usr/bin/env python3
"""End-to-end check that a real Python etcd v3 client from PyPI works against etcd-node.

What it checks, through `etcd3` (python-etcd3, the most widely used Python etcd v3 gRPC
client; pinned in requirements.txt) talking to two client endpoints of one cluster:

  kv          put/get on the first endpoint, linearizable read-back on the second,
              get_prefix over several keys (key order, prefix boundary), delete, delete_prefix
  txn         compare on mod_revision with Then(put)/Else(get), as kube-apiserver's
              optimistic update does: success branch, then the failure branch with a stale
              revision; create_revision == 0 (put_if_not_exists)
  lease       grant, put with the lease, time-to-live with keys, lease list, keep-alive,
              revoke (the attached key is gone, time-to-live answers TTL -1), errors for an
              unknown lease
  lock        etcd3's distributed lock (create_revision == 0 txn + lease): acquire, held
              against a second client, release, then acquire by the second client
  watch       prefix watch on the second endpoint while the first one writes: events arrive
              in order with the right types, keys, values and revisions; the server
              acknowledges a cancel; a watch from a past start_revision replays the history
              (with prev_kv)
  cluster     Status (version, leader, db size, raft index/term), Hash, response header IDs
              on every endpoint; HashKV at one revision equal on every endpoint; MemberList
              (regular members with client URLs; with --expect-witness exactly two of them and
              the witness member: a `witness:` peer URL and no client URL)
  compaction  Compact at a revision; a read below it fails with etcd's "required revision
              has been compacted" (OUT_OF_RANGE) on both endpoints, reads at or above it
              work, a watch from below it is told the compact revision

Why: etcd-node claims wire compatibility with etcd v3.5; a third-party client built only from
etcd's protos (not from this repository) is the honest test of that claim.

Where python-etcd3 0.12.0 has no API for something (a Range at a revision: its `revision=`
keyword is silently dropped; LeaseLeases; seeing the server's watch-cancel acknowledgement),
the check calls the client's own generated gRPC stubs over the client's own channel.

Usage: client_check.py [--expect-witness] HOST:PORT [HOST:PORT]
With one endpoint it is used for both roles. Exit code 0 only when every check passed.
"""

import argparse
import queue
import sys
import time
import traceback
import uuid

import grpc

import etcd3
import etcd3.etcdrpc as etcdrpc
import etcd3.events
import etcd3.exceptions
import etcd3.locks
import etcd3.transactions
import etcd3.utils

RPC_TIMEOUT = 5.0  # seconds; a deadline for every call, never a pause
WATCH_DEADLINE = 5.0  # how long to wait for an expected watch event before failing

COMPACTED_MSG = "etcdserver: mvcc: required revision has been compacted"
FUTURE_REV_MSG = "etcdserver: mvcc: required revision is a future revision"
LEASE_NOT_FOUND_MSG = "etcdserver: requested lease not found"


class CheckFailed(AssertionError):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def expect_eq(what, expected, got):
    if expected != got:
        raise CheckFailed("%s: expected %r, got %r" % (what, expected, got))


def expect_rpc_error(what, fn, code, details):
    """Call fn; it must fail with the given gRPC status code and message."""
    try:
        result = fn()
    except grpc.RpcError as e:
        expect(
            e.code() == code and e.details() == details,
            "%s: expected gRPC error %s %r, got %s %r"
            % (what, code.name, details, e.code().name, e.details()),
        )
        return
    raise CheckFailed("%s: expected gRPC error %s %r, got success: %r" % (what, code.name, details, result))


def parse_endpoint(ep):
    ep = ep.split("://", 1)[-1].rstrip("/")
    host, _, port = ep.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit("client_check: endpoint %r is not HOST:PORT" % ep)
    return host, int(port)


class Ctx:
    def __init__(self, endpoints, expect_witness):
        self.names = endpoints
        self.clients = []
        for ep in endpoints:
            host, port = parse_endpoint(ep)
            self.clients.append(etcd3.client(host=host, port=port, timeout=RPC_TIMEOUT))
        self.a = self.clients[0]
        self.b = self.clients[-1]
        self.a_name = endpoints[0]
        self.b_name = endpoints[-1]
        self.expect_witness = expect_witness
        self.base = "/pycheck/%s/" % uuid.uuid4().hex

    def key(self, *parts):
        return self.base + "/".join(parts)


def range_at(client, key, revision, range_end=b""):
    """A Range at a revision via the client's stub (etcd3.get ignores revision=)."""
    req = etcdrpc.RangeRequest(key=key.encode(), range_end=range_end, revision=revision)
    return client.kvstub.Range(req, RPC_TIMEOUT)


# --------------------------------------------------------------------------- checks


def check_kv(ctx):
    a, b = ctx.a, ctx.b
    k = ctx.key("kv", "single")

    r1 = a.put(k, "v1").header.revision
    val, meta = b.get(k)  # etcd3's get is linearizable unless serializable=True
    expect_eq("get %r on %s right after put on %s: value" % (k, ctx.b_name, ctx.a_name), b"v1", val)
    expect_eq("get %r: create_revision" % k, r1, meta.create_revision)
    expect_eq("get %r: mod_revision" % k, r1, meta.mod_revision)
    expect_eq("get %r: version" % k, 1, meta.version)
    expect_eq("get %r: key" % k, k.encode(), meta.key)
    expect(meta.response_header.revision >= r1,
           "get %r on %s: header revision %d is below the put's revision %d (stale read)"
           % (k, ctx.b_name, meta.response_header.revision, r1))

    resp = a.put(k, "v2", prev_kv=True)
    r2 = resp.header.revision
    expect(r2 > r1, "second put of %r: revision %d not above the first put's %d" % (k, r2, r1))
    expect_eq("put %r with prev_kv: prev_kv.value" % k, b"v1", resp.prev_kv.value)
    val, meta = b.get(k)
    expect_eq("get %r after second put: value" % k, b"v2", val)
    expect_eq("get %r after second put: version" % k, 2, meta.version)
    expect_eq("get %r after second put: create_revision" % k, r1, meta.create_revision)
    expect_eq("get %r after second put: mod_revision" % k, r2, meta.mod_revision)

    expect_eq("get of a key never written", (None, None), b.get(ctx.key("kv", "absent")))

    # Several keys under a prefix, written out of order; a key equal to the prefix's range
    # end (last byte '/' + 1 = '0') must stay outside the prefix.
    prefix = ctx.key("kv", "list") + "/"
    names = ["c", "a", "e", "b", "d"]
    for n in names:
        a.put(prefix + n, "val-" + n)
    outside = ctx.key("kv", "list") + "0"
    a.put(outside, "outside")

    got = [(m.key.decode(), v.decode()) for v, m in b.get_prefix(prefix)]
    want = [(prefix + n, "val-" + n) for n in sorted(names)]
    expect_eq("get_prefix %r on %s (key order, no key outside the prefix)" % (prefix, ctx.b_name), want, got)
    got_desc = [m.key.decode() for _, m in b.get_prefix(prefix, sort_order="descend", sort_target="key")]
    expect_eq("get_prefix %r sorted descending by key" % prefix, [k for k, _ in reversed(want)], got_desc)
    got_keys = [(m.key.decode(), v) for v, m in b.get_prefix(prefix, keys_only=True)]
    expect_eq("get_prefix %r keys_only (values empty)" % prefix, [(k, b"") for k, _ in want], got_keys)

    expect_eq("delete %r (existing) returns" % k, True, a.delete(k))
    expect_eq("get %r on %s after delete" % (k, ctx.b_name), (None, None), b.get(k))
    expect_eq("delete %r again (already gone) returns" % k, False, a.delete(k))

    dresp = a.delete(prefix + "a", prev_kv=True, return_response=True)
    expect_eq("delete %r with prev_kv: deleted" % (prefix + "a"), 1, dresp.deleted)
    expect_eq("delete %r with prev_kv: prev_kvs values" % (prefix + "a"),
              [b"val-a"], [kv.value for kv in dresp.prev_kvs])

    dp = a.delete_prefix(prefix)
    expect_eq("delete_prefix %r: deleted count" % prefix, len(names) - 1, dp.deleted)
    expect_eq("get_prefix %r on %s after delete_prefix" % (prefix, ctx.b_name), [], list(b.get_prefix(prefix)))
    val, _ = b.get(outside)
    expect_eq("key %r just past the prefix's range end after delete_prefix %r" % (outside, prefix), b"outside", val)


def check_txn(ctx):
    a, b = ctx.a, ctx.b
    t = a.transactions
    k = ctx.key("txn", "obj")

    rev0 = a.put(k, "gen-1").header.revision
    _, meta = b.get(k)
    expect_eq("mod_revision of %r read on %s" % (k, ctx.b_name), rev0, meta.mod_revision)

    # kube-apiserver GuaranteedUpdate: If(ModRevision(key) == rev) Then(Put) Else(Get)
    ok, responses = a.transaction(
        compare=[t.mod(k) == rev0],
        success=[t.put(k, "gen-2")],
        failure=[etcd3.transactions.Get(k)],
    )
    expect_eq("txn mod_revision(%r) == %d (current): succeeded" % (k, rev0), True, ok)
    expect_eq("txn success branch: number of responses", 1, len(responses))
    expect_eq("txn success branch: response kind", "response_put", responses[0].WhichOneof("response"))
    val, meta = b.get(k)
    expect_eq("value of %r after the successful txn" % k, b"gen-2", val)
    rev1 = meta.mod_revision
    expect(rev1 > rev0, "mod_revision of %r after the successful txn: %d, not above %d" % (k, rev1, rev0))

    # Same compare with the now-stale revision: failure branch, which reads the current object.
    ok, responses = a.transaction(
        compare=[t.mod(k) == rev0],
        success=[t.put(k, "lost-update")],
        failure=[etcd3.transactions.Get(k)],
    )
    expect_eq("txn mod_revision(%r) == %d (stale): succeeded" % (k, rev0), False, ok)
    expect_eq("txn failure branch: number of responses", 1, len(responses))
    got = [(v, m.mod_revision) for v, m in responses[0]]
    expect_eq("txn failure branch: Get(%r) returns current value and mod_revision" % k, [(b"gen-2", rev1)], got)
    val, _ = b.get(k)
    expect_eq("value of %r after the failed txn (must be unchanged)" % k, b"gen-2", val)

    # create_revision == 0: "create if absent" (put_if_not_exists)
    expect_eq("put_if_not_exists on existing %r" % k, False, a.put_if_not_exists(k, "x"))
    k2 = ctx.key("txn", "new")
    expect_eq("put_if_not_exists on absent %r" % k2, True, a.put_if_not_exists(k2, "created"))
    val, _ = b.get(k2)
    expect_eq("value of %r after put_if_not_exists" % k2, b"created", val)

    # value compare (replace), both outcomes
    expect_eq("replace(%r, 'created' -> 'replaced')" % k2, True, a.replace(k2, "created", "replaced"))
    expect_eq("replace(%r, 'created' -> 'again') with stale value" % k2, False, a.replace(k2, "created", "again"))
    val, _ = b.get(k2)
    expect_eq("value of %r after the replaces" % k2, b"replaced", val)


def check_lease(ctx):
    a, b = ctx.a, ctx.b
    ttl = 30
    lease = a.lease(ttl)
    expect(lease.id > 0, "lease grant: expected a positive lease ID, got %r" % lease.id)
    expect_eq("lease grant: granted TTL", ttl, lease.ttl)

    k = ctx.key("lease", "attached")
    a.put(k, "leased", lease=lease)
    val, meta = b.get(k)
    expect_eq("get %r on %s: value" % (k, ctx.b_name), b"leased", val)
    expect_eq("get %r on %s: lease_id" % (k, ctx.b_name), lease.id, meta.lease_id)

    info = b.get_lease_info(lease.id)  # LeaseTimeToLive with keys=true
    expect_eq("LeaseTimeToLive on %s: ID" % ctx.b_name, lease.id, info.ID)
    expect_eq("LeaseTimeToLive on %s: grantedTTL" % ctx.b_name, ttl, info.grantedTTL)
    expect(0 < info.TTL <= ttl, "LeaseTimeToLive on %s: TTL %d not in (0, %d]" % (ctx.b_name, info.TTL, ttl))
    expect_eq("LeaseTimeToLive on %s: keys" % ctx.b_name, [k.encode()], list(info.keys))

    listed = b.leasestub.LeaseLeases(etcdrpc.LeaseLeasesRequest(), RPC_TIMEOUT)
    expect(lease.id in [l.ID for l in listed.leases],
           "LeaseLeases on %s: lease %d missing from %r" % (ctx.b_name, lease.id, [l.ID for l in listed.leases]))

    ka = lease.refresh()  # one LeaseKeepAlive round trip
    expect_eq("keep-alive: number of responses", 1, len(ka))
    expect_eq("keep-alive: ID", lease.id, ka[0].ID)
    expect_eq("keep-alive: TTL", ttl, ka[0].TTL)

    lease.revoke()
    expect_eq("get %r on %s after its lease was revoked" % (k, ctx.b_name), (None, None), b.get(k))
    info = b.get_lease_info(lease.id)
    expect_eq("LeaseTimeToLive of the revoked lease on %s: TTL" % ctx.b_name, -1, info.TTL)
    listed = b.leasestub.LeaseLeases(etcdrpc.LeaseLeasesRequest(), RPC_TIMEOUT)
    expect(lease.id not in [l.ID for l in listed.leases],
           "LeaseLeases on %s: revoked lease %d still listed" % (ctx.b_name, lease.id))
    ka = lease.refresh()
    expect_eq("keep-alive of the revoked lease: number of responses", 1, len(ka))
    expect_eq("keep-alive of the revoked lease: TTL", 0, ka[0].TTL)

    expect_rpc_error("LeaseRevoke of the already revoked lease",
                     lambda: a.leasestub.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease.id), RPC_TIMEOUT),
                     grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND_MSG)
    expect_rpc_error("Put with the revoked lease",
                     lambda: a.kvstub.Put(etcdrpc.PutRequest(key=k.encode(), value=b"x", lease=lease.id),
                                          RPC_TIMEOUT),
                     grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND_MSG)


def check_lock(ctx):
    # etcd3's Lock: Txn If(CreateRevision(/locks/NAME) == 0) Then(Put with a lease) Else(Get);
    # release is Txn If(Value == own uuid) Then(Delete).
    name = ctx.base.strip("/") + "/lock"
    key = etcd3.locks.Lock.lock_prefix + name
    holder = ctx.a.lock(name, ttl=10)
    contender = ctx.b.lock(name, ttl=10)
    expect_eq("lock %r: acquire on %s" % (key, ctx.a_name), True, holder.acquire(timeout=5))
    expect_eq("lock %r: is_acquired by the holder" % key, True, holder.is_acquired())
    _, meta = ctx.b.get(key)
    expect_eq("lock key %r read on %s: lease_id is the holder's lease" % (key, ctx.b_name),
              holder.lease.id, meta and meta.lease_id)
    # timeout=0 is a single attempt, no waiting: it must fail while the lock is held
    expect_eq("lock %r: acquire on %s while held" % (key, ctx.b_name), False, contender.acquire(timeout=0))
    expect_eq("lock %r: keep-alive TTL" % key, 10, holder.refresh()[0].TTL)
    expect_eq("lock %r: release by the holder" % key, True, holder.release())
    expect_eq("lock %r: is_acquired by the former holder" % key, False, holder.is_acquired())
    expect_eq("lock %r: acquire on %s after release" % (key, ctx.b_name), True, contender.acquire(timeout=0))
    expect_eq("lock %r: release by the former holder again (not its lock)" % key, False, holder.release())
    expect_eq("lock %r: release by the new holder" % key, True, contender.release())
    for lk in (holder, contender):
        lk.lease.revoke()


def _describe(ev):
    kind = {etcd3.events.PutEvent: "PUT", etcd3.events.DeleteEvent: "DELETE"}.get(type(ev), type(ev).__name__)
    return (kind, ev.key.decode(), ev.value.decode(), ev.mod_revision)


class EventCollector:
    """A watch callback that queues what it gets, so the test can wait with a deadline."""

    def __init__(self):
        self.q = queue.Queue()

    def __call__(self, resp_or_err):
        self.q.put(resp_or_err)

    def take(self, n, what):
        """The next n events, failing if they do not all arrive within WATCH_DEADLINE."""
        out = []
        deadline = time.monotonic() + WATCH_DEADLINE
        while len(out) < n:
            left = deadline - time.monotonic()
            try:
                item = self.q.get(timeout=max(left, 0))
            except queue.Empty:
                raise CheckFailed("%s: got %d of %d events within %.0fs: %r"
                                  % (what, len(out), n, WATCH_DEADLINE, [_describe(e) for e in out]))
            if isinstance(item, Exception):
                raise CheckFailed("%s: watch failed with %r after events %r"
                                  % (what, item, [_describe(e) for e in out]))
            out.extend(item.events)
        return out

    def take_error(self, what):
        try:
            item = self.q.get(timeout=WATCH_DEADLINE)
        except queue.Empty:
            raise CheckFailed("%s: nothing arrived within %.0fs" % (what, WATCH_DEADLINE))
        return item


def check_watch(ctx):
    a, b = ctx.a, ctx.b
    prefix = ctx.key("watch") + "/"

    live = EventCollector()
    wid = b.add_watch_prefix_callback(prefix, live)  # returns once the server said "created"

    ops = []  # expected events: (type, key, value, mod_revision)
    r = a.put(prefix + "k1", "one").header.revision
    ops.append(("PUT", prefix + "k1", "one", r))
    r = a.put(prefix + "k2", "two").header.revision
    ops.append(("PUT", prefix + "k2", "two", r))
    a.put(ctx.key("watch-sibling"), "not watched")  # outside the prefix
    r = a.put(prefix + "k1", "one-b").header.revision
    ops.append(("PUT", prefix + "k1", "one-b", r))
    r = a.delete(prefix + "k2", return_response=True).header.revision
    ops.append(("DELETE", prefix + "k2", "", r))

    got = [_describe(e) for e in live.take(len(ops), "watch %r on %s" % (prefix, ctx.b_name))]
    expect_eq("events of the watch on %r (%s) for writes on %s" % (prefix, ctx.b_name, ctx.a_name), ops, got)
    b.cancel_watch(wid)

    # Replay from the first write's revision, with prev_kv.
    replay = EventCollector()
    rid = b.add_watch_prefix_callback(prefix, replay, start_revision=ops[0][3], prev_kv=True)
    evs = replay.take(len(ops), "watch %r from start_revision %d" % (prefix, ops[0][3]))
    expect_eq("events replayed from start_revision %d" % ops[0][3], ops, [_describe(e) for e in evs])
    prev = [e.prev_value.decode() if e._event.HasField("prev_kv") else None for e in evs]
    expect_eq("prev_kv values of the replayed events", [None, None, "one", "two"], prev)
    b.cancel_watch(rid)

    # The server acknowledges a cancel (etcd3 does not wait for it, so use its stub directly).
    reqs = queue.Queue()
    reqs.put(etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
        key=prefix.encode(), range_end=etcd3.utils.increment_last_byte(prefix.encode()))))

    def req_iter():
        while True:
            item = reqs.get()
            if item is None:
                return
            yield item

    stream = b.watcher._watch_stub.Watch(req_iter(), timeout=RPC_TIMEOUT * 2)
    try:
        first = next(stream)
        expect(first.created, "raw watch create: first response is not created=true: %r" % first)
        reqs.put(etcdrpc.WatchRequest(cancel_request=etcdrpc.WatchCancelRequest(watch_id=first.watch_id)))
        second = next(stream)
        expect(second.canceled and second.watch_id == first.watch_id and not second.events,
               "raw watch cancel of watch %d: expected canceled=true for that id with no events, got %r"
               % (first.watch_id, second))
    finally:
        reqs.put(None)
        stream.cancel()


def check_cluster(ctx):
    statuses = []
    for name, c in zip(ctx.names, ctx.clients):
        s = c.status()
        expect(s.version, "Status on %s: empty version" % name)
        expect(s.db_size > 0, "Status on %s: dbSize %r is not positive" % (name, s.db_size))
        expect(s.leader is not None, "Status on %s: leader ID is not a member from MemberList" % name)
        expect(s.raft_index > 0 and s.raft_term > 0,
               "Status on %s: raftIndex %r / raftTerm %r not positive" % (name, s.raft_index, s.raft_term))
        h = c.hash()
        expect(isinstance(h, int), "Hash on %s: not an integer: %r" % (name, h))
        statuses.append(s)
    leaders = {s.leader.id for s in statuses}
    expect_eq("leader ID reported by Status on %s (all must agree)" % ", ".join(ctx.names), 1, len(leaders))

    # Response headers name the cluster and the member that answered.
    headers = [c.maintenancestub.Status(etcdrpc.StatusRequest(), RPC_TIMEOUT).header for c in ctx.clients]
    cluster_ids = {h.cluster_id for h in headers}
    expect(len(cluster_ids) == 1 and 0 not in cluster_ids,
           "Status header cluster_id on %s: expected one non-zero ID, got %r" % (", ".join(ctx.names), cluster_ids))

    # HashKV at one revision is the same on every member.
    rev = ctx.a.get_response(ctx.key("cluster", "none")).header.revision
    for c in ctx.clients:
        c.get_response(ctx.key("cluster", "none"))  # linearizable: each member has applied rev
    hashes = [c.maintenancestub.HashKV(etcdrpc.HashKVRequest(revision=rev), RPC_TIMEOUT) for c in ctx.clients]
    expect_eq("HashKV(revision=%d) (hash, compact_revision) on %s" % (rev, ", ".join(ctx.names)),
              [(hashes[0].hash, hashes[0].compact_revision)] * len(hashes),
              [(h.hash, h.compact_revision) for h in hashes])

    members = list(ctx.a.members)
    desc = [(m.name, m.id, list(m.peer_urls), list(m.client_urls)) for m in members]
    ids = [m.id for m in members]
    expect_eq("MemberList: member IDs are unique", len(ids), len(set(ids)))
    expect(all(m.peer_urls for m in members), "MemberList: a member without peer URLs: %r" % desc)
    witness = [m for m in members if any(u.startswith("witness:") for u in m.peer_urls)]
    regular = [m for m in members if m not in witness]
    all_client_urls = [u for m in regular for u in m.client_urls]
    for name in ctx.names:
        expect(any(u.split("://", 1)[-1].rstrip("/") == name for u in all_client_urls),
               "MemberList: endpoint %s is no member's client URL: %r" % (name, desc))
    expect(any(s.leader.id == m.id for m in regular for s in statuses),
           "Status leader %r is not a regular member of %r" % (leaders, desc))
    for name, h in zip(ctx.names, headers):
        owners = [m for m in regular
                  if any(u.split("://", 1)[-1].rstrip("/") == name for u in m.client_urls)]
        if len(owners) == 1:
            expect_eq("Status header member_id on %s (member %s has that client URL)" % (name, owners[0].name),
                      owners[0].id, h.member_id)

    if ctx.expect_witness:
        expect_eq("MemberList: number of regular members (%r)" % desc, 2, len(regular))
        for m in regular:
            expect(m.client_urls, "MemberList: regular member %s has no client URLs: %r" % (m.name, desc))
        expect_eq("MemberList: number of witness members (%r)" % desc, 1, len(witness))
        w = witness[0]
        expect_eq("MemberList: witness %s peer URLs all witness: URLs" % w.name,
                  len(w.peer_urls), sum(1 for u in w.peer_urls if u.startswith("witness:")))
        expect_eq("MemberList: witness %s client URLs" % w.name, [], list(w.client_urls))
        # the other endpoint sees the same membership
        other = sorted((m.id, m.name, tuple(m.peer_urls), tuple(m.client_urls)) for m in ctx.b.members)
        expect_eq("MemberList on %s vs %s" % (ctx.b_name, ctx.a_name),
                  sorted((m.id, m.name, tuple(m.peer_urls), tuple(m.client_urls)) for m in members), other)
    elif witness:
        print("     (cluster: %d witness member(s) not checked without --expect-witness)" % len(witness))


def check_compaction(ctx):
    a, b = ctx.a, ctx.b
    k = ctx.key("compact", "k")
    r1 = a.put(k, "v1").header.revision
    r2 = a.put(k, "v2").header.revision
    r3 = a.put(k, "v3").header.revision

    resp = range_at(b, k, r1)  # before compaction: history is readable
    expect_eq("Range %r at revision %d before compaction" % (k, r1), [b"v1"], [kv.value for kv in resp.kvs])

    a.compact(r2, physical=True)

    for name, c in ((ctx.a_name, a), (ctx.b_name, b)):
        expect_rpc_error("Range %r at revision %d on %s after Compact(%d)" % (k, r1, name, r2),
                         lambda: range_at(c, k, r1), grpc.StatusCode.OUT_OF_RANGE, COMPACTED_MSG)
        resp = range_at(c, k, r2)
        expect_eq("Range %r at revision %d (= compact revision) on %s" % (k, r2, name),
                  [b"v2"], [kv.value for kv in resp.kvs])
        resp = range_at(c, k, r3)
        expect_eq("Range %r at revision %d on %s" % (k, r3, name), [b"v3"], [kv.value for kv in resp.kvs])

    current = a.get_response(k).header.revision
    expect_rpc_error("Range %r at future revision %d" % (k, current + 1000),
                     lambda: range_at(a, k, current + 1000), grpc.StatusCode.OUT_OF_RANGE, FUTURE_REV_MSG)
    expect_rpc_error("Compact(%d) again (not above the compact revision)" % r2,
                     lambda: a.compact(r2), grpc.StatusCode.OUT_OF_RANGE, COMPACTED_MSG)
    expect_rpc_error("Compact(%d) (future revision)" % (current + 1000),
                     lambda: a.compact(current + 1000), grpc.StatusCode.OUT_OF_RANGE, FUTURE_REV_MSG)

    # A watch from a compacted revision: etcd3 surfaces the server's compact_revision.
    w = EventCollector()
    what = "watch %r from compacted start_revision %d on %s" % (k, r1, ctx.b_name)
    try:
        wid = b.add_watch_callback(k, w, start_revision=r1)
    except etcd3.exceptions.RevisionCompactedError as e:
        item = e  # the server put compact_revision on the created response itself
    else:
        item = w.take_error(what)
        b.cancel_watch(wid)
    expect(isinstance(item, etcd3.exceptions.RevisionCompactedError),
           "%s: expected RevisionCompactedError, got %r" % (what, item))
    expect_eq("%s: compact_revision" % what, r2, item.compacted_revision)


def describe_unexpected(e):
    """The error, the gRPC status under it (etcd3 replaces it with its own exception) and where."""
    rpc = e if isinstance(e, grpc.RpcError) else e.__context__
    if isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code"):
        grpc_status = "gRPC %s %r" % (rpc.code().name, rpc.details())
        detail = grpc_status if rpc is e else "%r from %s" % (e, grpc_status)
    else:
        detail = repr(e)
    here = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__]
    if here:
        detail += " at line %d: %s" % (here[-1].lineno, here[-1].line)
    return "unexpected error: " + detail


CHECKS = [
    ("kv", check_kv),
    ("txn", check_txn),
    ("lease", check_lease),
    ("lock", check_lock),
    ("watch", check_watch),
    ("cluster", check_cluster),
    ("compaction", check_compaction),
]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("endpoints", nargs="+", metavar="HOST:PORT",
                   help="client endpoints; the first writes, the last reads and watches")
    p.add_argument("--expect-witness", action="store_true",
                   help="require MemberList to show 2 regular members and 1 witness member")
    p.add_argument("--only", action="append", choices=[n for n, _ in CHECKS], help="run only these checks")
    args = p.parse_args(argv)

    ctx = Ctx(args.endpoints, args.expect_witness)
    print("client_check: etcd3 %s against %s, keys under %s" % (etcd3.__version__, ", ".join(ctx.names), ctx.base))
    for name, c in zip(ctx.names, ctx.clients):
        try:
            c.maintenancestub.Status(etcdrpc.StatusRequest(), RPC_TIMEOUT)
        except grpc.RpcError as e:
            print("client_check: endpoint %s does not answer Status: %s %r" % (name, e.code().name, e.details()))
            return 2
    passed, failed = 0, 0
    started = time.monotonic()
    try:
        for name, fn in CHECKS:
            if args.only and name not in args.only:
                continue
            t0 = time.monotonic()
            try:
                fn(ctx)
            except CheckFailed as e:
                failed += 1
                print("FAIL %-10s %s" % (name, e))
            except Exception as e:  # an unexpected error is a failure of that check, not a crash
                failed += 1
                print("FAIL %-10s %s" % (name, describe_unexpected(e)))
            else:
                passed += 1
                print("ok   %-10s (%.2fs)" % (name, time.monotonic() - t0))
    finally:
        try:
            ctx.a.delete_prefix(ctx.base)
            ctx.a.delete_prefix(etcd3.locks.Lock.lock_prefix + ctx.base.strip("/") + "/")
        except Exception as e:
            print("note: cleanup of %s failed: %r" % (ctx.base, e))
        # Channels are left for process exit to close: closing them under etcd3's watch thread
        # makes that thread die with a traceback on stderr.
    print("client_check: took %.1fs" % (time.monotonic() - started))
    print("client_check: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
