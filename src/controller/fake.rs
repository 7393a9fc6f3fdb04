//! An in-memory API server for the controller's tests, behind a `tower_test` mock service (the
//! pattern of kube-rs/controller-rs `fixtures.rs`, with state instead of a scripted sequence):
//! GET, POST, DELETE and the four PATCH types, the status subresource, finalizers and
//! deletionTimestamp, generation and resourceVersion, and server-side-apply conflicts on a
//! Lease's holder. Every call is recorded, so tests can count writes per verb.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request the fake answered.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    /// The object (or collection) path, without `/status` and the query.
    pub path: String,
    pub status_subresource: bool,
    pub query: String,
    /// `apply`, `merge`, `strategic`, `json` for PATCH.
    pub patch_type: Option<&'static str>,
    pub body: Option<Value>,
    pub code: u16,
}

impl Call {
    /// Reads are GETs; everything else writes.
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
    /// `statefulsets`, `etcdclusters`, `events`, ...
    pub fn resource(&self) -> &str {
        let parts: Vec<&str> = self.path.split('/').collect();
        match parts.iter().position(|p| *p == "namespaces") {
            Some(i) => parts.get(i + 2).copied().unwrap_or(""),
            None => "",
        }
    }
}

struct Fault {
    method: String,
    path_contains: String,
    left: usize,
    code: u16,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    calls: Vec<Call>,
    faults: Vec<Fault>,
    version: u64,
    /// Clients (by tag) whose requests fail as if the network were cut.
    partitioned: std::collections::HashSet<String>,
}

/// The fake server; cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

fn status(code: u16, reason: &str, message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

/// RFC 7386 merge (`null` deletes), also used for strategic merge (close enough for Leases).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Server-side apply, simplified: the applied fields replace ours, objects merge recursively,
/// lists are replaced whole.
fn apply(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    continue;
                }
                apply(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl FakeApi {
    /// A client that talks to this fake.
    pub fn client(&self) -> Client {
        self.client_as("default")
    }

    /// A client whose requests carry `tag` (see [`FakeApi::partition`]).
    pub fn client_as(&self, tag: &str) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let me = self.clone();
        let tag = tag.to_owned();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let cut = me.state.lock().unwrap().partitioned.contains(&tag);
                let response = if cut {
                    Response::builder()
                        .status(StatusCode::SERVICE_UNAVAILABLE)
                        .body(Body::from(
                            serde_json::to_vec(&status(
                                503,
                                "ServiceUnavailable",
                                "partitioned".to_owned(),
                            ))
                            .unwrap(),
                        ))
                        .unwrap()
                } else {
                    me.answer(request).await
                };
                send.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// Cuts (or restores) the clients made with `tag`.
    pub fn partition(&self, tag: &str, cut: bool) {
        let mut st = self.state.lock().unwrap();
        if cut {
            st.partitioned.insert(tag.to_owned());
        } else {
            st.partitioned.remove(tag);
        }
    }

    /// Stores an object as if a user had created it.
    pub fn insert(&self, path: &str, mut object: Value) {
        let mut st = self.state.lock().unwrap();
        st.version += 1;
        let v = st.version;
        let meta = object["metadata"].as_object_mut().expect("metadata");
        meta.entry("resourceVersion")
            .or_insert(json!(v.to_string()));
        meta.entry("uid").or_insert(json!(format!("uid-{v}")));
        meta.entry("generation").or_insert(json!(1));
        meta.entry("creationTimestamp")
            .or_insert(json!("2026-11-30T00:00:00Z"));
        st.objects.insert(path.to_owned(), object);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Changes one field of a stored object (what another actor, e.g. the kubelet, would do).
    pub fn set(&self, path: &str, pointer: &str, value: Value) {
        let mut st = self.state.lock().unwrap();
        let obj = st.objects.get_mut(path).expect("object exists");
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
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }

    /// Paths of stored objects under a prefix.
    pub fn paths(&self, prefix: &str) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The next `times` requests of `method` whose path contains `path_contains` fail with
    /// `code`.
    pub fn fail(&self, method: &str, path_contains: &str, times: usize, code: u16) {
        self.state.lock().unwrap().faults.push(Fault {
            method: method.to_owned(),
            path_contains: path_contains.to_owned(),
            left: times,
            code,
        });
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Option<Value> = if bytes.is_empty() {
            None
        } else {
            serde_json::from_slice(&bytes).ok()
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let patch_type = match content_type.as_str() {
            "application/apply-patch+yaml" => Some("apply"),
            "application/merge-patch+json" => Some("merge"),
            "application/strategic-merge-patch+json" => Some("strategic"),
            "application/json-patch+json" => Some("json"),
            _ => None,
        };
        let raw_path = parts.uri.path().to_owned();
        let (path, sub) = match raw_path.strip_suffix("/status") {
            Some(p) => (p.to_owned(), true),
            None => (raw_path.clone(), false),
        };
        let query = parts.uri.query().unwrap_or("").to_owned();
        let method = parts.method.as_str().to_owned();
        let (code, out) = self.handle(&method, &path, sub, &query, patch_type, body.as_ref());
        self.state.lock().unwrap().calls.push(Call {
            method,
            path,
            status_subresource: sub,
            query,
            patch_type,
            body,
            code,
        });
        Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&out).unwrap()))
            .unwrap()
    }

    fn handle(
        &self,
        method: &str,
        path: &str,
        sub: bool,
        query: &str,
        patch_type: Option<&'static str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut st = self.state.lock().unwrap();
        if let Some(f) = st
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
        let not_found = || (404, status(404, "NotFound", format!("{path} not found")));
        match method {
            "GET" => match st.objects.get(path) {
                Some(o) => (200, o.clone()),
                None => not_found(),
            },
            "POST" => {
                let mut obj = body.cloned().unwrap_or(json!({}));
                let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
                let full = format!("{path}/{name}");
                if st.objects.contains_key(&full) {
                    return (409, status(409, "AlreadyExists", format!("{full} exists")));
                }
                st.version += 1;
                let v = st.version;
                obj["metadata"]["uid"] = json!(format!("uid-{v}"));
                obj["metadata"]["resourceVersion"] = json!(v.to_string());
                obj["metadata"]["generation"] = json!(1);
                st.objects.insert(full, obj.clone());
                (201, obj)
            }
            "DELETE" => {
                let Some(obj) = st.objects.get_mut(path) else {
                    return not_found();
                };
                let has_finalizers = obj["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    if obj["metadata"]["deletionTimestamp"].is_null() {
                        obj["metadata"]["deletionTimestamp"] =
                            json!(k8s_openapi::jiff::Timestamp::now().to_string());
                    }
                    (200, obj.clone())
                } else {
                    let obj = st.objects.remove(path).unwrap();
                    (200, obj)
                }
            }
            "PATCH" => {
                let body = body.cloned().unwrap_or(json!({}));
                let existing = st.objects.get(path).cloned();
                let lease = path.contains("/leases/");
                let mut obj = match (existing.clone(), patch_type) {
                    (None, Some("apply")) if !sub => {
                        let mut o = body.clone();
                        o["metadata"]["uid"] = json!(format!("uid-{}", st.version + 1));
                        o["metadata"]["generation"] = json!(1);
                        o
                    }
                    (None, _) => return not_found(),
                    (Some(o), _) => o,
                };
                let before = obj.clone();
                match patch_type {
                    Some("apply") => {
                        if lease && existing.is_some() && !query.contains("force=true") {
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
                        if existing.is_some() {
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
                // The status subresource: each endpoint changes only its own part.
                if path.contains("/etcdclusters/") {
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
                st.version += 1;
                obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
                if existing.is_some() && obj.get("spec") != before.get("spec") {
                    let g = before["metadata"]["generation"].as_i64().unwrap_or(1);
                    obj["metadata"]["generation"] = json!(g + 1);
                }
                let gone = !obj["metadata"]["deletionTimestamp"].is_null()
                    && obj["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(|f| f.is_empty());
                if gone {
                    st.objects.remove(path);
                } else {
                    st.objects.insert(path.to_owned(), obj.clone());
                }
                (200, obj)
            }
            _ => (405, status(405, "MethodNotAllowed", method.to_owned())),
        }
    }
}

/// Counts of calls per verb (`GET`, `POST`, `PATCH`, `DELETE`).
pub fn per_verb(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.method.clone()).or_insert(0) += 1;
    }
    m
}
