//! The live pass and its per-feature shells: each reads through the loop's caches, asks a
//! decision of `decide` or a rendering of `render`, and writes what it says.

pub(crate) mod backup;
pub mod certificates;
pub(crate) mod claims;
pub(crate) mod deletion;
pub(crate) mod live;
pub(crate) mod maintenance;
pub(crate) mod members;
pub(crate) mod reconcile;
pub(crate) mod rescue;
pub(crate) mod restore;
pub(crate) mod scale;
pub(crate) mod storage;
pub(crate) mod upgrade;
