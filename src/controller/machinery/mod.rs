//! The loop's machinery: the shared context, the caches of owned objects, turns, request
//! limits, the leader Lease, the finalizer and the status writes.

pub(crate) mod caches;
pub(crate) mod children;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod finalizer;
pub mod leader;
pub mod rbac;
pub(crate) mod series;
pub(crate) mod settings;
pub(crate) mod status_writer;
pub mod throttle;
pub(crate) mod turns;
