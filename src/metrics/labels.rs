//! The label sets of the metrics' families.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub endpoint: &'static str,
    pub operation: &'static str,
    pub version: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabel {
    /// `kind/name`, e.g. `validatingwebhookconfiguration/etcd-webhook-validating`.
    pub object: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub name: String,
}

/// One member of a cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub namespace: String,
    pub name: String,
    pub member: String,
}

/// A cluster's members in one state (`leader`, `follower`, `learner`, `unhealthy`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberStateLabels {
    pub namespace: String,
    pub name: String,
    pub state: String,
}

/// One answer of the API server to the loop's client: the verb (`WATCH` for a watch) and the
/// HTTP code (`error` when no answer came).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeRequestLabels {
    pub verb: &'static str,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConversionLabels {
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub serial: String,
    pub subject: String,
}
