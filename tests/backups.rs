//! Backups on real parts: three etcd v3.6.4 members in network namespaces of their own
//! (tests/common/members.rs), an S3-compatible server (gofakes3, built into the control-plane
//! binary: `controlplane s3`), and the backup Jobs' containers as the loop renders them, run as
//! processes: `/etcd-webhook backup` with the rendered arguments, in a pod's network namespace
//! of the same net (its hosts file names the members and the client Service), with the
//! credentials the Secret `NAME-backup-credentials` would give. The container's mounts are
//! folders here: its `--work-dir`, `--destination` (the backup claim) and `--report` (the
//! termination message file) are rewritten to them.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::members::{Net, Release, TestCa, writer};
use etcd_webhook::api::SnapshotSource;
use etcd_webhook::api::v1::{EtcdCluster, SnapshotRecord};
use etcd_webhook::backup::snapshot;
use etcd_webhook::controller::render::{self, BackupTarget, RenderOptions};
use k8s_openapi::api::core::v1::Container;
use serde_json::{Value, json};

const NAMESPACE: &str = "prod";
const ACCESS_KEY: &str = "backup-test-key";
const SECRET_KEY: &str = "backup-test-secret";
const BUCKET: &str = "backups";

fn cluster(name: &str, destination: Option<&str>, retention: i32) -> EtcdCluster {
    cluster_on(name, destination, retention, Release::V3_6_4)
}

fn cluster_on(
    name: &str,
    destination: Option<&str>,
    retention: i32,
    release: Release,
) -> EtcdCluster {
    serde_json::from_value(json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "6a3c1f9e-0000-4000-8000-00000000b4c7"},
        "spec": {"size": 3, "version": release.version(), "storageSize": "1Gi",
            "backup": {"enabled": true, "schedule": "0 * * * *", "retention": retention,
                "destination": destination}},
    }))
    .expect("an EtcdCluster")
}

/// The etcd container of the members.
fn member_container(ec: &EtcdCluster) -> Container {
    render::stateful_set(ec, 3, &RenderOptions::default())
        .spec
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .find(|c| c.name == "etcd")
        .unwrap()
}

/// The container of the scheduled backup Job (`final_job`: of the final snapshot Job).
fn job_container(ec: &EtcdCluster, final_job: bool) -> Container {
    let target = render::backup_target(ec).unwrap().unwrap();
    let opts = RenderOptions::default();
    let pod = if final_job {
        render::final_snapshot_job(ec, &target, &opts)
            .spec
            .unwrap()
            .template
    } else {
        render::backup_cron_job(ec, &target, &opts)
            .spec
            .job_template
            .spec
            .unwrap()
            .template
    };
    let spec = pod.spec.unwrap();
    assert_eq!(spec.containers.len(), 1, "one container, no shell step");
    spec.containers.into_iter().next().unwrap()
}

/// A formed cluster of three (pods 0-2) and a fourth namespace (pod 3, `NAME-job`) where the
/// S3 server and the Jobs' containers run.
struct Setup {
    net: Net,
    ec: EtcdCluster,
    s3: Option<std::process::Child>,
    s3_data: PathBuf,
    claim: PathBuf,
    runs: u32,
    /// The secret key the Jobs' containers sign with (the Secret NAME-backup-credentials').
    secret: &'static str,
}

const JOB: usize = 3;

impl Setup {
    fn new(name: &str, destination: Option<&str>, retention: i32) -> Setup {
        Setup::with(name, destination, retention, true)
    }

    /// The net, its S3 server stopped and its members not started when `start` is false.
    fn with(name: &str, destination: Option<&str>, retention: i32, start: bool) -> Setup {
        Setup::of(cluster(name, destination, retention), start, None)
    }

    /// The net of `ec`; a TLS cluster's Secrets issued by `ca` (the members and the Job mount
    /// them).
    fn of(ec: EtcdCluster, start: bool, ca: Option<&TestCa>) -> Setup {
        let name = ec.metadata.name.clone().unwrap();
        let names: Vec<String> = (0..3)
            .map(|i| format!("{name}-{i}"))
            .chain([format!("{name}-job")])
            .collect();
        let release = Release::of_image(&format!(":{}", ec.spec.version))
            .expect("a release the harness runs");
        let mut net = Net::new(NAMESPACE, &name, &names, release);
        if let Some(ca) = ca {
            net.secrets = ca.issue(&ec, net.tmp.path(), "");
        }
        net.config = render::bootstrap_config(&ec, 3, false).data.unwrap();
        let container = member_container(&ec);
        if start {
            for i in 0..3 {
                net.start(i, &container);
            }
            net.wait_ready(&container, Duration::from_secs(60));
        }
        let s3_data = net.tmp.path().join("s3.bolt");
        let claim = net.tmp.path().join("backup-claim");
        std::fs::create_dir_all(&claim).unwrap();
        let mut setup = Setup {
            net,
            ec,
            s3: None,
            s3_data,
            claim,
            runs: 0,
            secret: SECRET_KEY,
        };
        if start {
            setup.start_s3();
        }
        setup
    }

    /// The S3 server on the job namespace's loopback, port 9000, on its bolt file.
    fn start_s3(&mut self) {
        let program = common::control_plane();
        let log = std::fs::File::create(self.net.tmp.path().join("s3.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.net.pods[JOB].ns])
            .arg(program)
            .args(["s3", "--listen", "127.0.0.1:9000", "--bucket", BUCKET])
            .args([
                "--access-key",
                ACCESS_KEY,
                "--secret-key",
                SECRET_KEY,
                "--data",
            ])
            .arg(&self.s3_data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the S3 server");
        self.s3 = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.net.http(JOB, "GET", "http://127.0.0.1:9000/", None).0 == 0 {
            assert!(Instant::now() < deadline, "the S3 server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop_s3(&mut self) {
        if let Some(mut child) = self.s3.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs the rendered Job container once: (exit code, the termination message, stderr).
    fn run_job(&mut self, final_job: bool, key: &str) -> (i32, Value, String) {
        self.runs += 1;
        let container = job_container(&self.ec, final_job);
        assert_eq!(
            container.command.as_deref(),
            Some(&["/etcd-webhook".to_owned()][..])
        );
        let work = self.net.tmp.path().join(format!("work-{}", self.runs));
        std::fs::create_dir_all(&work).unwrap();
        let report = self.net.tmp.path().join(format!("report-{}", self.runs));
        let mut mounts: BTreeMap<String, PathBuf> = [
            ("/work".to_owned(), work.clone()),
            (render::BACKUP_MOUNT.to_owned(), self.claim.clone()),
            ("/dev/termination-log".to_owned(), report.clone()),
        ]
        .into();
        // A TLS cluster's client Secret, where the Job mounts it.
        if let Some(dir) = self.net.secrets.get("client-tls") {
            let volume = container
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == "client-tls")
                .expect("the Job mounts the client Secret");
            mounts.insert(volume.mount_path.clone(), dir.clone());
        }
        let args: Vec<String> = container
            .args
            .iter()
            .flatten()
            .map(|a| match a.split_once('=') {
                Some((flag, path)) if mounts.contains_key(path) => {
                    format!("{flag}={}", mounts[path].display())
                }
                _ => a.clone(),
            })
            .collect();
        // What the Secret NAME-backup-credentials gives through envFrom.
        let s3 = matches!(
            render::backup_target(&self.ec).unwrap().unwrap(),
            BackupTarget::S3(_)
        );
        if s3 {
            assert_eq!(
                container.env_from.as_ref().unwrap()[0]
                    .secret_ref
                    .as_ref()
                    .unwrap()
                    .name,
                format!(
                    "{}-backup-credentials",
                    self.ec.metadata.name.as_deref().unwrap()
                )
            );
        }
        let out = Command::new("ip")
            .args(["netns", "exec", &self.net.pods[JOB].ns])
            .arg(env!("CARGO_BIN_EXE_etcd-webhook"))
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("AWS_ACCESS_KEY_ID", key)
            .env("AWS_SECRET_ACCESS_KEY", self.secret)
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
            .stdin(Stdio::null())
            .output()
            .expect("run the backup container");
        let code = out.status.code().unwrap_or(-1);
        let message = std::fs::read_to_string(&report).unwrap_or_default();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let parsed = serde_json::from_str(&message)
            .unwrap_or_else(|e| panic!("report {message:?}: {e}\n{stderr}"));
        if code == 0 {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(stdout.trim(), message.trim(), "the same line on stdout");
        }
        (code, parsed, stderr)
    }

    /// Runs `container` (a Job's) once in the job namespace as `/etcd-webhook`, or as `etcdutl`
    /// of the release its image names, with the folders `mounts` in place of its mount paths:
    /// (exit code, termination message, stderr).
    fn run_container(
        &self,
        container: &Container,
        mounts: &[(&str, &Path)],
        report: &Path,
    ) -> (i32, String, String) {
        common::members::run_job_container(
            &self.net.pods[JOB].ns,
            container,
            mounts,
            report,
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", self.secret),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ],
        )
    }

    /// Plays the verification Job of `record` as the kubelet runs it: the init containers in
    /// turn, the native sidecar (restartPolicy Always: the etcd of the release its image names)
    /// started and left running, then `verify-snapshot`, then the sidecar stopped. The step
    /// that ended it, its exit code and its termination message.
    fn play_verification(&mut self, record: &SnapshotRecord) -> (String, i32, String) {
        self.runs += 1;
        let job = render::verify_job(&self.ec, record, &RenderOptions::default())
            .expect("a verification Job for a record with a hash");
        let pod = job.spec.unwrap().template.spec.unwrap();
        let sandbox = self.net.tmp.path().join(format!("verify-{}", self.runs));
        std::fs::create_dir_all(&sandbox).unwrap();
        let mounts = [("/verify", sandbox.as_path())];
        let mut sidecar: Option<std::process::Child> = None;
        let mut ended = None;
        for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
            if c.restart_policy.as_deref() == Some("Always") {
                let (program, before) = c
                    .image
                    .as_deref()
                    .and_then(Release::of_image)
                    .expect("an etcd image of a release the harness runs")
                    .program();
                let args: Vec<String> = c
                    .args
                    .iter()
                    .flatten()
                    .map(|a| a.replace("/verify", &sandbox.display().to_string()))
                    .collect();
                let log = std::fs::File::create(sandbox.join("etcd.log")).unwrap();
                sidecar = Some(
                    Command::new("ip")
                        .args(["netns", "exec", &self.net.pods[JOB].ns])
                        .arg(program)
                        .args(before)
                        .args(&args)
                        .stdin(Stdio::null())
                        .stdout(log.try_clone().unwrap())
                        .stderr(log)
                        .spawn()
                        .expect("start the sandbox's etcd"),
                );
                continue;
            }
            let report = sandbox.join(format!("{}-report", c.name));
            let (code, message, out) = self.run_container(c, &mounts, &report);
            if code != 0 || c.name == "verify" {
                eprintln!("{}: exit {code}: {message}\n{out}", c.name);
                ended = Some((c.name.clone(), code, message));
                break;
            }
        }
        if let Some(mut etcd) = sidecar {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        ended.expect("a step ended the pod")
    }

    /// A request to the bucket by curl, signed (SigV4) with the test's key; `put` uploads it.
    fn s3(&self, query: &str, put: Option<&Path>) -> Vec<u8> {
        let url = format!("http://127.0.0.1:9000/{BUCKET}{query}");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.net.pods[JOB].ns, "curl", "-sf"])
            // S3 wants the payload's hash said (curl 7.88 does not add it itself).
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"));
        if let Some(file) = put {
            cmd.arg("-T").arg(file);
        }
        let out = cmd.arg(&url).output().unwrap();
        assert!(out.status.success(), "{url}: {:?}", out.status);
        out.stdout
    }

    /// Puts an object into the bucket.
    fn s3_put(&self, key: &str, file: &Path) {
        self.s3(&format!("/{key}"), Some(file));
    }

    /// An object of the bucket.
    fn s3_get(&self, key: &str) -> Vec<u8> {
        self.s3(&format!("/{key}"), None)
    }

    /// The object keys of the bucket (ListObjectsV2).
    fn s3_list(&self) -> Vec<String> {
        let out = self.s3("?list-type=2", None);
        let xml = String::from_utf8_lossy(&out).into_owned();
        let mut keys: Vec<String> = xml
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect();
        keys.sort();
        keys
    }

    /// The members whose etcd says it streamed a snapshot to a client since it started (its
    /// own log, `v3rpc/maintenance.go`: "sending database snapshot to client"): who served
    /// the Job, whatever the Job reports.
    fn snapshot_senders(&self) -> Vec<String> {
        (0..JOB)
            .filter(|&i| {
                self.net
                    .run_log(i)
                    .contains("sending database snapshot to client")
            })
            .map(|i| self.net.pods[i].name.clone())
            .collect()
    }

    fn leader_name(&self) -> String {
        let status = self.net.v3(0, "maintenance/status", json!({})).unwrap();
        let leader = status["leader"].as_str().unwrap().to_owned();
        let list = self
            .net
            .v3(0, "cluster/member/list", json!({"linearizable": true}))
            .unwrap();
        list["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["ID"].as_str() == Some(leader.as_str()))
            .unwrap()["name"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop_s3();
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    snapshot::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn object_key(uri: &str) -> String {
    uri.strip_prefix(&format!("s3://{BUCKET}/"))
        .unwrap()
        .to_owned()
}

/// A scheduled backup with writes running: taken from a follower (never the leader), checked,
/// uploaded to the S3 server, read back; the report's size and SHA-256 are the object's, the
/// snapshot's integrity hash holds, and its revision is at least the revision of every key
/// written before the backup began.
#[test]
fn a_scheduled_backup_comes_from_a_follower_and_is_the_object_in_the_bucket() {
    let mut s = Setup::new("bk", Some("s3://backups/prod/"), 3);
    for i in 0..200 {
        assert!(s.net.put(0, &format!("/pre/{i}"), "x"));
    }
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(
        s.net.pods[0].ns.clone(),
        s.net.pods[0].addr.clone(),
        writing.clone(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let leader = s.leader_name();
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(failed, 0, "writes failed during the backup");
    assert!(keys.len() > 5);
    let member = report["member"].as_str().unwrap();
    assert_ne!(member, leader, "the leader is spared");
    assert_eq!(
        s.snapshot_senders(),
        [member],
        "the member the report names is the one that streamed it"
    );
    assert!(member.starts_with("bk-"), "{report}");
    let uri = report["uri"].as_str().unwrap();
    assert!(
        uri.starts_with(&format!(
            "s3://backups/prod/prod/{}-snapshot-",
            render::snapshot_stem(&s.ec)
        )) && uri.ends_with(".db"),
        "{uri}"
    );
    let object = s.s3_get(&object_key(uri));
    assert_eq!(object.len() as u64, report["size"].as_u64().unwrap());
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
    let checked = snapshot::check(&object).expect("etcd's integrity hash holds");
    assert_eq!(checked.sha256, sha256_hex(&object));
    assert!(report["revision"].as_u64().unwrap() > 200, "{report}");
    eprintln!(
        "scheduled backup: {} bytes from {member} (leader {leader}) in {} s, revision {}",
        report["size"], report["seconds"], report["revision"]
    );
}

/// A TLS cluster (`spec.tls`): the rendered Job presents the client certificate of the
/// cluster's Secret (mounted where the Job mounts it) to members that require one, and files
/// a checked snapshot; with the Secret's key unreadable the run fails at the step that says
/// so (exit 2), and with another CA's certificate it finds no voter (exit 1): the members
/// refuse it.
#[test]
fn a_tls_cluster_is_backed_up_with_its_client_certificate() {
    let mut ec = cluster("bktls", Some("s3://backups/tls/"), 3);
    ec.spec.tls = Some(etcd_webhook::api::v1::Tls::default());
    let ca = TestCa::new("bktls-ca");
    let mut s = Setup::of(ec, true, Some(&ca));
    for i in 0..100 {
        assert!(s.net.put(0, &format!("/pre/{i}"), "x"), "put over TLS");
    }
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let object = s.s3_get(&object_key(report["uri"].as_str().unwrap()));
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
    snapshot::check(&object).expect("etcd's integrity hash holds");
    assert!(report["revision"].as_u64().unwrap() > 100, "{report}");

    // Another CA's client certificate: the members refuse it, no voter answers.
    let client = s.net.secrets["client-tls"].clone();
    let stranger = TestCa::new("stranger").issue(&s.ec, &s.net.tmp.path().join("stranger"), "");
    let saved = s.net.tmp.path().join("saved-client");
    std::fs::create_dir_all(&saved).unwrap();
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(client.join(f), saved.join(f)).unwrap();
        std::fs::copy(stranger["client-tls"].join(f), client.join(f)).unwrap();
    }
    let (code, report, _) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["failed"], "choose a member", "{report}");
    // The key unreadable (an empty file): the step that says so.
    std::fs::write(client.join("tls.key"), "").unwrap();
    let (code, report, _) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["failed"], "read the client certificate", "{report}");
    assert!(
        report["error"].as_str().unwrap().contains("tls.key"),
        "{report}"
    );
    eprintln!(
        "TLS backup: {} bytes over client-certificate TLS; another CA's certificate and an empty key refused",
        object.len()
    );
}

/// A member down (a follower): the backup still comes from a healthy voter.
#[test]
fn a_backup_with_one_member_down_comes_from_a_healthy_voter() {
    let mut s = Setup::new("down", Some("s3://backups"), 3);
    let leader = s.leader_name();
    // Stop a follower that is not pod 0 (the client Service's address here).
    let stopped = (1..3).find(|&i| format!("down-{i}") != leader).unwrap();
    s.net.stop(stopped);
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let other = (1..3)
        .map(|i| format!("down-{i}"))
        .chain(["down-0".to_owned()])
        .find(|n| *n != leader && *n != format!("down-{stopped}"))
        .unwrap();
    assert_eq!(report["member"], other.as_str(), "the follower that runs");
    assert_eq!(s.snapshot_senders(), [other.as_str()], "and it streamed it");
    let object = s.s3_get(&object_key(report["uri"].as_str().unwrap()));
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
}

/// The store down: exit 4, the report names the step; the S3 server back on its data, the
/// next run files a snapshot. A key the store does not know, or its id with a wrong secret:
/// exit 4, refused (InvalidAccessKeyId, SignatureDoesNotMatch).
#[test]
fn a_store_that_is_down_or_refuses_the_key_fails_the_run_with_the_step() {
    let mut s = Setup::new("s3down", Some("s3://backups/x"), 3);
    s.stop_s3();
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 4, "{report}\n{stderr}");
    assert_eq!(report["failed"], "upload", "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("s3://backups/x/prod/s3down-"),
        "{report}"
    );
    s.start_s3();
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(
        s.s3_list(),
        [object_key(report["uri"].as_str().unwrap())],
        "only the good one"
    );
    let (code, report, _) = s.run_job(false, "someone-else");
    assert_eq!(code, 4, "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("InvalidAccessKeyId")
            || report["error"].as_str().unwrap().contains("403"),
        "{report}"
    );
    // The right key with a wrong secret: the server checks every signature, as S3 does
    // (issue 45 item 15: a wrong secret passed before), and nothing is filed.
    s.secret = "not-the-secret";
    let (code, report, _) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 4, "{report}");
    assert!(
        report["error"].as_str().unwrap().contains("403"),
        "{report}"
    );
    // A HEAD's 403 has no body: the server's log names the refusal.
    let log = std::fs::read_to_string(s.net.tmp.path().join("s3.log")).unwrap();
    assert!(log.contains("refused: 403 SignatureDoesNotMatch"), "{log}");
    s.secret = SECRET_KEY;
    assert_eq!(s.s3_list().len(), 1, "nothing filed with the wrong secret");
}

/// Retention 2 over five runs, in a bucket and on the backup claim alike: exactly the two
/// newest scheduled snapshots stay, and a final snapshot taken first is never pruned.
#[test]
fn retention_keeps_the_newest_and_every_final_snapshot_in_a_bucket_and_on_the_claim() {
    for destination in [Some("s3://backups/r"), None] {
        let name = if destination.is_some() { "rs3" } else { "rvol" };
        let mut s = Setup::new(name, destination, 2);
        let (code, final_report, stderr) = s.run_job(true, ACCESS_KEY);
        assert_eq!(code, 0, "{final_report}\n{stderr}");
        let mut filed = Vec::new();
        for _ in 0..5 {
            // Names are to the second.
            std::thread::sleep(Duration::from_millis(1100));
            let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
            assert_eq!(code, 0, "{report}\n{stderr}");
            filed.push(report["uri"].as_str().unwrap().to_owned());
        }
        let file_name = |uri: &str| uri.rsplit('/').next().unwrap().to_owned();
        let mut want: Vec<String> = filed[3..].iter().map(|u| file_name(u)).collect();
        want.push(file_name(final_report["uri"].as_str().unwrap()));
        want.sort();
        let have: Vec<String> = match destination {
            Some(_) => s.s3_list().iter().map(|k| file_name(k)).collect(),
            None => {
                let mut names: Vec<String> = std::fs::read_dir(&s.claim)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                names
            }
        };
        assert_eq!(have, want, "{name}");
        if destination.is_none() {
            let newest = std::fs::read(s.claim.join(file_name(&filed[4]))).unwrap();
            snapshot::check(&newest).expect("the newest on the claim is whole");
        }
    }
}

/// A database over the store's 10 MiB part buffer (16 MB of values) goes up in parts; the
/// object read back is the snapshot.
#[test]
fn a_snapshot_over_ten_mib_goes_up_in_parts_and_reads_back_whole() {
    let mut s = Setup::new("big", Some("s3://backups/big"), 3);
    write_values(&s.net, 16_000_000);
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let size = report["size"].as_u64().unwrap();
    assert!(size > 16_000_000, "{report}");
    let object = s.s3_get(&object_key(report["uri"].as_str().unwrap()));
    assert_eq!(object.len() as u64, size);
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
    snapshot::check(&object).expect("whole");
    eprintln!(
        "backup of a {:.1} MB database: {} s from {}",
        size as f64 / 1e6,
        report["seconds"],
        report["member"]
    );
}

/// The work folder is left empty after a run (the snapshot is not kept twice).
#[test]
fn a_backup_to_the_claim_leaves_nothing_in_the_work_folder() {
    let mut s = Setup::new("tidy", None, 3);
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let work = s.net.tmp.path().join("work-1");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    let path = Path::new(report["uri"].as_str().unwrap());
    assert!(path.starts_with(&s.claim), "{report}");
    let file = std::fs::read(path).unwrap();
    assert_eq!(sha256_hex(&file), report["sha256"].as_str().unwrap());
}

/// Writes `n` keys `/k/<i>` through member 0, 100 to a transaction.
fn write_keys(net: &Net, n: usize) -> Vec<String> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let keys: Vec<String> = (0..n).map(|i| format!("/k/{i:05}")).collect();
    for batch in keys.chunks(100) {
        let puts: Vec<Value> = batch
            .iter()
            .map(|k| json!({"requestPut": {"key": b64(k), "value": b64(&format!("value of {k}"))}}))
            .collect();
        net.v3(0, "kv/txn", json!({"success": puts}))
            .expect("a transaction of puts");
    }
    keys
}

/// What the loop records of a backup run's report (`status.backup.last`).
fn record_of(report: &Value) -> SnapshotRecord {
    let r: render::BackupReport = serde_json::from_value(report.clone()).expect("a report");
    SnapshotRecord {
        time: r.time,
        uri: r.uri,
        size: r.size as i64,
        sha256: r.sha256,
        revision: r.revision as i64,
        keys: r.keys.map(|k| k as i64),
        hash: r.hash.map(|h| h as i64),
        compact_revision: r.compact_revision,
        member: r.member,
    }
}

/// Backups proven by restoring them (issue 47): a scheduled backup records the keys and their
/// hash at its revision on the member; its verification Job, played as rendered (fetch with the
/// recorded SHA-256, etcdutl restore into a scratch folder, a lone etcd on it as a native
/// sidecar, `verify-snapshot`), finds as many keys and the same hash there: Verified. The
/// object altered after upload (bytes of the file changed in the bucket) fails at the fetch;
/// a record whose hash is not what the snapshot holds fails the comparison.
#[test]
fn verification_restores_a_snapshot_in_a_sandbox_and_compares_keys_and_hash() {
    verification("ver", Release::V3_6_4);
}

/// [`verification_restores_a_snapshot_in_a_sandbox_and_compares_keys_and_hash`] on v3.7.4
/// (the default release): its etcdutl restores, its etcd serves the sandbox.
#[test]
fn etcd_3_7_verification_restores_a_snapshot_in_a_sandbox() {
    verification("ver37", Release::V3_7_4);
}

/// The same on v3.5.36, whose etcdutl and etcd spell the same calls.
#[test]
fn etcd_3_5_verification_restores_a_snapshot_in_a_sandbox() {
    verification("ver35", Release::V3_5_36);
}

fn verification(name: &str, release: Release) {
    let mut s = Setup::of(
        cluster_on(name, Some(&format!("s3://backups/{name}/")), 3, release),
        true,
        None,
    );
    // History, then a compaction: the hash counts from the compacted revision, in the member
    // and in the restored copy alike.
    write_keys(&s.net, 300);
    write_keys(&s.net, 300);
    let compacted = s
        .net
        .v3(
            0,
            "kv/compaction",
            json!({"revision": "4", "physical": true}),
        )
        .expect("a compaction");
    assert!(compacted.get("header").is_some(), "{compacted}");
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let record = record_of(&report);
    assert_eq!(record.compact_revision, Some(4), "{report}");
    assert!(record.hash.is_some(), "{report}");
    assert!(record.keys.unwrap() >= 300, "{report}");

    let started = Instant::now();
    let (step, code, message) = s.play_verification(&record);
    let took = started.elapsed();
    assert_eq!((step.as_str(), code), ("verify", 0), "{message}");
    let verdict: render::VerifyReport = serde_json::from_str(&message).unwrap();
    assert_eq!(verdict.outcome, render::VERIFY_OK, "{verdict:?}");
    assert_eq!(verdict.keys as i64, record.keys.unwrap());
    assert_eq!(verdict.hash as i64, record.hash.unwrap());

    // A record that says another hash: the comparison fails, naming both.
    let other = SnapshotRecord {
        hash: Some(record.hash.unwrap() ^ 1),
        ..record.clone()
    };
    let (step, code, message) = s.play_verification(&other);
    assert_eq!((step.as_str(), code), ("verify", 6), "{message}");
    let verdict: render::VerifyReport = serde_json::from_str(&message).unwrap();
    assert_eq!(verdict.outcome, render::VERIFY_FAILED, "{verdict:?}");
    assert!(verdict.message.contains("the member had"), "{verdict:?}");

    // The object altered in the bucket after it was filed: refused before anything restores.
    let key = object_key(&record.uri);
    let mut bytes = s.s3_get(&key);
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let altered = s.net.tmp.path().join("altered.db");
    std::fs::write(&altered, &bytes).unwrap();
    s.s3_put(&key, &altered);
    let (step, code, message) = s.play_verification(&record);
    assert_eq!(step, "fetch", "{message}");
    assert_ne!(code, 0);
    assert!(message.contains("failed"), "{message}");
    eprintln!(
        "verification ({release:?}): {} keys, hash {:x} at revision {} restored and compared in {took:?}; a wrong hash and an altered object refused",
        verdict.keys, verdict.hash, verdict.revision
    );
}

fn member_ids(net: &Net, via: usize) -> (u64, Vec<(String, u64, bool)>) {
    let list = net
        .v3(via, "cluster/member/list", json!({"linearizable": true}))
        .expect("member list");
    let cluster = list["header"]["cluster_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut members: Vec<(String, u64, bool)> = list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or("").to_owned(),
                m["ID"].as_str().unwrap().parse().unwrap(),
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    members.sort();
    (cluster, members)
}

/// Restore: 1,000 keys written, a scheduled backup to S3, the source cluster gone; a new
/// cluster of three is made from the snapshot by the rendered restore Jobs (`fetch-snapshot`,
/// then `etcdutl snapshot restore` v3.6.4 into each member's own volume), then its members
/// start from the rendered StatefulSet: every key is there through every member, the
/// revision is at least the snapshot's, and `member list` has 3 voters with new member IDs
/// and a new cluster ID. A snapshot with one byte changed is refused by the fetch (exit 3, no
/// file left for etcdutl).
#[test]
fn a_snapshot_restores_into_a_new_cluster_with_every_key_and_its_revision() {
    snapshot_restore("src", "dst", Release::V3_6_4);
}

/// The same on etcd v3.7.4: its snapshot, restored by v3.7.4's etcdutl.
#[test]
fn etcd_3_7_a_snapshot_restores_into_a_new_cluster_with_every_key_and_its_revision() {
    snapshot_restore("src37", "dst37", Release::V3_7_4);
}

fn snapshot_restore(src_name: &str, dst_name: &str, release: Release) {
    let mut src = Setup::of(
        cluster_on(
            src_name,
            Some(&format!("s3://backups/{src_name}")),
            3,
            release,
        ),
        true,
        None,
    );
    let keys = write_keys(&src.net, 1000);
    let (src_cluster, src_members) = member_ids(&src.net, 0);
    let (code, report, stderr) = src.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let uri = report["uri"].as_str().unwrap().to_owned();
    let sha = report["sha256"].as_str().unwrap().to_owned();
    let revision = report["revision"].as_u64().unwrap();
    src.stop_s3();

    // The new cluster: its net, the bucket's bolt file carried over, its S3 server.
    let mut dst = Setup::of(
        cluster_on(
            dst_name,
            Some(&format!("s3://backups/{dst_name}")),
            3,
            release,
        ),
        false,
        None,
    );
    std::fs::copy(&src.s3_data, &dst.s3_data).unwrap();
    drop(src);
    dst.start_s3();
    let (restored_in, ready_in) = restore(&mut dst, &uri, &sha);
    let opts = RenderOptions::default();
    for i in 0..3 {
        for key in keys.iter().step_by(37).chain(keys.last()) {
            assert_eq!(
                dst.net.get(i, key).as_deref(),
                Some(format!("value of {key}").as_str()),
                "{key} through {dst_name}-{i}"
            );
        }
    }
    let count = dst
        .net
        .v3(
            0,
            "kv/range",
            json!({"key": "L2sv", "range_end": "L2sw", "count_only": true}),
        )
        .unwrap();
    assert_eq!(count["count"], "1000", "{count}");
    let now = count["header"]["revision"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    // The revision moved on past anything the former cluster's clients saw (etcdutl
    // --bump-revision, --mark-compacted): a watcher resuming from one relists.
    assert!(
        now >= revision + render::RESTORE_REVISION_BUMP,
        "revision {now} not bumped past the snapshot's {revision}"
    );
    let compacted = dst.net.v3(
        2,
        "kv/range",
        json!({"key": "AA==", "range_end": "AA==", "count_only": true,
            "revision": revision.to_string()}),
    );
    assert!(
        compacted.as_ref().is_none_or(|r| r.get("count").is_none()),
        "the snapshot's revision is compacted: {compacted:?}"
    );
    // The keys the report counted at its revision are the restored cluster's now.
    let keys_then = report["keys"].as_u64().unwrap();
    assert!(keys_then >= 1000, "{report}");
    let at = dst
        .net
        .v3(
            2,
            "kv/range",
            json!({"key": "AA==", "range_end": "AA==", "count_only": true}),
        )
        .unwrap();
    assert_eq!(at["count"], keys_then.to_string(), "{at}");
    let (cluster, members) = member_ids(&dst.net, 1);
    assert_ne!(cluster, src_cluster, "a new cluster ID");
    let names: Vec<&str> = members.iter().map(|(n, ..)| n.as_str()).collect();
    let want: Vec<String> = (0..3).map(|i| format!("{dst_name}-{i}")).collect();
    assert_eq!(names, want);
    assert!(members.iter().all(|(_, _, learner)| !learner), "3 voters");
    for (_, id, _) in &members {
        assert!(
            src_members.iter().all(|(_, s, _)| s != id),
            "new member IDs"
        );
    }
    eprintln!(
        "restore of 1,000 keys on {} ({} bytes, revision {revision}): fetched and restored on 3 members in {restored_in:?}, all ready {ready_in:?} after the start",
        release.version(),
        report["size"]
    );

    // A snapshot with one byte changed: the fetch refuses it and leaves nothing.
    let good = dst.s3_get(&object_key(&uri));
    let mut bad = good.clone();
    bad[4096 + 100] ^= 0x01;
    let bad_file = dst.net.tmp.path().join("bad.db");
    std::fs::write(&bad_file, &bad).unwrap();
    dst.s3_put(&format!("{dst_name}/bad.db"), &bad_file);
    let bad_uri = format!("s3://backups/{dst_name}/bad.db");
    let bad_uri = SnapshotSource::parse(&bad_uri).unwrap();
    let job = render::restore_job(&dst.ec, 0, bad_uri, None, &opts);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let scratch = dst.net.tmp.path().join("restore-bad");
    std::fs::create_dir_all(&scratch).unwrap();
    let fetch = &pod.init_containers.as_ref().unwrap()[0];
    let (code, message, out) = dst.run_container(
        fetch,
        &[("/restore", scratch.as_path())],
        &scratch.join("report"),
    );
    assert_eq!(code, 3, "{message}\n{out}");
    let report: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(report["failed"], "verify", "{report}");
    assert!(
        report["error"].as_str().unwrap().contains("is corrupt"),
        "{report}"
    );
    assert!(
        !scratch.join("snapshot.db").exists() && !scratch.join("snapshot.part").exists(),
        "nothing left for etcdutl"
    );

    // The good snapshot, but not the one the spec's sha256 names (another backup, or one
    // changed in the bucket since): refused the same way, before etcdutl sees it.
    let other = "0123456789abcdef".repeat(4);
    let job = render::restore_job(&dst.ec, 0, source_of(&uri), Some(&other), &opts);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let fetch = &pod.init_containers.as_ref().unwrap()[0];
    let (code, message, out) = dst.run_container(
        fetch,
        &[("/restore", scratch.as_path())],
        &scratch.join("report"),
    );
    assert_eq!(code, 3, "{message}\n{out}");
    let report: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(report["failed"], "verify", "{report}");
    let error = report["error"].as_str().unwrap();
    assert!(error.contains(&other) && error.contains(&sha), "{report}");
    assert!(
        !scratch.join("snapshot.db").exists() && !scratch.join("snapshot.part").exists(),
        "nothing left for etcdutl"
    );
}

fn source_of(uri: &str) -> SnapshotSource<'_> {
    SnapshotSource::parse(uri).unwrap()
}

/// Restore from a backup claim: a scheduled backup to the source's claim `src-backup`, then a
/// new cluster restored from `pvc://src-backup/FILE` (the URI the loop records for a snapshot
/// on the claim): each Job mounts the claim read-only, with no credentials, and the new cluster
/// has every key. A file that is not a snapshot is refused by the fetch.
#[test]
fn a_snapshot_on_a_backup_claim_restores_into_a_new_cluster() {
    let mut src = Setup::new("csrc", None, 3);
    let keys = write_keys(&src.net, 300);
    let (code, report, stderr) = src.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let file = Path::new(report["uri"].as_str().unwrap())
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let sha = report["sha256"].as_str().unwrap().to_owned();
    // The claim outlives its cluster (no ownerReference): its files, without the source.
    let mut dst = Setup::with("cdst", None, 3, false);
    let kept = dst.net.tmp.path().join("csrc-backup");
    copy_dir(&src.claim, &kept);
    drop(src);
    let uri = format!("pvc://csrc-backup/{file}");
    let job = render::restore_job(
        &dst.ec,
        0,
        SnapshotSource::parse(&uri).unwrap(),
        None,
        &RenderOptions::default(),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    let source = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "source")
        .unwrap();
    let pvc = source.persistent_volume_claim.as_ref().unwrap();
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("csrc-backup", Some(true))
    );
    let fetch = &pod.init_containers.as_ref().unwrap()[0];
    assert!(fetch.env_from.is_none(), "no credentials for a claim");
    assert!(
        fetch
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "source" && m.read_only == Some(true))
    );

    let (restored_in, ready_in) = restore_from(&mut dst, &uri, &sha, Some(&kept));
    for i in 0..3 {
        for key in keys.iter().step_by(29).chain(keys.last()) {
            assert_eq!(
                dst.net.get(i, key).as_deref(),
                Some(format!("value of {key}").as_str()),
                "{key} through cdst-{i}"
            );
        }
    }
    eprintln!(
        "restore of 300 keys from a claim: {restored_in:?}, all ready {ready_in:?} after the start"
    );

    // Not a snapshot: refused, nothing left.
    std::fs::write(kept.join("notes.db"), b"not a snapshot").unwrap();
    let job = render::restore_job(
        &dst.ec,
        1,
        SnapshotSource::parse("pvc://csrc-backup/notes.db").unwrap(),
        None,
        &RenderOptions::default(),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    let scratch = dst.net.tmp.path().join("restore-notes");
    std::fs::create_dir_all(&scratch).unwrap();
    let (code, message, out) = dst.run_container(
        &pod.init_containers.as_ref().unwrap()[0],
        &[
            ("/restore", scratch.as_path()),
            (render::RESTORE_SOURCE_MOUNT, kept.as_path()),
        ],
        &scratch.join("report"),
    );
    assert_eq!(code, 3, "{message}\n{out}");
    assert!(
        !scratch.join("snapshot.db").exists(),
        "nothing left for etcdutl"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Writes about `bytes` of 64 KiB values through member 0, 16 to a transaction (1 MiB, under
/// etcd's 1.5 MiB request limit).
fn write_values(net: &Net, bytes: usize) {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let value = b64(&vec![b'v'; 64 * 1024]);
    let n = bytes.div_ceil(64 * 1024);
    for start in (0..n).step_by(16) {
        let puts: Vec<Value> = (start..(start + 16).min(n))
            .map(|i| json!({"requestPut": {"key": b64(format!("/big/{i:06}").as_bytes()), "value": value}}))
            .collect();
        net.v3(0, "kv/txn", json!({"success": puts}))
            .unwrap_or_else(|| panic!("a transaction of 16 values at {start}"));
    }
}

/// Runs the rendered restore Jobs of `dst`'s three members from `uri` (fetch, then etcdutl into
/// each member's folder, owned by the members' user as fsGroup would make it), then starts the
/// members: (restored after, all ready after).
fn restore(dst: &mut Setup, uri: &str, sha: &str) -> (Duration, Duration) {
    restore_from(dst, uri, sha, None)
}

/// [`restore`] from `uri`, an `s3://` or a `pvc://` snapshot whose claim is the folder `claim`.
fn restore_from(
    dst: &mut Setup,
    uri: &str,
    sha: &str,
    claim: Option<&Path>,
) -> (Duration, Duration) {
    let opts = RenderOptions::default();
    let source = SnapshotSource::parse(uri).unwrap();
    let started = Instant::now();
    for i in 0..3 {
        let job = render::restore_job(&dst.ec, i as i32, source, Some(sha), &opts);
        let pod = job.spec.unwrap().template.spec.unwrap();
        let scratch = dst.net.tmp.path().join(format!("restore-{i}"));
        std::fs::create_dir_all(&scratch).unwrap();
        let data = dst.net.pods[i].data.clone();
        let mut mounts = vec![
            ("/restore", scratch.as_path()),
            ("/var/lib/etcd", data.as_path()),
        ];
        if let Some(claim) = claim {
            mounts.push((render::RESTORE_SOURCE_MOUNT, claim));
        }
        // The kubelet's order: the init containers one after another, then the container.
        for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
            let report = scratch.join(format!("{}-report", c.name));
            let (code, message, out) = dst.run_container(c, &mounts, &report);
            assert_eq!(code, 0, "{} for member {i}: {message}\n{out}", c.name);
        }
        common::members::run(
            Command::new("chown")
                .arg("-R")
                .arg(format!("{0}:{0}", common::members::RUN_AS))
                .arg(&data),
        );
        // The snapshot is the Job's emptyDir: gone with its pod.
        std::fs::remove_dir_all(&scratch).unwrap();
    }
    let restored_in = started.elapsed();
    dst.net.config = render::bootstrap_config(&dst.ec, 3, true).data.unwrap();
    let container = member_container(&dst.ec);
    for i in 0..3 {
        dst.net.start(i, &container);
    }
    dst.net.wait_ready(&container, Duration::from_secs(120));
    (restored_in, started.elapsed())
}

/// A 100 MB database: backed up to the S3 server in parts, then restored into a new cluster of
/// three (the times are in the closing notes and docs/clusters.md, not asserted).
#[test]
fn a_100_mb_database_backs_up_and_restores() {
    let mut src = Setup::new("hsrc", Some("s3://backups/h"), 3);
    write_values(&src.net, 100_000_000);
    let (code, report, stderr) = src.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let size = report["size"].as_u64().unwrap();
    assert!(size > 100_000_000, "{report}");
    let uri = report["uri"].as_str().unwrap().to_owned();
    let sha = report["sha256"].as_str().unwrap().to_owned();
    src.stop_s3();
    let mut dst = Setup::with("hdst", Some("s3://backups/h"), 3, false);
    std::fs::copy(&src.s3_data, &dst.s3_data).unwrap();
    drop(src);
    dst.start_s3();
    let (restored_in, ready_in) = restore(&mut dst, &uri, &sha);
    let count = dst
        .net
        .v3(
            1,
            "kv/range",
            json!({"key": "L2JpZy8=", "range_end": "L2JpZzA=", "count_only": true}),
        )
        .unwrap();
    assert_eq!(
        count["count"],
        100_000_000_usize.div_ceil(64 * 1024).to_string(),
        "{count}"
    );
    eprintln!(
        "100 MB: backup of {:.1} MB in {} s; restored on 3 members in {restored_in:?}, all ready {ready_in:?} after the start",
        size as f64 / 1e6,
        report["seconds"]
    );
}

/// A backup volume short of space (a 4 MiB tmpfs): the oldest scheduled snapshots of this
/// cluster go first until the new one fits, never the newest one, a final snapshot or another
/// cluster's; when even that is not enough, the run stops at the step `space` with how much is
/// missing (the loop's BackupReady says StoreFull). Before, the write came first and failed
/// for ever once the claim was full.
#[test]
fn a_full_backup_volume_makes_room_from_the_oldest_or_says_it_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(mnt)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "mount a 4 MiB tmpfs (the tests run as root)"
    );
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(mnt);
    let mib = vec![7u8; 1 << 20];
    let stem = "full-6a3c1f9e";
    let files = [
        format!("{stem}-snapshot-20261201T000000Z.db"),
        format!("{stem}-snapshot-20261202T000000Z.db"),
        format!("{stem}-final-20261101T000000Z.db"),
    ];
    for f in &files {
        std::fs::write(mnt.join(f), &mib).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 3 of 4 MiB used: a 512 KiB snapshot (with the 1 MiB margin) needs the oldest scheduled
    // one gone.
    let gone = rt
        .block_on(etcd_webhook::backup::make_room(
            mnt,
            stem,
            1 << 19,
            "/backup/x",
        ))
        .unwrap();
    assert_eq!(gone, [files[0].clone()]);
    assert!(
        mnt.join(&files[1]).exists(),
        "the newest scheduled snapshot stays"
    );
    assert!(mnt.join(&files[2]).exists(), "a final snapshot stays");
    // 8 MiB cannot fit whatever goes: nothing more is deleted, the step is `space`.
    let e = rt
        .block_on(etcd_webhook::backup::make_room(
            mnt,
            stem,
            8 << 20,
            "/backup/x",
        ))
        .unwrap_err();
    assert_eq!(e.step(), "space");
    assert!(
        e.to_string()
            .contains("the backup volume is full: the snapshot needs 9 MiB"),
        "{e}"
    );
    assert!(mnt.join(&files[1]).exists() && mnt.join(&files[2]).exists());
}

/// A cluster out of space (every member's NOSPACE alarm raised: writes refused) still serves
/// reads and a snapshot, the copy most worth having then: the backup is taken. Before, a
/// member with any alarm was "unhealthy" and the run failed at `choose a member`.
#[test]
fn a_cluster_out_of_space_is_still_backed_up() {
    let mut ec = cluster("full", Some("s3://backups"), 3);
    ec.spec.maintenance =
        Some(serde_json::from_value(json!({"quotaBackendBytes": 16 << 20})).unwrap());
    let mut s = Setup::of(ec, true, None);
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let value = b64(&vec![b'v'; 64 * 1024]);
    let mut refused = None;
    // 16 MiB of quota: NOSPACE well before 64 MiB of values.
    for i in 0..1024 {
        let put = json!({"key": b64(format!("/full/{i:06}").as_bytes()), "value": value});
        let url = format!("{}/v3/kv/put", s.net.target(0, 0).base);
        match s.net.http(0, "POST", &url, Some(&put)) {
            (200, text) if !text.contains("\"error\"") => {}
            (_, text) => {
                refused = Some(text);
                break;
            }
        }
    }
    let refused = refused.expect("the quota is reached");
    assert!(refused.contains("space exceeded"), "{refused}");
    let (code, report, stderr) = s.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let object = s.s3_get(&object_key(report["uri"].as_str().unwrap()));
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
    assert!(report["keys"].as_u64().unwrap() > 100, "{report}");
}

/// A restore Job killed while etcdutl wrote (the node lost, the pod evicted) is tried again by
/// the Job's next pod: etcdutl writes beside the data directory and `place-restored` moves it
/// in once whole, so the retry clears what the killed one left and succeeds, and a member's
/// volume never holds half a data directory. Before, etcdutl wrote the data directory itself
/// and the retry failed with "data-dir ... not empty" (a wrong cause, and no restore).
#[test]
fn a_restore_killed_mid_write_is_tried_again_from_scratch() {
    let mut src = Setup::new("ksrc", Some("s3://backups/k"), 3);
    let keys = write_keys(&src.net, 200);
    let (code, report, stderr) = src.run_job(false, ACCESS_KEY);
    assert_eq!(code, 0, "{report}\n{stderr}");
    let uri = report["uri"].as_str().unwrap().to_owned();
    let sha = report["sha256"].as_str().unwrap().to_owned();
    src.stop_s3();
    let mut dst = Setup::with("kdst", Some("s3://backups/k"), 3, false);
    std::fs::copy(&src.s3_data, &dst.s3_data).unwrap();
    drop(src);
    dst.start_s3();

    // Member 0's first attempt: fetched and restored, then killed before the move, with its
    // write cut short (the WAL gone).
    let opts = RenderOptions::default();
    let source = SnapshotSource::parse(&uri).unwrap();
    let job = render::restore_job(&dst.ec, 0, source, Some(&sha), &opts);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let scratch = dst.net.tmp.path().join("killed");
    std::fs::create_dir_all(&scratch).unwrap();
    let data = dst.net.pods[0].data.clone();
    let mounts = [
        ("/restore", scratch.as_path()),
        ("/var/lib/etcd", data.as_path()),
    ];
    for c in pod.init_containers.iter().flatten() {
        let (code, message, out) = dst.run_container(c, &mounts, &scratch.join("report"));
        assert_eq!(code, 0, "{}: {message}\n{out}", c.name);
    }
    let half = data.join(format!("data{}", render::RESTORING_SUFFIX));
    assert!(
        half.join("member").is_dir(),
        "etcdutl wrote beside the data directory"
    );
    assert!(
        !data.join("data").exists(),
        "nothing in the member's place yet"
    );
    std::fs::remove_dir_all(half.join("member/wal")).unwrap();

    // The Job's next pod for member 0, and the other members' Jobs: every member restored.
    restore(&mut dst, &uri, &sha);
    assert!(!half.exists(), "the half-written copy is gone");
    for i in 0..3 {
        for key in keys.iter().step_by(41).chain(keys.last()) {
            assert_eq!(
                dst.net.get(i, key).as_deref(),
                Some(format!("value of {key}").as_str()),
                "{key} through kdst-{i}"
            );
        }
    }
}
