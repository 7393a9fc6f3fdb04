//! The commands other than `serve`, each returning its exit code: the offline ones (`review`,
//! `convert`, `render`, `certs`) and the two that read a cluster once (`crd` with fewer
//! versions, `migrate-storage`).

use crate::cli::{
    CertsArgs, ConvertArgs, CrdArgs, MigrateStorageArgs, OutputFormat, RenderArgs, ReviewArgs,
};
use crate::{api, app, migrate, offline, tls};

/// Why a command that reads a cluster could not.
#[derive(Debug, thiserror::Error)]
enum ClusterError {
    #[error("{}", config_error(.0))]
    Config(#[from] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client: {}", causes(.0))]
    Client(#[from] kube::Error),
    #[error("{} (API server {server})", causes(.error))]
    Migrate {
        error: migrate::Error,
        server: String,
    },
    #[error(transparent)]
    App(#[from] app::Error),
}

/// An error and its causes as one line, each cause once (kube's errors repeat their source in
/// their own message, and the innermost one, "Connection refused", is the one a person needs).
fn causes(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = e.source();
    }
    out
}

/// Where the config was looked for and why none was usable, without kube's nested dump.
fn config_error(error: &kube::config::InferConfigError) -> String {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(e) = innermost.source() {
        innermost = e;
    }
    match std::env::var_os("KUBECONFIG") {
        Some(path) => format!(
            "cannot use the kubeconfig {} (from KUBECONFIG): {innermost}",
            path.to_string_lossy()
        ),
        None => format!(
            "no Kubernetes config: KUBECONFIG is not set, ~/.kube/config cannot be used \
             ({innermost}), and this is not a pod; set KUBECONFIG to a kubeconfig file"
        ),
    }
}

/// The client, and the API server it talks to (named in every error about it).
async fn client() -> Result<(kube::Client, String), ClusterError> {
    let config = kube::Config::infer().await?;
    let server = config.cluster_url.to_string();
    Ok((kube::Client::try_from(config)?, server))
}

/// Runs a migration step against the cluster, naming the server when it fails.
async fn against_cluster<T, F, Fut>(step: F) -> Result<T, ClusterError>
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, migrate::Error>>,
{
    let (client, server) = client().await?;
    step(client)
        .await
        .map_err(|error| ClusterError::Migrate { error, server })
}

/// `crd`: all versions served, offline; fewer only after checking that the cluster stores none
/// of the others (exit 1 when it may, 2 when it cannot tell).
pub fn crd(args: &CrdArgs) -> i32 {
    let served: Vec<api::Version> = args.served.iter().map(|&v| v.into()).collect();
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(app::install_namespace);
    let in_namespace = |crd| api::crd_in_namespace(crd, &namespace);
    let command = |flags: String| {
        if namespace == api::WEBHOOK_NAMESPACE {
            format!("etcd-webhook crd{flags}")
        } else {
            format!("etcd-webhook crd{flags} --namespace {namespace}")
        }
    };
    if api::Version::ALL.iter().all(|v| served.contains(v)) {
        print!(
            "{}",
            api::crd_document(&in_namespace(api::crd()), &command(String::new()))
        );
        return 0;
    }
    let crd = match migrate::crd_serving(&served) {
        Ok(crd) => in_namespace(crd),
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let names: Vec<&str> = served.iter().map(|v| v.as_str()).collect();
    if !args.offline {
        let check = against_cluster(migrate::stored_versions);
        let stored = match app::runtime()
            .map_err(ClusterError::from)
            .and_then(|rt| rt.block_on(check))
        {
            Ok(stored) => stored,
            Err(e) => {
                eprintln!(
                    "error: cannot read status.storedVersions of {} from the cluster: {e}\n\
                     (--offline prints the CRD without this check)",
                    migrate::CRD_NAME
                );
                return 2;
            }
        };
        match stored {
            None => tracing::info!(
                crd = migrate::CRD_NAME,
                "the CRD is not installed in this cluster: nothing is stored in any version"
            ),
            Some(stored) => {
                let left = migrate::still_stored(&stored, &served);
                if !left.is_empty() {
                    eprintln!(
                        "refusing to stop serving {}: status.storedVersions of {} is [{}], so \
                         objects may still be stored in {}. Run `etcd-webhook migrate-storage` \
                         first (see docs/versions.md, \"Retiring v1alpha1 and v1beta1\").",
                        left.join(", "),
                        migrate::CRD_NAME,
                        stored.join(", "),
                        left.join(", ")
                    );
                    return 1;
                }
            }
        }
    }
    print!(
        "{}",
        api::crd_document(&crd, &command(format!(" --served {}", names.join(","))))
    );
    0
}

/// `migrate-storage`: exit 0 when every object was rewritten, 1 when some could not be
/// (storedVersions left alone), 2 on any other error.
pub fn migrate_storage(args: &MigrateStorageArgs) -> i32 {
    let options = migrate::Options {
        dry_run: args.dry_run,
        concurrency: usize::from(args.concurrency),
    };
    let run = against_cluster(|client| {
        migrate::run(client, options, |done, total| {
            let step = (total / 20).max(10);
            if done % step == 0 || done == total {
                tracing::info!(done, total, "migrate-storage progress: {done}/{total}");
            }
        })
    });
    let report = match app::runtime()
        .map_err(ClusterError::from)
        .and_then(|rt| rt.block_on(run))
    {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match args.output {
        None => print!("{}", report.text()),
        Some(OutputFormat::Json) => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        ),
        Some(OutputFormat::Yaml) => print!(
            "{}",
            serde_yaml_ng::to_string(&report).expect("a report serializes")
        ),
    }
    if report.failed.is_empty() { 0 } else { 1 }
}

/// `review`: exit 0 when every document is allowed, 1 when any is denied, 2 on bad input.
pub fn review(args: &ReviewArgs) -> i32 {
    let run = || -> Result<bool, offline::OfflineError> {
        let input = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let old = match &args.old {
            Some(path) => offline::parse_documents(&offline::read_source(path)?, path)?.documents,
            None => Vec::new(),
        };
        let settings = crate::admission::Settings {
            default_storage_class: args.default_storage_class.clone(),
            default_member_tls: args.default_member_tls,
            storage_classes: None,
            secrets: None,
        };
        let decisions = offline::review(&input.documents, &old, args.strict, &settings)?;
        for d in &decisions {
            if d.allowed {
                eprintln!("{}: allowed", d.label);
            } else {
                eprintln!("{}: denied: {}", d.label, d.message);
            }
            for w in &d.warnings {
                eprintln!("{}: warning: {w}", d.label);
            }
        }
        if args.patch {
            for d in &decisions {
                println!("{}", d.patch);
            }
        } else {
            // Only what would be stored: a denied document prints nothing on stdout.
            let patched: Vec<_> = decisions
                .iter()
                .filter(|d| d.allowed)
                .map(|d| d.patched.clone())
                .collect();
            print!("{}", offline::render(&patched, false, input.list));
        }
        Ok(decisions.iter().all(|d| d.allowed))
    };
    match run() {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// `convert`: exit 0 on success, 2 on bad input (convert never denies).
pub fn convert(args: &ConvertArgs) -> i32 {
    print_or_fail((|| {
        let input = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let converted = offline::convert(&input.documents, args.to.into())?;
        Ok(offline::render(
            &converted,
            args.output == OutputFormat::Json,
            input.list,
        ))
    })())
}

/// `render`: exit 0 with the objects, 1 when a manifest is denied, 2 on bad input.
pub fn render(args: &RenderArgs) -> i32 {
    print_or_fail((|| {
        let input = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let (objects, warnings) = offline::objects(
            &input.documents,
            &(&args.images).into(),
            args.strict,
            &crate::admission::Settings {
                default_storage_class: args.default_storage_class.clone(),
                default_member_tls: args.default_member_tls,
                storage_classes: None,
                secrets: None,
            },
        )?;
        for w in warnings {
            eprintln!("{w}");
        }
        Ok(offline::render(
            &objects,
            args.output == OutputFormat::Json,
            input.list,
        ))
    })())
}

/// Prints the output of an offline command (exit 0), or the error (its exit code).
fn print_or_fail(result: Result<String, offline::OfflineError>) -> i32 {
    match result {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

/// `certs`: exit 0 with the files written, 2 when they cannot be.
pub fn certs(args: &CertsArgs) -> i32 {
    if !args.atomic && !args.force {
        let existing: Vec<_> = [tls::CA_FILE, tls::CERT_FILE, tls::KEY_FILE]
            .iter()
            .map(|f| args.out.join(f))
            .filter(|p| p.exists())
            .collect();
        if !existing.is_empty() {
            eprintln!(
                "error: {} already exist{}: pass --force to replace {} (a server reading {} \
                 picks up the new pair), or choose another --out",
                existing
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if existing.len() == 1 { "s" } else { "" },
                if existing.len() == 1 { "it" } else { "them" },
                args.out.display()
            );
            return 2;
        }
    }
    let written = tls::dev::generate(&args.dns, &args.ip, args.days).and_then(|certs| {
        if args.atomic {
            tls::dev::write_kubelet_layout(&args.out, &certs.files()).map(|_| ())
        } else {
            certs.write_plain(&args.out)
        }
    });
    match written {
        Ok(()) => {
            println!(
                "wrote {}, {} and {} to {}",
                tls::CA_FILE,
                tls::CERT_FILE,
                tls::KEY_FILE,
                args.out.display()
            );
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}
