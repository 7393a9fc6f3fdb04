//! Logs: text on a terminal, JSON lines otherwise, through a writer thread.

use std::io::IsTerminal;

use crate::cli::{LogArgs, LogFormat};

/// A `--log-level` that is not a filter.
#[derive(Debug, thiserror::Error)]
#[error("bad --log-level {filter:?}: {error}")]
pub struct BadFilter {
    filter: String,
    error: tracing_subscriber::filter::ParseError,
}

/// Logs go to stderr through a writer thread: a request only formats its line and hands it over
/// (no `write` on the request path), and the thread writes whatever has queued up in one
/// `write` per batch. Nothing is dropped: with the queue full, logging waits (lossy off). The
/// returned guard flushes and stops the thread when dropped.
pub fn init(args: &LogArgs) -> Result<tracing_appender::non_blocking::WorkerGuard, BadFilter> {
    let filter =
        tracing_subscriber::EnvFilter::try_new(&args.log_level).map_err(|error| BadFilter {
            filter: args.log_level.clone(),
            error,
        })?;
    let json = match args.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(512)
        .thread_name("log-writer")
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stderr(),
        ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    Ok(guard)
}
