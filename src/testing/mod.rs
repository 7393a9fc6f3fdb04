//! What the unit tests and the integration tests share (feature `testing`, on in every test
//! build through the crate's dev-dependency on itself; never in the binary): the in-memory API
//! server and its transports. Nothing in `src/` outside this module, and nothing in the
//! binary, depends on it.

pub mod api_rules;
pub mod fake_api;
pub mod fake_etcd;
pub mod fake_etcds;
mod garbage;
pub mod mock;

pub use fake_api::FakeCore;
pub use fake_etcd::FakeEtcd;
pub use fake_etcds::FakeEtcds;
pub use mock::{Call, FakeApi, assert_granted, per_verb};
