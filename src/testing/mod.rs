//! What the unit tests and the integration tests share (feature `testing`, on in every test
//! build through the crate's dev-dependency on itself; never in the binary): the in-memory API
//! server and its transports. Nothing in `src/` outside this module, and nothing in the
//! binary, depends on it.

pub mod api_rules;
pub mod fake_api;
pub mod fake_etcd;
pub mod fake_etcds;
pub mod feed;
mod garbage;
pub mod mock;

pub use fake_api::FakeCore;
pub use fake_etcd::FakeEtcd;
pub use fake_etcds::FakeEtcds;
pub use mock::{Call, FakeApi, assert_granted, per_verb};

/// `http://etcd-1.etcd.prod.svc:2380` (or `https://`) -> `etcd-1`.
fn host_name(url: &str) -> &str {
    host_part(url, 0)
}

/// The `n`th dot-separated label of a URL's host.
fn host_part(url: &str, n: usize) -> &str {
    url.trim_start_matches("http://")
        .trim_start_matches("https://")
        .split('.')
        .nth(n)
        .unwrap_or_default()
}
