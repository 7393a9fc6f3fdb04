#!/usr/bin/env bash
# Builds etcd v3.5 (the release tests/etcd35/go.mod pins) from its Go modules, once, and prints
# the binary's path: the older release of the rolling-upgrade test (v3.5 -> the control plane's
# v3.6). Cached under target/etcd35/<hash of go.mod, go.sum, main.go>/etcd; concurrent callers
# wait for one build (flock).
#   usage: bin=$(tests/etcd35/build.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
key=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)
out_dir=${CARGO_TARGET_DIR:-$root/target}/etcd35/$key
out=$out_dir/etcd
if [[ -x $out ]]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null 2>&1 || {
  echo "tests/etcd35/build.sh: no go command on PATH; Go builds etcd v3.5 for the upgrade test" >&2
  exit 1
}
mkdir -p "$out_dir"
exec 9>"$out_dir.lock"
flock 9
if [[ ! -x $out ]]; then
  echo "building etcd $(grep 'go.etcd.io/etcd/server/v3 ' "$here/go.mod" | awk '{print $2}') into $out_dir" >&2
  start=$(date +%s)
  (cd "$here" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out.tmp" .) >&2
  mv "$out.tmp" "$out"
  echo "etcd v3.5 built in $(($(date +%s) - start)) s" >&2
fi
echo "$out"
