//! The in-memory API server ([`FakeCore`]) behind two transports over one state: a
//! `tower_test` mock client for the unit tests (the pattern of kube-rs/controller-rs
//! `fixtures.rs`, with state instead of a scripted sequence) and HTTP on a loopback port for
//! tests of the binary (a kubeconfig points at it; watches stream the stored changes). Every
//! call is recorded, so tests can count writes per verb and check them against the RBAC rules.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{self, Method, Request, Response, StatusCode};
use axum::response::IntoResponse;
use kube::Client;
use kube::client::Body;
use serde_json::Value;

use super::api_rules::{group_of, parse, patch_type, selected, status};
use super::fake_api::FakeCore;

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
    /// API group (`""` for the core group), resource (`statefulsets`, `events`, ...) and
    /// whether the path names one object, as the fake understood the path.
    pub group: String,
    pub resource: String,
    pub named: bool,
}

impl Call {
    /// Reads are GETs; everything else writes.
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
    /// `statefulsets`, `etcdclusters`, `events`, ...
    pub fn resource(&self) -> &str {
        &self.resource
    }
}

#[derive(Default)]
struct State {
    core: FakeCore,
    calls: Vec<Call>,
    /// Clients (by tag) whose requests fail as if the network were cut.
    partitioned: HashSet<String>,
    /// Requests over HTTP whose `METHOD path` starts with the prefix are held this long before
    /// they are answered ([`FakeApi::delay`]).
    delays: Vec<(String, std::time::Duration)>,
    /// How many requests a delay is holding or has held.
    delayed: usize,
}

/// The fake server; cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
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
                let (code, body) = if cut {
                    (
                        503,
                        status(503, "ServiceUnavailable", "partitioned".to_owned()),
                    )
                } else {
                    me.answer(request).await
                };
                let response = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// Holds every request over HTTP whose `METHOD path` starts with `prefix` for `hold` before
    /// answering it (a slow API server; the request is recorded when it is answered).
    pub fn delay(&self, prefix: &str, hold: std::time::Duration) {
        self.state
            .lock()
            .unwrap()
            .delays
            .push((prefix.to_owned(), hold));
    }

    /// How many requests a [`FakeApi::delay`] has held so far (answered or not).
    pub fn delayed(&self) -> usize {
        self.state.lock().unwrap().delayed
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

    pub fn insert(&self, path: &str, object: Value) {
        self.state.lock().unwrap().core.insert(path, object);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().core.objects.get(path).cloned()
    }

    pub fn set(&self, path: &str, pointer: &str, value: Value) {
        self.state.lock().unwrap().core.set(path, pointer, value);
    }

    /// Every stored object of `resource` (`statefulsets`, ...) in any namespace that the label
    /// selector selects, as a watch with that selector would list them.
    pub fn list_selected(&self, resource: &str, selector: &str) -> Vec<Value> {
        let query = format!("labelSelector={selector}");
        let st = self.state.lock().unwrap();
        st.core
            .objects
            .iter()
            .filter(|(k, _)| {
                parse(k).is_some_and(|(_, _, r, name)| r == resource && name.is_some())
            })
            .filter(|(_, o)| selected(&query, o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Runs the garbage collector until it has nothing left to do (bounded).
    pub fn collect_garbage(&self) {
        for _ in 0..10 {
            if self.state.lock().unwrap().core.collect_garbage() == 0 {
                return;
            }
        }
        panic!("the garbage collector did not settle in 10 rounds");
    }

    pub fn fail(&self, method: &str, path_contains: &str, times: usize, code: u16) {
        self.state
            .lock()
            .unwrap()
            .core
            .fail(method, path_contains, times, code);
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
        st.core
            .objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Removes a stored object (as if deleted behind the loop's back).
    pub fn remove(&self, path: &str) {
        self.state.lock().unwrap().core.remove(path);
    }

    /// Whether a request `METHOD /path` starting with `prefix` was made.
    pub fn requested(&self, prefix: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .any(|c| format!("{} {}", c.method, c.path).starts_with(prefix))
    }

    /// Serves this fake over HTTP on a loopback port, on the current runtime.
    pub async fn serve_http(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a bound listener");
        let app = axum::Router::new()
            .fallback(http_answer)
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    async fn answer(&self, request: Request<Body>) -> (u16, Value) {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        self.answer_parts(&parts, &bytes)
    }

    fn answer_parts(&self, parts: &http::request::Parts, bytes: &[u8]) -> (u16, Value) {
        let body: Option<Value> = serde_json::from_slice(bytes).ok();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let patch_type = patch_type(content_type);
        let raw_path = parts.uri.path();
        let (path, sub) = match raw_path.strip_suffix("/status") {
            Some(p) => (p.to_owned(), true),
            None => (raw_path.to_owned(), false),
        };
        let query = parts.uri.query().unwrap_or("").to_owned();
        let method = parts.method.as_str().to_owned();
        let (group, resource, named) = target(&path);
        let mut st = self.state.lock().unwrap();
        let (code, out) = st
            .core
            .handle(&method, &path, sub, &query, patch_type, body.as_ref());
        st.calls.push(Call {
            method,
            path,
            status_subresource: sub,
            query,
            patch_type,
            body,
            code,
            group,
            resource,
            named,
        });
        (code, out)
    }
}

/// API group (`""` for the core group), resource and whether the path names one object.
fn target(path: &str) -> (String, String, bool) {
    match parse(path) {
        Some((prefix, _, resource, name)) => {
            (group_of(&prefix).to_owned(), resource, name.is_some())
        }
        None => (String::new(), String::new(), false),
    }
}

/// The HTTP transport: one request answered by the core, or a watch that streams the changes
/// after the requested resourceVersion, one JSON event per line, until `timeoutSeconds`.
async fn http_answer(
    Shared(api): Shared<FakeApi>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let query = parts.uri.query().unwrap_or("").to_owned();
    if parts.method == Method::GET && query.contains("watch=true") {
        let path = parts.uri.path().to_owned();
        let (group, resource, _) = target(&path);
        api.state.lock().unwrap().calls.push(Call {
            method: "GET".to_owned(),
            path: path.clone(),
            status_subresource: false,
            query: query.clone(),
            patch_type: None,
            body: None,
            code: 200,
            group,
            resource,
            named: false,
        });
        return watch(api, path, query);
    }
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let hold = {
        let mut st = api.state.lock().unwrap();
        let request = format!("{} {}", parts.method, parts.uri.path());
        let hold = st
            .delays
            .iter()
            .find(|(prefix, _)| request.starts_with(prefix.as_str()))
            .map(|(_, hold)| *hold);
        st.delayed += usize::from(hold.is_some());
        hold
    };
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    let (code, out) = api.answer_parts(&parts, &bytes);
    (
        StatusCode::from_u16(code).unwrap(),
        [(http::header::CONTENT_TYPE, "application/json")],
        out.to_string(),
    )
        .into_response()
}

fn watch(api: FakeApi, path: String, query: String) -> axum::response::Response {
    use std::time::{Duration, Instant};
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let since = param("resourceVersion").unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(param("timeoutSeconds").unwrap_or(290));
    let stream = futures_util::stream::unfold(since, move |since| {
        let (api, path, query) = (api.clone(), path.clone(), query.clone());
        async move {
            while Instant::now() < until {
                let (events, last) = api
                    .state
                    .lock()
                    .unwrap()
                    .core
                    .watch_events(&path, &query, since);
                if !events.is_empty() {
                    let mut lines = String::new();
                    for e in events {
                        lines.push_str(&e.to_string());
                        lines.push('\n');
                    }
                    return Some((Ok::<_, std::io::Error>(Bytes::from(lines)), last));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        }
    });
    (StatusCode::OK, axum::body::Body::from_stream(stream)).into_response()
}

/// Counts of calls per verb (`GET`, `POST`, `PATCH`, `DELETE`).
pub fn per_verb(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.method.clone()).or_insert(0) += 1;
    }
    m
}

/// What a call needs: its verb on its resource and, for an object whose ownerReference blocks the
/// owner's deletion, `update` on the owner's `finalizers` subresource (the admission plugin
/// OwnerReferencesPermissionEnforcement checks it on create and update; tests/e2e proves it).
pub fn needs(c: &Call) -> Vec<(String, String, &'static str)> {
    let verb = match (c.method.as_str(), c.named) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected {m}"),
    };
    let resource = if c.status_subresource {
        format!("{}/status", c.resource)
    } else {
        c.resource.clone()
    };
    let mut all = vec![(c.group.clone(), resource, verb)];
    let owners = c
        .body
        .as_ref()
        .and_then(|b| b.pointer("/metadata/ownerReferences"))
        .and_then(Value::as_array);
    for owner in owners.into_iter().flatten() {
        if owner["blockOwnerDeletion"] == true {
            assert_eq!(owner["kind"], crate::api::KIND, "{} {}", c.method, c.path);
            all.push((
                crate::api::GROUP.to_owned(),
                "etcdclusters/finalizers".to_owned(),
                "update",
            ));
        }
    }
    all
}

/// Every call was allowed by the rules the install grants.
pub fn assert_granted(calls: &[Call], rules: &[(&str, &str, &[&str])]) {
    for c in calls {
        for (group, resource, verb) in needs(c) {
            assert!(
                rules
                    .iter()
                    .any(|(g, r, vs)| *g == group && *r == resource && vs.contains(&verb)),
                "{} {} needs {verb} on {group}/{resource}, which the RBAC rules do not grant",
                c.method,
                c.path
            );
        }
    }
}
