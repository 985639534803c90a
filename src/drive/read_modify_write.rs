//! The one driver of the read-modify-write [flow](crate::flow::read_modify_write), for
//! both APIs: `modify`, the JSON edits and the guarded operation on a version row run
//! their attempts here, each in a write transaction of the library's, on connections
//! from [`Attempts`], until the flow is done.

use std::future::Future;

use super::{Attempts, End, Ended, ReadRow, WriteAttempt};
use crate::error::Error;
use crate::flow::read_modify_write::{Effect, ReadModifyWrite};
use crate::guard::{Guarded, TokenOf};
use crate::operation::modify::Modified;
use crate::retry::{RetryPolicy, Stop};
use crate::telemetry::Call;

/// What an attempt does with the row it read, inside its transaction: the row as
/// written, its new token and the caller's value. A change of a copy of the row, an edit
/// of its JSON document, the caller's operation and the advance of a version row.
pub(crate) trait Step<T: Guarded, C, R, E> {
    /// The operation's name in the telemetry (`db.operation`).
    const OPERATION: &'static str;

    /// Applies the step to `original` on `conn`.
    fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> impl Future<Output = Result<(T, TokenOf<T>, R), Stop<E>>>;
}

/// Runs the read-modify-write of the row of `T` with `key` on connections from
/// `attempts`, each attempt applying `step` to the row as read, retried as `policy` says
/// (once only inside the caller's transaction), the flow's pauses waited out holding no
/// connection. `suspects` names the columns an unreadable row is blamed on.
pub(crate) async fn read_modify_write<T, C, A, S, R, E>(
    mut attempts: A,
    key: &T::Key,
    policy: &RetryPolicy,
    suspects: &str,
    mut step: S,
) -> Result<Modified<T, R>, E>
where
    C: WriteAttempt,
    A: Attempts<C>,
    T: ReadRow<C>,
    S: Step<T, C, R, E>,
    E: From<Error>,
{
    let call = Call::new::<C::Backend>(S::OPERATION, T::table_name(), Some(key));
    // The call reports the library's error; the change's own is the caller's.
    let modified = call
        .run_as(
            async move {
                let nested = attempts.caller_transaction().map_err(Stop::Occ)?;
                let table = T::table_name();
                let mut flow = ReadModifyWrite::new(
                    policy,
                    nested,
                    A::FRESH_PER_ATTEMPT,
                    table,
                    key,
                    suspects,
                )
                .reconnecting_on_read_only(
                    <C::Backend as crate::connect::backend::OccBackend>::RECONNECT_MAY_REACH_PRIMARY,
                )
                .reported_as(S::OPERATION);
                let mut effect = flow.start();
                loop {
                    effect = match effect {
                        Effect::Begin => {
                            let attempt = async |conn: &mut C| {
                                run_attempt(conn, &mut flow, key, &mut step).await
                            };
                            match attempts.attempt(attempt).await {
                                Ok(next) => next,
                                // No connection for the attempt: nothing began.
                                Err(error) => flow.began(Err(error)),
                            }
                        }
                        Effect::Pause(pause) => {
                            attempts.pause(pause).await;
                            flow.paused()
                        }
                        Effect::Done => break,
                        other => unreachable!("{other:?} is run inside an attempt"),
                    };
                }
                Ok(Modified::of(flow.outcome()?))
            },
            |stop| match stop {
                Stop::Occ(error) => Some(error),
                Stop::Caller(_) => None,
            },
        )
        .await;
    modified.map_err(Stop::into_error)
}

/// One attempt of `flow` on `conn`, from its `BEGIN` to its `COMMIT` or `ROLLBACK`: the
/// effect after it. On an async connection a future dropped half way leaves the
/// connection marked broken, whatever statement was on its way.
async fn run_attempt<T, C, S, R, E>(
    conn: &mut C,
    flow: &mut ReadModifyWrite<'_, T, (T, TokenOf<T>, R), E>,
    key: &T::Key,
    step: &mut S,
) -> Effect
where
    C: WriteAttempt,
    T: ReadRow<C>,
    S: Step<T, C, R, E>,
    E: From<Error>,
{
    let ended = conn
        .write_transaction(async |conn: &mut C| {
            let mut effect = flow.began(Ok(()));
            loop {
                effect = match effect {
                    Effect::Read(lock) => {
                        let read = T::read_row(conn, key, lock).await;
                        let classifier = conn.classifier(read.as_ref().err()).await;
                        flow.read(read, |e| classifier.classify(e))
                    }
                    Effect::Change => {
                        let changed = step.apply(conn, flow.row()).await;
                        flow.changed(changed)
                    }
                    Effect::Commit => return (End::Commit, ()),
                    Effect::Rollback => return (End::Rollback, ()),
                    other => unreachable!("{other:?} inside an attempt's transaction"),
                }
            }
        })
        .await;
    let next = match ended {
        Ended::NotBegun(error) => flow.began(Err(error)),
        Ended::Committed((), committed) => flow.committed(committed),
        // A failed ROLLBACK leaves the connection broken, which the next call refuses;
        // the attempt's own failure is what counts.
        Ended::RolledBack((), _) => flow.rolled_back(),
    };
    if flow.connection_unfit() {
        conn.discard();
    }
    next
}
