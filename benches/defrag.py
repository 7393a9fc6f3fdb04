#!/usr/bin/env python3
"""A defragmentation of a large database on real etcd, with the member's probes watched.

For each release (v3.6.4 from the control-plane binary, v3.5.35 from tests/etcd35), one member
on loopback with a quota of 8 GiB is filled with --gib GiB of 1 MiB values, half of them are
overwritten and the history compacted (so half the file is free), then a defragmentation is
sent while /livez, /readyz (/health on 3.5) and maintenance/status are polled every second with
a 1 s timeout. Printed: the database before and after, how long the defragmentation took, and
for each poll target the longest stretch it did not answer (what the kubelet's probes and the
loop's status reads see). The figures go in docs/benchmarks.md.

    python3 benches/defrag.py            # 2 GiB on both releases (~4 minutes)
    python3 benches/defrag.py --gib 1 --release v3.6.4
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 1 << 20


def built(script):
    out = subprocess.run(["bash", os.path.join(ROOT, script)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.split()
    return out[-1]


def binaries(release):
    if release == "v3.6.4":
        return [built("tests/controlplane/build.sh"), "etcd"]
    return [built("tests/etcd35/build.sh")]


def post(url, path, body, timeout):
    req = urllib.request.Request(url + "/v3/" + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def get(url, path, timeout):
    with urllib.request.urlopen(url + path, timeout=timeout) as r:
        return r.status


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class Poller(threading.Thread):
    """Asks `probe` every second (1 s timeout); records the longest stretch without an answer."""

    def __init__(self, name, probe):
        super().__init__(daemon=True)
        self.name, self.probe = name, probe
        self.stop = threading.Event()
        self.longest = 0.0
        self.failed = 0
        self.asked = 0
        self.last_ok = time.monotonic()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            self.asked += 1
            try:
                self.probe()
                self.last_ok = time.monotonic()
            except Exception:
                self.failed += 1
                self.longest = max(self.longest, time.monotonic() - self.last_ok)
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))


def measure(release, gib):
    data = tempfile.mkdtemp(prefix="defrag-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    port = 23790 if release == "v3.6.4" else 23890
    url = f"http://127.0.0.1:{port}"
    cmd = binaries(release) + [
        "--name", "d", "--data-dir", os.path.join(data, "data"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{port + 1}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{port + 1}",
        "--initial-cluster", f"d=http://127.0.0.1:{port + 1}",
        "--quota-backend-bytes", str(8 << 30), "--log-level", "warn",
    ]
    log = open(os.path.join(data, "etcd.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        for _ in range(100):
            try:
                post(url, "maintenance/status", {}, 1)
                break
            except Exception:
                time.sleep(0.1)
        value = b64(os.urandom(MIB))
        n = gib * 1024
        t = time.monotonic()
        for round_ in range(2):  # the second round overwrites: half the file becomes history
            for i in range(n // 2):
                post(url, "kv/put", {"key": b64(f"k{i:06d}"), "value": value}, 30)
        filled = time.monotonic() - t
        status = post(url, "maintenance/status", {}, 5)
        rev = int(status["header"]["revision"])
        post(url, "kv/compaction", {"revision": rev, "physical": True}, 600)
        before = post(url, "maintenance/status", {}, 5)
        health = "/readyz" if release == "v3.6.4" else "/health"
        pollers = [
            Poller("livez", lambda: get(url, "/livez", 1)),
            Poller(health.strip("/"), lambda: get(url, health, 1)),
            Poller("status", lambda: post(url, "maintenance/status", {}, 1)),
        ]
        for p in pollers:
            p.start()
        time.sleep(2)
        t = time.monotonic()
        post(url, "maintenance/defragment", {}, 3600)
        took = time.monotonic() - t
        time.sleep(2)
        for p in pollers:
            p.stop.set()
            p.join()
        after = post(url, "maintenance/status", {}, 5)
        return {
            "release": release,
            "filled_gib": gib,
            "fill_seconds": round(filled, 1),
            "db_before_mib": int(before["dbSize"]) // MIB,
            "in_use_before_mib": int(before.get("dbSizeInUse", 0)) // MIB,
            "db_after_mib": int(after["dbSize"]) // MIB,
            "defrag_seconds": round(took, 2),
            "mib_per_second": round(int(before.get("dbSizeInUse", 0)) / MIB / took, 1),
            "unanswered_longest_seconds": {p.name: round(p.longest, 1) for p in pollers},
            "polls_failed": {p.name: f"{p.failed}/{p.asked}" for p in pollers},
        }
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--release", action="append", choices=["v3.6.4", "v3.5.35"])
    args = ap.parse_args()
    for release in args.release or ["v3.6.4", "v3.5.35"]:
        print(json.dumps(measure(release, args.gib)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
