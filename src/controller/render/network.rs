//! The members' NetworkPolicy (`--network-policy`): who may reach which port of a cluster's
//! members. Ingress only; the members' own egress is left alone.
//!
//! - peer port: the cluster's own members;
//! - client port: the members, this install's pods (the loop), the cluster's backup,
//!   final-snapshot and rescue Jobs, and pods of the cluster's namespace labelled
//!   [`CLIENT_LABEL`]`: NAME` (the applications);
//! - metrics port: pods of the namespaces `--metrics-namespace-selector` names (all by default),
//!   and this install's pods (the loop reads a member that serves no client there).
//!   The kubelet's probes come from the node, which network plugins let through.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::*;

/// The label an application's pods carry, with the cluster's name as its value, to reach the
/// cluster's client port through its NetworkPolicy.
pub const CLIENT_LABEL: &str = "etcd.example.com/client";

/// The default of `--install-namespace` outside a pod.
pub const DEFAULT_INSTALL_NAMESPACE: &str = "etcd-system";

/// Which clusters get a NetworkPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkPolicies {
    /// Clusters with `spec.tls` (the default: their clients are set up anew anyway, so the
    /// label is part of that; a plain cluster's existing clients are not cut off).
    Tls,
    /// Every cluster.
    All,
    /// None (a policy made before is deleted).
    None,
}

/// Selects by `labels`; none selects everything, as the apiserver stores it (no `matchLabels`,
/// so that what the loop applies is what it reads back and nothing is applied again).
fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        ..Default::default()
    }
}

fn pods(labels: BTreeMap<String, String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(selector(labels)),
        ..Default::default()
    }
}

fn rule(port: &str, from: Vec<NetworkPolicyPeer>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::String(port.to_owned())),
            protocol: Some("TCP".to_owned()),
            ..Default::default()
        }]),
    }
}

/// NetworkPolicy `NAME` when `--network-policy` asks for one for `ec`.
pub fn network_policy(ec: &EtcdCluster, opts: &RenderOptions) -> Option<NetworkPolicy> {
    let wanted = match opts.network_policy {
        NetworkPolicies::All => true,
        NetworkPolicies::Tls => crate::api::tls_on(&ec.spec),
        NetworkPolicies::None => false,
    };
    if !wanted {
        return None;
    }
    let name = ec.name_any();
    let members = || pods(member_selector(ec));
    let jobs = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("app.kubernetes.io/instance".to_owned(), name.clone()),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "etcd-webhook".to_owned(),
                ),
            ])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app.kubernetes.io/component".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![
                    "backup".to_owned(),
                    "final-snapshot".to_owned(),
                    "rescue".to_owned(),
                ]),
            }]),
        }),
        ..Default::default()
    };
    let install = NetworkPolicyPeer {
        namespace_selector: Some(selector(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            opts.install_namespace.clone(),
        )]))),
        pod_selector: Some(selector(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "etcd-webhook".to_owned(),
        )]))),
        ..Default::default()
    };
    let clients = pods(BTreeMap::from([(CLIENT_LABEL.to_owned(), name.clone())]));
    let scrapers = NetworkPolicyPeer {
        namespace_selector: Some(selector(opts.metrics_namespaces.clone())),
        ..Default::default()
    };
    Some(NetworkPolicy {
        metadata: meta(ec, name, "member"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(member_selector(ec))),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![
                rule("peer", vec![members()]),
                rule("client", vec![members(), install.clone(), jobs, clients]),
                // The loop too: a member that restarted without a leader serves no client, and
                // its metrics say how far it got (a lost quorum's diagnosis).
                rule("metrics", vec![scrapers, install]),
            ]),
            ..Default::default()
        }),
    })
}
