//! Every API call the loop makes, as RBAC rules: the install's ClusterRole and Role are
//! checked against these (tests/manifests.rs), and the unit tests check every call made against
//! the fake API server is covered by them.

/// Every API call the loop makes, as RBAC rules (group, resource, verbs): the install's
/// ClusterRole must grant these (tests/manifests.rs), and the tests check that every call made
/// against the fake API server is covered. Applies that create also need `create`.
pub const RBAC_RULES: &[(&str, &str, &[&str])] = &[
    (
        "etcd.example.com",
        "etcdclusters",
        &["get", "list", "watch", "patch"],
    ),
    ("etcd.example.com", "etcdclusters/status", &["get", "patch"]),
    // The children's ownerReferences block the cluster's deletion (blockOwnerDeletion), which
    // the admission plugin OwnerReferencesPermissionEnforcement allows only with this grant.
    ("etcd.example.com", "etcdclusters/finalizers", &["update"]),
    (
        "apps",
        "statefulsets",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    ("", "services", &["get", "list", "watch", "create", "patch"]),
    // The members' ConfigMap (initial cluster and state, read by the pods at start).
    // (delete: a restore in place clears it with the lost cluster's StatefulSet and claims.)
    (
        "",
        "configmaps",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // Member pods: lost volumes from their termination message, the voter label.
    // (delete: a member whose volume was lost starts over on a new claim.)
    ("", "pods", &["get", "list", "watch", "patch", "delete"]),
    (
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        "policy",
        "poddisruptionbudgets",
        &["get", "list", "watch", "create", "patch"],
    ),
    (
        "batch",
        "cronjobs",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // delete: a final-snapshot attempt that failed or ran out of time is replaced.
    (
        "batch",
        "jobs",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    ("events.k8s.io", "events", &["create", "patch"]),
    // The members' NetworkPolicy (`--network-policy`); deleted when the flag stops asking for it.
    (
        "networking.k8s.io",
        "networkpolicies",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // TLS clusters' client certificate Secrets, read by name (`NAME-client-tls`, every
    // `CLIENT_SECRET_REFRESH`): `get` only, never list or watch (with them, every replica could
    // read every Secret in the cluster at once); the same `get` serves
    // `credentials::CREDENTIALS_RBAC_RULES`.
    ("", "secrets", &["get"]),
];

/// With `--cache-client-secrets` only: the watch cache of TLS clusters' client Secrets (the
/// watch selects `api::CLIENT_TLS_LABEL`, but RBAC cannot narrow a list to a label, so this is
/// list and watch on every Secret the loop's namespaces hold).
pub const SECRET_CACHE_RBAC_RULES: &[(&str, &str, &[&str])] =
    &[("", "secrets", &["list", "watch"])];

/// The calls in the install's own namespace, granted by a Role there: the leader election's
/// Lease, and the replica's own Pod, read once at start for the image the Jobs run when
/// `--backup-image` is not given (`own_image`; a single-namespace install has no cluster-wide
/// `get` on pods).
pub const LEADER_RBAC_RULES: &[(&str, &str, &[&str])] = &[
    ("coordination.k8s.io", "leases", &["get", "create", "patch"]),
    ("", "pods", &["get"]),
];
