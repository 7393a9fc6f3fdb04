//! Issue 31, the monitoring half: the alerts (config/prometheus/rules.yaml) checked and
//! unit-tested by the real promtool (built from Prometheus' Go modules with the control plane,
//! tests/controlplane/build.sh), the copies the chart and config/ ship checked against them, and
//! every PromQL expression of the alerts and the Grafana dashboard parsed and checked to name only
//! metrics the running binary (server and loop) exposes.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use etcd_webhook::testing::FakeApi;
use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::{Value, json};

use common::{Server, Target, root};

const RULES: &str = "config/prometheus/rules.yaml";
const RULE_TESTS: &str = "config/prometheus/rules.test.yaml";
const DASHBOARD: &str = "config/grafana/etcd-webhook.json";

/// promtool, built beside the control plane's binary by the same `go build`.
fn promtool() -> PathBuf {
    common::control_plane().with_file_name("promtool")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(s: &str) -> Value {
    serde_yaml_ng::from_str(s).unwrap()
}

fn tool(name: &str, args: &[&str]) -> String {
    let out = run(Command::new(common::k8s_tools().join(name))
        .args(args)
        .current_dir(root()));
    assert!(out.status.success(), "{name} {args:?}: {}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn documents(s: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(s)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The chart as `helm template` renders it into etcd-system, with `extra` arguments.
fn helm_template(extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "etcd-webhook",
        "charts/etcd-webhook",
        "-n",
        "etcd-system",
    ];
    args.extend_from_slice(extra);
    documents(&tool("helm", &args))
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

#[test]
fn the_alerts_pass_promtool_check_and_their_unit_tests() {
    let promtool = promtool();
    let out = run(Command::new(&promtool)
        .args(["check", "rules", RULES])
        .current_dir(root()));
    assert!(out.status.success(), "promtool check rules: {}", text(&out));
    assert!(
        text(&out).contains("SUCCESS: 16 rules found"),
        "{}",
        text(&out)
    );

    let out = run(Command::new(&promtool)
        .args(["test", "rules", RULE_TESTS])
        .current_dir(root()));
    assert!(out.status.success(), "promtool test rules: {}", text(&out));
    assert!(text(&out).contains("SUCCESS"), "{}", text(&out));

    // The unit tests hold the rules to their words: a threshold moved (7 days to 1) fails them.
    let tmp = tempfile::tempdir().unwrap();
    let rules = read(RULES);
    assert!(rules.contains("< 7 * 86400"));
    std::fs::write(
        tmp.path().join("rules.yaml"),
        rules.replace("< 7 * 86400", "< 1 * 86400"),
    )
    .unwrap();
    std::fs::write(tmp.path().join("rules.test.yaml"), read(RULE_TESTS)).unwrap();
    let out = run(Command::new(&promtool)
        .args(["test", "rules", "rules.test.yaml"])
        .current_dir(tmp.path()));
    assert!(
        !out.status.success(),
        "a moved threshold passed: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("alertname: EtcdWebhookCertificateExpiresSoon"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_chart_and_config_ship_the_tested_alerts_and_dashboard() {
    let rules = yaml(&read(RULES));
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    // The chart's copies, byte for byte (Helm reads files only from inside the chart).
    assert_eq!(
        read("charts/etcd-webhook/files/prometheus-rules.yaml"),
        read(RULES),
        "charts/etcd-webhook/files/prometheus-rules.yaml is a copy of {RULES}"
    );
    assert_eq!(
        read("charts/etcd-webhook/files/grafana-dashboard.json"),
        read(DASHBOARD),
        "charts/etcd-webhook/files/grafana-dashboard.json is a copy of {DASHBOARD}"
    );

    // config/: the PrometheusRule's spec is rules.yaml; the dashboard's ConfigMap holds the JSON.
    let docs = documents(&tool("kubectl", &["kustomize", "config/prometheus"]));
    assert_eq!(one(&docs, "PrometheusRule")["spec"], rules);
    let config_sm = one(&docs, "ServiceMonitor").clone();
    let config_pm = one(&docs, "PodMonitor").clone();
    let docs = documents(&tool("kubectl", &["kustomize", "config/grafana"]));
    let cm = one(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(cm["data"]["etcd-webhook.json"].as_str().unwrap()).unwrap();
    assert_eq!(json, dashboard);

    // The chart with everything on, and with its defaults (everything off).
    let docs = helm_template(&["-f", "charts/etcd-webhook/ci/monitoring-values.yaml"]);
    let rule = one(&docs, "PrometheusRule");
    assert_eq!(rule["spec"], rules);
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "etcd-webhook-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(cm["data"]["etcd-webhook.json"].as_str().unwrap()).unwrap();
    assert_eq!(json, dashboard);
    // Tracing: the flag and the OTEL_* variables reach the container.
    let container = &one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--otlp-endpoint=http://otel-collector.monitoring:4318"),
        "{args:?}"
    );
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "OTEL_TRACES_SAMPLER" && e["value"] == "parentbased_traceidratio"),
        "{env:?}"
    );
    assert!(
        env.iter().any(|e| e["name"] == "POD_NAME"),
        "the token's variables stay: {env:?}"
    );
    let defaults = helm_template(&[]);
    for kind in ["PrometheusRule", "PodMonitor", "ServiceMonitor"] {
        assert!(
            !defaults.iter().any(|d| d["kind"] == kind),
            "{kind} is off by default"
        );
    }

    // The ServiceMonitors select the webhook's Service and its `metrics` port, honouring the
    // per-cluster labels; the PodMonitors select the member pods the loop renders, by the port
    // etcd serves its metrics on.
    let service = one(&docs, "Service");
    let config_service = documents(&tool("kubectl", &["kustomize", "config/default"]))
        .into_iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "etcd-webhook")
        .unwrap();
    let members = etcd_webhook::controller::render::stateful_set(
        &serde_json::from_value(json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "etcd", "namespace": "prod", "uid": "11111111-2222-4333-8444-555555555555"},
            "spec": {"size": 3, "version": "v3.5.10", "storageSize": "1Gi"}
        }))
        .unwrap(),
        3,
        &Default::default(),
    );
    let template = members.spec.template;
    let pod_labels = serde_json::to_value(template.metadata.unwrap().labels.unwrap()).unwrap();
    let pod_ports: Vec<String> = template.spec.unwrap().containers[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.clone())
        .collect();
    for (sm, svc) in [
        (one(&docs, "ServiceMonitor"), service),
        (&config_sm, &config_service),
    ] {
        for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                &svc["metadata"]["labels"][k], v,
                "ServiceMonitor selects {k}"
            );
        }
        let endpoint = &sm["spec"]["endpoints"][0];
        assert_eq!(endpoint["honorLabels"], true);
        let port = endpoint["port"].as_str().unwrap();
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == port),
            "the Service has a port named {port}"
        );
    }
    for pm in [one(&docs, "PodMonitor"), &config_pm] {
        for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&pod_labels[k], v, "PodMonitor selects {k}: {pod_labels}");
        }
        let port = pm["spec"]["podMetricsEndpoints"][0]["port"]
            .as_str()
            .unwrap();
        assert!(
            pod_ports.iter().any(|p| p == port),
            "members have a port {port}: {pod_ports:?}"
        );
    }
}

/// Metric names a PromQL expression reads.
fn names(expr: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            let vs = match e {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            let name = vs.name.clone().or_else(|| {
                vs.matchers
                    .matchers
                    .iter()
                    .find(|m| m.name == "__name__")
                    .map(|m| m.value.clone())
            });
            match name {
                Some(n) => {
                    self.0.insert(n);
                    Ok(true)
                }
                None => Err("a selector without a metric name".to_owned()),
            }
        }
    }
    let ast = parser::parse(expr)?;
    let mut v = Names(BTreeSet::new());
    walk_expr(&mut v, &ast)?;
    Ok(v.0)
}

/// The dashboard's variables as a query would see them: every `$var` matches anything and
/// `$__rate_interval` is five minutes.
fn substitute(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 1..];
        let (braced, tail) = match tail.strip_prefix('{') {
            Some(t) => (true, t),
            None => (false, tail),
        };
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        out.push_str(if name == "__rate_interval" {
            "5m"
        } else {
            ".*"
        });
        rest = &tail[end + usize::from(braced)..];
    }
    out.push_str(rest);
    out
}

/// Every PromQL expression of a dashboard: panel targets (rows' panels included) and the
/// metrics of `label_values(...)` variables, with where each comes from.
fn dashboard_expressions(d: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            if p["type"] == "row" {
                panels(&p["panels"], out);
                continue;
            }
            let title = p["title"].as_str().unwrap_or_default();
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "panel {title:?} has no query");
            for t in targets {
                let expr = t["expr"].as_str().expect("a PromQL target");
                out.push((format!("panel {title:?}"), expr.to_owned()));
            }
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().unwrap();
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|s| s.rsplit_once(','))
            .map(|(m, _)| m)
            .unwrap_or_else(|| panic!("variable {}: {q}", v["name"]));
        out.push((format!("variable {}", v["name"]), inner.to_owned()));
    }
    out
}

/// Every alert's expression.
fn rule_expressions(rules: &Value) -> Vec<(String, String)> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| {
            (
                format!("alert {}", r["alert"].as_str().unwrap()),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The families a running exposition lists (those with a sample) and their series names.
fn exposed(metrics: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            out.insert(format!("{name}{s}"));
        }
    }
    out
}

/// The binary's `/metrics` with its loop running against the in-memory API server and one
/// cluster with backups on: the per-cluster backup gauges have samples, every other family its
/// `# TYPE` line.
fn running_metrics() -> String {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = FakeApi::default();
    api.insert(
        "/apis/etcd.example.com/v1/namespaces/prod/etcdclusters/etcd",
        json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "etcd", "namespace": "prod", "uid": "11111111-2222-4333-8444-555555555555"},
            "spec": {"size": 3, "version": "v3.5.10", "storageSize": "1Gi",
                     "backup": {"enabled": true, "schedule": "0 */6 * * *"}}}),
    );
    let port = rt.block_on(api.serve_http()).port();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("kubeconfig");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: fake\n  user:\n    token: test\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    let server = Server::start_with_env(
        &["--controller", "on", "--shutdown-delay", "0s"],
        &[("KUBECONFIG", config.to_str().unwrap())],
    );
    let labels = r#"namespace="prod",name="etcd""#;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server
        .health_get("/metrics")
        .1
        .contains("etcd_webhook_backup_interval_seconds{")
    {
        assert!(
            Instant::now() < deadline,
            "no backup interval exported; log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The schedule's longest gap, and since when the CronJob (made by this pass) exists.
    assert_eq!(
        server.metric("etcd_webhook_backup_interval_seconds", labels),
        21600.0
    );
    let cron = api
        .get("/apis/batch/v1/namespaces/prod/cronjobs/etcd-backup")
        .expect("the backup CronJob");
    let created = cron["metadata"]["creationTimestamp"].as_str().unwrap();
    let created: k8s_openapi::jiff::Timestamp = created.parse().unwrap();
    assert_eq!(
        server.metric(
            "etcd_webhook_backup_scheduled_since_timestamp_seconds",
            labels
        ),
        created.as_second() as f64
    );
    // One review through /validate: the webhook's families get their samples too.
    let (code, _, _) = rt.block_on(common::post(
        &common::apiserver_client(&server.ca()),
        &server.url("/validate"),
        common::fixture("validate-v1-create-valid.json"),
    ));
    assert_eq!(code, 200);
    let metrics = server.health_get("/metrics").1;
    drop(server);
    rt.shutdown_timeout(Duration::from_secs(5));
    metrics
}

#[test]
fn every_expression_parses_and_names_only_metrics_the_binary_exposes() {
    // What a family can hold, sample or not: the running exposition leaves out a family until
    // its first sample (a cluster's members are counted once its etcd answers), so the names
    // come from the registry, and the running server and loop show they are the binary's.
    let exposed = etcd_webhook::metrics::Metrics::new().series_names();
    let metrics = running_metrics();
    let running = self::exposed(&metrics);
    assert!(
        running.is_subset(&exposed),
        "the binary exposes families the registry does not list: {:?}",
        running.difference(&exposed).collect::<Vec<_>>()
    );
    for n in [
        "etcd_webhook_backup_interval_seconds",
        "etcd_webhook_backup_scheduled_since_timestamp_seconds",
        "etcd_webhook_controller_leader",
        "etcd_webhook_admission_requests_total",
    ] {
        assert!(
            running.contains(n),
            "{n} is in the running exposition: {metrics}"
        );
    }
    let rules = yaml(&read(RULES));
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut all = rule_expressions(&rules);
    let from_dashboard = dashboard_expressions(&dashboard);
    assert!(from_dashboard.len() >= 20, "{from_dashboard:?}");
    all.extend(
        from_dashboard
            .iter()
            .map(|(w, e)| (w.clone(), substitute(e))),
    );
    let mut named = BTreeSet::new();
    for (what, expr) in &all {
        let names = names(expr).unwrap_or_else(|e| panic!("{what}: {expr}: {e}"));
        assert!(!names.is_empty(), "{what} reads no metric: {expr}");
        for n in &names {
            assert!(
                exposed.contains(n),
                "{what} reads {n}, which the binary does not expose: {expr}"
            );
        }
        named.extend(names);
    }
    // The per-cluster families the issue asks for are all read somewhere.
    for family in [
        "etcd_webhook_cluster_members",
        "etcd_webhook_cluster_leader_changes_total",
        "etcd_webhook_member_db_size_bytes",
        "etcd_webhook_backup_last_success_timestamp_seconds",
        "etcd_webhook_nospace_alarm",
    ] {
        assert!(named.contains(family), "nothing reads {family}");
    }

    // The real parser agrees: each dashboard expression as a recording rule passes promtool.
    let tmp = tempfile::tempdir().unwrap();
    let recorded: Vec<Value> = from_dashboard
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("dashboard:query{i}"), "expr": substitute(e)}))
        .collect();
    let file = tmp.path().join("dashboard-rules.yaml");
    std::fs::write(
        &file,
        serde_yaml_ng::to_string(&json!({"groups": [{"name": "dashboard", "rules": recorded}]}))
            .unwrap(),
    )
    .unwrap();
    let out = run(Command::new(promtool()).args(["check", "rules"]).arg(&file));
    assert!(out.status.success(), "promtool: {}", text(&out));
}

/// The per-cluster series the loop exports for a cluster of 3 whose member etcd-2 does not
/// answer and whose etcd raised NOSPACE: whole passes (`controller::reconcile`) against the
/// in-memory API server and etcd, then the loop's own exposition.
fn series_of_a_sick_cluster() -> String {
    use etcd_webhook::controller::{Context, Settings, reconcile};
    use etcd_webhook::testing::FakeEtcd;
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = FakeApi::default();
        let path = "/apis/etcd.example.com/v1/namespaces/prod/etcdclusters/etcd";
        api.insert(
            path,
            json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                "metadata": {"name": "etcd", "namespace": "prod", "uid": "11111111-2222-4333-8444-555555555555"},
                "spec": {"size": 3, "version": "v3.6.17", "storageSize": "1Gi"}}),
        );
        let peers: Vec<String> = (0..3)
            .map(|i| format!("http://etcd-{i}.etcd.prod.svc:2380"))
            .collect();
        let etcd = Arc::new(FakeEtcd::running(&peers));
        let (caches, mut feed) = etcd_webhook::testing::feed::caches();
        let ctx = Arc::new(
            Context::new(
                api.client(),
                Settings::default(),
                Arc::new(etcd_webhook::metrics::Metrics::new()),
                caches,
            )
            .with_etcd(Box::new(etcd.clone())),
        );
        let pass = async |feed: &mut etcd_webhook::testing::feed::Feed| {
            feed.sync(&api);
            let ec = serde_json::from_value(api.get(path).unwrap()).unwrap();
            reconcile(Arc::new(ec), ctx.clone()).await.unwrap();
        };
        pass(&mut feed).await;
        api.set(
            "/apis/apps/v1/namespaces/prod/statefulsets/etcd",
            "/status",
            json!({"replicas": 3, "readyReplicas": 3}),
        );
        pass(&mut feed).await;
        etcd.set_unhealthy("etcd-2", true);
        etcd.raise_alarm("etcd-0", "NOSPACE");
        pass(&mut feed).await;
        pass(&mut feed).await;
        ctx.metrics.encode()
    })
}

/// The alerts on the series the loop itself exports (issue 45 item 4: a renamed label value,
/// e.g. the member state `unhealthy`, left every alert test green): the per-cluster series
/// of a cluster with a member down and NOSPACE raised, exactly as exported, are the input of a
/// promtool test of rules.yaml, which must find EtcdClusterNoSpace firing for that cluster at
/// once, EtcdClusterQuorumAtRisk after its 5 minutes (2 of 3 healthy: one more failure stops
/// writes), EtcdClusterMemberUnhealthy after its 10, and nothing else (not QuorumLost).
#[test]
fn the_cluster_alerts_fire_on_the_series_the_loop_exports() {
    let exported = series_of_a_sick_cluster();
    let series: Vec<(String, String)> = exported
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(r#"namespace="prod",name="etcd""#))
        .filter_map(|l| {
            let (s, v) = l.rsplit_once(' ')?;
            Some((s.to_owned(), v.to_owned()))
        })
        .collect();
    for family in [
        "etcd_webhook_cluster_members{",
        "etcd_webhook_nospace_alarm{",
    ] {
        assert!(
            series.iter().any(|(s, _)| s.starts_with(family)),
            "{family} exported: {exported}"
        );
    }
    let input: Vec<Value> = series
        .iter()
        .map(|(s, v)| json!({"series": s, "values": format!("{v}x30")}))
        .collect();
    let firing = |at: &str, alerts: &[&str]| {
        json!({"expr": "count by (alertname, namespace, name) (ALERTS{alertstate=\"firing\", namespace=\"prod\"})",
            "eval_time": at,
            "exp_samples": alerts.iter().map(|a| json!({
                "labels": format!("{{alertname=\"{a}\", name=\"etcd\", namespace=\"prod\"}}"),
                "value": 1})).collect::<Vec<_>>()})
    };
    let test = json!({
        "rule_files": [root().join(RULES).display().to_string()],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "promql_expr_test": [
                firing("4m", &["EtcdClusterNoSpace"]),
                firing("5m", &["EtcdClusterNoSpace", "EtcdClusterQuorumAtRisk"]),
                firing(
                    "15m",
                    &[
                        "EtcdClusterMemberUnhealthy",
                        "EtcdClusterNoSpace",
                        "EtcdClusterQuorumAtRisk",
                    ],
                ),
            ],
        }],
    });
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("exported.test.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&test).unwrap()).unwrap();
    let out = run(Command::new(promtool()).args(["test", "rules"]).arg(&file));
    assert!(
        out.status.success(),
        "promtool on the exported series: {}\nseries:\n{}",
        text(&out),
        series
            .iter()
            .map(|(s, v)| format!("{s} {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn dashboard_variables_are_substituted_the_way_grafana_would_fill_them() {
    assert_eq!(
        substitute(r#"rate(x{job=~"$job", name=~"${cluster}"}[$__rate_interval])"#),
        r#"rate(x{job=~".*", name=~".*"}[5m])"#
    );
    assert_eq!(
        names(r#"sum(rate(a_total[5m])) / on (x) b or {__name__="d"}"#).unwrap(),
        BTreeSet::from(["a_total".to_owned(), "b".to_owned(), "d".to_owned()])
    );
}
