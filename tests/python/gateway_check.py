"""etcd's HTTP/JSON gateway, judged by etcd itself and by a real gateway client.

    gateway_check.py transcript ENDPOINT
        Runs etcd's documented curl examples (KV, txn, watch, leases, auth with a token, Lock,
        Election) and the error cases (bad JSON, wrong types, unknown fields and paths,
        oversized bodies) against ENDPOINT and prints what it answered, normalised (ids, terms
        and tokens replaced, keys and values decoded) as JSON. Run against etcd-node and etcd
        3.6 from fresh clusters, the two transcripts must be equal.

    gateway_check.py etcd3gw ENDPOINT
        OpenStack's etcd3gw (what tooz uses) against ENDPOINT: KV, a transaction, leases, its
        lock (tried while held), watches, members and status. Prints "N passed, M failed".
"""

import base64
import json
import sys
import threading
import time

import requests


def b64(text):
    return base64.b64encode(text.encode()).decode()


class Transcript:
    def __init__(self, endpoint):
        self.endpoint = endpoint.rstrip("/")
        self.entries = []
        self.leases = []
        self.token = None

    def normalise(self, value, key=None):
        if isinstance(value, dict):
            return {k: self.normalise(v, k) for k, v in sorted(value.items())}
        if isinstance(value, list):
            return [self.normalise(v, key) for v in value]
        if key in ("cluster_id", "member_id", "raft_term", "leader", "token"):
            return "<%s>" % key
        if key in ("key", "value", "name", "range_end") and isinstance(value, str):
            try:
                value = base64.b64decode(value).decode()
            except (ValueError, UnicodeDecodeError):
                return value
        if isinstance(value, str):
            for lease in self.leases:
                value = value.replace("%x" % lease, "<lease>").replace(str(lease), "<lease>")
        return value

    def call(self, path, body, what, own_words=False, method="POST", raw=None):
        headers = {"Authorization": self.token} if self.token else {}
        data = raw if raw is not None else json.dumps(body)
        r = requests.request(method, self.endpoint + path, data=data, headers=headers, timeout=30)
        try:
            answer = r.json()
        except ValueError:
            answer = {"text": r.text.strip()}
        if r.status_code != 200:
            # etcd 3.4/3.5 answer {"error","code","message"}, 3.6 {"code","message"}: the code
            # and message are what both carry. A JSON parser's or a size limit's own words
            # differ by implementation.
            answer = {"code": answer.get("code"), "message": answer.get("message")}
            if own_words:
                answer["message"] = "<the implementation's words>"
        self.entries.append({"what": what, "status": r.status_code, "answer": self.normalise(answer)})
        return r.status_code, answer

    def stream(self, path, body, what, during, seconds=1.5):
        """A streaming call read for `seconds` while `during()` runs (`body`: a request, or the
        body's text)."""
        lines = []
        data = body if isinstance(body, str) else json.dumps(body)

        def read():
            try:
                with requests.post(self.endpoint + path, data=data, stream=True,
                                   timeout=(5, seconds)) as r:
                    for line in r.iter_lines():
                        if line:
                            lines.append(json.loads(line))
            except requests.exceptions.ConnectionError:
                pass  # (the read timeout ends the stream)

        t = threading.Thread(target=read)
        t.start()
        time.sleep(0.5)
        during()
        t.join()
        self.entries.append({"what": what, "lines": [self.normalise(l) for l in lines]})

    def grant(self, ttl):
        _, answer = self.call("/v3/lease/grant", {"TTL": ttl}, "lease grant %d" % ttl)
        lease = int(answer["ID"])
        self.leases.append(lease)
        # (normalised after the fact: the grant's own entry names the id)
        self.entries[-1]["answer"] = self.normalise(answer)
        return lease


def transcript(endpoint):
    t = Transcript(endpoint)
    # etcd's documented examples (Documentation/dev-guide/api_grpc_gateway.md).
    t.call("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")}, "put")
    t.call("/v3/kv/range", {"key": b64("foo")}, "range")
    t.call("/v3/kv/range", {"key": b64("f"), "range_end": b64("g")}, "prefix range")
    t.call("/v3beta/kv/range", {"key": b64("foo")}, "range under /v3beta")
    t.call("/v3alpha/kv/range", {"key": b64("foo")}, "/v3alpha (etcd 3.4 and 3.6: not served)")
    t.call("/v3/kv/txn", {
        "compare": [{"target": "CREATE", "key": b64("foo"), "createRevision": "2"}],
        "success": [{"requestPut": {"key": b64("foo"), "value": b64("bar2")}}],
    }, "txn (camelCase names, as etcd's docs)")
    t.call("/v3/kv/txn", {
        "compare": [{"target": "VALUE", "key": b64("foo"), "result": "EQUAL", "value": b64("x")}],
        "success": [{"request_delete_range": {"key": b64("foo")}}],
        "failure": [{"request_range": {"key": b64("foo")}}],
    }, "txn (failing compare)")

    def changes():
        t.call("/v3/kv/put", {"key": b64("watched"), "value": b64("1")}, "put watched")
        t.call("/v3/kv/deleterange", {"key": b64("watched"), "prev_kv": True}, "delete watched")
    t.stream("/v3/watch", {"create_request": {"key": b64("watched")}}, "watch", changes)
    t.stream("/v3/watch", {"create_request": {"key": b64("b"), "range_end": b64("a")}},
             "watch of an empty range", lambda: None, seconds=1)
    t.stream("/v3/watch", '{"create_request": {"key": "%s"}} {"create_request": {"key": 5}}' % b64("w"),
             "watch, then a malformed request in the stream", lambda: None, seconds=1)

    lease = t.grant(60)
    t.call("/v3/kv/put", {"key": b64("leased"), "value": b64("v"), "lease": str(lease)}, "put on a lease")
    t.call("/v3/lease/timetolive", {"ID": str(lease), "keys": True}, "lease time to live")
    t.stream("/v3/lease/keepalive", {"ID": str(lease)}, "lease keepalive", lambda: None, seconds=1)
    t.call("/v3/lease/leases", {}, "leases")
    t.call("/v3/kv/lease/revoke", {"ID": str(lease)}, "revoke (the older path)")
    t.call("/v3/lease/revoke", {"ID": str(lease)}, "revoke an unknown lease")
    t.call("/v3/kv/range", {"key": b64("leased")}, "range of a revoked lease's key")

    # Lock and Election.
    lease = t.grant(60)
    _, locked = t.call("/v3/lock/lock", {"name": b64("mylock"), "lease": str(lease)}, "lock")
    t.call("/v3/kv/range", {"key": b64("mylock/"), "range_end": b64("mylock0")}, "the lock's key")
    t.call("/v3/lock/unlock", {"key": locked.get("key")}, "unlock")
    _, campaign = t.call("/v3/election/campaign",
                         {"name": b64("el"), "lease": str(lease), "value": b64("one")}, "campaign")
    leader = campaign.get("leader")
    t.call("/v3/election/leader", {"name": b64("el")}, "leader")

    def proclaim():
        t.call("/v3/election/proclaim", {"leader": leader, "value": b64("two")}, "proclaim")
    t.stream("/v3/election/observe", {"name": b64("el")}, "observe", proclaim)
    t.call("/v3/election/resign", {"leader": leader}, "resign")
    t.call("/v3/election/leader", {"name": b64("el")}, "leader after resigning")
    t.call("/v3/election/proclaim", {"leader": leader, "value": b64("x")}, "proclaim after resigning")
    t.call("/v3/election/resign", {}, "resign without a leader key")

    # Errors.
    t.call("/v3/kv/range", None, "malformed JSON", own_words=True, raw='{"key": "Zm9v"')
    t.call("/v3/kv/range", None, "a number for bytes", own_words=True, raw='{"key": 1}')
    t.call("/v3/kv/range", None, "a word for an integer", own_words=True,
           raw='{"key": "Zm9v", "limit": "abc"}')
    t.call("/v3/kv/range", {"key": b64("foo"), "no_such_field": 1}, "an unknown field")
    t.call("/v3/kv/range", None, "an empty body", raw="")
    t.call("/v3/kv/put", {"key": "", "value": b64("v")}, "an empty key")
    t.call("/v3/kv/put", {"key": b64("big"), "value": base64.b64encode(b"x" * (1600 * 1024)).decode()},
           "a value over --max-request-bytes")
    t.call("/v3/kv/put", {"key": b64("huge"), "value": base64.b64encode(b"x" * (5 << 20)).decode()},
           "a body over the gRPC message limit", own_words=True)
    t.call("/v3/kv/range", {"key": b64("foo"), "revision": "1000"}, "a future revision")
    t.call("/v3/no/such/call", {}, "an unknown path")

    # Auth with a token in the Authorization header (etcd's documented example).
    t.call("/v3/auth/user/add", {"name": "root", "password": "pass"}, "user add root")
    t.call("/v3/auth/role/add", {"name": "root"}, "role add root")
    t.call("/v3/auth/user/grant", {"user": "root", "role": "root"}, "grant root")
    t.call("/v3/auth/enable", {}, "auth enable")
    t.call("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")}, "put without a token")
    t.call("/v3/auth/authenticate", {"name": "root", "password": "wrong"}, "a wrong password")
    _, auth = t.call("/v3/auth/authenticate", {"name": "root", "password": "pass"}, "authenticate")
    t.token = auth.get("token")
    t.call("/v3/kv/put", {"key": b64("foo"), "value": b64("bar3")}, "put with the token")
    t.call("/v3/auth/disable", {}, "auth disable")
    t.token = None
    t.call("/v3/kv/range", {"key": b64("foo")}, "range after auth disable")
    json.dump(t.entries, sys.stdout, indent=1, sort_keys=True)
    print()


def etcd3gw_checks(endpoint):
    from etcd3gw.client import Etcd3Client
    from urllib.parse import urlparse

    u = urlparse(endpoint)
    client = Etcd3Client(host=u.hostname, port=u.port, protocol=u.scheme)
    results = []

    def check(name, f):
        try:
            f()
            results.append((name, None))
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            results.append((name, repr(e)))

    def kv():
        assert client.put("gw/a", "1")
        assert client.get("gw/a") == [b"1"], client.get("gw/a")
        assert client.create("gw/b", "2") and not client.create("gw/b", "3")
        assert sorted(v for v, _ in client.get_prefix("gw/")) == [b"1", b"2"]
        assert client.replace("gw/a", "1", "10") and not client.replace("gw/a", "1", "11")
        assert client.delete("gw/a") and not client.delete("gw/a")
        assert client.delete_prefix("gw/")

    def lease():
        lease = client.lease(ttl=30)
        assert 0 < lease.ttl() <= 30
        client.put("gw/leased", "v", lease=lease)
        assert lease.keys() == [b"gw/leased"], lease.keys()
        assert lease.refresh() == 30
        assert lease.revoke()
        assert client.get("gw/leased") == []

    def lock():
        # (etcd3gw's acquire does not wait: it tries once)
        name = "gw-lock-%d" % time.time_ns()
        first = client.lock(id=name, ttl=30)
        assert first.acquire() and first.is_acquired()
        second = client.lock(id=name, ttl=30)
        assert not second.acquire(), "a second holder while the first holds the lock"
        assert not second.is_acquired()
        assert first.release() and not first.is_acquired()
        assert second.acquire() and second.is_acquired()
        assert second.release()

    def watch():
        events, cancel = client.watch_prefix("gw/w/")
        time.sleep(0.5)
        client.put("gw/w/1", "a")
        client.delete("gw/w/1")
        seen = [next(events), next(events)]
        cancel()
        assert [e.get("type", "PUT") for e in seen] == ["PUT", "DELETE"], seen

    def cluster():
        assert client.status()["version"], client.status()
        assert len(client.members()) >= 1

    for name, f in [("kv", kv), ("lease", lease), ("lock", lock), ("watch", watch),
                    ("members and status", cluster)]:
        check(name, f)
    failed = [r for r in results if r[1]]
    for name, error in failed:
        print("FAILED %s: %s" % (name, error))
    print("%d passed, %d failed" % (len(results) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "transcript":
        transcript(sys.argv[2])
    else:
        sys.exit(etcd3gw_checks(sys.argv[2]))
