//! The state machine of an in-memory Kubernetes API server; `mock::FakeApi` puts it
//! behind a `tower_test` mock client (the unit tests) or HTTP on a loopback port (the binary's
//! tests).
//!
//! It knows GET (object and list), POST, PUT, DELETE and the four PATCH types, the status
//! subresource of EtcdClusters and CRDs, finalizers and deletionTimestamp, generation and
//! resourceVersion (a write naming a stale one gets the apiserver's 409), dry runs of PUT,
//! label selectors on list and watch, canonical storage quantities (`1024Gi` is stored as `1Ti`), the fields of a StatefulSet's and
//! a Job's spec the apiserver refuses to change (422 with its message), and server-side-apply
//! conflicts on a Lease's holder. Watches are the caller's business (they never send events
//! here).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::api_rules::{
    apply, canonicalize_quantities, conflict, immutable_change, merge, parse, selected, status,
};

struct Fault {
    method: String,
    path_contains: String,
    left: usize,
    code: u16,
}

/// The stored objects, by path.
#[derive(Default)]
pub struct FakeCore {
    pub objects: BTreeMap<String, Value>,
    faults: Vec<Fault>,
    pub(super) version: u64,
    /// Every change, for watches: (resourceVersion, ADDED|MODIFIED|DELETED, path, object).
    events: Vec<(u64, &'static str, String, Value)>,
}

impl FakeCore {
    pub(super) fn record(&mut self, kind: &'static str, path: &str, object: &Value) {
        self.events
            .push((self.version, kind, path.to_owned(), object.clone()));
    }

    /// The watch events of the collection at `watch_path` after resourceVersion `since`, and
    /// the resourceVersion to continue from. With a `labelSelector` in `query`, only objects
    /// it selects; one that stops being selected is seen as DELETED, as the apiserver sends it.
    pub fn watch_events(&self, watch_path: &str, query: &str, since: u64) -> (Vec<Value>, u64) {
        let want = parse(watch_path);
        let mut last = since;
        let mut out = Vec::new();
        for (version, kind, path, object) in &self.events {
            if *version <= since {
                continue;
            }
            last = last.max(*version);
            if let (Some((p, ns, r, _)), Some((p2, ns2, r2, Some(_)))) = (&want, parse(path))
                && *p == p2
                && *r == r2
                && (ns.is_none() || *ns == ns2)
            {
                if selected(query, object) {
                    out.push(json!({"type": kind, "object": object}));
                } else if *kind == "MODIFIED" {
                    out.push(json!({"type": "DELETED", "object": object}));
                }
            }
        }
        (out, last)
    }

    /// Deletes an object behind the client's back (what a user with kubectl would do).
    pub fn remove(&mut self, path: &str) -> Option<Value> {
        let mut object = self.objects.remove(path)?;
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.record("DELETED", path, &object);
        Some(object)
    }

    /// Stores an object as if a user had created it.
    pub fn insert(&mut self, path: &str, mut object: Value) {
        self.version += 1;
        let v = self.version;
        let meta = object["metadata"].as_object_mut().expect("metadata");
        meta.entry("resourceVersion")
            .or_insert(json!(v.to_string()));
        meta.entry("uid").or_insert(json!(format!("uid-{v}")));
        meta.entry("generation").or_insert(json!(1));
        meta.entry("creationTimestamp")
            .or_insert(json!("2026-11-30T00:00:00Z"));
        self.record("ADDED", path, &object);
        self.objects.insert(path.to_owned(), object);
    }

    /// Changes one field of a stored object (what another actor, e.g. the kubelet, would do).
    pub fn set(&mut self, path: &str, pointer: &str, value: Value) {
        let obj = self.objects.get_mut(path).expect("object exists");
        let mut parent = pointer.rsplitn(2, '/');
        let (last, head) = (parent.next().unwrap(), parent.next().unwrap_or(""));
        let mut cur = obj;
        for seg in head.split('/').filter(|s| !s.is_empty()) {
            cur = cur
                .as_object_mut()
                .unwrap()
                .entry(seg.to_owned())
                .or_insert(json!({}));
        }
        cur.as_object_mut().unwrap().insert(last.to_owned(), value);
        self.version += 1;
        let version = self.version;
        let obj = self.objects.get_mut(path).unwrap();
        obj["metadata"]["resourceVersion"] = json!(version.to_string());
        let obj = obj.clone();
        self.record("MODIFIED", path, &obj);
    }

    /// The next `times` requests of `method` whose path contains `path_contains` fail with
    /// `code`.
    pub fn fail(&mut self, method: &str, path_contains: &str, times: usize, code: u16) {
        self.faults.push(Fault {
            method: method.to_owned(),
            path_contains: path_contains.to_owned(),
            left: times,
            code,
        });
    }

    fn list(&self, path: &str, query: &str) -> Value {
        let want = parse(path);
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| {
                let got = parse(k);
                match (&want, got) {
                    (Some((p, ns, r, _)), Some((p2, ns2, r2, Some(_)))) => {
                        *p == p2 && *r == r2 && (ns.is_none() || *ns == ns2)
                    }
                    _ => false,
                }
            })
            .filter(|(_, v)| selected(query, v))
            .map(|(_, v)| v.clone())
            .collect();
        json!({"apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": self.version.to_string()}, "items": items})
    }

    /// Answers one request: `(status code, body)`. `path` has no `/status` (that is `sub`).
    pub fn handle(
        &mut self,
        method: &str,
        path: &str,
        sub: bool,
        query: &str,
        patch_type: Option<&'static str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        if let Some(f) = self
            .faults
            .iter_mut()
            .find(|f| f.left > 0 && f.method == method && path.contains(&f.path_contains))
        {
            f.left -= 1;
            let code = f.code;
            return (
                code,
                status(code, "InternalError", "injected fault".to_owned()),
            );
        }
        // The apiserver's validation of events.k8s.io/v1: a note over 1024 bytes is refused.
        if path.starts_with("/apis/events.k8s.io/")
            && let Some(note) = body.and_then(|b| b["note"].as_str())
            && note.len() > 1024
        {
            return (
                422,
                status(
                    422,
                    "Invalid",
                    format!(
                        "note: Too long: may not be more than 1024 bytes (it has {})",
                        note.len()
                    ),
                ),
            );
        }
        let not_found = || (404, status(404, "NotFound", format!("{path} not found")));
        let is_collection = parse(path).is_some_and(|(_, _, _, name)| name.is_none());
        match method {
            "GET" if is_collection => (200, self.list(path, query)),
            "GET" => match self.objects.get(path) {
                Some(o) => (200, o.clone()),
                None => not_found(),
            },
            "POST" => {
                let mut obj = body.cloned().unwrap_or(json!({}));
                canonicalize_quantities(&mut obj, false);
                let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
                let full = format!("{path}/{name}");
                if self.objects.contains_key(&full) {
                    return (409, status(409, "AlreadyExists", format!("{full} exists")));
                }
                self.version += 1;
                let v = self.version;
                obj["metadata"]["uid"] = json!(format!("uid-{v}"));
                obj["metadata"]["resourceVersion"] = json!(v.to_string());
                obj["metadata"]["generation"] = json!(1);
                obj["metadata"]["creationTimestamp"] = json!(created_now());
                self.record("ADDED", &full, &obj);
                self.objects.insert(full, obj.clone());
                (201, obj)
            }
            "DELETE" => {
                let Some(obj) = self.objects.get_mut(path) else {
                    return not_found();
                };
                // Orphan and Foreground deletion are finalizers the garbage collector removes
                // (see `collect_garbage`); Background (the default) deletes at once.
                let policy = body
                    .and_then(|b| b["propagationPolicy"].as_str())
                    .unwrap_or("Background");
                let finalizer = match policy {
                    "Orphan" => Some("orphan"),
                    "Foreground" => Some("foregroundDeletion"),
                    _ => None,
                };
                if obj["metadata"]["deletionTimestamp"].is_null()
                    && let Some(f) = finalizer
                {
                    let list = obj["metadata"]
                        .as_object_mut()
                        .unwrap()
                        .entry("finalizers")
                        .or_insert(json!([]));
                    if !list.as_array().unwrap().iter().any(|x| x == f) {
                        list.as_array_mut().unwrap().push(json!(f));
                    }
                }
                let has_finalizers = obj["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    if obj["metadata"]["deletionTimestamp"].is_null() {
                        obj["metadata"]["deletionTimestamp"] =
                            json!(k8s_openapi::jiff::Timestamp::now().to_string());
                    }
                    self.version += 1;
                    obj["metadata"]["resourceVersion"] = json!(self.version.to_string());
                    let obj = obj.clone();
                    self.record("MODIFIED", path, &obj);
                    (200, obj)
                } else {
                    (200, self.remove(path).unwrap())
                }
            }
            "PATCH" => self.patch(path, sub, query, patch_type, body),
            "PUT" => self.put(path, sub, query, body),
            _ => (405, status(405, "MethodNotAllowed", method.to_owned())),
        }
    }

    fn patch(
        &mut self,
        path: &str,
        sub: bool,
        query: &str,
        patch_type: Option<&'static str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let body = body.cloned().unwrap_or(json!({}));
        let existing = self.objects.get(path).cloned();
        let mut obj = match (existing.clone(), patch_type) {
            (None, Some("apply")) if !sub => {
                let mut o = body.clone();
                o["metadata"]["uid"] = json!(format!("uid-{}", self.version + 1));
                o["metadata"]["generation"] = json!(1);
                o["metadata"]["creationTimestamp"] = json!(created_now());
                o
            }
            (None, _) => return (404, status(404, "NotFound", format!("{path} not found"))),
            (Some(o), _) => o,
        };
        if let (Some(o), Some(want)) = (&existing, body["metadata"]["resourceVersion"].as_str())
            && o["metadata"]["resourceVersion"].as_str() != Some(want)
        {
            return conflict(path);
        }
        let before = obj.clone();
        match patch_type {
            Some("apply") => {
                if path.contains("/leases/") && existing.is_some() && !query.contains("force=true")
                {
                    let held = &obj["spec"]["holderIdentity"];
                    let wanted = &body["spec"]["holderIdentity"];
                    if !held.is_null() && !wanted.is_null() && held != wanted {
                        return (
                            409,
                            status(
                                409,
                                "Conflict",
                                "holderIdentity is owned by another manager".to_owned(),
                            ),
                        );
                    }
                }
                if sub && body.get("status").is_some() {
                    // The loop is the status's one manager and applies all of it each time:
                    // a field it applied before and leaves out now is removed (what
                    // server-side apply does with a manager's own fields).
                    obj["status"] = body["status"].clone();
                } else if existing.is_some() {
                    apply(&mut obj, &body);
                }
            }
            Some("merge") | Some("strategic") => merge(&mut obj, &body),
            Some("json") => {
                let ops: json_patch::Patch = match serde_json::from_value(body.clone()) {
                    Ok(p) => p,
                    Err(e) => return (400, status(400, "BadRequest", e.to_string())),
                };
                if let Err(e) = json_patch::patch(&mut obj, &ops) {
                    return (422, status(422, "Invalid", e.to_string()));
                }
            }
            _ => {
                return (
                    415,
                    status(415, "UnsupportedMediaType", "patch type".to_owned()),
                );
            }
        }
        self.commit(path, sub, existing, before, obj)
    }

    /// An update (PUT): the whole object, on the condition of its resourceVersion; a dry run
    /// (`dryRun=All`) answers what would be stored and stores nothing.
    fn put(&mut self, path: &str, sub: bool, query: &str, body: Option<&Value>) -> (u16, Value) {
        let Some(existing) = self.objects.get(path).cloned() else {
            return (404, status(404, "NotFound", format!("{path} not found")));
        };
        let mut obj = body.cloned().unwrap_or(json!({}));
        if let Some(want) = obj["metadata"]["resourceVersion"].as_str()
            && existing["metadata"]["resourceVersion"].as_str() != Some(want)
        {
            return conflict(path);
        }
        // What the apiserver sets and a client cannot change.
        for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
            obj["metadata"][field] = existing["metadata"][field].clone();
        }
        if query.split('&').any(|q| q == "dryRun=All") {
            return (200, obj);
        }
        self.commit(path, sub, Some(existing.clone()), existing, obj)
    }

    /// Stores the result of a write: the status subresource and the main resource each change
    /// only their own part, generation follows the spec, and a write that changes nothing
    /// stores nothing (no new resourceVersion), as the apiserver does.
    fn commit(
        &mut self,
        path: &str,
        sub: bool,
        existing: Option<Value>,
        before: Value,
        mut obj: Value,
    ) -> (u16, Value) {
        canonicalize_quantities(&mut obj, false);
        if existing.is_some()
            && !sub
            && let Some(invalid) = immutable_change(path, &before, &obj)
        {
            return (422, invalid);
        }
        if path.contains("/etcdclusters/") || path.contains("/customresourcedefinitions/") {
            if sub {
                let new_status = obj["status"].clone();
                obj = before.clone();
                obj["status"] = new_status;
            } else if let Some(s) = before.get("status") {
                obj["status"] = s.clone();
            }
        }
        if obj == before && existing.is_some() {
            return (200, obj);
        }
        self.version += 1;
        obj["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if existing.is_some() && obj.get("spec") != before.get("spec") {
            let g = before["metadata"]["generation"].as_i64().unwrap_or(1);
            obj["metadata"]["generation"] = json!(g + 1);
        }
        let gone = !obj["metadata"]["deletionTimestamp"].is_null()
            && obj["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        if gone {
            self.objects.remove(path);
            self.record("DELETED", path, &obj);
        } else {
            self.record(
                if existing.is_some() {
                    "MODIFIED"
                } else {
                    "ADDED"
                },
                path,
                &obj,
            );
            self.objects.insert(path.to_owned(), obj.clone());
        }
        (200, obj)
    }
}

/// A creationTimestamp as the apiserver sets one: now, to the second.
fn created_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .expect("now is a timestamp")
        .to_string()
}
