#!/usr/bin/env python3
"""One-layer OCI image archive from a folder, for `ctr -n k8s.io images import` on the real
node (tests/e2e/node.rs): the image layout (oci-layout, index.json, blobs) with the image's
name in the `io.containerd.image.name` annotation, so no registry is needed. Deterministic: the
layer's entries are sorted, owned by 0:0 and dated 0, so the same folder gives the same digest.
Standard library only.

usage: mkimage.py --name REF --dir ROOTFS --out FILE.tar [--entrypoint A,B] [--cmd A,B] [--user U]"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def layer(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in dirs + sorted(files):
                path = os.path.join(top, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, root))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def dumps(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--entrypoint", default="")
    p.add_argument("--cmd", default="")
    p.add_argument("--user", default="")
    a = p.parse_args()
    rootfs = layer(a.dir)
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    if a.entrypoint:
        config["Entrypoint"] = a.entrypoint.split(",")
    if a.cmd:
        config["Cmd"] = a.cmd.split(",")
    if a.user:
        config["User"] = a.user
    config = dumps({"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [digest(rootfs)]}})
    manifest = dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(rootfs), "size": len(rootfs)}],
    })
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    index = dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": a.name,
                                       "org.opencontainers.image.ref.name": tag}}],
    })
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        def add(path, data=None):
            info = tarfile.TarInfo(path)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                out.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                out.addfile(info, io.BytesIO(data))
        add("blobs")
        add("blobs/sha256")
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for blob in (config, rootfs, manifest):
            add("blobs/sha256/" + digest(blob).split(":")[1], blob)
    os.replace(tmp, a.out)
    print(a.name, digest(manifest))


main()
