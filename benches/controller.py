#!/usr/bin/env python3
"""Controller benchmark: what the reconcile loop costs, against a fake API server on loopback.

Starts an in-memory API server (this file; GET/LIST, POST, PATCH of the four kinds, DELETE,
the status subresource, watches with ADDED/MODIFIED/DELETED events; label selectors, canonical
storage quantities, the StatefulSet and Job fields the apiserver refuses to change, and
resourceVersion preconditions by the same rules as tests/common/fake_api.rs, the Rust fake of the
unit and integration tests: each Python function names its Rust twin; the garbage collector's
Orphan/Foreground steps are modelled there only, as this cycle never deletes that way), preloads N
EtcdClusters,
then runs the release binary three ways and reports each against the webhooks-only baseline
of the same run:

  A  --controller off                    idle RSS: the baseline
  B  --controller on, no EtcdClusters    idle RSS of the loop, its watches and the Lease
  C  --controller on, N EtcdClusters     time and CPU until every cluster has a status, RSS
                                         after, then the API calls of steady resyncs (none
                                         expected: reads come from the watch caches)

  python3 benches/controller.py               # N=200, release build
  python3 benches/controller.py --clusters 1000
  python3 benches/controller.py --smoke       # debug binary, N=5: checks the harness (CI)
"""
import argparse
import bisect
import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote_plus, urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benches"))
from load import Proc, sh  # noqa: E402


def merge(target, patch, delete_nulls):
    """RFC 7386 (delete_nulls) or a simplified server-side apply (lists replaced whole)."""
    if not isinstance(target, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            if delete_nulls:
                out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v, delete_nulls)
    return out


def json_patch(doc, ops):
    """RFC 6902 add/remove/replace/test, enough for finalizers and annotations."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            else:
                parent.insert(int(last), op["value"])
        else:
            parent[last] = op["value"]
    return doc


def where(path):
    """(group/version prefix, namespace, resource, name) of an API path."""
    segs = path.strip("/").split("/")
    n = 2 if segs[0] == "api" else 3
    prefix, rest = "/".join(segs[:n]), segs[n:]
    if len(rest) == 1:
        return prefix, None, rest[0], None
    if len(rest) >= 3 and rest[0] == "namespaces":
        return prefix, rest[1], rest[2], rest[3] if len(rest) > 3 else None
    return prefix, None, None, None


def selected(query, obj):
    """Whether the labelSelector of `query` (if any) selects `obj`: k=v, k==v, k!=v, k, !k, all
    required; the same rules as selected() in tests/common/fake_api.rs (the Rust fake of the
    unit and integration tests); keep the two alike."""
    params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
    selector = unquote_plus(params.get("labelSelector", ""))
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for req in filter(None, (r.strip() for r in selector.split(","))):
        if " in " in req or " notin " in req:
            raise ValueError(f"set-based selector {req!r} is not modelled")
        if "!=" in req:
            k, v = req.split("!=", 1)
            ok = labels.get(k.strip()) != v.strip()
        elif "=" in req:
            k, v = req.replace("==", "=").split("=", 1)
            ok = labels.get(k.strip()) == v.strip()
        elif req.startswith("!"):
            ok = req[1:] not in labels
        else:
            ok = req in labels
        if not ok:
            return False
    return True


SUFFIXES = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def canonical(q):
    """A storage quantity as the apiserver stores it: whole GiB in the largest binary suffix
    with a whole mantissa (1024Gi -> 1Ti); anything else as written. The same rule as
    src/api/quantity.rs canonical(), which the Rust fake uses."""
    m = re.fullmatch(r"([+-]?)(\d*\.?\d*)(e[+-]?\d+|E[+-]?\d+|[a-zA-Z]*)", q.strip())
    if not m or m.group(2) in ("", "."):
        return q
    sign, number, suffix = m.groups()
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        value = Fraction(number) * Fraction(10) ** int(suffix[1:])
    elif suffix in SUFFIXES:
        value = Fraction(number) * SUFFIXES[suffix]
    else:
        return q
    if sign == "-" or value.denominator != 1 or value % 2**30:
        return q
    n = int(value) // 2**30
    if n == 0:
        return "0"
    for suffix in ("Gi", "Ti", "Pi"):
        if n % 1024:
            return f"{n}{suffix}"
        n //= 1024
    return f"{n}Ei"


def canonicalize(obj, quantities=False):
    """Canonical quantities under requests, limits and capacity, in place."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if quantities and isinstance(v, str):
                obj[k] = canonical(v)
            else:
                canonicalize(v, k in ("requests", "limits", "capacity"))
    elif isinstance(obj, list):
        for v in obj:
            canonicalize(v)


STS_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "revisionHistoryLimit",
               "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def immutable_change(path, before, after):
    """The apiserver's 422 for a change it refuses (StatefulSet spec outside the mutable
    fields, a Job's template), or None; the same rules as tests/common/fake_api.rs."""
    name = after["metadata"].get("name", "")
    if "/statefulsets/" in path:
        def fixed(o):
            return {k: v for k, v in (o.get("spec") or {}).items() if k not in STS_MUTABLE}
        if fixed(before) != fixed(after):
            return {"kind": "Status", "code": 422, "reason": "Invalid", "message":
                    f'StatefulSet.apps "{name}" is invalid: spec: Forbidden: updates to statefulset spec '
                    "for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
                    "'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and "
                    "'minReadySeconds' are forbidden"}
    if "/jobs/" in path and (before.get("spec") or {}).get("template") != (after.get("spec") or {}).get("template"):
        return {"kind": "Status", "code": 422, "reason": "Invalid",
                "message": f'Job.batch "{name}" is invalid: spec.template: Invalid value: field is immutable'}
    return None


class Store:
    def __init__(self):
        self.lock = threading.Condition()
        self.objects = {}
        self.version = 0
        self.calls = Counter()
        self.events = []  # (resourceVersion, type, path, object), for watches
        self.versions = []  # their resourceVersions, ascending

    def bump(self, obj):
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)

    def changed(self, kind, path, obj):
        """Records a change for the watches (call with the lock held)."""
        self.events.append((self.version, kind, path, copy.deepcopy(obj)))
        self.versions.append(self.version)
        self.lock.notify_all()

    def watch(self, path, query, since, until, send):
        """Sends the changes of `path`'s resource after `since` until `until` (a time); with a
        labelSelector, only the objects it selects (one that stops being selected: DELETED)."""
        prefix, ns, res, _ = where(path)
        with self.lock:
            index = bisect.bisect_right(self.versions, since)
        while time.time() < until:
            with self.lock:
                if index >= len(self.events):
                    self.lock.wait(timeout=0.5)
                batch = self.events[index:]
                index = len(self.events)
            for _, kind, key, obj in batch:
                p, n, r, _ = where(key)
                if p == prefix and r == res and (ns is None or n == ns):
                    if not selected(query, obj):
                        if kind != "MODIFIED":
                            continue
                        kind = "DELETED"
                    if not send({"type": kind, "object": obj}):
                        return

    def handle(self, method, path, query, ctype, body):
        sub = path.endswith("/status")
        if sub:
            path = path[: -len("/status")]
        prefix, ns, res, name = where(path)
        with self.lock:
            self.calls[(method, res, "status" if sub else "")] += 1
            if method == "GET" and name is None:
                items = [
                    o for k, o in self.objects.items()
                    if where(k)[0] == prefix and where(k)[2] == res and (ns is None or where(k)[1] == ns)
                    and selected(query, o)
                ]
                return 200, {"apiVersion": "v1", "kind": "List",
                             "metadata": {"resourceVersion": str(self.version)}, "items": items}
            obj = self.objects.get(path)
            if method == "GET":
                return (200, obj) if obj else (404, notfound(path))
            if method == "POST":
                key = f"{path}/{body['metadata']['name']}"
                canonicalize(body)
                self.bump(body)
                body["metadata"].setdefault("uid", f"uid-{self.version}")
                self.objects[key] = body
                self.changed("ADDED", key, body)
                return 201, body
            if method == "DELETE":
                if obj is None:
                    return 404, notfound(path)
                if obj["metadata"].get("finalizers"):
                    obj["metadata"].setdefault(
                        "deletionTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                    self.bump(obj)
                    self.changed("MODIFIED", path, obj)
                    return 200, obj
                self.bump(obj)
                self.changed("DELETED", path, obj)
                return 200, self.objects.pop(path)
            if method != "PATCH":
                return 405, notfound(path)
            if obj is None and "apply-patch" not in ctype:
                return 404, notfound(path)
            want_rv = ((body or {}).get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if obj is not None and want_rv and obj["metadata"].get("resourceVersion") != want_rv:
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict", "message":
                             f"Operation cannot be fulfilled on {path}: the object has been modified; "
                             "please apply your changes to the latest version and try again"}
            before = copy.deepcopy(obj) if obj else None
            if "apply-patch" in ctype:
                new = merge(obj or {}, body, False)
            elif "json-patch" in ctype:
                try:
                    new = json_patch(obj, body)
                except (ValueError, KeyError, IndexError) as e:
                    return 422, {"kind": "Status", "code": 422, "reason": "Invalid", "message": str(e)}
            else:
                new = merge(obj, body, True)
            canonicalize(new)
            if before is not None and not sub:
                invalid = immutable_change(path, before, new)
                if invalid:
                    return 422, invalid
            if "/etcdclusters/" in path:
                keep = new.get("status") if sub else (before or {}).get("status")
                new = copy.deepcopy(before or new) if sub else new
                if keep is not None:
                    new["status"] = keep
                elif "status" in new:
                    del new["status"]
            if new != before:
                self.bump(new)
                new["metadata"].setdefault("uid", f"uid-{self.version}")
                if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                    self.objects.pop(path, None)
                    self.changed("DELETED", path, new)
                else:
                    self.objects[path] = new
                    self.changed("MODIFIED" if before else "ADDED", path, new)
            return 200, new


def notfound(path):
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
            "code": 404, "message": f"{path} not found"}


def fake_api(store, stop):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do(self):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.command == "GET" and "watch=true" in url.query:
                query = dict(p.split("=", 1) for p in url.query.split("&") if "=" in p)
                since = int(query.get("resourceVersion") or 0)
                until = time.time() + int(query.get("timeoutSeconds") or 290)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()

                def send(event):
                    if stop.is_set():
                        return False
                    data = json.dumps(event).encode() + b"\n"
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        return True
                    except OSError:
                        return False

                store.watch(url.path, url.query, since, until, send)
                try:
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
                return
            body = json.loads(raw) if raw else None
            code, out = store.handle(self.command, url.path, url.query,
                                     self.headers.get("Content-Type", ""), body)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = do

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cluster(i):
    return {"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": f"etcd-{i}", "namespace": "bench", "uid": f"cluster-{i}",
                         "generation": 1, "resourceVersion": "1"},
            "spec": {"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "10Gi",
                     "backup": {"enabled": True, "schedule": "0 */6 * * *", "retention": 7}}}


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def simulate(store, stop):
    """The kubelet and the Job controller, in short: StatefulSet pods become ready, Jobs
    complete, a moment after they appear."""
    while not stop.wait(0.1):
        with store.lock:
            for path, o in list(store.objects.items()):
                if "/statefulsets/" in path:
                    want = o.get("spec", {}).get("replicas", 0)
                    if o.get("status", {}).get("readyReplicas") != want:
                        o = copy.deepcopy(o)
                        o["status"] = {"replicas": want, "readyReplicas": want,
                                       "currentRevision": "r1", "updateRevision": "r1"}
                        store.bump(o)
                        store.objects[path] = o
                        store.changed("MODIFIED", path, o)
                elif "/jobs/" in path and not o.get("status", {}).get("succeeded"):
                    o = copy.deepcopy(o)
                    o["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                    store.bump(o)
                    store.objects[path] = o
                    store.changed("MODIFIED", path, o)


def edit_clusters(store, n, change):
    """Changes every cluster as a user would (a MODIFIED event each)."""
    with store.lock:
        for i in range(n):
            path = f"/apis/etcd.example.com/v1/namespaces/bench/etcdclusters/etcd-{i}"
            o = copy.deepcopy(store.objects[path])
            if change == "delete":
                o["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            else:
                change(o)
                o["metadata"]["generation"] += 1
            store.bump(o)
            store.objects[path] = o
            store.changed("MODIFIED", path, o)


def wait_for(store, what, deadline):
    while time.time() < deadline:
        with store.lock:
            clusters = [o for k, o in store.objects.items() if "/etcdclusters/" in k]
            if what(clusters):
                return True
        time.sleep(0.05)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", type=int, default=200)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--resync", type=int, default=10, help="--resync-interval in seconds")
    ap.add_argument("--skip-build", action="store_true",
                    help="use the binary already under target/ (in --smoke: the one `cargo test` built)")
    args = ap.parse_args()
    n = 5 if args.smoke else args.clusters
    if args.smoke:
        args.resync = 2
    profile = "debug" if args.smoke else "release"
    if not args.skip_build:
        sh(["cargo", "build", "--bin", "etcd-webhook"] + ([] if args.smoke else ["--release"]), cwd=ROOT)
    binary = os.path.join(ROOT, "target", profile, "etcd-webhook")
    if not os.path.isfile(binary):
        raise SystemExit(f"--skip-build: {binary} is missing (`cargo test` builds the debug one)")
    tmp = tempfile.mkdtemp(prefix="etcd-webhook-ctl-")
    sh([binary, "certs", "--out", os.path.join(tmp, "certs")])

    store, stop = Store(), threading.Event()
    server = fake_api(store, stop)
    kubeconfig = os.path.join(tmp, "kubeconfig")
    with open(kubeconfig, "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "http://127.0.0.1:{server.server_address[1]}"}}}}]
users: [{{name: fake, user: {{token: bench}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: bench}}}}]
current-context: fake
""")
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    argv = [binary, "--log-format", "text", "serve", "--cert-dir", os.path.join(tmp, "certs"),
            "--addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0", "--shutdown-delay", "0s",
            "--resync-interval", f"{args.resync}s", "--lease-duration", "15s", "--identity", "bench"]

    def start(name, env, *extra):
        return Proc(name, argv + list(extra), env, "etcd-webhook listening", os.path.join(tmp, f"{name}.log"))

    # --controller auto is off outside a pod, so the loop is asked for explicitly.
    on = ("--controller", "on", "--leader-election-namespace", "bench")

    settle = 2 if args.smoke else 5
    off = start("off", base, "--controller", "off")
    time.sleep(settle)
    rss_off = off.mem("VmRSS")
    off.stop()
    on_env = dict(base, KUBECONFIG=kubeconfig)
    idle = start("idle", on_env, *on)
    time.sleep(settle)
    rss_idle = idle.mem("VmRSS")
    idle.stop()

    with store.lock:
        for i in range(n):
            store.objects[f"/apis/etcd.example.com/v1/namespaces/bench/etcdclusters/etcd-{i}"] = cluster(i)
        store.calls.clear()
    threading.Thread(target=simulate, args=(store, stop), daemon=True).start()
    limit = 60 if args.smoke else 900
    phases = []
    busy = start("busy", on_env, *on)
    try:
        cycle(store, busy, n, args, limit, phases)
    finally:
        busy.stop()
        stop.set()
        server.shutdown()
    report(binary, profile, n, rss_off, rss_idle, phases)


def cycle(store, busy, n, args, limit, phases):
    """Create, steady, delete; each phase's wall time, CPU and calls into `phases`."""
    t0 = time.time()
    pid = busy.p.pid

    def phase(name, started, cpu0, pid):
        with store.lock:
            calls = Counter(store.calls)
            store.calls.clear()
        phases.append((name, time.time() - started, cpu_seconds(pid) - cpu0, calls))

    def running(size):
        return lambda cs: len(cs) == n and all(
            c.get("status", {}).get("phase") == "Running" and c["status"].get("readyReplicas") == size
            for c in cs)

    cpu0 = cpu_seconds(pid)
    if not wait_for(store, running(3), t0 + limit):
        raise SystemExit(f"clusters did not reach Running; log: {busy.log.name}")
    phase("create (to Running)", t0, cpu0, pid)

    t1, cpu1 = time.time(), cpu_seconds(pid)
    time.sleep(2 * args.resync + 1)
    phase(f"steady ({2 * args.resync + 1} s, 2 resyncs)", t1, cpu1, pid)

    # No scale phase: a scale-up is decided from etcd's member list (learner add, promote), and
    # this fake API runs no etcd; tests/members.rs measures it against real members.

    t3, cpu3 = time.time(), cpu_seconds(pid)
    edit_clusters(store, n, "delete")
    if not wait_for(store, lambda cs: not cs, t3 + limit):
        raise SystemExit(f"clusters were not finalized; log: {busy.log.name}")
    phase("delete (final snapshot, finalizer)", t3, cpu3, pid)
    phases.append(("rss", busy.mem("VmRSS")))


def report(binary, profile, n, rss_off, rss_idle, phases):
    rss_busy = phases.pop()[1]
    print(f"binary: {profile}, {os.path.getsize(binary) / 1e6:.1f} MB; clusters: {n} (3 members, backups to a volume)")
    print(f"A webhooks only         idle RSS {rss_off:.1f} MiB (baseline)")
    print(f"B controller, idle      idle RSS {rss_idle:.1f} MiB ({rss_idle / rss_off:.2f}x)")
    print(f"C controller, {n} clusters, RSS after the cycle {rss_busy:.1f} MiB ({rss_busy / rss_off:.2f}x)")
    print(f"  {'phase':38} {'wall s':>7} {'CPU s':>6}  API calls per cluster (Lease excluded)")
    steady_calls = None
    for name, wall, cpu, calls in phases:
        per = Counter()
        for (method, res, sub), count in calls.items():
            if res != "leases":
                per[f"{method} {res}{'/status' if sub else ''}"] += count
        verbs = Counter()
        for key, count in per.items():
            verbs[key.split()[0]] += count
        text = ", ".join(f"{v} {c / n:.2f}" for v, c in sorted(verbs.items())) or "none"
        print(f"  {name:38} {wall:7.2f} {cpu:6.2f}  {text}")
        print(f"  {'':38} {'':7} {'':6}  {dict(sorted((k, round(c / n, 2)) for k, c in per.items()))}")
        if name.startswith("steady"):
            steady_calls = per
    if steady_calls:
        raise SystemExit("steady state called the API for the clusters")


if __name__ == "__main__":
    main()
