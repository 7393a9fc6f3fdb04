#!/usr/bin/env bash
# Builds the real node's container runtime from Go modules (checked against the Go checksum
# database), once, into one cached folder, and prints its path:
#   runc (static, with seccomp: the rendered pods ask for seccompProfile RuntimeDefault; needs
#   libseccomp's static library, the Debian package libseccomp-dev that .ci/run installs),
#   containerd with its runc shim and ctr (image import), the CNI plugins the node's network
#   uses (bridge, host-local, loopback) and the sandbox's pause (pause/).
# The kubelet, kube-scheduler, kube-proxy and the cluster DNS are cases of the control plane's
# multi-call binary (tests/controlplane/build.sh). Cached under target/node/<hash of this file
# and pause/>; concurrent callers wait for one build (flock).
#   usage: dir=$(tests/node/build.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

runc_version=v1.4.4
containerd_version=v2.2.9
cni_version=v1.9.1
parts=(runc containerd containerd-shim-runc-v2 ctr bridge host-local loopback pause)

key=$( (cat "$here/build.sh" "$here"/pause/*) | sha256sum | cut -c1-16)
out=${CARGO_TARGET_DIR:-$root/target}/node/$key
built() {
  for p in "${parts[@]}"; do [[ -x $out/$p ]] || return 1; done
}
if built; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null 2>&1 || { echo "tests/node/build.sh: no go command on PATH; Go builds the real node's runtime" >&2; exit 1; }
lib=$(gcc -print-file-name=libseccomp.a 2>/dev/null || true)
if [[ ! -f $lib && ! -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]]; then
  echo "tests/node/build.sh: runc needs libseccomp's static library (Debian: apt-get install libseccomp-dev)" >&2
  exit 1
fi
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if ! built; then
  echo "building the node's runtime (runc $runc_version, containerd $containerd_version, CNI plugins $cni_version, pause) into $out; the first build takes minutes" >&2
  start=$(date +%s)
  tmp=$out/build.tmp
  rm -rf "$tmp" && mkdir -p "$tmp"
  (
    cd /
    GOFLAGS=-mod=mod GOBIN=$tmp CGO_ENABLED=1 go install -trimpath -tags "seccomp netgo osusergo" \
      -ldflags "-s -w -extldflags -static" "github.com/opencontainers/runc@$runc_version"
    GOFLAGS=-mod=mod GOBIN=$tmp CGO_ENABLED=1 go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
      "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
      "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
      "github.com/containerd/containerd/v2/cmd/ctr@$containerd_version"
    GOFLAGS=-mod=mod GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "github.com/containernetworking/plugins/plugins/main/bridge@$cni_version" \
      "github.com/containernetworking/plugins/plugins/main/loopback@$cni_version" \
      "github.com/containernetworking/plugins/plugins/ipam/host-local@$cni_version"
    cd "$here/pause" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .
  ) >&2
  for p in "${parts[@]}"; do mv "$tmp/$p" "$out/$p"; done
  rmdir "$tmp"
  echo "node runtime built in $(($(date +%s) - start)) s" >&2
fi
echo "$out"
