//! The slim reconcile loop: each v1 EtcdCluster becomes a headless and a client Service, a
//! StatefulSet, a PodDisruptionBudget, a members' ConfigMap and (with backups) a CronJob,
//! applied server-side with the field manager `etcd-webhook`, plus a status and Events; etcd's
//! own membership is changed through its API, one call at a time.
//!
//! The rooms, each importing only the rooms above it (docs/architecture.md has the table, and
//! `tests/layers.rs` holds it):
//!
//! - [`render`] (pure): the desired objects, names and URLs.
//! - [`decide`] (pure): the decisions, plain functions over typed values: the membership plan,
//!   the upgrade order, the upkeep plan, the status, what a backup run recorded.
//! - [`etcd`]: the talk to etcd: the gateway client, the calls, and the I/O halves of the
//!   membership pass and of the upkeep (defragmentation, NOSPACE recovery).
//! - [`machinery`]: the loop's machinery: the shared context and settings, the caches of owned
//!   objects, turns, the client-side request limit, the leader Lease, the finalizer, status
//!   writes, the per-cluster metric series, the RBAC table.
//! - [`lookups`]: what every replica looks up for `/validate` and the Jobs.
//! - [`pass`]: the pass itself (`pass::reconcile`) and its per-feature shells: the live pass,
//!   scale, upgrade, storage growth, upkeep, backups, restore, certificates, claims, deletion.
//! - `run`: the watches and the controller that runs the passes.
//!
//! A pass with nothing to change makes no API call: children are read from the caches the
//! controller's watches fill ([`Caches`]), and applied only when they lack something the
//! rendering says.

pub mod decide;
pub mod etcd;
pub mod lookups;
pub mod machinery;
pub mod pass;
pub mod render;
mod run;

pub use crate::api::MANAGER;
pub use machinery::caches::{Cached, Caches, Child, slim_meta};
pub use machinery::children::{Applied, MANAGED_SELECTOR, includes};
pub use machinery::context::{Context, EVENT_NOTE_MAX, cut_note};
pub use machinery::error::Error;
pub use machinery::finalizer::{CLAIM_FINALIZER, FINALIZER, RELEASE_ANNOTATION};
pub use machinery::rbac::{LEADER_RBAC_RULES, RBAC_RULES};
pub use machinery::settings::{CLIENT_SECRET_REFRESH, CLIENT_SECRET_REREAD, Settings};
pub use pass::reconcile::{backoff, error_policy, reconcile};
pub use run::{run, run_with_etcd};

#[cfg(test)]
mod tests;
