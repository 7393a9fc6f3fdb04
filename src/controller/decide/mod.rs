//! The pure decisions: plain functions over typed values (no kube client, no etcd call, no
//! clock of their own), unit-tested without a network.

pub mod backup;
pub mod corruption;
pub mod exits;
pub mod maintenance;
pub mod members;
pub mod membership;
pub mod memory;
pub mod observation;
pub mod quorum;
pub mod recovery;
pub mod restoring;
pub mod status;
pub mod upgrade;
