//! The loop's settings (its flags), and how long a client Secret read by name is used.

use std::time::Duration;

use crate::controller::decide::membership;
use crate::controller::render::RenderOptions;

/// The controller's settings (flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub render: RenderOptions,
    /// How long the finalizer waits for the final snapshot before giving up.
    pub finalizer_timeout: Duration,
    /// Periodic resync of a cluster with a member ready (ten times this with none).
    pub resync: Duration,
    /// Restrict to one namespace.
    pub namespace: Option<String>,
    /// This replica's name in Events (`reportingInstance`).
    pub instance: Option<String>,
    /// How long a member added to etcd may stay unstarted, and a started learner behind its
    /// leader, before it is removed.
    pub member_timeouts: membership::Timeouts,
    /// At most this many passes run at once (0: no bound).
    pub max_concurrent_reconciles: u16,
    /// After the stop signal, passes still running get this long to finish; then they are
    /// abandoned (dropped between two API calls; the next leader's pass starts over).
    pub stop_timeout: Duration,
    /// Keep TLS clusters' client Secrets in a watch cache (needs list and watch on Secrets)
    /// instead of reading each by name every [`CLIENT_SECRET_REFRESH`].
    pub cache_client_secrets: bool,
}

/// How long a TLS cluster's client Secret, read by name, is used before it is read again (and
/// at once after a pass no member answered): a renewed certificate (cert-manager renews 30 days
/// ahead) is picked up within this, at one GET per TLS cluster per period (1,000 TLS clusters:
/// 3.3 a second at most, against 33 a second for one GET per 30 s resync).
pub const CLIENT_SECRET_REFRESH: Duration = Duration::from_secs(300);

/// After a pass no member answered, a TLS cluster's client Secret is read again once it is this
/// old: a renewed certificate or a new CA is picked up within a minute, and a cluster whose
/// members stay out of reach costs one GET a minute (1,000 such clusters: 16.7 a second), not
/// one a pass.
pub const CLIENT_SECRET_REREAD: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Self {
        Self {
            render: RenderOptions::default(),
            finalizer_timeout: Duration::from_secs(600),
            resync: Duration::from_secs(30),
            namespace: None,
            instance: None,
            member_timeouts: membership::Timeouts::default(),
            max_concurrent_reconciles: 16,
            stop_timeout: Duration::from_secs(10),
            cache_client_secrets: false,
        }
    }
}
