//! Certificates changing under load (issue 15 items 3 and 4): a leaf renewal delivered through a
//! Secret volume or through `--cert-secret`, and a CA rotation done naively and by README's
//! procedure. Each counts the apiserver requests that failed while it happened.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::wait_for;
use crate::common;
use crate::install::{Env, NAMESPACE, ok};
use crate::lifecycle::the_served_certificate_is_what_the_apiserver_trusts_now;

/// How the serving replica gets the renewed pair.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The Secret volume: the test writes the new Secret into the folder as the kubelet does
    /// (`..data` swap), at once or after a delay standing in for the kubelet's sync.
    Volume,
    /// `--cert-secret`: the server watches the Secret through the API itself.
    Secret,
}

/// Follows the serving Secret's `tls.crt` with `kubectl get -w` (an API watch, as the server's
/// own), recording when each new value arrived.
struct SecretWatch {
    child: std::process::Child,
    seen: Arc<Mutex<Vec<(Instant, std::time::SystemTime, String)>>>,
}

impl SecretWatch {
    fn start(env: &Env) -> SecretWatch {
        use std::io::BufRead;
        let mut child = std::process::Command::new(common::k8s_tools().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&env.cp.kubeconfig)
            .args([
                "-n",
                NAMESPACE,
                "get",
                "secret",
                "etcd-webhook-tls",
                "--watch",
            ])
            .args(["-o", r#"jsonpath={.data.tls\.crt}{"\n"}"#])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl get --watch");
        let out = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let now = (Instant::now(), std::time::SystemTime::now());
                sink.lock().unwrap().push((now.0, now.1, line));
            }
        });
        let watch = SecretWatch { child, seen };
        wait_for("the Secret watch to list", Duration::from_secs(30), || {
            (!watch.seen.lock().unwrap().is_empty()).then_some(())
        });
        watch
    }

    /// The newest `tls.crt` seen, and when it arrived.
    fn latest(&self) -> (Instant, String) {
        let seen = self.seen.lock().unwrap();
        let (at, _, value) = seen.last().unwrap();
        (*at, value.clone())
    }

    /// When a `tls.crt` other than `before` first arrived (monotonic and wall clock).
    fn changed_at(&self, before: &str) -> Option<(Instant, std::time::SystemTime)> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .find(|(_, _, v)| v != before)
            .map(|(t, w, _)| (*t, *w))
    }
}

impl Drop for SecretWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the clients saw while a change happened.
struct Load {
    admitted: usize,
    failures: Vec<String>,
}

/// Runs `work` while three clients create (in v1alpha1, so through /convert, /mutate and
/// /validate), label and read EtcdClusters in namespace `ns` through the apiserver without
/// pause, from 3 s before `work` to 3 s after it. `work` gets the count admitted so far.
fn under_load<R>(env: &Env, ns: &str, work: impl FnOnce(&dyn Fn() -> usize) -> R) -> (R, Load) {
    env.create_namespace(ns);
    let stop = AtomicBool::new(false);
    let admitted = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let result = std::thread::scope(|scope| {
        for client in 0..3 {
            let (stop, admitted, failures) = (&stop, &admitted, &failures);
            scope.spawn(move || {
                for i in 0..5000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let name = format!("load-{client}-{i}");
                    let cluster = json!({
                        "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
                        "metadata": {"name": name, "namespace": ns},
                        "spec": {"replicas": 1, "etcdVersion": "3.5.10", "storageSizeGi": 1}
                    })
                    .to_string();
                    let resource = "etcdclusters.v1alpha1.etcd.example.com";
                    let calls: [(&[&str], Option<&str>); 3] = [
                        (&["create", "-f", "-"], Some(&cluster)),
                        (&["-n", ns, "label", resource, &name, "step=updated"], None),
                        (&["-n", ns, "get", resource, &name, "-o", "name"], None),
                    ];
                    for (args, input) in calls {
                        let out = env.cp.kubectl_output(args, input);
                        if out.status.success() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failures.lock().unwrap().push(format!(
                                "kubectl {}: {}",
                                args.join(" "),
                                String::from_utf8_lossy(&out.stderr).trim()
                            ));
                        }
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs(3));
        let result = work(&|| admitted.load(Ordering::Relaxed));
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        result
    });
    ok(
        env.kubectl(&["delete", "namespace", ns, "--wait=false"]),
        "delete namespace",
    );
    let load = Load {
        admitted: admitted.into_inner(),
        failures: failures.into_inner().unwrap(),
    };
    (result, load)
}

/// The revision of one of the shipped Certificates.
fn revision(env: &Env, certificate: &str) -> i64 {
    env.get_json(&["-n", NAMESPACE, "certificate", certificate])["status"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("{certificate} has a revision"))
}

/// Renews a Certificate as `cmctl renew` does (the Issuing condition, reason
/// ManuallyTriggered) and returns once cert-manager has issued the next revision.
fn renew(env: &Env, certificate: &str) {
    let before = revision(env, certificate);
    let condition = json!([{"op": "add", "path": "/status/conditions/-", "value": {
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "renewal triggered by the e2e test"}}]);
    ok(
        env.kubectl(&[
            "-n",
            NAMESPACE,
            "patch",
            "certificate",
            certificate,
            "--subresource=status",
            "--type=json",
            "-p",
            &condition.to_string(),
        ]),
        "trigger the renewal",
    );
    wait_for(
        &format!(
            "cert-manager to issue revision {} of {certificate}",
            before + 1
        ),
        Duration::from_secs(60),
        || (revision(env, certificate) > before).then_some(()),
    );
}

/// How many times the serving replica has loaded a pair.
fn loads(env: &Env) -> usize {
    env.serving_log()
        .matches("serving certificate loaded")
        .count()
}

/// A leaf renewal under load, with the Secret mounted as a volume: see [`renewal_under_load`].
pub fn leaf_renewal_under_load_drops_nothing(env: &Env) {
    renewal_under_load(env, Delivery::Volume);
}

/// Issue 15, item 4: a replica started as config/cert-secret runs it (`--cert-secret`, the
/// ServiceAccount bound to that overlay's Role and nothing more for Secrets) replaces the
/// serving one; a renewal under load reaches it through its own watch, with no volume.
pub fn leaf_renewal_under_load_with_cert_secret(env: &Env) {
    let docs = crate::install::kustomize("config/cert-secret");
    let rbac: Vec<Value> = docs
        .iter()
        .filter(|d| d["metadata"]["name"] == "etcd-webhook-cert-secret")
        .cloned()
        .collect();
    assert_eq!(rbac.len(), 2, "the overlay's Role and RoleBinding");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": rbac});
    crate::install::apply_as_installer(&env.cp, &list, "apply config/cert-secret's Role");
    let args: Vec<String> = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| {
            serde_json::from_value(d["spec"]["template"]["spec"]["containers"][0]["args"].clone())
                .ok()
        })
        .expect("the overlay's Deployment args");
    let secret_flag = args
        .iter()
        .find(|a| a.starts_with("--cert-secret="))
        .expect("config/cert-secret passes --cert-secret");
    let server = env.start_replica("etcd-webhook-e2e-secret", &["--no-cert-dir", secret_flag]);
    assert!(
        server
            .log()
            .contains("read from the Secret through the API"),
        "{}",
        server.log()
    );
    env.route_to(&server);
    env.stop_webhook();
    *env.webhook.lock().unwrap() = Some(server);
    renewal_under_load(env, Delivery::Secret);
}

/// A leaf renewal under load: the serving Certificate is renewed as `cmctl renew` does it and
/// the server takes the new pair as `delivery` brings it (the volume swapped the moment the
/// Secret changes). Not one request may fail. Prints the time from the new Secret (as an API
/// watch sees it) to the server serving it.
fn renewal_under_load(env: &Env, delivery: Delivery) {
    let ns = match delivery {
        Delivery::Volume => "e2e-renew",
        Delivery::Secret => "e2e-renew-secret",
    };
    let loads_before = loads(env);
    let revision_before = revision(env, "etcd-webhook-serving");
    let (((latency, after_delivery), admitted_at_new_secret), load) =
        under_load(env, ns, |admitted| {
            let watch = SecretWatch::start(env);
            let before = watch.latest().1;
            renew(env, "etcd-webhook-serving");
            // Bounded: 60 s for the Secret, then 30 s for the server, in 5 ms steps.
            let deadline = Instant::now() + Duration::from_secs(60);
            let (_, new_secret_wall) = loop {
                if let Some(at) = watch.changed_at(&before) {
                    break at;
                }
                assert!(
                    Instant::now() < deadline,
                    "the renewed Secret did not arrive within 60 s"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            let at_new_secret = admitted();
            // When the pair reached the server's reach: the watch event itself with --cert-secret,
            // the ..data swap with a volume.
            let mut delivered = new_secret_wall;
            if delivery == Delivery::Volume {
                env.sync_secret_volume();
                delivered = std::time::SystemTime::now();
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while loads(env) == loads_before {
                assert!(
                    Instant::now() < deadline,
                    "the server did not load the renewed certificate within 30 s"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            // The server's own timestamp of the load, so the log pipe's delay does not count.
            let log = env.webhook.lock().unwrap().as_ref().unwrap().log();
            let line = log
                .lines()
                .rfind(|l| l.contains("serving certificate loaded"))
                .unwrap()
                .to_owned();
            let stamp = line.split_whitespace().next().unwrap();
            let loaded = humantime::parse_rfc3339_weak(stamp)
                .unwrap_or_else(|e| panic!("timestamp of {line:?}: {e}"));
            let ms = |since: std::time::SystemTime| match loaded.duration_since(since) {
                Ok(d) => d.as_secs_f64() * 1000.0,
                Err(e) => -e.duration().as_secs_f64() * 1000.0,
            };
            ((ms(new_secret_wall), ms(delivered)), at_new_secret)
        });
    let how = match delivery {
        Delivery::Volume => "the test's ..data swap at once (a kubelet adds its sync delay)",
        Delivery::Secret => "--cert-secret's own watch",
    };
    eprintln!(
        "    {} apiserver requests admitted during the renewal ({} after the new Secret), {} failed; loaded {latency:.0} ms (the server's log time) after an API watch of the test saw the new Secret ({after_delivery:.0} ms after it was delivered), through {how}",
        load.admitted,
        load.admitted - admitted_at_new_secret,
        load.failures.len(),
    );
    assert!(
        load.failures.is_empty(),
        "failed during the renewal: {:#?}",
        load.failures
    );
    assert!(
        load.admitted >= 30 && load.admitted - admitted_at_new_secret >= 10,
        "the load ran through the reload: {} requests, {} after the new Secret",
        load.admitted,
        load.admitted - admitted_at_new_secret
    );
    if delivery == Delivery::Secret {
        assert!(
            latency < 5000.0,
            "--cert-secret loaded the renewal {latency:.0} ms after the Secret changed"
        );
    }
    // The server serves the renewed leaf, and the apiserver still trusts it. cert-manager
    // sometimes issues twice for one renewal (a second revision moments after the first), so
    // the check is "at least one new revision, and what the server serves is the Secret as it
    // is once the revisions stop moving", not "exactly one".
    let after = settled_revision(env, delivery);
    assert!(
        after > revision_before,
        "no new revision: {revision_before} -> {after}"
    );
    the_served_certificate_is_what_the_apiserver_trusts_now(env, delivery);
}

/// Waits (bounded) until the serving Certificate's revision holds still for 3 s and the server
/// has loaded that revision's Secret (delivered into the volume again where the test plays the
/// kubelet); returns the revision.
fn settled_revision(env: &Env, delivery: Delivery) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let seen = revision(env, "etcd-webhook-serving");
        if delivery == Delivery::Volume {
            env.sync_secret_volume();
        }
        std::thread::sleep(Duration::from_secs(3));
        if revision(env, "etcd-webhook-serving") == seen {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "the serving Certificate's revision kept moving for 90 s"
        );
    }
}

/// Stands in for the kubelet: writes each new version of the Secret into the volume folder
/// `delay` after an API watch saw it, until dropped.
struct DelayedKubelet {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DelayedKubelet {
    fn start(env: &Env, delay: Duration) -> DelayedKubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let watch = SecretWatch::start(env);
        let volume = env.volume_writer();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut synced = watch.latest().1;
            // Bounded by the scenario: it drops the stand-in when done (at most 10 minutes).
            let deadline = Instant::now() + Duration::from_secs(600);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                let (at, value) = watch.latest();
                if value != synced {
                    std::thread::sleep(delay.saturating_sub(at.elapsed()));
                    volume();
                    synced = value;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        DelayedKubelet {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for DelayedKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The CA in each caBundle, as PEM certificates (a bundle may hold several).
fn bundle_subjects_and_keys(env: &Env) -> Vec<Vec<Vec<u8>>> {
    use base64::Engine;
    crate::install::CA_BUNDLES
        .iter()
        .map(|target| {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(env.ca_bundle(*target))
                .unwrap();
            x509_parser::pem::Pem::iter_from_buffer(&pem)
                .map(|p| p.unwrap().contents)
                .collect()
        })
        .collect()
}

/// What a naive CA rotation did.
struct Naive {
    /// From the start of the leaf renewal to cainjector's new caBundles, and to the pod
    /// serving the new leaf.
    bundles_at: Option<Duration>,
    loaded_at: Duration,
    /// How many CAs each caBundle held afterwards.
    bundle_sizes: Vec<usize>,
    load: Load,
}

/// Renews the CA, then the leaf from it, under load, and nothing else: what a user does who
/// runs `cmctl renew` on both.
fn naive_rotation(env: &Env, ns: &str) -> Naive {
    let before = bundle_subjects_and_keys(env);
    let ((bundles_at, loaded_at), load) = under_load(env, ns, |_| {
        renew(env, "etcd-webhook-ca");
        let loads_before = loads(env);
        let renewed = Instant::now();
        renew(env, "etcd-webhook-serving");
        let (mut bundles_at, mut loaded_at) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while (bundles_at.is_none() || loaded_at.is_none()) && Instant::now() < deadline {
            if bundles_at.is_none() && bundle_subjects_and_keys(env) != before {
                bundles_at = Some(renewed.elapsed());
            }
            if loaded_at.is_none() && loads(env) > loads_before {
                loaded_at = Some(renewed.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (
            bundles_at,
            loaded_at.expect("the pod serves the leaf of the new CA within 60 s"),
        )
    });
    let after = bundle_subjects_and_keys(env);
    Naive {
        bundles_at,
        loaded_at,
        bundle_sizes: after.iter().map(Vec::len).collect(),
        load,
    }
}

fn report(what: &str, n: &Naive) {
    eprintln!(
        "    {what}: caBundles changed {:?} and the new leaf served {:.1} s after the leaf renewal began; caBundles hold {:?} CAs; {} requests admitted, {} failed{}",
        n.bundles_at.map(|d| format!("{:.1} s", d.as_secs_f64())),
        n.loaded_at.as_secs_f64(),
        n.bundle_sizes,
        n.load.admitted,
        n.load.failures.len(),
        n.load
            .failures
            .first()
            .map(|f| format!(", e.g. {f}"))
            .unwrap_or_default()
    );
}

/// Issue 15, item 3: CA rotations under load, with a volume-mounted Secret that reaches the
/// pod 5 s after cert-manager writes it (a kubelet's sync, shortened).
/// 1. Naive (renew the CA, then the leaf) with the suite's cainjector, cert-manager v1.19.4's
///    defaults: `CAInjectorMerging` appends the new CA to each caBundle, so nothing fails, and
///    the old CA stays trusted.
/// 2. Naive with a cainjector that replaces the bundle (`CAInjectorMerging=false`, as
///    cert-manager did before that gate): the failures are counted and printed.
/// 3. README's procedure, as written, with that replacing cainjector: not one request may
///    fail; afterwards every caBundle holds the new CA alone, also once the suite's cainjector
///    is back, and the served leaf verifies against it.
pub fn ca_rotation_under_load(env: &Env) {
    const KUBELET_DELAY: Duration = Duration::from_secs(5);
    // A replica reading the volume (the one before may read the Secret through the API).
    env.sync_secret_volume();
    let server = env.start_replica("etcd-webhook-e2e-rotation", &[]);
    env.route_to(&server);
    env.stop_webhook();
    *env.webhook.lock().unwrap() = Some(server);
    let kubelet = DelayedKubelet::start(env, KUBELET_DELAY);

    let merging = naive_rotation(env, "e2e-ca-naive-merging");
    report(
        "naive CA rotation, cainjector merging (v1.19.4 default)",
        &merging,
    );
    assert!(
        merging.load.failures.is_empty(),
        "with the merging cainjector nothing fails: {:#?}",
        merging.load.failures
    );
    assert!(
        merging.bundle_sizes.iter().all(|n| *n >= 2),
        "the old CA stays in every bundle: {:?}",
        merging.bundle_sizes
    );

    let wait = KUBELET_DELAY + Duration::from_secs(3);
    {
        let _paused = crate::lifecycle::Paused::new(env.cp.pid("cainjector"));
        let _replacing = env.cp.start_extra(
            "cainjector",
            "cainjector-replacing",
            &["--feature-gates=CAInjectorMerging=false"],
        );
        // Its first pass replaces every bundle with the Secret's CA alone.
        wait_for(
            "the replacing cainjector to leave one CA per caBundle",
            Duration::from_secs(60),
            || {
                bundle_subjects_and_keys(env)
                    .iter()
                    .all(|b| b.len() == 1)
                    .then_some(())
            },
        );
        let replacing = naive_rotation(env, "e2e-ca-naive-replacing");
        report(
            "naive CA rotation, cainjector replacing (CAInjectorMerging=false)",
            &replacing,
        );
        readme_rotation(env, "replacing cainjector", wait);
    }
    // The suite's cainjector, resumed, works off what it missed while stopped (with a cache
    // from before, it may append a CA of then); then README's procedure with it.
    std::thread::sleep(Duration::from_secs(5));
    readme_rotation(env, "merging cainjector", wait);
    drop(kubelet);
    the_served_certificate_is_what_the_apiserver_trusts_now(env, Delivery::Volume);
}

/// Runs docs/certificates.md's "Rotating the CA" block as written, as a cluster admin, under
/// load (`RELOAD_WAIT` = `wait`): not one request may fail, and afterwards each caBundle holds
/// the serving Secret's (new) CA alone, still 3 s later, with the inject annotation back.
fn readme_rotation(env: &Env, what: &str, wait: Duration) {
    use base64::Engine;
    let block = crate::install::doc_block("docs/certificates.md", "## Rotating the CA");
    let path = format!(
        "{}:{}",
        common::k8s_tools().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let before = bundle_subjects_and_keys(env);
    let (out, load) = under_load(
        env,
        &format!("e2e-ca-safe-{}", what.split(' ').next().unwrap()),
        |_| {
            std::process::Command::new("bash")
                .args(["-euo", "pipefail", "-c", &block])
                .env("PATH", &path)
                .env("KUBECONFIG", &env.cp.kubeconfig)
                .env("RELOAD_WAIT", wait.as_secs().to_string())
                .current_dir(&env.cp.dir)
                .output()
                .unwrap()
        },
    );
    assert!(
        out.status.success(),
        "docs/certificates.md's rotation block failed:\n{block}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "    README's CA rotation ({what}, RELOAD_WAIT={}): {} requests admitted, {} failed",
        wait.as_secs(),
        load.admitted,
        load.failures.len()
    );
    assert!(
        load.failures.is_empty(),
        "failed during README's CA rotation ({what}): {:#?}",
        load.failures
    );
    assert!(load.admitted >= 30, "the load ran through the rotation");
    for target in crate::install::CA_BUNDLES {
        let obj = env.get_json(&[target.0, target.1]);
        assert_eq!(
            obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/etcd-webhook-serving"),
            "{} {}: the annotation is back",
            target.0,
            target.1
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let secret = env.get_json(&["-n", NAMESPACE, "secret", "etcd-webhook-tls"]);
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["ca.crt"].as_str().unwrap())
        .unwrap();
    let ca: Vec<Vec<u8>> = x509_parser::pem::Pem::iter_from_buffer(&ca_pem)
        .map(|p| p.unwrap().contents)
        .collect();
    let end = bundle_subjects_and_keys(env);
    assert!(
        end.iter().all(|b| *b == ca),
        "{what}: each caBundle holds the serving Secret's CA alone: {:?} CAs",
        end.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        before.iter().all(|b| !b.contains(&ca[0])),
        "{what}: a new CA"
    );
}
