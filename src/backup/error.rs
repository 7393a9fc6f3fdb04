//! Why a backup, a fetch or a placement failed, and the exit code each step has.

use super::snapshot;

/// Why a backup failed; [`Error::step`] names the step for the loop's Warning Event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no healthy voter to take the snapshot from: {0}")]
    NoVoter(String),
    #[error("snapshot from {member}: {source}")]
    Snapshot {
        member: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("snapshot from {member} refused: {source}")]
    Corrupt {
        member: String,
        source: snapshot::StreamError,
    },
    #[error("{step} {uri}: {source}")]
    Store {
        step: &'static str,
        uri: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{0}")]
    Usage(String),
    #[error("the client certificate: {0}")]
    Tls(String),
    #[error("place the restored data: {0}")]
    Place(String),
    #[error("the restored etcd: {0}")]
    Sandbox(String),
}

impl Error {
    /// The step that failed, as the loop names it.
    pub fn step(&self) -> &'static str {
        match self {
            Error::NoVoter(_) => "choose a member",
            Error::Snapshot { .. } => "snapshot",
            Error::Corrupt { .. } => "verify",
            Error::Store { step, .. } => step,
            Error::Usage(_) => "arguments",
            Error::Tls(_) => "read the client certificate",
            Error::Place(_) => "place",
            Error::Sandbox(_) => "ask the restored etcd",
        }
    }

    /// The process's exit code: 1 etcd (the members, or a verification's restored etcd), 2
    /// arguments, 3 a corrupt snapshot, 4 the store, 5 the restored data cannot be placed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::NoVoter(_) | Error::Snapshot { .. } | Error::Sandbox(_) => 1,
            Error::Usage(_) | Error::Tls(_) => 2,
            Error::Corrupt { .. } => 3,
            Error::Store { .. } => 4,
            Error::Place(_) => 5,
        }
    }
}
