//! Passes take turns in the order they became due.
//!
//! kube-runtime bounds concurrency itself, but once its bound is reached the requests that fall
//! due wait in a hash set and the next one is picked in hash order: when more passes fall due
//! than the loop can run (5,000 clusters on one replica), the clusters early in that order run
//! again and again while the late ones never get a first pass (the e2e 5,000-cluster run left
//! 550 clusters without a finalizer after 111,155 passes). So the controller runs without a
//! bound of its own and every pass first waits here, on a fair (first come, first served)
//! semaphore: overload makes every cluster wait longer, it never leaves one out.
//!
//! A pass that waits on etcd for long (a defragmentation, a physical compaction: seconds to
//! minutes on a large database) does it [`outside`] its turn, so that the other clusters' passes
//! run meanwhile; kube-runtime never runs two passes of one cluster at once, so nothing else
//! touches that cluster while it waits.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// At most `bound` passes run at once; the rest wait in arrival order.
pub struct Turns {
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

/// A pass's turn: held while it runs.
pub struct Turn {
    permit: OwnedSemaphorePermit,
}

/// The turn of the pass running in this task, for [`outside`].
struct Held {
    turns: Arc<Turns>,
    stop: CancellationToken,
    permit: Option<OwnedSemaphorePermit>,
}

tokio::task_local! {
    static HELD: RefCell<Held>;
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
            permits: Arc::new(Semaphore::new(n)),
            metrics,
        }
    }

    /// Waits for a turn; `None` once `stop` is cancelled (the pass is not run: stopping takes
    /// no new work).
    pub async fn wait(&self, stop: &CancellationToken) -> Option<Turn> {
        if stop.is_cancelled() {
            return None;
        }
        let since = Instant::now();
        self.metrics.reconciles_waiting.inc();
        let permit = tokio::select! {
            biased;
            () = stop.cancelled() => None,
            permit = self.permits.clone().acquire_owned() => permit.ok(),
        };
        self.metrics.reconciles_waiting.dec();
        let permit = permit?;
        self.metrics
            .reconcile_wait
            .observe(since.elapsed().as_secs_f64());
        Some(Turn { permit })
    }

    /// Runs `pass` in `turn` (taken with [`Turns::wait`]): the pass may step out of it with
    /// [`outside`].
    pub async fn run<P: Future>(
        self: &Arc<Self>,
        turn: Turn,
        stop: &CancellationToken,
        pass: P,
    ) -> P::Output {
        let held = Held {
            turns: self.clone(),
            stop: stop.clone(),
            permit: Some(turn.permit),
        };
        // Boxed: thousands of passes may wait for a turn at once, and a waiting one should not
        // be as large as a running one.
        Box::pin(HELD.scope(RefCell::new(held), pass)).await
    }
}

/// Runs `wait` (a long call to etcd) without the turn of the pass this task runs, then takes a
/// turn again, at the back of the queue as a pass that fell due now would: a cluster that
/// defragments a large database no longer keeps every other cluster's pass waiting. Once the
/// loop is stopping no new turn is taken (the pass finishes within the stop timeout, as one
/// that was running). Outside a pass run by [`Turns::run`] (a test calling the reconcile
/// directly), it is just `wait`.
pub async fn outside<F: Future>(wait: F) -> F::Output {
    let given_back = HELD
        .try_with(|held| {
            let mut held = held.borrow_mut();
            let permit = held.permit.take()?;
            Some((held.turns.clone(), held.stop.clone(), permit))
        })
        .ok()
        .flatten();
    let Some((turns, stop, permit)) = given_back else {
        return wait.await;
    };
    drop(permit);
    turns.metrics.reconciles_outside_turn.inc();
    let out = wait.await;
    turns.metrics.reconciles_outside_turn.dec();
    if let Some(turn) = turns.wait(&stop).await {
        let _ = HELD.try_with(|held| held.borrow_mut().permit = Some(turn.permit));
    }
    out
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

    /// A pass that waits on etcd outside its turn lets another run meanwhile, and takes a turn
    /// again (behind the one that got it) before it goes on; outside a pass it is a plain wait.
    #[tokio::test]
    async fn a_pass_waiting_outside_its_turn_lets_another_run() {
        let turns = Arc::new(Turns::new(1, Arc::new(Metrics::new())));
        let stop = CancellationToken::new();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (etcd_answers, answer) = tokio::sync::oneshot::channel::<()>();
        let long = {
            let (turns, stop, order) = (turns.clone(), stop.clone(), order.clone());
            tokio::spawn(async move {
                let turn = turns.wait(&stop).await?;
                turns
                    .run(turn, &stop, async {
                        order.lock().unwrap().push("long starts");
                        outside(answer).await.unwrap();
                        order.lock().unwrap().push("long goes on");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        order.lock().unwrap().push("long ends");
                    })
                    .await;
                Some(())
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let other = tokio::time::timeout(Duration::from_secs(5), turns.wait(&stop))
            .await
            .expect("a turn while the long pass waits on etcd")
            .expect("not stopping");
        assert_eq!(turns.metrics.reconciles_outside_turn.get(), 1);
        etcd_answers.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The answer came, but the turn is taken: the long pass waits for it.
        assert_eq!(*order.lock().unwrap(), ["long starts"]);
        assert_eq!(turns.metrics.reconciles_waiting.get(), 1);
        order.lock().unwrap().push("other ends");
        drop(other);
        long.await.unwrap().expect("run");
        assert_eq!(
            *order.lock().unwrap(),
            ["long starts", "other ends", "long goes on", "long ends"]
        );
        assert_eq!(turns.metrics.reconciles_outside_turn.get(), 0);
        // Not in a pass: just the wait.
        assert_eq!(outside(async { 7 }).await, 7);
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
