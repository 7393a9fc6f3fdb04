#![forbid(unsafe_code)]
//! etcd-webhook: admission and conversion webhooks for the EtcdCluster custom resource.
//!
//! Without the `server` feature (on by default) the library is the decisions alone: `api`,
//! `admission` and the reviews' codec in `webhook` (decode, decide, encode), with none of the
//! server's, the loop's or the backups' dependencies; the fuzz targets build it that way.

pub mod admission;
pub mod api;
#[cfg(feature = "server")]
pub mod app;
#[cfg(feature = "server")]
pub mod backup;
#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
pub mod commands;
#[cfg(feature = "server")]
pub mod controller;
#[cfg(feature = "server")]
pub mod health;
#[cfg(feature = "server")]
pub mod listen;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod migrate;
#[cfg(feature = "server")]
pub mod offline;
#[cfg(feature = "server")]
pub mod otel;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "server")]
pub mod tls;
pub mod webhook;

/// Errors of the library; `main` wraps them with context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
