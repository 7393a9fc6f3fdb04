//! The pure decisions: plain functions over typed values (no kube client, no etcd call, no
//! clock of their own), unit-tested without a network.

pub mod maintenance;
pub mod membership;
pub mod status;
pub mod upgrade;
