//! What a call to etcd could not do.

/// What a call to etcd could not do.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EtcdError {
    /// No answer (connection refused, timeout, bad HTTP): the member may be down, and a write
    /// may or may not have happened.
    #[error("{endpoint}: no answer: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// etcd answered and refused (e.g. `etcdserver: can only promote a learner member which is
    /// in sync with leader`).
    #[error("{endpoint}: etcd refused: {message}")]
    Refused { endpoint: String, message: String },
    /// An answer that is not what the gateway sends.
    #[error("{endpoint}: unexpected answer: {reason}")]
    Decode { endpoint: String, reason: String },
}
