//! The install manifests, rendered with the real kubectl (kustomize) and helm, checked for the
//! invariants that break clusters when they drift. helm and kubectl come from
//! tests/tools/k8s-cli.sh (PATH first, else the Python package registry); no check is skipped.

mod common;

use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use etcd_webhook::admission::{defaults, validate};
use etcd_webhook::api::{self, convert};
use etcd_webhook::controller;

use common::root;

fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(common::k8s_tools().join(name))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// A rendered install: every document, with typed access by kind.
struct Install {
    name: String,
    docs: Vec<Value>,
}

impl Install {
    fn all<T: DeserializeOwned>(&self, kind: &str) -> Vec<T> {
        self.docs
            .iter()
            .filter(|d| d["kind"] == kind)
            .map(|d| {
                serde_json::from_value(d.clone())
                    .unwrap_or_else(|e| panic!("{}: {kind} does not parse: {e}", self.name))
            })
            .collect()
    }
    fn one<T: DeserializeOwned>(&self, kind: &str) -> T {
        let mut v = self.all(kind);
        assert_eq!(v.len(), 1, "{}: exactly one {kind}", self.name);
        v.remove(0)
    }
    fn raw(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }
}

fn kustomize() -> Install {
    Install {
        name: "config/default".into(),
        docs: documents(&tool("kubectl", &["kustomize", "config/default"])),
    }
}

fn helm(values: Option<&str>) -> Install {
    let mut args = vec![
        "template",
        "etcd-webhook",
        "charts/etcd-webhook",
        "--namespace",
        "etcd-system",
        "--include-crds",
    ];
    if let Some(v) = values {
        args.extend(["-f", v]);
    }
    Install {
        name: format!("helm {}", values.unwrap_or("defaults")),
        docs: documents(&tool("helm", &args)),
    }
}

fn value_sets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("charts/etcd-webhook/ci"))
        .unwrap()
        .map(|e| {
            format!(
                "charts/etcd-webhook/ci/{}",
                e.unwrap().file_name().into_string().unwrap()
            )
        })
        .collect();
    v.sort();
    assert!(
        v.len() >= 3,
        "at least three value sets besides the defaults"
    );
    v
}

/// The `serve` arguments of the install's Deployment.
fn serve_args(install: &Install) -> Vec<String> {
    let d: Deployment = install.one("Deployment");
    d.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap()
}

fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
}

fn has_key(v: &Value, key: &str) -> bool {
    match v {
        Value::Object(m) => m.contains_key(key) || m.values().any(|x| has_key(x, key)),
        Value::Array(a) => a.iter().any(|x| has_key(x, key)),
        _ => false,
    }
}

/// The install's namespace.
const NS: &str = "etcd-system";

/// Everything that must hold in any rendering.
fn check(install: &Install, cert_manager: bool) {
    assert!(
        !install.docs.iter().any(|d| has_key(d, "caBundle")),
        "{}: no caBundle anywhere",
        install.name
    );
    let (pod, pod_labels, secret_name) = check_deployment(install);
    let svc_name = check_budget_and_service(install, &pod_labels);
    check_webhook_configurations(install, &svc_name);
    let has_crd = check_crd(install, &svc_name);
    check_cert_manager(install, cert_manager, &secret_name, &svc_name, has_crd);
    check_service_account(install, &pod);
}

/// The Deployment: replicas, security, probes, the certificate volume as a directory. Returns
/// its pod spec, the pods' labels and the Secret the certificate comes from.
fn check_deployment(
    install: &Install,
) -> (PodSpec, std::collections::BTreeMap<String, String>, String) {
    let n = &install.name;
    let ns = NS;
    let deploy: Deployment = install.one("Deployment");
    let spec = deploy.spec;
    assert!(spec.replicas.unwrap() >= 2, "{n}: at least 2 replicas");
    let pod = spec.template.spec.as_ref().unwrap();
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true), "{n}");
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault",
        "{n}"
    );
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{n}");
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{n}");
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "{n}"
    );
    assert!(
        c.resources.as_ref().unwrap().requests.is_some()
            && c.resources.as_ref().unwrap().limits.is_some(),
        "{n}"
    );
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "serve");
    let port_of = |name: &str| {
        c.ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap()
            .container_port
    };
    let addr_port: i32 = arg(&args, "--addr")
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let health_port: i32 = arg(&args, "--health-addr")
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        port_of("webhook"),
        addr_port,
        "{n}: containerPort webhook is what --addr listens on"
    );
    assert_eq!(port_of("health"), health_port, "{n}");
    for probe in [
        c.readiness_probe.as_ref().unwrap(),
        c.liveness_probe.as_ref().unwrap(),
    ] {
        assert_eq!(
            probe.http_get.as_ref().unwrap().port,
            IntOrString::String("health".into()),
            "{n}: probes on the health port"
        );
    }
    assert_eq!(
        c.readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/readyz")
    );
    assert_eq!(
        c.liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/healthz")
    );
    let secret_name = match (arg(&args, "--cert-dir"), arg(&args, "--cert-secret")) {
        (Some(cert_dir), None) => cert_volume(n, pod, cert_dir),
        (None, Some(secret)) => check_cert_secret(install, pod, secret),
        other => panic!("{n}: exactly one of --cert-dir and --cert-secret, got {other:?}"),
    };
    assert_eq!(deploy.metadata.namespace.as_deref(), Some(ns));
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    (pod.clone(), pod_labels, secret_name)
}

/// A PodDisruptionBudget over the pods, and the Service that reaches their webhook port;
/// returns the Service's name.
fn check_budget_and_service(
    install: &Install,
    pod_labels: &std::collections::BTreeMap<String, String>,
) -> String {
    let n = &install.name;
    let ns = NS;
    let selects = |sel: &std::collections::BTreeMap<String, String>| {
        sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    let pdb: PodDisruptionBudget = install.one("PodDisruptionBudget");
    assert!(
        selects(
            pdb.spec
                .as_ref()
                .unwrap()
                .selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()
        ),
        "{n}: PDB selects the pods"
    );

    // The Service reaches the webhook container port.
    let svc: Service = install.one("Service");
    let svc_name = svc.metadata.name.clone().unwrap();
    assert_eq!(svc.metadata.namespace.as_deref(), Some(ns));
    assert!(
        selects(svc.spec.as_ref().unwrap().selector.as_ref().unwrap()),
        "{n}: Service selects the pods"
    );
    let ports = svc.spec.as_ref().unwrap().ports.clone().unwrap();
    let https = ports.iter().find(|p| p.port == 443).expect("port 443");
    assert_eq!(
        https.target_port,
        Some(IntOrString::String("webhook".into())),
        "{n}"
    );

    svc_name
}

/// Both webhook configurations: our Service, port 443, the served paths, the rules, and a
/// timeout the server's --request-timeout stays under.
fn check_webhook_configurations(install: &Install, svc_name: &str) {
    let n = &install.name;
    let ns = NS;
    // Every client config: our Service, port 443, a path the server serves.
    let check_client = |cc: &WebhookClientConfig, path: &str| {
        let s = cc.service.as_ref().unwrap();
        assert_eq!(
            (s.name.as_str(), s.namespace.as_str()),
            (svc_name, ns),
            "{n}"
        );
        assert_eq!(s.port, Some(443), "{n}");
        assert_eq!(s.path.as_deref(), Some(path), "{n}");
        assert!(cc.url.is_none() && cc.ca_bundle.is_none(), "{n}");
    };
    let m: MutatingWebhookConfiguration = install.one("MutatingWebhookConfiguration");
    let v: ValidatingWebhookConfiguration = install.one("ValidatingWebhookConfiguration");
    let mw = &m.webhooks.as_ref().unwrap()[0];
    let vw = &v.webhooks.as_ref().unwrap()[0];
    check_client(&mw.client_config, "/mutate");
    check_client(&vw.client_config, "/validate");
    for (rules, mp, arv, se, ns_sel, timeout, operations) in [
        (
            &mw.rules,
            &mw.match_policy,
            &mw.admission_review_versions,
            &mw.side_effects,
            &mw.namespace_selector,
            mw.timeout_seconds,
            &["CREATE", "UPDATE"][..],
        ),
        (
            &vw.rules,
            &vw.match_policy,
            &vw.admission_review_versions,
            &vw.side_effects,
            &vw.namespace_selector,
            vw.timeout_seconds,
            // DELETE: a foreground deletion of a cluster with backups is refused.
            &["CREATE", "DELETE", "UPDATE"][..],
        ),
    ] {
        let rule = &rules.as_ref().unwrap()[0];
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["etcd.example.com".to_owned()][..])
        );
        assert_eq!(rule.api_versions.as_deref(), Some(&["v1".to_owned()][..]));
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["etcdclusters".to_owned()][..])
        );
        let mut ops = rule.operations.clone().unwrap();
        ops.sort();
        assert_eq!(ops, operations);
        assert_eq!(mp.as_deref(), Some("Equivalent"));
        assert_eq!(arv, &["v1".to_owned()]);
        assert_eq!(se, "None");
        assert!((1..=30).contains(&timeout.unwrap()), "{n}");
        // The server answers (503 at the latest) before the apiserver gives up on the call.
        let args = serve_args(install);
        let request_timeout = arg(&args, "--request-timeout")
            .unwrap_or_else(|| panic!("{n}: --request-timeout is set from timeoutSeconds"));
        let request_timeout = humantime::parse_duration(request_timeout).unwrap();
        assert!(
            request_timeout < std::time::Duration::from_secs(timeout.unwrap() as u64),
            "{n}: --request-timeout {request_timeout:?} < timeoutSeconds {timeout:?}"
        );
        // Every address, IPv6 and IPv4, so one manifest fits single-stack IPv6 clusters too
        // (issue 12, item 3: both listeners were 0.0.0.0).
        assert_eq!(arg(&args, "--addr"), Some(":8443"), "{n}");
        assert_eq!(arg(&args, "--health-addr"), Some(":8081"), "{n}");
        // EtcdClusters are checked in every namespace, the webhook's own included: the rules
        // match only etcdclusters, so there is no lock-out to avoid.
        assert!(ns_sel.is_none(), "{n}: no namespaceSelector");
    }
}

/// The CRD: generated, converting through our Service. Returns whether the install carries it.
fn check_crd(install: &Install, svc_name: &str) -> bool {
    let n = &install.name;
    let ns = NS;
    let crds: Vec<CustomResourceDefinition> = install.all("CustomResourceDefinition");
    assert_eq!(crds.len(), 1, "{n}: the install carries the CRD");
    {
        let crd = &crds[0];
        let conv = crd
            .spec
            .conversion
            .as_ref()
            .unwrap()
            .webhook
            .as_ref()
            .unwrap();
        let cc = conv.client_config.as_ref().unwrap();
        let s = cc.service.as_ref().unwrap();
        assert_eq!(
            (
                s.name.as_str(),
                s.namespace.as_str(),
                s.port,
                s.path.as_deref()
            ),
            (svc_name, ns, Some(443), Some("/convert")),
            "{n}"
        );
        assert!(cc.url.is_none() && cc.ca_bundle.is_none(), "{n}");
        let generated = serde_json::to_value(api::crd()).unwrap();
        assert_eq!(
            serde_json::to_value(crd).unwrap(),
            generated,
            "{n}: CRD equals `etcd-webhook crd`"
        );
    }

    !crds.is_empty()
}

/// cert-manager: the serving Certificate's Secret is what the Deployment mounts, its names are
/// the Service's, and every cainjector annotation names it (none without cert-manager).
fn check_cert_manager(
    install: &Install,
    cert_manager: bool,
    secret_name: &str,
    svc_name: &str,
    has_crd: bool,
) {
    let n = &install.name;
    let ns = NS;
    let certs = install.raw("Certificate");
    let annotated: Vec<String> = install
        .docs
        .iter()
        .filter_map(|d| {
            d.pointer("/metadata/annotations/cert-manager.io~1inject-ca-from")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if cert_manager {
        let serving = certs
            .iter()
            .find(|c| c["spec"]["secretName"] == secret_name)
            .expect("a Certificate writes the mounted Secret");
        let cert_name = serving["metadata"]["name"].as_str().unwrap();
        let dns: Vec<&str> = serving["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert!(
            dns.contains(&format!("{svc_name}.{ns}.svc").as_str()),
            "{n}: {dns:?}"
        );
        assert!(
            dns.contains(&format!("{svc_name}.{ns}.svc.cluster.local").as_str()),
            "{n}: {dns:?}"
        );
        assert_eq!(serving["spec"]["duration"], "8760h");
        assert_eq!(serving["spec"]["renewBefore"], "720h");
        // Issued by a CA issuer whose CA comes from a SelfSigned issuer: a stable caBundle.
        let issuer_name = serving["spec"]["issuerRef"]["name"].as_str().unwrap();
        let issuer = install
            .raw("Issuer")
            .into_iter()
            .find(|i| i["metadata"]["name"] == issuer_name)
            .unwrap();
        let ca_secret = issuer["spec"]["ca"]["secretName"]
            .as_str()
            .expect("serving cert comes from a CA issuer");
        let ca_cert = certs
            .iter()
            .find(|c| c["spec"]["secretName"] == ca_secret)
            .unwrap();
        assert_eq!(ca_cert["spec"]["isCA"], true);
        let self_signed = ca_cert["spec"]["issuerRef"]["name"].as_str().unwrap();
        assert!(
            install
                .raw("Issuer")
                .iter()
                .any(|i| i["metadata"]["name"] == self_signed
                    && i["spec"].get("selfSigned").is_some())
        );
        let want = format!("{ns}/{cert_name}");
        let expected = if has_crd { 3 } else { 2 };
        assert_eq!(
            annotated.len(),
            expected,
            "{n}: CRD and both webhook configurations carry inject-ca-from"
        );
        assert!(
            annotated.iter().all(|a| *a == want),
            "{n}: {annotated:?} vs {want}"
        );
    } else {
        assert!(certs.is_empty(), "{n}: no cert-manager resources");
        assert!(
            install
                .docs
                .iter()
                .filter(|d| d["kind"] != "CustomResourceDefinition")
                .all(|d| d
                    .pointer("/metadata/annotations/cert-manager.io~1inject-ca-from")
                    .is_none()),
            "{n}: no inject annotations without cert-manager"
        );
    }
}

/// The ServiceAccount the pods run as, and the RBAC the --controller mode needs (none without
/// the controller).
fn check_service_account(install: &Install, pod: &PodSpec) {
    let n = &install.name;
    let args = serve_args(install);
    let sa: ServiceAccount = install.one("ServiceAccount");
    assert_eq!(
        pod.service_account_name.as_deref(),
        sa.metadata.name.as_deref()
    );
    match arg(&args, "--controller") {
        Some("on") => check_controller_rbac(install, &args, pod, &sa),
        Some("off") => {
            // Webhooks only: the server calls no API, so it is granted nothing, gets no token.
            assert!(
                install.raw("ClusterRole").is_empty() && install.raw("Role").is_empty(),
                "{n}: no Role without the controller"
            );
            assert!(
                install.raw("ClusterRoleBinding").is_empty()
                    && install.raw("RoleBinding").is_empty()
            );
            assert_ne!(sa.automount_service_account_token, Some(true), "{n}");
            assert_eq!(pod.automount_service_account_token, Some(false), "{n}");
        }
        other => panic!("{n}: --controller must be explicit in a cluster, got {other:?}"),
    }
}

/// The Secret the certificate volume mounts at `cert_dir` (as a directory, never subPath).
fn cert_volume(n: &str, pod: &PodSpec, cert_dir: &str) -> String {
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == cert_dir)
        .expect("--cert-dir is a mount");
    assert!(
        mount.sub_path.is_none() && mount.sub_path_expr.is_none(),
        "{n}: never subPath (never updated)"
    );
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    volume.secret.as_ref().unwrap().secret_name.clone().unwrap()
}

/// `--cert-secret`: no certificate volume, a token, and a Role granting get, list and watch on
/// exactly that Secret (by name) to the pods' ServiceAccount. Returns the Secret's name.
fn check_cert_secret(install: &Install, pod: &PodSpec, secret: &str) -> String {
    let n = &install.name;
    assert!(
        !secret.contains('/'),
        "{n}: --cert-secret names the Secret in the pod's namespace, so any namespace works"
    );
    assert!(
        pod.volumes.iter().flatten().all(|v| v.secret.is_none()),
        "{n}: no Secret volume with --cert-secret"
    );
    assert!(
        pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .next()
            .is_none(),
        "{n}: nothing mounted"
    );
    assert_eq!(pod.automount_service_account_token, Some(true), "{n}");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    assert!(
        env.iter().any(|e| e.name == "POD_NAMESPACE"
            && e.value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path
                == "metadata.namespace"),
        "{n}: POD_NAMESPACE, the Secret's namespace"
    );
    let role: Role = install
        .all::<Role>("Role")
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some("etcd-webhook-cert-secret"))
        .unwrap_or_else(|| panic!("{n}: the Role etcd-webhook-cert-secret"));
    assert_eq!(role.metadata.namespace.as_deref(), Some("etcd-system"));
    let rules = serde_json::to_value(role.rules.unwrap()).unwrap();
    assert_eq!(
        rules,
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets"],
            "resourceNames": [secret], "verbs": ["get", "list", "watch"]}]),
        "{n}: exactly get, list and watch on that one Secret"
    );
    let binding: RoleBinding = install
        .all::<RoleBinding>("RoleBinding")
        .into_iter()
        .find(|b| b.role_ref.name == "etcd-webhook-cert-secret")
        .unwrap_or_else(|| panic!("{n}: a RoleBinding of etcd-webhook-cert-secret"));
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(
        serde_json::to_value(binding.subjects.unwrap()).unwrap(),
        serde_json::json!([{"kind": "ServiceAccount", "name": pod.service_account_name.clone().unwrap(), "namespace": "etcd-system"}]),
        "{n}"
    );
    secret.to_owned()
}

/// The Role grants every (group, resource, verb) the loop uses, and no wildcard.
fn grants(rules: &[PolicyRule], need: &[(&str, &str, &[&str])], what: &str) {
    for r in rules {
        let all = r
            .resources
            .iter()
            .flatten()
            .chain(&r.verbs)
            .chain(r.api_groups.iter().flatten());
        for x in all {
            assert_ne!(x, "*", "{what}: no wildcards");
        }
    }
    for (group, resource, verbs) in need {
        for verb in *verbs {
            assert!(
                rules
                    .iter()
                    .any(|r| r.api_groups.iter().flatten().any(|g| g == group)
                        && r.resources.iter().flatten().any(|x| x == resource)
                        && r.verbs.iter().any(|v| v == verb)),
                "{what}: {verb} on {group}/{resource} is not granted"
            );
        }
    }
}

fn check_controller_rbac(install: &Install, args: &[String], pod: &PodSpec, sa: &ServiceAccount) {
    let n = &install.name;
    let sa_name = sa.metadata.name.clone().unwrap();
    let subject_is_sa = |subjects: &Option<Vec<Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == sa_name
                && s.namespace.as_deref() == Some("etcd-system")
        })
    };
    let roles: Vec<ClusterRole> = install.all("ClusterRole");
    let named = |suffix: &str| {
        roles
            .iter()
            .find(|r| r.metadata.name.as_deref().unwrap_or("").ends_with(suffix))
            .unwrap_or_else(|| panic!("{n}: a ClusterRole *{suffix}"))
            .clone()
    };
    let role = named("-controller");
    grants(
        role.rules.as_deref().unwrap_or_default(),
        controller::RBAC_RULES,
        &format!("{n}: ClusterRole"),
    );
    grants(
        role.rules.as_deref().unwrap_or_default(),
        controller::lookups::credentials::CREDENTIALS_RBAC_RULES,
        &format!("{n}: ClusterRole (the credentials look)"),
    );
    grants(
        role.rules.as_deref().unwrap_or_default(),
        controller::pass::certificates::CERTIFICATES_RBAC_RULES,
        &format!("{n}: ClusterRole (member TLS)"),
    );
    // Secrets by name only, unless the install asks for the client-Secret cache: no replica can
    // list or watch every Secret in the cluster.
    let lists_secrets = role.rules.iter().flatten().any(|r| {
        r.resources.iter().flatten().any(|x| x == "secrets")
            && r.verbs.iter().any(|v| v == "list" || v == "watch")
    });
    let cached = args.iter().any(|a| a == "--cache-client-secrets");
    assert_eq!(
        lists_secrets, cached,
        "{n}: list/watch on secrets only with --cache-client-secrets"
    );
    if cached {
        grants(
            role.rules.as_deref().unwrap_or_default(),
            controller::machinery::rbac::SECRET_CACHE_RBAC_RULES,
            &format!("{n}: ClusterRole (the client-Secret cache)"),
        );
    }
    let role_name = role.metadata.name.clone().unwrap();
    // The caBundle self-check: get on exactly the three objects by name, Events; bound
    // cluster-wide in every install (they are cluster-scoped).
    let check = named("-cabundle-check");
    let got: std::collections::BTreeSet<(String, String, Vec<String>, Vec<String>)> = check
        .rules
        .iter()
        .flatten()
        .flat_map(|r| {
            let groups = r.api_groups.clone().unwrap_or_default();
            let resources = r.resources.clone().unwrap_or_default();
            let names = r.resource_names.clone().unwrap_or_default();
            let verbs = r.verbs.clone();
            groups.into_iter().flat_map(move |g| {
                let (names, verbs) = (names.clone(), verbs.clone());
                resources
                    .clone()
                    .into_iter()
                    .map(move |res| (g.clone(), res, names.clone(), verbs.clone()))
            })
        })
        .collect();
    let mut want: std::collections::BTreeSet<_> = etcd_webhook::tls::cabundle::Target::shipped()
        .iter()
        .map(|t| {
            let (g, r, name) = t.rbac();
            (
                g.to_owned(),
                r.to_owned(),
                vec![name.to_owned()],
                vec!["get".to_owned()],
            )
        })
        .collect();
    want.insert((
        "events.k8s.io".to_owned(),
        "events".to_owned(),
        vec![],
        vec!["create".to_owned(), "patch".to_owned()],
    ));
    assert_eq!(got, want, "{n}: the caBundle check's ClusterRole");
    let all_cluster_bindings: Vec<ClusterRoleBinding> = install.all("ClusterRoleBinding");
    let check_binding = all_cluster_bindings
        .iter()
        .find(|b| b.role_ref.name == check.metadata.name.clone().unwrap())
        .unwrap_or_else(|| panic!("{n}: a ClusterRoleBinding of the caBundle check's role"));
    assert!(subject_is_sa(&check_binding.subjects), "{n}");
    // The StorageClasses /validate warns about: their own ClusterRole, bound cluster-wide in
    // every install (single-namespace too: StorageClasses are cluster-scoped).
    let classes = named("-storage-classes");
    grants(
        classes.rules.as_deref().unwrap_or_default(),
        controller::lookups::storage_classes::STORAGE_CLASS_RBAC_RULES,
        &format!("{n}: the StorageClass reader's ClusterRole"),
    );
    assert_eq!(
        classes.rules.as_deref().unwrap_or_default().len(),
        1,
        "{n}: read-only, one rule"
    );
    let classes_binding = all_cluster_bindings
        .iter()
        .find(|b| b.role_ref.name == classes.metadata.name.clone().unwrap())
        .unwrap_or_else(|| panic!("{n}: a ClusterRoleBinding of the StorageClass reader's role"));
    assert!(subject_is_sa(&classes_binding.subjects), "{n}");

    // Bound cluster-wide, or only in the --watch-namespace.
    let bindings: Vec<RoleBinding> = install.all("RoleBinding");
    let cluster_bindings: Vec<ClusterRoleBinding> = all_cluster_bindings
        .into_iter()
        .filter(|b| b.role_ref.name == role_name)
        .collect();
    match arg(args, "--watch-namespace") {
        None => {
            assert_eq!(cluster_bindings.len(), 1, "{n}: one ClusterRoleBinding");
            assert_eq!(cluster_bindings[0].role_ref.name, role_name);
            assert!(subject_is_sa(&cluster_bindings[0].subjects), "{n}");
        }
        Some(ns) => {
            assert!(
                cluster_bindings.is_empty(),
                "{n}: namespaced install binds the controller's role in no other namespace"
            );
            let b = bindings
                .iter()
                .find(|b| b.role_ref.kind == "ClusterRole")
                .unwrap_or_else(|| panic!("{n}: a RoleBinding of the controller's role"));
            assert_eq!(b.metadata.namespace.as_deref(), Some(ns), "{n}");
            assert_eq!(b.role_ref.name, role_name);
            assert!(subject_is_sa(&b.subjects), "{n}");
        }
    }
    // Leader election: a Role for Leases in the pod's namespace.
    assert_eq!(arg(args, "--leader-elect"), Some("true"), "{n}");
    let lease_role: Role = install
        .all::<Role>("Role")
        .into_iter()
        .find(|r| r.metadata.name.as_deref() != Some("etcd-webhook-cert-secret"))
        .unwrap_or_else(|| panic!("{n}: the leader Role"));
    assert_eq!(
        lease_role.metadata.namespace.as_deref(),
        Some("etcd-system")
    );
    grants(
        lease_role.rules.as_deref().unwrap_or_default(),
        controller::LEADER_RBAC_RULES,
        &format!("{n}: leader Role"),
    );
    let lb = bindings
        .iter()
        .find(|b| {
            b.role_ref.kind == "Role"
                && b.role_ref.name == lease_role.metadata.name.clone().unwrap()
        })
        .unwrap_or_else(|| panic!("{n}: a RoleBinding of the leader Role"));
    assert_eq!(lb.metadata.namespace.as_deref(), Some("etcd-system"));
    assert!(subject_is_sa(&lb.subjects), "{n}");
    // A token, and the identity for the Lease from the downward API.
    assert_eq!(pod.automount_service_account_token, Some(true), "{n}");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let e = env
            .iter()
            .find(|e| e.name == var)
            .unwrap_or_else(|| panic!("{n}: env {var}"));
        let path = e
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(path, Some(field), "{n}: {var}");
    }
}

#[test]
fn kustomize_config_default() {
    let install = kustomize();
    check(&install, true);
    let ns = install.raw("Namespace");
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["metadata"]["name"], "etcd-system");
}

/// An overlay that sets another namespace rewrites every reference, the ones kustomize's
/// `namespace:` leaves alone too (cert-manager's inject-ca-from annotations, the Certificate's
/// DNS names), through config/namespace-references.
#[test]
fn kustomize_overlay_in_another_namespace_rewrites_every_reference() {
    let rendered = tool("kubectl", &["kustomize", "config/custom-namespace"]);
    assert!(
        !rendered.contains("etcd-system"),
        "etcd-system is left somewhere:\n{rendered}"
    );
    let install = Install {
        name: "config/custom-namespace".into(),
        docs: documents(&rendered),
    };
    let inject = |kind: &str| {
        install.raw(kind)[0]["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].clone()
    };
    for kind in [
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(inject(kind), "etcd-webhook/etcd-webhook-serving", "{kind}");
    }
    let serving = install
        .raw("Certificate")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "etcd-webhook-serving")
        .expect("the serving Certificate");
    assert_eq!(
        serving["spec"]["dnsNames"],
        serde_json::json!([
            "etcd-webhook.etcd-webhook.svc",
            "etcd-webhook.etcd-webhook.svc.cluster.local"
        ])
    );
    assert_eq!(
        install.raw("Namespace")[0]["metadata"]["name"],
        "etcd-webhook"
    );
    // `etcd-webhook crd --namespace` (what the retire and serve-again steps print) is the
    // overlay's CRD, for every set of served versions.
    for served in [None, Some("v1")] {
        let mut args = vec!["crd", "--namespace", "etcd-webhook", "--offline"];
        args.extend(served.iter().flat_map(|v| ["--served", *v]));
        let out = Command::new(common::BIN).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: serde_json::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
        let overlay = &install.raw("CustomResourceDefinition")[0];
        assert_eq!(
            printed["spec"]["conversion"], overlay["spec"]["conversion"],
            "crd {args:?}"
        );
        assert_eq!(
            printed["metadata"]["annotations"], overlay["metadata"]["annotations"],
            "crd {args:?}"
        );
    }
}

#[test]
fn kustomize_single_namespace_overlay() {
    let install = Install {
        name: "config/single-namespace".into(),
        docs: documents(&tool("kubectl", &["kustomize", "config/single-namespace"])),
    };
    check(&install, true);
    assert_eq!(
        arg(&serve_args(&install), "--watch-namespace"),
        Some("etcd-apps")
    );
}

/// config/cert-secret: the certificate read through the API, by the Secret's name alone.
#[test]
fn kustomize_cert_secret_overlay() {
    let install = Install {
        name: "config/cert-secret".into(),
        docs: documents(&tool("kubectl", &["kustomize", "config/cert-secret"])),
    };
    check(&install, true);
    assert_eq!(
        arg(&serve_args(&install), "--cert-secret"),
        Some("etcd-webhook-tls")
    );
}

#[test]
fn helm_lint_strict() {
    // The defaults, then each value set.
    for values in std::iter::once(None).chain(value_sets().into_iter().map(Some)) {
        let mut args = vec![
            "lint",
            "--strict",
            "--namespace",
            "etcd-system",
            "charts/etcd-webhook",
        ];
        args.extend(values.as_deref().map(|v| ["-f", v]).into_iter().flatten());
        let out = tool("helm", &args);
        assert!(
            out.contains("0 chart(s) failed"),
            "{}: {out}",
            values.as_deref().unwrap_or("defaults")
        );
    }
}

#[test]
fn helm_template_default_and_value_sets() {
    check(&helm(None), true);
    for v in value_sets() {
        let install = helm(Some(&v));
        check(&install, !v.contains("cert-manager-off"));
        if v.contains("network-policy") {
            let np: NetworkPolicy = install.one("NetworkPolicy");
            let ports: Vec<i32> = np
                .spec
                .unwrap()
                .ingress
                .unwrap()
                .iter()
                .flat_map(|r| r.ports.clone().unwrap())
                .map(|p| match p.port.unwrap() {
                    IntOrString::Int(i) => i,
                    IntOrString::String(s) => panic!("{s}"),
                })
                .collect();
            assert_eq!(
                ports,
                [8443, 8081],
                "apiserver -> 8443, scraping -> health port"
            );
            let sm = install.raw("ServiceMonitor");
            assert_eq!(sm.len(), 1);
            assert_eq!(sm[0]["spec"]["endpoints"][0]["port"], "metrics");
        }
        if v.contains("controller-off") {
            assert_eq!(arg(&serve_args(&install), "--controller"), Some("off"));
        }
        if v.contains("controller-single-namespace") {
            let args = serve_args(&install);
            assert_eq!(arg(&args, "--watch-namespace"), Some("etcd-apps"));
            assert_eq!(
                arg(&args, "--etcd-image-registry"),
                Some("registry.example.com/mirror")
            );
            assert_eq!(arg(&args, "--finalizer-timeout"), Some("20m"));
        }
        if v.contains("custom") {
            let m: MutatingWebhookConfiguration = install.one("MutatingWebhookConfiguration");
            assert_eq!(
                m.webhooks.unwrap()[0].failure_policy.as_deref(),
                Some("Ignore")
            );
            let d: Deployment = install.one("Deployment");
            let spec = d.spec;
            assert_eq!(spec.replicas, Some(3));
            // The user's constraint keeps its own labelSelector (one key, no duplicate).
            let tsc = spec
                .template
                .spec
                .unwrap()
                .topology_spread_constraints
                .unwrap();
            assert_eq!(tsc[0].topology_key, "kubernetes.io/hostname");
            assert!(tsc[0].label_selector.is_some());
            // A YAML parser keeps the last of two equal keys; the rendered text must have one.
            let rendered = tool(
                "helm",
                &[
                    "template",
                    "x",
                    "charts/etcd-webhook",
                    "-n",
                    "etcd-system",
                    "-f",
                    &v,
                ],
            );
            let spread = rendered
                .split("\n---")
                .find(|d| d.contains("\nkind: Deployment"))
                .and_then(|d| d.split("topologySpreadConstraints:").nth(1))
                .and_then(|d| d.split("containers:").next())
                .unwrap();
            assert_eq!(
                spread.matches("labelSelector:").count(),
                tsc.len(),
                "one labelSelector per spread constraint:\n{spread}"
            );
            // commonAnnotations on every templated object (crds/ is not templated).
            for doc in install
                .docs
                .iter()
                .filter(|d| d["kind"] != "CustomResourceDefinition")
            {
                assert_eq!(
                    doc["metadata"]["annotations"]["owner"], "platform@example.com",
                    "{} {}: commonAnnotations",
                    doc["kind"], doc["metadata"]["name"]
                );
            }
            let m = &install.raw("MutatingWebhookConfiguration")[0];
            assert!(
                m["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(),
                "the inject annotation stays beside commonAnnotations"
            );
        }
    }
    // Defaults: off by default.
    let install = helm(None);
    assert!(install.raw("NetworkPolicy").is_empty() && install.raw("ServiceMonitor").is_empty());
    let m: MutatingWebhookConfiguration = install.one("MutatingWebhookConfiguration");
    assert_eq!(
        m.webhooks.unwrap()[0].failure_policy.as_deref(),
        Some("Fail")
    );
}

#[test]
fn helm_refuses_another_namespace() {
    let out = Command::new(common::k8s_tools().join("helm"))
        .args([
            "template",
            "x",
            "charts/etcd-webhook",
            "--namespace",
            "default",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("install etcd-webhook into the namespace etcd-system")
    );
}

#[test]
fn chart_crd_is_the_generated_crd() {
    let chart = std::fs::read_to_string(
        root().join("charts/etcd-webhook/crds/etcd.example.com_etcdclusters.yaml"),
    )
    .unwrap();
    assert!(
        chart == api::crd_yaml(),
        "charts/etcd-webhook/crds drifted: run `cargo run -- crd > charts/etcd-webhook/crds/etcd.example.com_etcdclusters.yaml`"
    );
}

#[test]
fn samples_pass_validate_and_mutate_only_adds_defaults() {
    let dir = root().join("config/samples");
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.starts_with("etcd_") {
            continue;
        }
        let obj: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let version = convert::version_of(&obj).unwrap();
        versions.push(version);
        let verdict = validate::validate(version, validate::Operation::Create, &obj, None);
        assert!(verdict.allowed(), "{name}: {}", verdict.message());
        let patch = serde_json::to_value(defaults::patch(&obj, version)).unwrap();
        for op in patch.as_array().unwrap() {
            assert_eq!(
                op["op"], "add",
                "{name}: /mutate may only add defaults, not change what is there: {op}"
            );
        }
    }
    versions.sort();
    assert_eq!(versions, api::Version::ALL, "one sample per version");
    // And the kustomization lists them all.
    let k = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    assert_eq!(k.matches("etcd_").count(), 3);
}

/// config/storage-migration grants exactly what `migrate-storage` calls (src/migrate.rs), the
/// CRD only by name, and binds nothing.
#[test]
fn storage_migration_role_is_exactly_what_the_migration_calls() {
    let install = Install {
        name: "config/storage-migration".into(),
        docs: documents(&tool("kubectl", &["kustomize", "config/storage-migration"])),
    };
    assert_eq!(install.docs.len(), 1, "only the ClusterRole");
    let role: ClusterRole = install.one("ClusterRole");
    assert_eq!(
        role.metadata.name.as_deref(),
        Some("etcd-webhook-storage-migrator")
    );
    let rules = role.rules.unwrap_or_default();
    grants(
        &rules,
        etcd_webhook::migrate::MIGRATOR_RBAC_RULES,
        "storage migrator",
    );
    let mut granted = Vec::new();
    for r in &rules {
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    granted.push((group.clone(), resource.clone(), verb.clone()));
                }
                if group == "apiextensions.k8s.io" {
                    assert_eq!(
                        r.resource_names.as_deref(),
                        Some(&[etcd_webhook::migrate::CRD_NAME.to_owned()][..]),
                        "{resource}: this CRD only"
                    );
                }
            }
        }
    }
    let needed: usize = etcd_webhook::migrate::MIGRATOR_RBAC_RULES
        .iter()
        .map(|(_, _, verbs)| verbs.len())
        .sum();
    assert_eq!(
        granted.len(),
        needed,
        "nothing beyond the calls: {granted:?}"
    );
}

/// The chart's NOTES are pasted into a shell: every command is one line (an indented heredoc
/// never ends, so pasting it hangs), and the check it suggests is a server-side dry run.
#[test]
fn chart_notes_paste_into_a_shell() {
    let render = |extra: &[&str]| {
        let mut args = vec![
            "install",
            "etcd-webhook",
            "charts/etcd-webhook",
            "--namespace",
            "etcd-system",
            "--dry-run=client",
        ];
        args.extend_from_slice(extra);
        tool("helm", &args)
            .split("NOTES:\n")
            .nth(1)
            .expect("helm prints the NOTES")
            .to_owned()
    };
    let notes = render(&[]);
    assert!(notes.contains("kubectl create --dry-run=server"), "{notes}");
    // The check NOTES suggest is one only the webhook answers (no CEL rule of the CRD is on
    // the field it names), and the denial NOTES promise is the one the rules give: the manifest
    // the printf writes, reviewed offline by the same code /validate runs.
    let check = notes
        .lines()
        .find(|l| l.contains("webhook-check"))
        .expect("NOTES suggest a dry run the webhook answers");
    let manifest = Command::new("bash")
        .args(["-c", check.trim().split(" | ").next().unwrap()])
        .output()
        .unwrap()
        .stdout;
    let expect = notes
        .lines()
        .find_map(|l| l.split("denied the request: ").nth(1))
        .expect("NOTES say what the webhook answers");
    let mut review = Command::new(common::BIN)
        .args(["review", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut review.stdin.take().unwrap(), &manifest).unwrap();
    let out = review.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("denied: {expect}")), "{stderr}");
    let field = expect.split(':').next().unwrap();
    for version in etcd_webhook::api::Version::ALL {
        for (cel, _) in etcd_webhook::api::cel::rules(version) {
            assert_ne!(cel.path(version), field, "a CEL rule answers {field} first");
        }
    }
    assert!(
        notes
            .contains("kubectl apply --server-side --force-conflicts -f charts/etcd-webhook/crds/"),
        "{notes}"
    );
    let without = render(&["--set", "certManager.enabled=false"]);
    assert!(
        without.contains(
            "kubectl annotate crd etcdclusters.etcd.example.com cert-manager.io/inject-ca-from-"
        ),
        "without cert-manager, NOTES say how to drop the CRD's inject annotation"
    );
    for line in notes.lines() {
        assert!(!line.contains("<<"), "a heredoc in NOTES: {line}");
        if line.trim_start().starts_with("kubectl") || line.trim_start().starts_with("printf") {
            let out = Command::new("bash")
                .args(["-n", "-c", line.trim()])
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{line}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// values.schema.json refuses unknown keys and out-of-range values, and the chart refuses the
/// combinations a schema cannot express, each with a message saying what to do.
#[test]
fn helm_refuses_values_it_cannot_honour() {
    let render = |set: &str| {
        Command::new(common::k8s_tools().join("helm"))
            .args([
                "template",
                "x",
                "charts/etcd-webhook",
                "--namespace",
                "etcd-system",
                "--set",
                set,
            ])
            .current_dir(root())
            .output()
            .unwrap()
    };
    for (set, says) in [
        (
            "replicaCount=1",
            "additional properties 'replicaCount' not allowed",
        ),
        (
            "webhook.failurePolicy=fail",
            "value must be one of 'Fail', 'Ignore'",
        ),
        ("webhook.timeoutSeconds=60", "maximum: got 60, want 30"),
        ("server.logFormat=yaml", "value must be one of"),
        ("certManager.duration=1y", "does not match pattern"),
        (
            "podDisruptionBudget.minAvailable=5",
            "podDisruptionBudget.minAvailable (5) must be below replicas (2)",
        ),
        (
            "replicas=1",
            "With replicas: 1 set podDisruptionBudget.minAvailable: 0",
        ),
        (
            "controller.leaderElection=false",
            "would run 2 reconcile loops against the same EtcdClusters",
        ),
    ] {
        let out = render(set);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} rendered");
        assert!(stderr.contains(says), "{set}: {stderr}");
    }
    // The safe forms of the same settings render.
    for set in [
        "replicas=1,podDisruptionBudget.minAvailable=0",
        "replicas=1,podDisruptionBudget.minAvailable=0,controller.leaderElection=false",
        "controller.enabled=false,controller.leaderElection=false",
    ] {
        let out = render(set);
        assert!(
            out.status.success(),
            "{set}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The NetworkPolicy, turned on with nothing else set, admits the apiserver from IPv4 and IPv6
/// addresses (it admitted only 0.0.0.0/0).
#[test]
fn network_policy_defaults_admit_both_address_families() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "networkPolicy:\n  enabled: true\n").unwrap();
    let install = helm(Some(values.to_str().unwrap()));
    let np: NetworkPolicy = install.one("NetworkPolicy");
    let cidrs: Vec<String> = np
        .spec
        .unwrap()
        .ingress
        .unwrap()
        .iter()
        .flat_map(|r| r.from.clone().unwrap_or_default())
        .filter_map(|peer| peer.ip_block.map(|b| b.cidr))
        .collect();
    assert_eq!(cidrs, ["0.0.0.0/0", "::/0"]);
}

/// The README's install with `kustomize edit set image` (what it writes into
/// config/manager/kustomization.yaml): the Deployment runs the user's image, and the loop,
/// given no `--backup-image`, finds that image on its own Pod (made from the rendered
/// template) and gives it to the backup CronJob, the final-snapshot Job and the restore Jobs.
/// Before, the Jobs kept the compiled-in image, which is not published.
#[test]
fn kustomize_edit_set_image_reaches_every_job() {
    let user_image = "registry.example.com/etcd-webhook:0.1.0";
    let dir = tempfile::tempdir().unwrap();
    let copy = Command::new("cp")
        .arg("-r")
        .arg(root().join("config"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copy.success());
    let manager = dir.path().join("config/manager/kustomization.yaml");
    let mut k = std::fs::read_to_string(&manager).unwrap();
    k.push_str(
        "images:\n- name: ghcr.io/example/etcd-webhook\n  newName: registry.example.com/etcd-webhook\n  newTag: 0.1.0\n",
    );
    std::fs::write(&manager, k).unwrap();
    let rendered = tool(
        "kubectl",
        &[
            "kustomize",
            dir.path().join("config/default").to_str().unwrap(),
        ],
    );
    let install = Install {
        name: "kustomize with an image set".to_owned(),
        docs: documents(&rendered),
    };
    let deploy: Deployment = install.one("Deployment");
    let template = deploy.spec.template;
    let args = serve_args(&install);
    assert!(
        arg(&args, "--backup-image").is_none(),
        "the kustomize install leaves --backup-image out: {args:?}"
    );
    // The Pod the ReplicaSet makes from the template (a name, the same spec).
    let pod = k8s_openapi::api::core::v1::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("etcd-webhook-5d8f7c9b4-x2x9q".to_owned()),
            namespace: Some(NS.to_owned()),
            ..template.metadata.unwrap_or_default()
        },
        spec: template.spec,
        ..Default::default()
    };
    let image = controller::lookups::own_image::of_pod(&pod).unwrap();
    assert_eq!(image, user_image);
    let opts = controller::render::RenderOptions {
        backup_image: image,
        ..Default::default()
    };
    let ec: api::v1::EtcdCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "first", "namespace": "default", "uid": "6a3c1f9e-0000-4000-8000-000000000009"},
        "spec": {"size": 3, "version": "v3.6.4", "storageSize": "1Gi",
                 "backup": {"enabled": true, "schedule": "0 */6 * * *", "retention": 7,
                            "destination": "s3://bucket/etcd"}},
    }))
    .unwrap();
    let target = controller::render::backup_target(&ec).unwrap().unwrap();
    let images = |spec: &PodSpec| -> Vec<String> {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| c.command.as_deref() == Some(&["/etcd-webhook".to_owned()][..]))
            .map(|c| c.image.clone().unwrap())
            .collect()
    };
    let cron = controller::render::backup_cron_job(&ec, &target, &opts);
    let cron_pod = cron.spec.job_template.spec.unwrap().template.spec.unwrap();
    let final_job = controller::render::final_snapshot_job(&ec, &target, &opts);
    let final_pod = final_job.spec.unwrap().template.spec.unwrap();
    let restore = controller::render::restore_job(
        &ec,
        0,
        api::SnapshotSource::S3("s3://bucket/etcd/first.db"),
        None,
        &opts,
    );
    let restore_pod = restore.spec.unwrap().template.spec.unwrap();
    for (what, pod, runs) in [
        ("backup CronJob", &cron_pod, 1),
        ("final-snapshot Job", &final_pod, 1),
        // fetch-snapshot, then place-restored.
        ("restore Job", &restore_pod, 2),
    ] {
        assert_eq!(images(pod), vec![user_image.to_owned(); runs], "{what}");
    }
}
