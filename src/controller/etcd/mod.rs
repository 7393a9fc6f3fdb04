//! The talk to etcd: how the loop reaches the members (the v3 JSON gateway over HTTP/1.1,
//! `https://` with the cluster's client certificate for a TLS cluster, the default; no gRPC
//! stack, so the binary stays small, and every call the loop makes is on the gateway in every
//! release it admits), the calls themselves, and the I/O halves of the passes that talk to
//! etcd: the membership pass (member list, statuses, at most one membership call) and the
//! upkeep's run (compaction, defragmentation, disarm).

pub mod calls;
pub mod error;
pub mod gateway;
pub mod maintenance;
pub mod membership;

pub use calls::{Etcd, Listed};
pub use error::EtcdError;
pub use gateway::{CALL_TIMEOUT, ClientTls, Gateway, IDLE_CONNECTION_TIMEOUT, TlsError, Transport};
