//! `etcd-webhook`: parse the command line and dispatch; everything else is in the library
//! (`app` for `serve`, `commands` for the rest).

use clap::Parser;

use etcd_webhook::cli::{Cli, Command};
use etcd_webhook::{app, backup, commands};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The offline commands print results, not logs.
    let code = match &cli.command {
        Command::Review(args) => commands::review(args),
        Command::Convert(args) => commands::convert(args),
        Command::Render(args) => commands::render(args),
        _ => {
            // Before anything makes a TLS client (the trace exporter's, set up with the logs).
            rustls::crypto::ring::default_provider()
                .install_default()
                .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
            let log_writer = app::logging::init(&cli.log)?;
            let outcome = run(cli.command);
            // Every line logged so far reaches stderr before the process ends (the writer
            // thread flushes and stops here); an exit code is given only after that.
            drop(log_writer);
            outcome?
        }
    };
    match code {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

/// The commands that log: their exit code, or the error main reports.
fn run(command: Command) -> anyhow::Result<i32> {
    Ok(match command {
        Command::Crd(args) => commands::crd(&args),
        Command::MigrateStorage(args) => commands::migrate_storage(&args),
        Command::Certs(args) => commands::certs(&args),
        Command::Backup(args) => i32::from(app::runtime()?.block_on(backup::command(&args))),
        Command::FetchSnapshot(args) => {
            i32::from(app::runtime()?.block_on(backup::fetch_command(&args)))
        }
        Command::PlaceRestored(args) => i32::from(backup::place_command(&args)),
        Command::VerifySnapshot(args) => {
            i32::from(app::runtime()?.block_on(backup::verify_command(&args)))
        }
        Command::Serve(args) => {
            app::runtime()?.block_on(app::serve(*args))?;
            0
        }
        Command::Review(_) | Command::Convert(_) | Command::Render(_) => {
            unreachable!("handled in main")
        }
    })
}
