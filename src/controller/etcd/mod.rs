//! The talk to etcd: the v3 JSON gateway and the calls the passes make.

pub mod calls;

pub use calls::*;
