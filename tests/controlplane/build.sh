#!/usr/bin/env bash
# Builds the end-to-end tests' control plane (etcd, kube-apiserver, kube-controller-manager, the real
# node's kube-scheduler, kubelet, kube-proxy and cluster DNS, and
# cert-manager's controller and cainjector in one multi-call binary, see main.go) from the Go
# modules pinned by go.mod/go.sum, once, and prints its path; cert-manager's CRDs are copied beside
# it (cert-manager-crds/). Prometheus' promtool (go.mod's `tool`, a main package of its own) is
# built by the same `go build` into the same folder (promtool), sharing its dependencies. The binary is cached under target/controlplane/<hash of go.mod, go.sum, *.go>/, so a
# second call only prints the path; concurrent callers wait for one build (flock).
#   usage: bin=$(tests/controlplane/build.sh)
#          bin=$(tests/controlplane/build.sh tests/controlplane/oldest)
# The argument names another module folder with the same main (oldest/: the oldest Kubernetes and
# cert-manager the chart claims, without the node's parts, the S3 server, the collector or promtool).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
module=$(cd "${1:-$here}" && pwd)

# Kubernetes' version string, set at link time (otherwise /version says v0.0.0): the
# k8s.io/kubernetes version the module requires.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$module/go.mod")
[[ $k8s_version == v1.* ]] || {
  echo "tests/controlplane/build.sh: $module/go.mod does not require k8s.io/kubernetes" >&2
  exit 1
}
# promtool, when the module names it as a tool (the main module does; oldest/ does not).
with_promtool=false
grep -q '^tool github.com/prometheus/prometheus/cmd/promtool$' "$module/go.mod" && with_promtool=true

# The Prometheus operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), for the e2e check
# that the chart's monitors and alerts are accepted as the operator defines them: taken from the
# operator's Go module at this version (`go mod download` checks it against the Go checksum
# database), copied beside the binary (prometheus-operator-crds/).
prometheus_operator_version=v0.89.0

# cat follows oldest/'s links to the main module's files.
key=$( (cat "$module/go.mod" "$module/go.sum" "$module"/*.go; echo "$prometheus_operator_version $with_promtool") | sha256sum | cut -c1-16)
out_dir=${CARGO_TARGET_DIR:-$root/target}/controlplane/$key
out=$out_dir/controlplane
crds=$out_dir/cert-manager-crds
monitoring_crds=$out_dir/prometheus-operator-crds
built() {
  [[ -x $out && -d $crds && -d $monitoring_crds ]] || return 1
  ! $with_promtool || [[ -x $out_dir/promtool ]]
}
if built; then
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<'MSG'
tests/controlplane/build.sh: the end-to-end tests build a real Kubernetes control plane from Go
modules, and no `go` command is on PATH. Install Go 1.25 or newer (Debian: apt-get install
golang-go, if its version is new enough; otherwise the official tarball) and run the tests again.
MSG
  exit 1
fi

mkdir -p "$out_dir"
exec 9>"$out_dir.lock"
flock 9
if ! built; then
  echo "building the control plane (kube-apiserver $k8s_version, kube-controller-manager, etcd, cert-manager; promtool: $with_promtool) from $module into $out_dir; the first build takes minutes" >&2
  start=$(date +%s)
  minor=${k8s_version#v1.}
  minor=${minor%%.*}
  rm -rf "$out_dir/build.tmp" && mkdir -p "$out_dir/build.tmp"
  tools=()
  $with_promtool && tools=(github.com/prometheus/prometheus/cmd/promtool)
  (
    cd "$module"
    go build -mod=readonly -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
      -o "$out_dir/build.tmp/" . "${tools[@]}"
  ) >&2
  ! $with_promtool || mv "$out_dir/build.tmp/promtool" "$out_dir/promtool"
  mv "$out_dir/build.tmp/$(basename "$module")" "$out"
  rmdir "$out_dir/build.tmp"
  # cert-manager's CRDs, from the same module version as its controllers.
  cm_dir=$(cd "$module" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
  rm -rf "$crds.tmp" && mkdir -p "$crds.tmp"
  cp "$cm_dir"/deploy/crds/*.yaml "$crds.tmp"/
  rm -rf "$crds" && mv "$crds.tmp" "$crds"
  po_dir=$(cd / && go mod download -json "github.com/prometheus-operator/prometheus-operator@$prometheus_operator_version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n $po_dir ]] || { echo "could not download the Prometheus operator's module $prometheus_operator_version" >&2; exit 1; }
  rm -rf "$monitoring_crds.tmp" && mkdir -p "$monitoring_crds.tmp"
  for kind in servicemonitors podmonitors prometheusrules; do
    cp "$po_dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$monitoring_crds.tmp"/
  done
  rm -rf "$monitoring_crds" && mv "$monitoring_crds.tmp" "$monitoring_crds"
  echo "control plane built in $(($(date +%s) - start)) s" >&2
fi
echo "$out"
