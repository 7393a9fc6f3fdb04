//! End-to-end tests against a real control plane: etcd, kube-apiserver and kube-controller-manager
//! built from Go modules (tests/controlplane), with the product installed as shipped (install.rs).
//!
//! One cluster serves every scenario but those that need a cluster of their own (OWN_CLUSTER:
//! they start from another install), so this target has its own runner (harness = false): the
//! scenarios run in order, each caught on panic; every process is stopped by PID at the end, after
//! success, failure or panic; the components' logs are printed for a failure. Arguments as
//! libtest's (`args`: filters, `--exact`, `--skip`, `--list`; an unknown flag is refused); with
//! no scenario left, no cluster starts.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod args;
mod bench;
mod case_study;
mod chart;
mod cluster;
mod install;
mod lifecycle;
mod node;
mod node_members;
mod node_quorum;
mod pods;
mod reconcile;
mod rotation;
mod scale;
mod storage;
mod traces;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

type Scenario = (&'static str, fn(&install::Env));
/// A scenario that starts from a bare control plane and installs what it needs itself.
type OwnScenario = (&'static str, fn(cluster::ControlPlane));

/// Each on a control plane of its own, after the shared one is stopped.
const OWN_CLUSTER: &[OwnScenario] = &[
    (
        "retiring_old_versions_after_storage_migration",
        storage::retiring_old_versions,
    ),
    (
        "helm_chart_installed_for_real",
        chart::helm_chart_installed_for_real,
    ),
    (
        "many_clusters_settle_without_throttling",
        scale::many_clusters_settle_without_throttling,
    ),
    (
        "one_apply_is_one_trace_through_the_webhook",
        traces::one_apply_is_one_trace_through_the_webhook,
    ),
    (
        "membership_on_a_real_node",
        node_members::membership_on_a_real_node,
    ),
    (
        "quorum_loss_on_a_real_node",
        node_quorum::quorum_loss_on_a_real_node,
    ),
    (
        "case_study_on_a_real_node",
        case_study::case_study_on_a_real_node,
    ),
    // Last: in CI its control plane is built in the background while the suite runs (.ci/run).
    (
        "helm_chart_installed_on_the_oldest_kubernetes",
        chart::helm_chart_installed_on_the_oldest_kubernetes,
    ),
];

/// Own-cluster scenarios that run on the real node (node.rs): their control plane is started
/// for it (`cluster::Kind::ForNode`).
const ON_NODE: &[&str] = &[
    "membership_on_a_real_node",
    "quorum_loss_on_a_real_node",
    "case_study_on_a_real_node",
];

/// Own-cluster scenarios on the oldest Kubernetes the chart claims (`cluster::Kind::Oldest`).
const OLDEST: &[&str] = &["helm_chart_installed_on_the_oldest_kubernetes"];

/// Own-cluster scenarios whose control plane sends traces (`ControlPlane::start_with`).
const TRACED: &[&str] = &["one_apply_is_one_trace_through_the_webhook"];

/// In order: the leader and outage scenarios replace the serving replica, so they come last.
const SCENARIOS: &[Scenario] = &[
    (
        "crd_is_established_with_the_schema",
        admission::crd_is_established_with_the_schema,
    ),
    (
        "the_served_certificate_is_what_the_apiserver_trusts",
        lifecycle::the_served_certificate_is_what_the_apiserver_trusts,
    ),
    (
        "samples_round_trip_through_every_version",
        admission::samples_round_trip_through_every_version,
    ),
    ("denials_reach_the_user", admission::denials_reach_the_user),
    (
        "cel_rules_agree_with_the_webhook",
        admission::cel_rules_agree_with_the_webhook,
    ),
    (
        "list_of_200_in_an_old_version",
        admission::list_of_200_in_an_old_version,
    ),
    (
        "the_loop_creates_and_deletes_the_children",
        reconcile::the_loop_creates_and_deletes_the_children,
    ),
    (
        "foreground_deletion_waits_for_the_children",
        reconcile::foreground_deletion_waits_for_the_children,
    ),
    (
        "namespace_deletion_keeps_the_claims_until_released",
        reconcile::namespace_deletion_keeps_the_claims_until_released,
    ),
    (
        "a_tls_cluster_gets_its_certificates_from_cert_manager",
        reconcile::a_tls_cluster_gets_its_certificates_from_cert_manager,
    ),
    (
        "storage_in_tebibytes_settles_and_grows",
        reconcile::storage_in_tebibytes_settles_and_grows,
    ),
    (
        "an_invalid_stored_cluster_can_still_be_edited_and_deleted",
        admission::an_invalid_stored_cluster_can_still_be_edited_and_deleted,
    ),
    (
        "storage_classes_are_filled_in_and_warned_about",
        admission::storage_classes_are_filled_in_and_warned_about,
    ),
    (
        "a_cabundle_mismatch_is_reported_until_cainjector_repairs_it",
        lifecycle::a_cabundle_mismatch_is_reported_until_cainjector_repairs_it,
    ),
    (
        "leaf_renewal_under_load_drops_nothing",
        rotation::leaf_renewal_under_load_drops_nothing,
    ),
    (
        "leaf_renewal_under_load_with_cert_secret",
        rotation::leaf_renewal_under_load_with_cert_secret,
    ),
    ("ca_rotation_under_load", rotation::ca_rotation_under_load),
    (
        "helm_chart_dry_runs_on_the_real_api",
        lifecycle::helm_chart_dry_runs_on_the_real_api,
    ),
    (
        "leader_election_on_real_leases",
        reconcile::leader_election_on_real_leases,
    ),
    (
        "webhook_down_fails_closed_and_recovers",
        lifecycle::webhook_down_fails_closed_and_recovers,
    ),
];

fn main() {
    let given: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&given) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if args.bench_apiserver {
        bench_apiserver();
        return;
    }
    let list = args.list;
    let wanted = |name: &str| args.wanted(name);
    let chosen: Vec<&Scenario> = SCENARIOS.iter().filter(|(name, _)| wanted(name)).collect();
    let own: Vec<&OwnScenario> = OWN_CLUSTER
        .iter()
        .filter(|(name, _)| wanted(name))
        .collect();
    if list {
        for name in chosen.iter().map(|s| s.0).chain(own.iter().map(|s| s.0)) {
            println!("{name}: test");
        }
        return;
    }
    let total_chosen = chosen.len() + own.len();
    let filtered_out = SCENARIOS.len() + OWN_CLUSTER.len() - total_chosen;
    println!("\nrunning {total_chosen} tests");
    if total_chosen == 0 {
        println!(
            "\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {filtered_out} filtered out; finished in 0.00s\n"
        );
        return;
    }
    common::install_crypto();
    let start = Instant::now();
    let (mut passed, mut failed) = (0, Vec::new());
    if !chosen.is_empty() {
        shared_cluster(&chosen, start, &mut passed, &mut failed);
    }
    for (name, scenario) in own {
        let t = Instant::now();
        let mut logs = None;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let kind = if ON_NODE.contains(name) {
                cluster::Kind::ForNode
            } else if TRACED.contains(name) {
                cluster::Kind::Traced
            } else if OLDEST.contains(name) {
                cluster::Kind::Oldest
            } else {
                cluster::Kind::Plain
            };
            let cp = cluster::ControlPlane::start_kind(kind);
            logs = Some(cp.logs.clone());
            scenario(cp)
        }));
        let secs = t.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({secs:.1} s)");
            }
            Err(_) => {
                if let Some(logs) = &logs {
                    cluster::print_logs(logs, 60);
                }
                failed.push(*name);
                println!("test {name} ... FAILED ({secs:.1} s)");
            }
        }
    }
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {filtered_out} filtered out; finished in {total:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(101);
    }
}

/// The scenarios that share one cluster with the product installed as shipped.
fn shared_cluster(
    chosen: &[&Scenario],
    start: Instant,
    passed: &mut usize,
    failed: &mut Vec<&'static str>,
) {
    let setup = catch_unwind(|| {
        let cp = cluster::ControlPlane::start();
        println!(
            "control plane up in {:.1} s (logs: {})",
            start.elapsed().as_secs_f64(),
            cp.logs.display()
        );
        cp
    });
    let Ok(cp) = setup else {
        println!("the control plane did not start (see above)");
        failed.extend(chosen.iter().map(|s| s.0));
        return;
    };
    let logs = cp.logs.clone();
    let install_start = Instant::now();
    let Ok(mut env) = catch_unwind(AssertUnwindSafe(|| install::Env::install(cp))) else {
        // The control plane was dropped (stopped) while unwinding; its logs stay.
        cluster::print_logs(&logs, 60);
        println!("the install failed (see above)");
        failed.extend(chosen.iter().map(|s| s.0));
        return;
    };
    println!(
        "installed in {:.1} s: config/default applied, cert-manager's chain issued, caBundles injected, the first EtcdCluster answered by the webhook {:.1} s after the apply began",
        start.elapsed().as_secs_f64(),
        install_start.elapsed().as_secs_f64()
    );
    let failed_before = failed.len();
    for (name, scenario) in chosen {
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| scenario(&env)));
        let secs = t.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                *passed += 1;
                println!("test {name} ... ok ({secs:.1} s)");
            }
            Err(_) => {
                failed.push(*name);
                println!("test {name} ... FAILED ({secs:.1} s)");
            }
        }
    }
    env.save_webhook_logs();
    if failed.len() > failed_before {
        env.cp.print_logs(60);
        env.cp.keep = true;
    }
}

/// `--bench-apiserver`: the apiserver-side benchmark (bench.rs), on a traced control plane of
/// its own; no scenario runs. Exits 1 when it cannot measure (a failed create, a misrouted call).
fn bench_apiserver() {
    common::install_crypto();
    let mut logs = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let cp = cluster::ControlPlane::start_with(true);
        logs = Some(cp.logs.clone());
        bench::apiserver_side(cp)
    }));
    if outcome.is_err() {
        if let Some(logs) = &logs {
            cluster::print_logs(logs, 60);
        }
        std::process::exit(1);
    }
}
