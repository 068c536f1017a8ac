#!/usr/bin/env bash
# Builds the previous release of etcd-node, for the rolling-upgrade test
# (etcd-node/tests/e2e/cluster.rs, a_rolling_upgrade_from_the_previous_release_keeps_every_write),
# and prints the directory that holds its etcd-node and etcdutl. The release is a pinned commit
# (PREVIOUS, default below: the last main that landed before peer versions were announced);
# its source comes from this repository's history (git archive), so a clone without that
# commit cannot run the test. The binaries are cached in target/previous/<commit>/.
# `--where` prints that directory without building anything (the test asks it, and fails with
# this script's command when the binaries are not there: a test never builds them itself).
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${PREVIOUS:-72cd6ef28448e6ec22972b695ca7c80ce9537100}
out="target/previous/$commit"
if [ "${1:-}" = --where ]; then
  echo "$out"
  exit 0
fi
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
# vendor/h2 has not changed since that commit: point its patch at this tree's copy, so that the
# patched h2 and everything built on it is the same package as this tree's and is built once.
sed -i "s|^h2 = { path = \"vendor/h2\" }|h2 = { path = \"$PWD/vendor/h2\" }|" "$src/Cargo.toml"
# The previous release's binaries get names of their own (etcd-node-previous, ...): they are
# built into this tree's target directory, and under their own names they never take the place
# of this tree's target/debug/etcd-node and etcdutl, which tests running meanwhile start.
sed -i '/^\[\[bin\]\]$/,/^path/ s/^name = "\(.*\)"$/name = "\1-previous"/' "$src/etcd-node/Cargo.toml"
echo "build-previous: building etcd-node at ${commit:0:12}" >&2
# The target directory is this tree's, with its profile: the crates both releases use (all of
# them but the workspace's own, at the pinned Cargo.lock) are built once and shared with
# `cargo test`.
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --locked --quiet --manifest-path "$src/Cargo.toml" -p etcd-node \
  --bin etcd-node-previous --bin etcdutl-previous \
  --config "profile.dev.package.etcd-node.opt-level=0" --config "profile.dev.package.etcd-node.debug=0" \
  --target-dir "$target" >&2
cp "$target/debug/etcd-node-previous" "$out/etcd-node"
cp "$target/debug/etcdutl-previous" "$out/etcdutl"
rm -rf "$src"
echo "$out"
