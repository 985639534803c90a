//! Ending many claims at once, as a flow: every decision of `finish_claims`, blocking and
//! async.
//!
//! - The keys are taken once each, in their first order, in statements of at most
//!   `KEYS_PER_STATEMENT` keys, after one check that the guard's timestamp column stores
//!   what the guard compares and that the statement does not assign the guard; the
//!   report keeps that order.
//! - Where the backend has `RETURNING`, one statement per chunk answers with the keys it
//!   ended; any other key is looked up, and the row found says whether it ended after all
//!   (a key the database compares more loosely than `==`) or why its claim was lost.
//! - Elsewhere a chunk of several keys is ended in a transaction that commits only when it
//!   matched every key (the usual case); otherwise it is rolled back and each claim is
//!   ended on its own, which tells exactly which ones were still this worker's. A single
//!   key is ended on its own at once.
//! - Each statement runs again after a transient failure, under the claims' policy (once
//!   inside the caller's transaction); a lost claim is the key's outcome, any other error
//!   ends the call.
//!
//! A driver feeds each effect's result to the method named after it and performs the
//! effect it gets back, until [`Effect::Done`]; then [`FinishClaims::outcome`].

use std::collections::VecDeque;
use std::time::Duration;

use crate::error::Error;
use crate::flow::claim_policy::claim_run;
use crate::guard::status::HasStatus;
use crate::guard::AdvanceInSql;
use crate::retry::{Run, Stop};
use report::{distinct, FinishedClaims, KEYS_PER_STATEMENT};

/// What a driver does next; `K` is the entity's key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect<K> {
    /// Before anything is sent: check that the guard's timestamp column stores what the
    /// guard compares, and that the statement (built for this key: every chunk's has the
    /// same assignments) does not assign the guard; then
    /// [`checked`](FinishClaims::checked).
    Check(K),
    /// End the claims on these keys in one statement that returns the keys it ended; then
    /// [`returned`](FinishClaims::returned).
    SendReturning(Vec<K>),
    /// Read the row with this key (not among those returned); then
    /// [`looked_up`](FinishClaims::looked_up).
    LookUp(K),
    /// End the claims on these keys in a transaction that commits only when the statement
    /// matched every one, and say whether it did; then
    /// [`all_or_nothing`](FinishClaims::all_or_nothing).
    SendAllOrNothing(Vec<K>),
    /// End the claim on this key alone; then [`ended_alone`](FinishClaims::ended_alone).
    EndAlone(K),
    /// Wait this long, then [`paused`](FinishClaims::paused): the statement runs again.
    Pause(Duration),
    /// Finished: take the [`outcome`](FinishClaims::outcome).
    Done,
}

/// The end of `owner`'s claims in state `held` on rows of entity `T`.
pub(crate) struct FinishClaims<T: HasStatus> {
    table: &'static str,
    owner: String,
    held: T::Status,
    returning: bool,
    in_callers_transaction: bool,
    chunks: VecDeque<Vec<T::Key>>,
    /// The keys of the current chunk still to handle one by one.
    queue: VecDeque<T::Key>,
    /// The keys the current chunk's `RETURNING` gave back.
    ended: Vec<T::Key>,
    /// The effect in flight, sent again after a pause.
    sent: Option<Effect<T::Key>>,
    /// The policy's run for the statement in flight.
    run: Option<Run<'static>>,
    report: FinishedClaims<T::Key>,
    outcome: Option<Error>,
}

impl<T> FinishClaims<T>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    /// The end of the claims on `keys` (repeats taken once) in `table`, on a backend with
    /// `RETURNING` or not, inside the caller's transaction or not.
    pub(crate) fn new(
        keys: &[T::Key],
        table: &'static str,
        (owner, held): (&str, T::Status),
        returning: bool,
        in_callers_transaction: bool,
    ) -> Self {
        let chunks = distinct(keys)
            .chunks(KEYS_PER_STATEMENT)
            .map(<[T::Key]>::to_vec)
            .collect();
        FinishClaims {
            table,
            owner: owner.to_string(),
            held,
            returning,
            in_callers_transaction,
            chunks,
            queue: VecDeque::new(),
            ended: Vec::new(),
            sent: None,
            run: None,
            report: FinishedClaims::default(),
            outcome: None,
        }
    }

    /// The first effect: nothing to do without keys.
    pub(crate) fn start(&mut self) -> Effect<T::Key> {
        match self.chunks.front().and_then(|chunk| chunk.first()) {
            Some(key) => Effect::Check(key.clone()),
            None => Effect::Done,
        }
    }

    /// The checks answered.
    pub(crate) fn checked(&mut self, checked: Result<(), Error>) -> Effect<T::Key> {
        match checked {
            Ok(()) => self.next_chunk(),
            Err(e) => self.fail(e),
        }
    }

    /// The statement with `RETURNING` answered with the keys it ended.
    pub(crate) fn returned(&mut self, ended: Result<Vec<T::Key>, Error>) -> Effect<T::Key> {
        let ended = match ended {
            Ok(ended) => ended,
            Err(e) => return self.again_or(e, Self::fail),
        };
        self.queue = self.sent_keys().into();
        self.ended = ended;
        self.next_look_up()
    }

    /// The row of the key looked up, as the database finds it now.
    pub(crate) fn looked_up(&mut self, row: Result<Option<T>, Error>) -> Effect<T::Key> {
        let Some(Effect::LookUp(key)) = self.sent.take() else {
            return self.fail(out_of_turn("looked_up"));
        };
        match row {
            Ok(row) => {
                let claim = (self.owner.as_str(), self.held);
                self.report
                    .add_looked_up(self.table, &key, &self.ended, row, claim);
                self.next_look_up()
            }
            Err(e) => self.fail(e),
        }
    }

    /// The all-or-nothing statement answered: whether it matched, and committed, every key.
    pub(crate) fn all_or_nothing(&mut self, every: Result<bool, Error>) -> Effect<T::Key> {
        match every {
            Ok(true) => {
                let chunk = self.sent_keys();
                self.report.finished.extend(chunk);
                self.next_chunk()
            }
            Ok(false) => {
                self.queue = self.sent_keys().into();
                self.next_alone()
            }
            Err(e) => self.again_or(e, Self::fail),
        }
    }

    /// The claim on the key sent alone ended, or did not.
    pub(crate) fn ended_alone(&mut self, ended: Result<(), Error>) -> Effect<T::Key> {
        match ended {
            Ok(()) => self.alone_outcome(Ok(())),
            Err(e) => self.again_or(e, |flow, e| flow.alone_outcome(Err(e))),
        }
    }

    /// The pause is over: the statement in flight runs again.
    pub(crate) fn paused(&mut self) -> Effect<T::Key> {
        match self.sent.clone() {
            Some(effect) => effect,
            None => self.fail(out_of_turn("paused")),
        }
    }

    /// What the flow found, once [`Effect::Done`].
    pub(crate) fn outcome(self) -> Result<FinishedClaims<T::Key>, Error> {
        match self.outcome {
            Some(e) => Err(e),
            None => Ok(self.report),
        }
    }

    /// The next chunk's statement, or done.
    fn next_chunk(&mut self) -> Effect<T::Key> {
        let Some(chunk) = self.chunks.pop_front() else {
            self.sent = None;
            return Effect::Done;
        };
        if self.returning {
            self.send(Effect::SendReturning(chunk))
        } else if chunk.len() > 1 {
            self.send(Effect::SendAllOrNothing(chunk))
        } else {
            self.queue = chunk.into();
            self.next_alone()
        }
    }

    /// The chunk's keys in their order: a returned key is finished, the next one not
    /// returned is looked up; or the next chunk. So the report keeps the keys' order even
    /// where a look-up finds a key ended after all.
    fn next_look_up(&mut self) -> Effect<T::Key> {
        while let Some(key) = self.queue.pop_front() {
            if self.ended.contains(&key) {
                self.report.finished.push(key);
                continue;
            }
            self.sent = Some(Effect::LookUp(key.clone()));
            return Effect::LookUp(key);
        }
        self.next_chunk()
    }

    /// The next key ended alone; or the next chunk.
    fn next_alone(&mut self) -> Effect<T::Key> {
        match self.queue.pop_front() {
            Some(key) => self.send(Effect::EndAlone(key)),
            None => self.next_chunk(),
        }
    }

    /// The outcome of the claim sent alone: the key's, or an error that ends the call.
    fn alone_outcome(&mut self, ended: Result<(), Error>) -> Effect<T::Key> {
        let Some(Effect::EndAlone(key)) = self.sent.take() else {
            return self.fail(out_of_turn("ended_alone"));
        };
        match self.report.add_alone(&key, ended) {
            Ok(()) => self.next_alone(),
            Err(e) => self.fail(e),
        }
    }

    /// Sends `effect` as a new statement, with a fresh run of the policy.
    fn send(&mut self, effect: Effect<T::Key>) -> Effect<T::Key> {
        self.run = Some(claim_run(self.in_callers_transaction));
        self.sent = Some(effect.clone());
        effect
    }

    /// The keys of the statement in flight.
    fn sent_keys(&mut self) -> Vec<T::Key> {
        match self.sent.take() {
            Some(Effect::SendReturning(keys) | Effect::SendAllOrNothing(keys)) => keys,
            _ => Vec::new(),
        }
    }

    /// A pause before the statement in flight runs again when `error` is transient and the
    /// policy allows another attempt; otherwise `given_up` with the error to report.
    fn again_or(
        &mut self,
        error: Error,
        given_up: impl FnOnce(&mut Self, Error) -> Effect<T::Key>,
    ) -> Effect<T::Key> {
        let waited = match self.run.as_mut() {
            Some(run) => run.wait_after::<Error>(Stop::Occ(error)),
            None => Err(error),
        };
        match waited {
            Ok(pause) => Effect::Pause(pause),
            Err(e) => given_up(self, e),
        }
    }

    /// Ends the call with `error`.
    fn fail(&mut self, error: Error) -> Effect<T::Key> {
        self.sent = None;
        self.outcome = Some(error);
        Effect::Done
    }
}

/// A driver fed a result the flow did not ask for: a bug of the driver's.
fn out_of_turn(method: &str) -> Error {
    Error::Database(diesel::result::Error::QueryBuilderError(
        format!("finish_claims: `{method}` was fed out of turn").into(),
    ))
}

pub(crate) mod report;
#[cfg(test)]
mod tests;
