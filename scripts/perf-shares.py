#!/usr/bin/env python3
"""Where the sampled CPU time of a perf recording went: by process, thread name and kind of
work, for `perf record -e cpu-clock --call-graph dwarf` of etcd-node or etcd members
(scripts/bench-threads.sh with PERF_SECONDS=N records one).

    perf script -i FILE -F comm,pid,tid,ip,sym | python3 scripts/perf-shares.py

A sample's kind comes from its whole stack, first match wins (the table below). Without the
hardware's counters the kernel takes a cpu-clock sample only where it enables interrupts
again: the cost of a thread's sleep and wake-up lands on `finish_task_switch` and the unlocks
of the scheduler, so the stack around it (a futex or epoll wait, an fsync's wait) says what
the thread waited for. That is why waits are told apart from the work done in the kernel.
"""
import collections
import re
import sys

# (kind, pattern over the stack joined by spaces, pattern the leaf frame must match or None).
KINDS = [
    ("kernel: woken after an fsync", r"fdatasync|fsync", r"finish_task_switch|__schedule|_raw_spin_unlock|handle_softirqs"),
    # (Go's threads also sleep in nanosleep: its monitor thread, and spinning ones that back off)
    ("kernel: woken after a wait for another thread or a socket", r"futex_wait|do_epoll_wait|futex\b|nanosleep|sched_yield", r"finish_task_switch|__schedule|_raw_spin_unlock|handle_softirqs"),
    ("kernel: WAL write and fsync", r"fdatasync|fsync|Wal::write|wal\.\(\*WAL\)", None),
    ("kernel: waking another thread", r"futex_wake|try_to_wake_up|eventfd_write", None),
    ("kernel: TCP over loopback", r"tcp_|__ip_|ip_finish|sock_|net_rx|netif|inet_|do_writev|__sys_recvfrom|__sys_sendto", None),
    ("kernel: files (the key space)", r"pwrite|pread|ext4|filemap|folio|blk_|\bmmap|page_fault|do_fault", None),
    ("kernel: other", r"do_syscall_64|entry_SYSCALL|exit_to_user|irqentry|asm_sysvec", None),
    # (Go's garbage collector is its allocator's cost: counted here)
    ("user: the allocator", r".", r"malloc|free|_int_|consolidate|unlink_chunk|tcache|realloc|^runtime\.(mallocgc|newobject|memclrNoHeapPointers|.*mspan|.*spanSet|.*Span|gc|scan|mark|greyobject|heapBits|wbBuf|bulkBarrier)|gc/scan"),
    ("user: the key-space store (redb, bbolt)", r"redb::|go\.etcd\.io/bbolt", None),
    ("user: gRPC and HTTP/2", r"h2::|hyper::|tonic::|tower|axum|http::|google\.golang\.org/grpc|golang\.org/x/net/http2", None),
    ("user: protobuf", r"prost::|protobuf|\.Marshal|\.Unmarshal", None),
    ("user: the async runtime (tokio), Go's scheduler and channels", r"tokio::|mio::", None),
    ("user: the async runtime (tokio), Go's scheduler and channels", r".", r"^runtime\.|^internal/runtime"),
    ("user: the server's own code (Raft, MVCC, WAL)", r"etcd_node::|go\.etcd\.io/(etcd|raft)|github\.com/google/btree", None),
    ("user: copies", r".", r"memmove|memcpy|memset|memcmp|cmpbody"),
]
COMPILED = [(k, re.compile(s), re.compile(l) if l else None) for k, s, l in KINDS]


def kind(stack):
    joined = " ".join(stack)
    leaf = stack[0] if stack else ""
    for name, over, at in COMPILED:
        if over.search(joined) and (at is None or at.search(leaf)):
            return name
    return "other"


def samples(lines):
    head, stack = None, []
    for line in lines:
        if not line.strip():
            if head:
                yield head, stack
            head, stack = None, []
        elif not line[0].isspace():
            head, stack = line.split(), []
        else:
            frame = line.strip().split(None, 1)
            if len(frame) > 1:
                stack.append(frame[1])
    if head:
        yield head, stack


def main():
    by = collections.defaultdict(collections.Counter)  # pid -> kind -> samples
    threads = collections.defaultdict(collections.Counter)  # (pid, kind) -> thread -> samples
    for head, stack in samples(sys.stdin):
        # (a header is "comm pid/tid" or "comm pid tid": perf prints one or the other)
        comm, pid = head[0], head[1].split("/")[0]
        k = kind(stack)
        by[pid][k] += 1
        threads[(pid, k)][comm] += 1
    if not by:
        sys.exit("perf-shares: no samples on standard input (perf script -F comm,pid,tid,ip,sym)")
    for pid in sorted(by):
        n = sum(by[pid].values())
        print(f"process {pid}: {n} samples")
        for k, m in by[pid].most_common():
            where = ", ".join(
                f"{c} {100 * t / n:.1f}" for c, t in threads[(pid, k)].most_common()
            )
            print(f"  {100 * m / n:5.1f}%  {k:<62} {where}")


if __name__ == "__main__":
    main()
