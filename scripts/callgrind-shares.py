#!/usr/bin/env python3
"""Where a callgrind file's instructions went, for files that callgrind_annotate reads badly
(a dump taken after `callgrind_control -z` gives it all to `clone`).

    python3 scripts/callgrind-shares.py FILE                  # own instructions, by crate
    python3 scripts/callgrind-shares.py FILE --top 30         # ... and the top functions
    python3 scripts/callgrind-shares.py FILE --inclusive NAME # cost of the calls into NAME

A function's own instructions are the cost lines under its `fn=`; a call's inclusive cost is
the line after its `calls=`. The inclusive cost of NAME (any function whose name contains it)
sums the calls into it from functions that do not match NAME themselves, so nested and
recursive calls are not counted twice. Names are compressed in the file as `(id) name` once,
then `(id)`.
"""
import argparse
import collections
import re

NAME = re.compile(r"^(c?fn)=\((\d+)\)(?: (.*))?$")

# (prefix of the function's path, group), first match wins.
CRATES = [
    ("redb", "redb"),
    ("h2::", "HTTP/2, gRPC and the runtime"),
    ("hyper", "HTTP/2, gRPC and the runtime"),
    ("tonic", "HTTP/2, gRPC and the runtime"),
    ("tower", "HTTP/2, gRPC and the runtime"),
    ("axum", "HTTP/2, gRPC and the runtime"),
    ("tokio", "HTTP/2, gRPC and the runtime"),
    ("prost", "prost"),
    ("etcd_node", "etcd-node"),
    ("witness", "etcd-node"),
]
# glibc's, mimalloc's (mi_*) and jemalloc's (je_*, through LD_PRELOAD) functions
ALLOCATOR = re.compile(
    r"malloc|free|_int_|realloc|calloc|__rdl_|memalign|unlink_chunk|consolidate|^_?mi_|^je_"
)
MEM = re.compile(r"memcpy|memset|memmove|memcmp")


def group(name):
    bare = name.lstrip("<")
    for prefix, label in CRATES:
        if bare.startswith(prefix):
            return label
    if ALLOCATOR.search(name):
        return "allocator"
    if MEM.search(name):
        return "memcpy, memset, memcmp"
    return "other"


def read(path):
    """(own cost by function, inclusive cost by (caller, callee)) of the file."""
    names, own, into = {}, collections.Counter(), collections.Counter()
    current = callee = None
    call_cost_next = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if call_cost_next:
                parts = line.split()
                if len(parts) >= 2 and callee is not None:
                    into[(current, callee)] += int(parts[1])
                call_cost_next = False
                continue
            m = NAME.match(line)
            if m:
                kind, ident, name = m.groups()
                if name:
                    names[ident] = name
                if kind == "fn":
                    current = names.get(ident, ident)
                else:
                    callee = names.get(ident, ident)
                continue
            if line.startswith("calls="):
                call_cost_next = True
                continue
            if line[:1].isdigit() or line[:1] in ("+", "-", "*"):
                parts = line.split()
                if len(parts) >= 2 and current is not None:
                    own[current] += int(parts[1])
    return own, into


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--top", type=int, default=0, help="also list the N costliest functions")
    p.add_argument("--inclusive", action="append", default=[], help="a function name's part")
    args = p.parse_args()
    own, into = read(args.file)
    total = sum(own.values())
    print(f"instructions: {total:,}")
    groups = collections.Counter()
    for name, cost in own.items():
        groups[group(name)] += cost
    for label, cost in groups.most_common():
        print(f"{cost / total * 100:5.1f}%  {label}")
    for name, cost in own.most_common(args.top):
        print(f"{cost / total * 100:5.1f}%  {cost:>14,}  {name[:120]}")
    for part in args.inclusive:
        cost = sum(c for (caller, n), c in into.items() if part in n and part not in caller)
        print(f"{cost / total * 100:5.1f}%  {cost:>14,}  calls into *{part}* (inclusive)")


if __name__ == "__main__":
    main()
