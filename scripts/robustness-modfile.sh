#!/usr/bin/env bash
# Prints the path of a go.mod for `go -modfile` that builds tests/go/robustness against etcd's
# robustness suite (go.etcd.io/etcd/tests/v3, as go.mod pins it) with the fix in
# tests/go/robustness/backport (its README says why). Go takes no overlay of files in the module
# cache, and the cache stays untouched: the module is copied to target/robustness-etcd-tests,
# patched there, and the printed go.mod (go.mod plus a replace of the module) points at it.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD/tests/go/robustness
# (`go list -m` names no directory for a module not yet downloaded: a fresh machine's cache)
(cd "$here" && go mod download go.etcd.io/etcd/tests/v3)
module=$(cd "$here" && go list -m -f '{{.Dir}}' go.etcd.io/etcd/tests/v3)
if [ -z "$module" ] || [ ! -d "$module" ]; then
  echo "robustness-modfile.sh: go.etcd.io/etcd/tests/v3 (pinned in $here/go.mod) is not in the" >&2
  echo "  Go module cache after \`go mod download\`; check that the Go module proxy is reachable" >&2
  exit 1
fi
copy=$PWD/target/robustness-etcd-tests
rm -rf "$copy"
mkdir -p "$(dirname "$copy")"
cp -r "$module" "$copy"
chmod -R u+w "$copy"
if ! patch --quiet --directory="$copy" -p1 < "$here/backport/unique-puts.patch" >&2; then
  echo "robustness-modfile.sh: $here/backport/unique-puts.patch no longer applies to $module;" >&2
  echo "  if go.mod moved to a newer etcd, see $here/backport/README.md (\"Dropping it\")" >&2
  exit 1
fi
cp "$here/backport/marker.go.txt" "$copy/robustness/validate/backported.go"
modfile=$copy.go.mod
{ cat "$here/go.mod"; echo; echo "replace go.etcd.io/etcd/tests/v3 => $copy"; } > "$modfile"
cp "$here/go.sum" "$copy.go.sum"
echo "$modfile"
