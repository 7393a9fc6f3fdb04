#!/usr/bin/env bash
# Builds the controller-runtime peer (benches/peer-go) and prints its path. Its go.mod requires
# the same versions of controller-runtime and the Kubernetes modules as the e2e control plane's
# (tests/controlplane/go.mod; checked below), and it is built with the same flags, so after the
# control plane's build every package it needs is already in the Go build cache: only its own
# package compiles and links (4 s in CI). Cached under target/peer-go/<hash of go.mod, go.sum, *.go>/.
#   usage: bin=$(benches/peer-go/build.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
key=$( (cat "$here/go.mod" "$here/go.sum" "$here"/*.go) | sha256sum | cut -c1-16)
out_dir=${CARGO_TARGET_DIR:-$root/target}/peer-go/$key
out=$out_dir/peer-go
if [[ -x $out ]]; then
  echo "$out"
  exit 0
fi
# A version of its own would be a cold build of that module's packages in CI: refused.
for module in sigs.k8s.io/controller-runtime k8s.io/api k8s.io/apimachinery k8s.io/client-go github.com/prometheus/client_golang; do
  ours=$(awk -v m="$module" '$1 == m && $2 != "=>" {print $2; exit}' "$here/go.mod")
  theirs=$(awk -v m="$module" '$1 == m && $2 != "=>" {print $2; exit}' "$root/tests/controlplane/go.mod")
  if [[ $ours != "$theirs" ]]; then
    echo "benches/peer-go/build.sh: go.mod requires $module $ours, the control plane $theirs; require the control plane's version" >&2
    exit 1
  fi
done
command -v go >/dev/null 2>&1 || { echo "benches/peer-go/build.sh: the controller-runtime peer is built with Go 1.25 or newer; no go on PATH" >&2; exit 1; }
mkdir -p "$out_dir"
exec 9>"$out_dir.lock"
flock 9
if [[ ! -x $out ]]; then
  start=$(date +%s)
  (cd "$here" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out.tmp" .) >&2
  mv "$out.tmp" "$out"
  echo "peer-go built in $(($(date +%s) - start)) s" >&2
fi
echo "$out"
