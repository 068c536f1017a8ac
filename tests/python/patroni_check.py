"""Patroni (Debian's) managing two PostgreSQL servers on etcd-node, as on two machines.

    patroni_check.py WORKDIR ENDPOINT0 ENDPOINT1 MEMBER1_PID

"Machine" i is PostgreSQL and Patroni node pgi, talking to etcd-node member i at ENDPOINTi
(through etcd's JSON gateway, as Patroni's etcd3 driver does). The check, each step timed:

1. bootstrap: pg0 becomes the primary, pg1 a streaming, synchronous replica;
2. a writer inserts rows with synchronous commit the whole time and remembers each commit
   PostgreSQL acknowledged;
3. switchover to pg1 (Patroni's REST API), the writer follows;
4. machine 1 (now the primary's) dies at once: kill -9 of its Patroni, its PostgreSQL and its
   etcd-node member (MEMBER1_PID);
5. pg0 is promoted (etcd-node's member 0 and the witness keep the cluster writable); the time
   from the kill to the first acknowledged insert on pg0 is measured;
6. every acknowledged row is on pg0.

Runs as root: PostgreSQL and Patroni run as the `postgres` user (setpriv). Prints the timings
and "patroni check passed", or what failed.
"""

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg2

BIN = "/usr/lib/postgresql/15/bin"
# Patroni's defaults are ttl 30, loop_wait 10, retry_timeout 10: a failover within about 30 s.
# These make the test shorter; docs/patroni.md explains the trade-off.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 2, 5


def log(message):
    print("[%7.2f] %s" % (time.monotonic() - START, message), flush=True)


START = time.monotonic()


def config(workdir, i, endpoint, pg_port, rest_port):
    # (JSON is YAML: no YAML library needed)
    return {
        "scope": "etcd-node-patroni",
        "name": "pg%d" % i,
        "restapi": {"listen": "127.0.0.1:%d" % rest_port, "connect_address": "127.0.0.1:%d" % rest_port},
        "etcd3": {"hosts": [endpoint.split("://")[-1]], "protocol": "http"},
        "bootstrap": {
            "dcs": {
                "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {"wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
                                   "max_wal_senders": 5, "max_replication_slots": 5},
                },
            },
            "initdb": [{"encoding": "UTF8"}, "data-checksums"],
            "pg_hba": ["local all all trust", "host replication replicator 127.0.0.1/32 trust",
                       "host all all 127.0.0.1/32 trust"],
        },
        "postgresql": {
            "listen": "127.0.0.1:%d" % pg_port,
            "connect_address": "127.0.0.1:%d" % pg_port,
            "data_dir": os.path.join(workdir, "data%d" % i),
            "bin_dir": BIN,
            "pgpass": os.path.join(workdir, "pgpass%d" % i),
            "authentication": {
                "replication": {"username": "replicator", "password": "rep"},
                "superuser": {"username": "postgres", "password": "pg"},
                "rewind": {"username": "rewinder", "password": "rw"},
            },
            "parameters": {"unix_socket_directories": workdir},
        },
    }


class Node:
    def __init__(self, workdir, i, endpoint, pg_port, rest_port):
        self.i, self.pg_port, self.rest_port, self.workdir = i, pg_port, rest_port, workdir
        self.config_path = os.path.join(workdir, "pg%d.yml" % i)
        with open(self.config_path, "w") as f:
            json.dump(config(workdir, i, endpoint, pg_port, rest_port), f, indent=1)
        self.log = open(os.path.join(workdir, "patroni%d.log" % i), "w")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
             "/usr/bin/patroni", self.config_path],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)

    def role(self):
        """'primary', 'replica' or None, from Patroni's REST API."""
        for path, role in (("/primary", "primary"), ("/replica", "replica")):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.rest_port, path), timeout=2) as r:
                    if r.status == 200:
                        return role
            except Exception:  # noqa: BLE001 (503, refused, timeout: not that role)
                pass
        return None

    def sync_standby(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/sync" % self.rest_port, timeout=2) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001
            return False

    def kill_machine(self):
        """kill -9 of this node's Patroni and PostgreSQL (its etcd-node member: the caller)."""
        self.proc.send_signal(signal.SIGKILL)
        with open(os.path.join(self.workdir, "data%d" % self.i, "postmaster.pid")) as f:
            postmaster = int(f.readline())
        # The postmaster and every backend (they are its children, in its process group).
        try:
            os.killpg(postmaster, signal.SIGKILL)
        except ProcessLookupError:
            os.kill(postmaster, signal.SIGKILL)
        for line in subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                   text=True).stdout.split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def connect(self):
        return psycopg2.connect(host="127.0.0.1", port=self.pg_port, user="postgres",
                                dbname="postgres", connect_timeout=2)


def wait_for(what, condition, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("%s: not within %d s" % (what, limit))


def first_ack(writer, node, after):
    """When `node` first acknowledged an insert after `after` (None: not yet)."""
    return next((t for t, i in list(writer.acks) if i == node and t > after), None)


class Writer(threading.Thread):
    """Inserts rows, one transaction each, into whichever node Patroni says is the primary."""

    def __init__(self, nodes):
        super().__init__(daemon=True)
        self.nodes = nodes
        self.acked = []
        self.next_id = 0
        self.stopping = False
        self.acks = []  # (time, node index) of each acknowledged insert

    def run(self):
        conn, node = None, None
        while not self.stopping:
            try:
                if conn is None:
                    node = next((n for n in self.nodes if n.role() == "primary"), None)
                    if node is None:
                        time.sleep(0.1)
                        continue
                    conn = node.connect()
                    conn.autocommit = True
                self.next_id += 1
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO acked (id) VALUES (%s)", (self.next_id,))
                self.acked.append(self.next_id)
                self.acks.append((time.monotonic(), node.i))
            except psycopg2.Error:
                # Not acknowledged (maybe committed: that is allowed, not counted).
                try:
                    if conn is not None:
                        conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                time.sleep(0.05)


def main():
    workdir, endpoint0, endpoint1, member1_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.makedirs(workdir, exist_ok=True)
    pg = pwd.getpwnam("postgres")
    os.chown(workdir, pg.pw_uid, pg.pw_gid)
    os.chmod(workdir, 0o700)
    ports = [int(p) for p in os.environ.get("PATRONI_PORTS", "55432 55433 58008 58009").split()]
    nodes = [Node(workdir, 0, endpoint0, ports[0], ports[2]), Node(workdir, 1, endpoint1, ports[1], ports[3])]
    timings = {}
    try:
        t = time.monotonic()
        nodes[0].start()
        wait_for("pg0 bootstraps as the primary", lambda: nodes[0].role() == "primary", 90)
        nodes[1].start()
        wait_for("pg1 streams as a replica", lambda: nodes[1].role() == "replica", 90)
        wait_for("pg1 is the synchronous standby", nodes[1].sync_standby, 60)
        timings["bootstrap (both nodes)"] = time.monotonic() - t
        log("bootstrapped: pg0 primary, pg1 synchronous replica")
        with nodes[0].connect() as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE acked (id bigint PRIMARY KEY)")
        writer = Writer(nodes)
        writer.start()
        time.sleep(3)

        t = time.monotonic()
        req = urllib.request.Request("http://127.0.0.1:%d/switchover" % nodes[0].rest_port,
                                     data=json.dumps({"leader": "pg0", "candidate": "pg1"}).encode(),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            log("switchover: %s %s" % (r.status, r.read().decode().strip()))
        wait_for("pg1 is the primary after the switchover", lambda: nodes[1].role() == "primary", 60)
        wait_for("pg0 streams from pg1", lambda: nodes[0].role() == "replica", 90)
        wait_for("pg0 is pg1's synchronous standby", nodes[0].sync_standby, 60)
        wait_for("the writer writes to pg1", lambda: first_ack(writer, 1, t) is not None, 30)
        timings["switchover"] = time.monotonic() - t
        log("switched over: pg1 primary, pg0 synchronous replica; %d rows acknowledged" % len(writer.acked))
        time.sleep(3)

        killed = time.monotonic()
        nodes[1].kill_machine()
        os.kill(member1_pid, signal.SIGKILL)
        log("machine 1 killed (Patroni, PostgreSQL, etcd-node member)")
        wait_for("pg0 is promoted", lambda: nodes[0].role() == "primary", 120)
        wait_for("the writer writes to pg0", lambda: first_ack(writer, 0, killed) is not None, 60)
        timings["kill -9 of the primary's machine to the first acknowledged write on pg0"] = \
            first_ack(writer, 0, killed) - killed
        time.sleep(2)
        writer.stopping = True
        writer.join(10)
        with nodes[0].connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM acked")
            present = {row[0] for row in cur.fetchall()}
        lost = [i for i in writer.acked if i not in present]
        for name, seconds in timings.items():
            print("timing: %s: %.2f s" % (name, seconds))
        print("rows acknowledged: %d, lost: %d" % (len(writer.acked), len(lost)))
        if lost:
            print("LOST (acknowledged by a synchronous commit, missing on pg0): %s" % lost[:20])
            return 1
        print("patroni check passed")
        return 0
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    sys.exit(main())
