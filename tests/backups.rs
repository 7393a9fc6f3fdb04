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

use common::members::{Net, Release, writer};
use etcd_webhook::api::v1::EtcdCluster;
use etcd_webhook::backup::snapshot;
use etcd_webhook::controller::render::{self, BackupTarget, RenderOptions};
use k8s_openapi::api::core::v1::Container;
use serde_json::{Value, json};

const NAMESPACE: &str = "prod";
const ACCESS_KEY: &str = "backup-test-key";
const SECRET_KEY: &str = "backup-test-secret";
const BUCKET: &str = "backups";

fn cluster(name: &str, destination: Option<&str>, retention: i32) -> EtcdCluster {
    serde_json::from_value(json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "6a3c1f9e-0000-4000-8000-00000000b4c7"},
        "spec": {"size": 3, "version": "v3.6.4", "storageSize": "1Gi",
            "backup": {"enabled": true, "schedule": "0 * * * *", "retention": retention,
                "destination": destination}},
    }))
    .expect("an EtcdCluster")
}

/// The etcd container of the members.
fn member_container(ec: &EtcdCluster) -> Container {
    render::stateful_set(ec, 3, &RenderOptions::default())
        .spec
        .unwrap()
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
            .unwrap()
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
}

const JOB: usize = 3;

impl Setup {
    fn new(name: &str, destination: Option<&str>, retention: i32) -> Setup {
        let ec = cluster(name, destination, retention);
        let names: Vec<String> = (0..3)
            .map(|i| format!("{name}-{i}"))
            .chain([format!("{name}-job")])
            .collect();
        let mut net = Net::new(NAMESPACE, name, &names, Release::V3_6_4);
        net.config = render::bootstrap_config(&ec, 3, false).data.unwrap();
        let container = member_container(&ec);
        for i in 0..3 {
            net.start(i, &container);
        }
        net.wait_ready(&container, Duration::from_secs(60));
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
        };
        setup.start_s3();
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
            .args(["--access-key", ACCESS_KEY, "--data"])
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
        let mounts: BTreeMap<String, PathBuf> = [
            ("/work".to_owned(), work.clone()),
            (render::BACKUP_MOUNT.to_owned(), self.claim.clone()),
            ("/dev/termination-log".to_owned(), report.clone()),
        ]
        .into();
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
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
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

    /// An object of the bucket, fetched with curl's own SigV4 signing.
    fn s3_get(&self, key: &str) -> Vec<u8> {
        let url = format!("http://127.0.0.1:9000/{BUCKET}/{key}");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.net.pods[JOB].ns, "curl", "-sf"])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "GET {url}: {:?}", out.status);
        out.stdout
    }

    /// The object keys of the bucket (ListObjectsV2, curl-signed).
    fn s3_list(&self) -> Vec<String> {
        let url = format!("http://127.0.0.1:9000/{BUCKET}?list-type=2");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.net.pods[JOB].ns, "curl", "-sf"])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
            .arg(&url)
            .output()
            .unwrap();
        let xml = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut keys: Vec<String> = xml
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect();
        keys.sort();
        keys
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
    assert!(member.starts_with("bk-"), "{report}");
    let uri = report["uri"].as_str().unwrap();
    assert!(
        uri.starts_with("s3://backups/prod/bk-snapshot-") && uri.ends_with(".db"),
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
    let object = s.s3_get(&object_key(report["uri"].as_str().unwrap()));
    assert_eq!(sha256_hex(&object), report["sha256"].as_str().unwrap());
}

/// The store down: exit 4, the report names the step; the S3 server back on its data, the
/// next run files a snapshot. A key the store does not know: exit 4, access denied.
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
            .contains("s3://backups/x/s3down-snapshot-"),
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
    // 64 KiB values: the harness's curl takes the JSON body as one argument (at most 128 KiB).
    let value = "v".repeat(64 * 1024);
    for i in 0..250 {
        assert!(s.net.put(0, &format!("/big/{i}"), &value), "put {i}");
    }
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
