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

/// A trace exporter that could not be made from its settings.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {error}")]
pub struct BadExporter {
    endpoint: String,
    error: opentelemetry_otlp::ExporterBuildError,
}

/// What [`init`] started: dropped at exit, it flushes the logs and the spans not yet sent.
pub struct Logging {
    _writer: tracing_appender::non_blocking::WorkerGuard,
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Logging {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take()
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "could not send the last spans");
        }
    }
}

/// Where traces go, if anywhere: `--otlp-endpoint` (a base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is), else the standard variables, which the exporter reads itself. `None`: tracing is off.
fn trace_endpoint(args: &LogArgs) -> Option<Option<String>> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    match &args.otlp_endpoint {
        Some(url) => Some(Some(format!("{}/v1/traces", url.trim_end_matches('/')))),
        None if env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
            || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() =>
        {
            Some(None)
        }
        None => None,
    }
}

/// The tracer provider: a batch of spans sent every few seconds (`OTEL_BSP_*`) from a thread of
/// its own, so a slow or absent collector never holds up a request.
fn tracer_provider(
    endpoint: Option<String>,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, BadExporter> {
    use opentelemetry_otlp::WithExportConfig;
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
    if let Some(url) = &endpoint {
        builder = builder.with_endpoint(url.clone());
    }
    let exporter = builder.build().map_err(|error| BadExporter {
        endpoint: endpoint.unwrap_or_else(|| "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned()),
        error,
    })?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(crate::api::MANAGER);
    }
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// A bad `--log-level` or trace exporter setting.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Filter(#[from] BadFilter),
    #[error(transparent)]
    Exporter(#[from] BadExporter),
}

/// Logs go to stderr through a writer thread: a request only formats its line and hands it over
/// (no `write` on the request path), and the thread writes whatever has queued up in one
/// `write` per batch. Nothing is dropped: with the queue full, logging waits (lossy off).
/// Traces (spans of the target [`crate::otel::TARGET`], never logged) go to the OTLP exporter
/// when one is configured; with none, nothing wants them and they are never made. The returned
/// guard flushes both and stops the writer thread when dropped.
pub fn init(args: &LogArgs) -> Result<Logging, InitError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, filter};

    // The log filter as given, with the trace spans kept out of the log lines.
    let directives = format!("{},{}=off", args.log_level, crate::otel::TARGET);
    let filter =
        tracing_subscriber::EnvFilter::try_new(&directives).map_err(|error| BadFilter {
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
    let endpoint = trace_endpoint(args);
    let traces = endpoint.clone().map(tracer_provider).transpose()?;
    match &traces {
        // No exporter: the subscriber the logs always had, one global filter (no per-layer
        // filter bookkeeping on each logged line), which also turns the trace spans off.
        None => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(writer);
            if json {
                builder.json().flatten_event(true).init();
            } else {
                builder.init();
            }
        }
        // An exporter: the log layer keeps its filter, the OTLP layer takes the trace spans.
        Some(provider) => {
            use opentelemetry::trace::TracerProvider;
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            let otel = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(crate::api::MANAGER))
                .with_filter(filter::filter_fn(|m| m.target() == crate::otel::TARGET));
            let fmt = tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(writer);
            let fmt = if json {
                fmt.json().flatten_event(true).with_filter(filter).boxed()
            } else {
                fmt.with_filter(filter).boxed()
            };
            tracing_subscriber::registry().with(fmt).with(otel).init();
        }
    }
    if let Some(endpoint) = endpoint {
        tracing::info!(
            endpoint = endpoint.as_deref().unwrap_or("from OTEL_EXPORTER_OTLP_*"),
            "exporting traces over OTLP/HTTP"
        );
    }
    Ok(Logging {
        _writer: guard,
        traces,
    })
}
