#![forbid(unsafe_code)]
//! etcd-webhook: admission and conversion webhooks for the EtcdCluster custom resource.

pub mod admission;
pub mod api;
pub mod app;
pub mod backup;
pub mod cli;
pub mod commands;
pub mod controller;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod migrate;
pub mod offline;
pub mod otel;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
pub mod webhook;

/// Errors of the library; `main` wraps them with context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
