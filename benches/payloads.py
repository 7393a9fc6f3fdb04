#!/usr/bin/env python3
"""Writes the load-test payloads into a folder (default target/bench-payloads):

  admission-<version>.json   a realistic ~3 KB CREATE AdmissionReview of an EtcdCluster in each
                             version (managedFields, last-applied annotation, userInfo extras),
                             complete, so /validate allows it and /mutate has nothing to add
  admission-mutate.json      the same v1 review missing three defaults: /mutate answers a patch
  convert-<n>.json           ConversionReviews of 1, 100, 1,000 and 5,000 objects in mixed source
                             versions (v1alpha1, v1beta1, v1) to etcd.example.com/v1
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "target/bench-payloads"
os.makedirs(out, exist_ok=True)

SPECS = {
    "v1": {"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "20Gi",
           "backup": {"enabled": True, "schedule": "0 */6 * * *", "retention": 14, "destination": "s3://etcd-backups/prod"},
           "tls": {}},
    "v1beta1": {"size": 3, "version": "v3.5.10", "storage": {"className": "ssd", "size": "20Gi"},
                "backup": {"enabled": True, "schedule": "0 */6 * * *"}},
    "v1alpha1": {"replicas": 3, "etcdVersion": "3.5.10", "storageClassName": "ssd", "storageSizeGi": 20,
                 "backupEnabled": True, "backupSchedule": "0 */6 * * *"},
}
STATUS = {
    "v1": {"phase": "Running", "readyReplicas": 3, "observedGeneration": 2,
           "endpoints": [f"http://etcd-prod-{i}.etcd-prod.platform.svc:2379" for i in range(3)]},
    "v1beta1": {"phase": "Running", "readyReplicas": 3,
                "endpoints": [f"http://etcd-prod-{i}.etcd-prod.platform.svc:2379" for i in range(3)]},
    "v1alpha1": {"phase": "Running", "readyReplicas": 3},
}


def obj(version, name, spec=None, stored=False):
    spec = spec if spec is not None else SPECS[version]
    o = {
        "apiVersion": f"etcd.example.com/{version}", "kind": "EtcdCluster",
        "metadata": {
            "name": name, "namespace": "platform",
            "labels": {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/part-of": "payments", "team": "platform"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                {"apiVersion": f"etcd.example.com/{version}", "kind": "EtcdCluster",
                 "metadata": {"name": name, "namespace": "platform"}, "spec": spec}, separators=(",", ":")) + "\n"},
            "managedFields": [{
                "manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": f"etcd.example.com/{version}", "time": "2026-11-30T09:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                                            "f:labels": {".": {}, "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {}, "f:team": {}}},
                             "f:spec": {f"f:{k}": {} for k in spec}}},
                {"manager": "etcd-webhook", "operation": "Apply", "subresource": "status",
                 "apiVersion": "etcd.example.com/v1", "time": "2026-11-30T09:02:11Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Progressing\"}": {".": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}},
                                                            "k:{\"type\":\"Ready\"}": {".": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}},
                                           "f:endpoints": {}, "f:observedGeneration": {}, "f:phase": {}, "f:readyReplicas": {}}}}],
        },
        "spec": spec,
    }
    if stored:
        o["metadata"].update({"uid": "3415a7fc-162b-4300-b5da-fd6083580d66", "resourceVersion": "48213",
                              "generation": 2, "creationTimestamp": "2026-11-30T09:00:00Z",
                              "finalizers": ["etcd.example.com/finalizer"]})
        o["status"] = STATUS[version]
    return o


def admission(version, spec=None):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "etcd.example.com", "version": version, "kind": "EtcdCluster"},
        "resource": {"group": "etcd.example.com", "version": version, "resource": "etcdclusters"},
        "requestKind": {"group": "etcd.example.com", "version": version, "kind": "EtcdCluster"},
        "requestResource": {"group": "etcd.example.com", "version": version, "resource": "etcdclusters"},
        "name": "etcd-prod", "namespace": "platform", "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:argocd:argocd-application-controller",
                     "uid": "014fbff9-a07c-4b3e-9f1a-3c7d0e2b9a11",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:argocd", "system:authenticated"],
                     "extra": {"authentication.kubernetes.io/pod-name": ["argocd-application-controller-0"],
                               "authentication.kubernetes.io/pod-uid": ["9a2c1e55-3b0f-4f5e-8d61-0c4e2f7a6b13"]}},
        "object": obj(version, "etcd-prod", spec), "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "argocd-controller"}}}


def write(name, value):
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(value, f, separators=(",", ":"))
    return os.path.getsize(path)


sizes = {}
for v in SPECS:
    sizes[f"admission-{v}.json"] = write(f"admission-{v}.json", admission(v))
sizes["admission-mutate.json"] = write("admission-mutate.json", admission("v1", {"size": 3, "backup": {"enabled": True}}))
versions = ["v1alpha1", "v1beta1", "v1"]
for n in (1, 100, 1000, 5000):
    objects = [obj(versions[i % 3] if n > 1 else "v1alpha1", f"etcd-{i}", stored=True) for i in range(n)]
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
              "request": {"uid": "c0a9e1f2-0000-4000-8000-000000000001",
                          "desiredAPIVersion": "etcd.example.com/v1", "objects": objects}}
    sizes[f"convert-{n}.json"] = write(f"convert-{n}.json", review)
for k, v in sizes.items():
    print(f"{k}\t{v} bytes")
