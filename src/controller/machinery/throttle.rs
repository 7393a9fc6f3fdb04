//! The loop's manners towards the API server: a client-side limit on requests per second with
//! a burst (what client-go's `QPS` and `Burst` are to a controller-runtime manager, which sets
//! 20 and 30), and the API server's own limit honoured: an answer 429 (API Priority and
//! Fairness) or 5xx that carries `Retry-After` is waited out and the request sent again, as
//! client-go does (at most [`MAX_RETRIES`] times, and only a request whose body can be sent
//! again). Every answer is counted by verb and code, and the time spent waiting for the
//! client-side limit is a histogram, so a scale run can tell which limit it met.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{self, Request, Response};
use futures_util::future::BoxFuture;
use kube::client::Body;
use tokio::time::Instant;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::metrics::{KubeRequestLabels, Metrics};

/// client-go's `maxRetries` for an answer with Retry-After.
pub const MAX_RETRIES: u32 = 10;
/// The longest Retry-After obeyed; a longer one is waited for this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Requests per second and the burst above it; `qps` 0 turns the client-side limit off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub qps: f64,
    pub burst: u32,
}

impl Default for Limits {
    /// controller-runtime's defaults for a manager's client.
    fn default() -> Self {
        Limits {
            qps: 20.0,
            burst: 30,
        }
    }
}

/// A token bucket kept as a schedule (GCRA): each request takes, in the order it arrives, the
/// next time the bucket has a token, so no request overtakes another and a waiting request
/// holds nothing but its own timer.
#[derive(Debug)]
pub struct Bucket {
    /// Time per token.
    interval: Duration,
    /// How far ahead of the schedule a burst may run: `burst - 1` tokens.
    slack: Duration,
    /// When the bucket is next empty of the requests already let through (the theoretical
    /// arrival time of the next request at the steady rate).
    next: Mutex<Option<Instant>>,
}

impl Bucket {
    /// `None` when `limits` sets no limit.
    pub fn new(limits: Limits) -> Option<Self> {
        if limits.qps.is_nan() || limits.qps <= 0.0 {
            return None;
        }
        let interval = Duration::from_secs_f64(1.0 / limits.qps);
        Some(Bucket {
            interval,
            slack: interval * limits.burst.max(1).saturating_sub(1),
            next: Mutex::new(None),
        })
    }

    /// Takes the next token at `now`: how long the request must wait for it.
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut next = self.next.lock().expect("not poisoned");
        let at = next.map_or(now, |n| n.max(now));
        *next = Some(at + self.interval);
        (at.checked_sub(self.slack).unwrap_or(now)).saturating_duration_since(now)
    }
}

/// How a request is counted: its method, and `WATCH` for a watch.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match request.method().as_str() {
        "GET" if watch => "WATCH",
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        _ => "OTHER",
    }
}

/// How long an answer asks to wait before the request is sent again: `Retry-After` in seconds
/// on a 429 or a 5xx (client-go's rule: no header, no retry), at most [`MAX_RETRY_AFTER`].
pub fn retry_after<B>(response: &Response<B>) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && !(500..600).contains(&status) {
        return None;
    }
    let secs: u64 = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// The layer a loop's [`kube::Client`] is built with ([`kube::client::ClientBuilder::with_layer`]).
#[derive(Clone)]
pub struct ThrottleLayer {
    bucket: Option<Arc<Bucket>>,
    metrics: Arc<Metrics>,
}

impl ThrottleLayer {
    pub fn new(limits: Limits, metrics: Arc<Metrics>) -> Self {
        ThrottleLayer {
            bucket: Bucket::new(limits).map(Arc::new),
            metrics,
        }
    }
}

impl<S, B> Layer<S> for ThrottleLayer
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = Throttle<Buffer<Request<Body>, S::Future>>;

    /// Must run on a Tokio runtime: the inner stack gets a [`Buffer`] (a task), so a retry can
    /// send again through it.
    fn layer(&self, inner: S) -> Self::Service {
        Throttle {
            inner: Buffer::new(inner, 1024),
            bucket: self.bucket.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`ThrottleLayer`] makes.
#[derive(Clone)]
pub struct Throttle<S> {
    inner: S,
    bucket: Option<Arc<Bucket>>,
    metrics: Arc<Metrics>,
}

impl<S, B> Service<Request<Body>> for Throttle<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited per attempt, in the future, on a clone of the buffer.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (inner, bucket, metrics) = (
            self.inner.clone(),
            self.bucket.clone(),
            self.metrics.clone(),
        );
        Box::pin(send(inner, bucket, metrics, request))
    }
}

/// One request: wait for a token, send, and while the answer asks for it (and the body can be
/// sent again), wait its Retry-After and send again.
async fn send<S, B>(
    inner: S,
    bucket: Option<Arc<Bucket>>,
    metrics: Arc<Metrics>,
    mut request: Request<Body>,
) -> Result<Response<B>, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError> + Clone,
{
    let verb = verb(&request);
    let mut retries = 0;
    loop {
        if let Some(bucket) = &bucket {
            let wait = bucket.reserve(Instant::now());
            metrics.kube_api_rate_limit_wait.observe(wait.as_secs_f64());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let again = (retries < MAX_RETRIES).then(|| copy(&request)).flatten();
        let result = inner.clone().oneshot(request).await;
        let code = match &result {
            Ok(response) => response.status().as_str().to_owned(),
            Err(_) => "error".to_owned(),
        };
        metrics
            .kube_api_requests
            .get_or_create(&KubeRequestLabels { verb, code })
            .inc();
        let response = result?;
        match (retry_after(&response), again) {
            (Some(wait), Some(next)) => {
                tracing::debug!(verb, status = response.status().as_u16(), ?wait, uri = %next.uri(), "the API server asks to retry later");
                retries += 1;
                tokio::time::sleep(wait).await;
                request = next;
            }
            _ => return Ok(response),
        }
    }
}

/// The request again, when its body can be sent twice (bytes, not a stream).
fn copy(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut out = Request::new(body);
    *out.method_mut() = request.method().clone();
    *out.uri_mut() = request.uri().clone();
    *out.version_mut() = request.version();
    *out.headers_mut() = request.headers().clone();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        let bucket = Bucket::new(Limits {
            qps: 10.0,
            burst: 3,
        })
        .unwrap();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..6).map(|_| bucket.reserve(t0)).collect();
        assert_eq!(waits, [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]);
        // After a quiet second the bucket is full again.
        let later = t0 + Duration::from_secs(2);
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve(later)).collect();
        assert_eq!(waits, [ms(0), ms(0), ms(0), ms(100)]);
    }

    #[test]
    fn a_steady_rate_at_the_limit_never_waits() {
        let bucket = Bucket::new(Limits {
            qps: 20.0,
            burst: 1,
        })
        .unwrap();
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                bucket.reserve(t0 + ms(50) * i),
                Duration::ZERO,
                "request {i}"
            );
        }
        assert_eq!(bucket.reserve(t0 + ms(50) * 99 + ms(10)), ms(40));
    }

    #[test]
    fn qps_zero_is_no_limit() {
        assert!(
            Bucket::new(Limits {
                qps: 0.0,
                burst: 30
            })
            .is_none()
        );
        assert!(
            Bucket::new(Limits {
                qps: f64::NAN,
                burst: 30
            })
            .is_none()
        );
    }

    #[test]
    fn retry_after_only_on_429_and_5xx_with_the_header() {
        let answer = |code: u16, header: Option<&str>| {
            let mut r = Response::builder().status(code);
            if let Some(h) = header {
                r = r.header("Retry-After", h);
            }
            r.body(()).unwrap()
        };
        assert_eq!(
            retry_after(&answer(429, Some("2"))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&answer(503, Some("1"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(&answer(429, Some("3600"))),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(retry_after(&answer(429, None)), None);
        assert_eq!(retry_after(&answer(429, Some("soon"))), None);
        assert_eq!(retry_after(&answer(409, Some("1"))), None);
        assert_eq!(retry_after(&answer(200, Some("1"))), None);
    }

    #[test]
    fn verbs() {
        let req = |m: &str, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        assert_eq!(
            verb(&req("GET", "/api/v1/pods?watch=true&resourceVersion=1")),
            "WATCH"
        );
        assert_eq!(verb(&req("GET", "/api/v1/pods?labelSelector=a")), "GET");
        assert_eq!(verb(&req("PATCH", "/api/v1/namespaces/a/pods/b")), "PATCH");
    }

    /// A server that answers 429 with Retry-After `throttled` times, then 200; counts calls.
    fn server(
        throttled: usize,
        calls: Arc<AtomicUsize>,
    ) -> tower::util::BoxService<Request<Body>, Response<Body>, BoxError> {
        tower::util::BoxService::new(tower::service_fn(move |request: Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let body = request.into_body().collect_bytes().await.unwrap();
                assert_eq!(&body[..], b"{\"a\":1}", "the body is sent again intact");
                let answer = if n < throttled {
                    Response::builder()
                        .status(429)
                        .header("Retry-After", "1")
                        .body(Body::empty())
                } else {
                    Response::builder().status(200).body(Body::empty())
                };
                Ok::<_, BoxError>(answer.unwrap())
            }
        }))
    }

    fn post() -> Request<Body> {
        Request::builder()
            .method("POST")
            .uri("/api/v1/namespaces/a/configmaps")
            .body(Body::from(b"{\"a\":1}".to_vec()))
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_is_waited_out_and_sent_again() {
        let metrics = Arc::new(Metrics::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = ThrottleLayer::new(Limits { qps: 0.0, burst: 1 }, metrics.clone());
        let mut service = layer.layer(server(2, calls.clone()));
        let started = Instant::now();
        let response = service.ready().await.unwrap().call(post()).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(
            started.elapsed().as_secs(),
            2,
            "two Retry-After: 1 waited out"
        );
        let text = metrics.encode();
        assert!(
            text.contains("etcd_webhook_kube_api_requests_total{verb=\"POST\",code=\"429\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("etcd_webhook_kube_api_requests_total{verb=\"POST\",code=\"200\"} 1"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_after_ten_and_the_429_is_returned() {
        let metrics = Arc::new(Metrics::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = ThrottleLayer::new(Limits::default(), metrics);
        let mut service = layer.layer(server(usize::MAX, calls.clone()));
        let response = service.ready().await.unwrap().call(post()).await.unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(calls.load(Ordering::SeqCst), 1 + MAX_RETRIES as usize);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_the_rate() {
        let metrics = Arc::new(Metrics::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = ThrottleLayer::new(Limits { qps: 5.0, burst: 2 }, metrics.clone());
        let service = layer.layer(server(0, calls.clone()));
        let started = Instant::now();
        let all = (0..6).map(|_| service.clone().oneshot(post()));
        for response in futures_util::future::join_all(all).await {
            assert_eq!(response.unwrap().status(), 200);
        }
        // Two at once, then one every 200 ms: the sixth at 800 ms.
        assert_eq!(started.elapsed(), ms(800));
        assert!(
            metrics
                .encode()
                .contains("etcd_webhook_kube_api_rate_limit_wait_seconds_count 6")
        );
    }
}
