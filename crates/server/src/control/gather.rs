//! Writes that launches running side by side make together: while one batch is in the
//! database, the requests that arrive gather into the next, which goes as soon as the first
//! returns (group commit, as Postgres does with its own commits). One launch alone waits no
//! longer than it would writing by itself; eight at once wait for one round trip, not eight,
//! and the database commits once.

use std::future::Future;

use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use trainyard_core::{Error, Result};

/// The most requests one batch takes (one statement's arrays).
const BATCH_MAX: usize = 256;

/// Requests of type `Q` written in batches by one background task, each answered with its own
/// `Result<A>`.
pub(crate) struct Gather<Q, A> {
    requests: mpsc::UnboundedSender<(Q, oneshot::Sender<Result<A>>)>,
}

impl<Q: Send + 'static, A: Send + 'static> Gather<Q, A> {
    /// Starts the task that writes each batch with `write`, which answers every request of the
    /// batch, in order. The task ends when the `Gather` is dropped.
    pub(crate) fn new<F, Fut>(what: &'static str, write: F) -> Gather<Q, A>
    where
        F: Fn(Vec<Q>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<A>>> + Send + 'static,
    {
        let (requests, mut incoming) = mpsc::unbounded_channel::<(Q, oneshot::Sender<Result<A>>)>();
        tokio::spawn(async move {
            while let Some(first) = incoming.recv().await {
                let mut batch = vec![first];
                while batch.len() < BATCH_MAX {
                    match incoming.try_recv() {
                        Ok(request) => batch.push(request),
                        Err(_) => break,
                    }
                }
                let (questions, replies): (Vec<Q>, Vec<_>) = batch.into_iter().unzip();
                let asked = replies.len();
                // A panic fails this batch's askers, not the writer: the next batch goes on.
                let answers =
                    std::panic::AssertUnwindSafe(write(questions)).catch_unwind().await.unwrap_or_else(|_| {
                        tracing::error!(what, requests = asked, "a batched write panicked");
                        Vec::new()
                    });
                let mut answers = answers.into_iter();
                for reply in replies {
                    let answer = answers.next().unwrap_or_else(|| {
                        Err(Error::internal(format!(
                            "{what}: no answer for this request (its batch of {asked} failed)"
                        )))
                    });
                    // The asker may have gone (its launch aborted): nothing to tell it.
                    let _ = reply.send(answer);
                }
            }
        });
        Gather { requests }
    }

    /// Writes `request` with the next batch and returns its answer.
    pub(crate) async fn ask(&self, request: Q) -> Result<A> {
        let (reply, answer) = oneshot::channel();
        self.requests.send((request, reply)).map_err(|_| Error::internal("the batch writer has stopped"))?;
        answer.await.map_err(|_| Error::internal("the batch writer stopped before answering"))?
    }
}

/// Writes `batch` with `all` in one go; if that is refused for any reason but a lost
/// leadership, writes each request alone with `each`, so that one request the database refuses
/// fails alone.
pub(crate) async fn all_or_each<Q, A, FA, FutA, FE, FutE>(batch: Vec<Q>, all: FA, each: FE) -> Vec<Result<A>>
where
    Q: Clone,
    FA: FnOnce(Vec<Q>) -> FutA,
    FutA: Future<Output = Result<Vec<A>>>,
    FE: Fn(Q) -> FutE,
    FutE: Future<Output = Result<A>>,
{
    match all(batch.clone()).await {
        Ok(answers) => answers.into_iter().map(Ok).collect(),
        Err(Error::Fenced(why)) => batch.iter().map(|_| Err(Error::Fenced(why.clone()))).collect(),
        Err(err) if batch.len() == 1 => vec![Err(err)],
        Err(err) => {
            tracing::warn!(%err, requests = batch.len(), "a batched write was refused; writing each alone");
            let mut answers = Vec::with_capacity(batch.len());
            for request in batch {
                answers.push(each(request).await);
            }
            answers
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Requests made while a batch is being written go together in the next one, and each
    /// asker gets its own answer.
    #[tokio::test]
    async fn requests_made_while_a_batch_is_written_gather_into_the_next() {
        let batches: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let (release, released) = tokio::sync::watch::channel(false);
        let seen = Arc::clone(&batches);
        let gather = Arc::new(Gather::new("test", move |batch: Vec<u32>| {
            seen.lock().unwrap().push(batch.clone());
            let mut released = released.clone();
            async move {
                // The first batch waits until the test lets it go.
                let _ = released.wait_for(|go| *go).await;
                batch.into_iter().map(|n| if n == 7 { Err(Error::internal("seven")) } else { Ok(n * 10) }).collect()
            }
        }));
        let first = tokio::spawn({
            let gather = Arc::clone(&gather);
            async move { gather.ask(1).await }
        });
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let more: Vec<_> = [2, 7, 3]
            .into_iter()
            .map(|n| {
                let gather = Arc::clone(&gather);
                tokio::spawn(async move { gather.ask(n).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        let answers: Vec<_> = futures::future::join_all(more).await.into_iter().map(|a| a.unwrap()).collect();
        assert_eq!(answers[0].as_ref().unwrap(), &20);
        assert!(answers[1].is_err(), "the refused request fails alone");
        assert_eq!(answers[2].as_ref().unwrap(), &30);
        let batches = batches.lock().unwrap();
        assert_eq!(batches.len(), 2, "one batch for the first request, one for the three that came meanwhile");
        let mut second = batches[1].clone();
        second.sort_unstable();
        assert_eq!(second, vec![2, 3, 7]);
    }

    #[tokio::test]
    async fn a_batch_whose_writer_panics_fails_its_askers_and_the_next_batch_goes_on() {
        let gather = Gather::new("test", |batch: Vec<u32>| async move {
            assert!(!batch.contains(&99), "the writer panics on 99");
            batch.into_iter().map(Ok).collect()
        });
        assert!(gather.ask(99).await.is_err());
        assert_eq!(gather.ask(5).await.unwrap(), 5, "the writer survived the panic");
    }

    #[tokio::test]
    async fn a_refused_batch_is_written_request_by_request_but_a_fenced_one_is_not() {
        let written: Arc<Mutex<Vec<u32>>> = Arc::default();
        let each = |n: u32| {
            let written = Arc::clone(&written);
            async move {
                written.lock().unwrap().push(n);
                if n == 2 { Err(Error::internal("two")) } else { Ok(n) }
            }
        };
        let refused = |_: Vec<u32>| async { Err::<Vec<u32>, _>(Error::internal("a row refused")) };
        let answers = all_or_each(vec![1, 2, 3], refused, each).await;
        assert_eq!(answers[0].as_ref().unwrap(), &1);
        assert!(answers[1].is_err());
        assert_eq!(answers[2].as_ref().unwrap(), &3);
        assert_eq!(*written.lock().unwrap(), vec![1, 2, 3]);

        written.lock().unwrap().clear();
        let fenced = |_: Vec<u32>| async { Err::<Vec<u32>, _>(Error::Fenced("another server leads".into())) };
        let answers = all_or_each(vec![1, 2], fenced, each).await;
        assert!(answers.iter().all(|a| matches!(a, Err(Error::Fenced(_)))));
        assert!(written.lock().unwrap().is_empty(), "a server that no longer leads writes nothing more");
    }
}
