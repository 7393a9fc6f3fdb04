#![forbid(unsafe_code)]
//! etcd-webhook: admission and conversion webhooks for the EtcdCluster custom resource.

// Lets code shared with the integration tests (tests/common/fake_api.rs, compiled into both)
// name this crate the same way in both.
extern crate self as etcd_webhook;

pub mod admission;
pub mod api;
pub mod app;
pub mod cli;
pub mod commands;
pub mod controller;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod migrate;
pub mod offline;
pub mod server;
pub mod tls;
pub mod webhook;

/// Errors of the library; `main` wraps them with context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
