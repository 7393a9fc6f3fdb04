//! Issue 15, item 2, second half: the Helm chart installed for real (`helm install` with its
//! defaults, on a control plane of its own), cert-manager's chain issued from the chart's
//! Issuers and Certificates, cainjector filling every caBundle, and the apiserver calling the
//! webhook through that chain: a denial, a defaulted create and an old-version read.

use std::time::Instant;

use serde_json::json;

use crate::cluster::ControlPlane;
use crate::common;
use crate::install::{Env, NAMESPACE, ok, yaml_docs};
use crate::lifecycle::the_served_certificate_is_what_the_apiserver_trusts_now;
use crate::rotation::Delivery;

/// Issue 46: the same install on the oldest Kubernetes the chart claims (Chart.yaml's
/// `kubeVersion` floor) with the cert-manager release of its time: tests/controlplane/oldest,
/// built from the Go modules of that release. Checked first: the apiserver is that release, the
/// chart's floor is its minor, and it refuses a Service named `1etcd` (the reason the webhook's
/// name rule exists; Kubernetes 1.37 takes that name).
pub fn helm_chart_installed_on_the_oldest_kubernetes(cp: ControlPlane) {
    let oldest = common::oldest_kubernetes();
    let version: serde_json::Value = serde_json::from_str(&ok(
        cp.kubectl_output(&["get", "--raw", "/version"], None),
        "/version",
    ))
    .unwrap();
    assert_eq!(version["gitVersion"], oldest.as_str(), "{version}");
    let chart: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(common::root().join("charts/etcd-webhook/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let floor = chart["kubeVersion"]
        .as_str()
        .expect("Chart.yaml's kubeVersion");
    let minor = |v: &str| {
        v.trim_start_matches(['>', '=', 'v'])
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    };
    assert_eq!(
        minor(floor),
        minor(&oldest),
        "Chart.yaml claims {floor}: tests/controlplane/oldest must pin that minor, not {oldest}"
    );
    let service = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"1etcd","namespace":"default"},
        "spec":{"ports":[{"port":2379}]}}"#;
    let out = cp.kubectl_output(&["create", "--dry-run=server", "-f", "-"], Some(service));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("1etcd") && stderr.contains("metadata.name"),
        "Kubernetes {oldest} refuses a Service named 1etcd: {stderr}"
    );
    eprintln!("    Kubernetes {oldest} (the chart claims {floor}) refuses a Service named 1etcd");
    helm_chart_installed_for_real(cp);
}

pub fn helm_chart_installed_for_real(cp: ControlPlane) {
    let kubeconfig = cp.kubeconfig.clone();
    let helm = |args: &[&str]| {
        std::process::Command::new(common::k8s_tools().join("helm"))
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .current_dir(common::root())
            .output()
            .unwrap()
    };
    let started = Instant::now();
    ok(
        helm(&[
            "install",
            "etcd-webhook",
            "charts/etcd-webhook",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ]),
        "helm install etcd-webhook charts/etcd-webhook",
    );
    let installed = started.elapsed();
    // What helm installed, as the cluster has it (the Deployment's arguments included).
    let manifest = ok(
        helm(&["get", "manifest", "etcd-webhook", "--namespace", NAMESPACE]),
        "helm get manifest",
    );
    let objects = yaml_docs(&manifest);
    for kind in [
        "Issuer",
        "Certificate",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Deployment",
        "Service",
    ] {
        assert!(
            objects.iter().any(|o| o["kind"] == kind),
            "the release has a {kind}"
        );
    }
    // The chain from the chart, cainjector's caBundles, a replica with the chart's arguments,
    // the apiserver calling /validate.
    let env = Env::adopt(cp, &objects, &[]);
    the_served_certificate_is_what_the_apiserver_trusts_now(&env, Delivery::Volume);

    // The first EtcdCluster admitted (defaulted by /mutate) after `helm install` began.
    env.create_namespace("e2e-helm");
    let first = json!({
        "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "first", "namespace": "e2e-helm"},
        "spec": {"replicas": 3, "storageSizeGi": 1}
    });
    ok(
        env.kubectl_in(&["create", "-f", "-"], &first.to_string()),
        "create an EtcdCluster in v1alpha1 (through /convert, /mutate, /validate)",
    );
    let to_first = started.elapsed();
    let stored = env.get_json(&[
        "-n",
        "e2e-helm",
        "etcdclusters.v1.etcd.example.com",
        "first",
    ]);
    assert_eq!(stored["spec"]["size"], 3, "{stored}");
    assert_eq!(stored["spec"]["storageSize"], "1Gi", "{stored}");
    assert_eq!(
        stored["spec"]["version"], "v3.7.4",
        "/mutate filled in the defaults: {stored}"
    );
    assert!(
        stored["spec"].get("storageClass").is_none(),
        "no class named: the claims get the cluster's default StorageClass: {stored}"
    );
    // Member TLS by default (issue 28): /mutate wrote `tls: {}` into the new cluster (sent to it
    // as v1), and the loop's certificates become Ready through the real cert-manager.
    assert_eq!(stored["spec"]["tls"], json!({}), "TLS by default: {stored}");
    let tls_started = Instant::now();
    let certificates = [
        "certificate/first-ca",
        "certificate/first-peer",
        "certificate/first-server",
        "certificate/first-client",
    ];
    // Until the loop has made every one of `objects` (kind/name) in e2e-helm.
    let wait_until_made = |what: &str, objects: &[&str]| {
        crate::cluster::wait_for(what, std::time::Duration::from_secs(60), || {
            let mut args = vec!["-n", "e2e-helm", "get"];
            args.extend(objects);
            env.kubectl(&args).status.success().then_some(())
        })
    };
    wait_until_made("the loop to make the cluster's Certificates", &certificates);
    ok(
        env.kubectl(&[
            "-n",
            "e2e-helm",
            "wait",
            "--for=condition=Ready",
            "--timeout=120s",
            certificates[0],
            certificates[1],
            certificates[2],
            certificates[3],
        ]),
        "the default TLS cluster's Certificates become Ready",
    );
    eprintln!(
        "    the default TLS cluster's four Certificates Ready {:.1} s after it was admitted",
        tls_started.elapsed().as_secs_f64()
    );
    // The loop's children as this apiserver took them (its server-side applies are checked
    // against this release's schemas: a field it does not know is refused).
    let children = [
        "service/first",
        "service/first-client",
        "statefulset/first",
        "poddisruptionbudget/first",
    ];
    wait_until_made(
        "the loop to apply the cluster's Services, StatefulSet and budget",
        &children,
    );
    let old = env.get_json(&[
        "-n",
        "e2e-helm",
        "etcdclusters.v1alpha1.etcd.example.com",
        "first",
    ]);
    assert_eq!(old["spec"]["replicas"], 3, "read back in v1alpha1: {old}");
    // An even size, refused with the rule's words.
    let even = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "even", "namespace": "e2e-helm"},
        "spec": {"size": 4, "version": "v3.5.10", "storageSize": "1Gi"}
    });
    let out = env.kubectl_in(&["create", "-f", "-"], &even.to_string());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("must be odd"),
        "an even size is refused: {err}"
    );
    eprintln!(
        "    helm install returned after {:.1} s; the first EtcdCluster admitted {:.1} s after it began (chain issued, caBundles injected, Secret laid out, replica up)",
        installed.as_secs_f64(),
        to_first.as_secs_f64()
    );
    monitoring_is_accepted(&env, &helm);
    ok(
        helm(&["uninstall", "etcd-webhook", "--namespace", NAMESPACE]),
        "helm uninstall",
    );
}

/// Issue 31: with the Prometheus operator's CRDs installed (from its Go module, by
/// tests/controlplane/build.sh), the chart's ServiceMonitor, PodMonitor, PrometheusRule and
/// dashboard ConfigMap (`helm upgrade` with ci/monitoring-values.yaml), and config/prometheus and
/// config/grafana, are accepted by the real apiserver, and what it stores is what was tested:
/// nothing pruned by the operator's schemas (the alerts' groups, honorLabels, the relabeling).
fn monitoring_is_accepted(env: &Env, helm: &dyn Fn(&[&str]) -> std::process::Output) {
    let crds = env
        .cp
        .bin()
        .parent()
        .unwrap()
        .join("prometheus-operator-crds");
    ok(
        env.kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()]),
        "install the Prometheus operator's CRDs",
    );
    ok(
        env.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ]),
        "the Prometheus operator's CRDs established",
    );
    ok(
        helm(&[
            "upgrade",
            "etcd-webhook",
            "charts/etcd-webhook",
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "-f",
            "charts/etcd-webhook/ci/monitoring-values.yaml",
        ]),
        "helm upgrade with the monitors, the alerts and the dashboard",
    );
    let rules: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(common::root().join("config/prometheus/rules.yaml")).unwrap(),
    )
    .unwrap();
    let stored = env.get_json(&["-n", NAMESPACE, "prometheusrule", "etcd-webhook"]);
    assert_eq!(
        stored["spec"], rules,
        "the apiserver stores the tested alerts as they are"
    );
    let sm = env.get_json(&["-n", NAMESPACE, "servicemonitor", "etcd-webhook"]);
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true, "{sm}");
    let pm = env.get_json(&["-n", NAMESPACE, "podmonitor", "etcd-webhook-etcd-members"]);
    assert_eq!(
        pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["targetLabel"], "etcd_cluster",
        "{pm}"
    );
    assert_eq!(pm["spec"]["namespaceSelector"]["any"], true, "{pm}");
    let dashboard = env.get_json(&["-n", NAMESPACE, "configmap", "etcd-webhook-dashboard"]);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    // The kustomize trees, as the apiserver would take them.
    for dir in ["config/prometheus", "config/grafana"] {
        ok(
            env.kubectl(&[
                "apply",
                "--dry-run=server",
                "-k",
                common::root().join(dir).to_str().unwrap(),
            ]),
            &format!("kubectl apply --dry-run=server -k {dir}"),
        );
    }
}
