#!/usr/bin/env bash
# Builds the previous release of etcd-node, for the rolling-upgrade test
# (etcd-node/tests/cluster.rs, a_rolling_upgrade_from_the_previous_release_keeps_every_write),
# and prints the directory that holds its etcd-node and etcdutl. The release is a pinned commit
# (PREVIOUS, default below: the last main that landed before peer versions were announced);
# its source comes from this repository's history (git archive), so a clone without that
# commit cannot run the test. The binaries are cached in target/previous/<commit>/.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${PREVIOUS:-72cd6ef28448e6ec22972b695ca7c80ce9537100}
out="target/previous/$commit"
if [ -x "$out/etcd-node" ] && [ -x "$out/etcdutl" ]; then
  echo "$out"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "build-previous: commit $commit is not in this clone's history (a shallow clone?);" \
    "run 'git fetch --unshallow' or clone the repository whole" >&2
  exit 1
fi
src="target/previous/src-$commit"
rm -rf "$src"
mkdir -p "$src" "$out"
git archive "$commit" | tar -x -C "$src"
echo "build-previous: building etcd-node at ${commit:0:12} (debug, no debug info)" >&2
# (a target directory of its own: its binaries must not replace this tree's)
cargo build --locked --quiet --manifest-path "$src/Cargo.toml" -p etcd-node --bins \
  --config 'profile.dev.debug=0' --target-dir target/previous/build >&2
cp target/previous/build/debug/etcd-node target/previous/build/debug/etcdutl "$out/"
rm -rf "$src"
echo "$out"
