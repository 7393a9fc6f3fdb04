//! Passes take turns in the order they became due.
//!
//! kube-runtime bounds concurrency itself, but once its bound is reached the requests that fall
//! due wait in a hash set and the next one is picked in hash order: when more passes fall due
//! than the loop can run (5,000 clusters on one replica), the clusters early in that order run
//! again and again while the late ones never get a first pass (the e2e 5,000-cluster run left
//! 550 clusters without a finalizer after 111,155 passes). So the controller runs without a
//! bound of its own and every pass first waits here, on a fair (first come, first served)
//! semaphore: overload makes every cluster wait longer, it never leaves one out.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// At most `bound` passes run at once; the rest wait in arrival order.
pub struct Turns {
    permits: Semaphore,
    metrics: Arc<Metrics>,
}

/// A pass's turn: held while it runs.
pub struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
}

impl Turns {
    /// `bound` passes at once (0: no bound).
    pub fn new(bound: u16, metrics: Arc<Metrics>) -> Self {
        let n = if bound == 0 {
            Semaphore::MAX_PERMITS
        } else {
            usize::from(bound)
        };
        Self {
            permits: Semaphore::new(n),
            metrics,
        }
    }

    /// Waits for a turn; `None` once `stop` is cancelled (the pass is not run: stopping takes
    /// no new work).
    pub async fn wait(&self, stop: &CancellationToken) -> Option<Turn<'_>> {
        if stop.is_cancelled() {
            return None;
        }
        let since = Instant::now();
        self.metrics.reconciles_waiting.inc();
        let permit = tokio::select! {
            biased;
            () = stop.cancelled() => None,
            permit = self.permits.acquire() => permit.ok(),
        };
        self.metrics.reconciles_waiting.dec();
        let permit = permit?;
        self.metrics
            .reconcile_wait
            .observe(since.elapsed().as_secs_f64());
        Some(Turn { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Turns go in the order they were asked for, whatever the waiters are.
    #[tokio::test]
    async fn waiters_run_in_arrival_order_and_at_most_bound_at_once() {
        let turns = Arc::new(Turns::new(1, Arc::new(Metrics::new())));
        let stop = CancellationToken::new();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let first = turns.wait(&stop).await.expect("free");
        let mut waiters = Vec::new();
        // Names whose hashes are in no particular order.
        for name in ["zeta", "alpha", "mu", "beta", "omega", "kappa"] {
            let (turns, stop, order) = (turns.clone(), stop.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.wait(&stop).await.expect("not stopped");
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }));
            // Each is queued before the next one asks.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(turns.metrics.reconciles_waiting.get(), 6);
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["zeta", "alpha", "mu", "beta", "omega", "kappa"]
        );
        assert_eq!(turns.metrics.reconciles_waiting.get(), 0);
    }

    #[tokio::test]
    async fn a_stop_ends_the_wait_without_a_turn() {
        let turns = Arc::new(Turns::new(1, Arc::new(Metrics::new())));
        let stop = CancellationToken::new();
        let held = turns.wait(&stop).await.expect("free");
        let waiter = {
            let (turns, stop) = (turns.clone(), stop.clone());
            tokio::spawn(async move { turns.wait(&stop).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        stop.cancel();
        assert!(!waiter.await.unwrap(), "no turn after the stop");
        drop(held);
        assert!(turns.wait(&stop).await.is_none(), "nor for a late asker");
        assert_eq!(turns.metrics.reconciles_waiting.get(), 0);
    }

    #[tokio::test]
    async fn no_bound_never_waits() {
        let turns = Turns::new(0, Arc::new(Metrics::new()));
        let stop = CancellationToken::new();
        let held: Vec<_> = futures_util::future::join_all((0..100).map(|_| turns.wait(&stop)))
            .await
            .into_iter()
            .map(|t| t.expect("a turn"))
            .collect();
        assert_eq!(held.len(), 100);
    }
}
