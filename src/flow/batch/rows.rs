//! A batch's rows as the flow takes them: each row's key and tokens, the rounds they are
//! sent in, and each row's outcome.

use crate::error::Error;
use crate::flow::compare_and_set::Written;
use crate::flow::miss::RowMoved;
use crate::guard::{Guarded, TokenOf};
use crate::operation::batch::RowOutcome;

/// The most rows one PostgreSQL batch statement holds (fewer when the rows bind more
/// than 65,535 values in all). Every row's statement of a batch is built before anything
/// is sent (so that a refused row refuses the batch with nothing written): a batch holds
/// all of them in memory, so send a very large one in slices. Measured with W5 on PostgreSQL 15 on localhost (a batch of 1,000
/// rows, median of three runs): 50 rows per statement 14.4 ms, 100 rows 11.1 ms, 250 rows
/// 8.7 ms, 500 rows 9.2 ms, 1,000 rows 8.6 ms. Flat beyond 250; the largest size saves
/// the most round trips where the server is farther away.
pub const ROWS_PER_STATEMENT: usize = 1000;

/// The index of each row of a round that its statements wrote and, for a guard whose
/// next token only the database knows, that token.
pub(crate) type RoundWritten<Tok> = Vec<(usize, Option<Tok>)>;

/// A batch's rows, each with its statement, built before anything is sent.
pub(crate) type BuiltRows<T, S> = Vec<(Pending<T>, S)>;

/// One row of a batch statement: its key, the token it expects, and the token a written
/// row holds when the guard computes it.
pub(crate) struct Pending<T: Guarded> {
    key: T::Key,
    expected: TokenOf<T>,
    next: TokenOf<T>,
}

impl<T: Guarded> Pending<T> {
    /// The row with `key`, expected at `expected`, that a write leaves at `next`.
    pub(crate) fn new(key: T::Key, expected: TokenOf<T>, next: TokenOf<T>) -> Self {
        Pending {
            key,
            expected,
            next,
        }
    }

    /// The key and the expected token.
    pub(crate) fn key_and_expected(&self) -> (&T::Key, &TokenOf<T>) {
        (&self.key, &self.expected)
    }

    /// The key, the expected token and the token a written row holds when the guard
    /// computes it.
    pub(crate) fn into_parts(self) -> (T::Key, TokenOf<T>, TokenOf<T>) {
        (self.key, self.expected, self.next)
    }
}

/// The rows one round of a batch sends: at most [`ROWS_PER_STATEMENT`] rows, no key
/// twice, with their statements in the same order.
pub(crate) struct Chunk<T: Guarded, S> {
    pub(crate) rows: Vec<Pending<T>>,
    pub(crate) updates: Vec<S>,
}

impl<T: Guarded, S> Chunk<T, S> {
    /// The next round's rows taken from `rows`: `None` when none is left.
    pub(crate) fn next<I>(rows: &mut std::iter::Peekable<I>) -> Option<Self>
    where
        I: Iterator<Item = (Pending<T>, S)>,
    {
        let mut chunk = Chunk {
            rows: Vec::new(),
            updates: Vec::new(),
        };
        while chunk.rows.len() < ROWS_PER_STATEMENT {
            // A key that comes again waits for the next round, which sees this one's write.
            let again = |(row, _): &(Pending<T>, S)| chunk.rows.iter().any(|r| r.key == row.key);
            match rows.next_if(|next| !again(next)) {
                Some((row, update)) => {
                    chunk.rows.push(row);
                    chunk.updates.push(update);
                }
                None => break,
            }
        }
        (!chunk.rows.is_empty()).then_some(chunk)
    }

    /// The rows' statements, to send.
    pub(crate) fn take_updates(&mut self) -> Vec<S> {
        std::mem::take(&mut self.updates)
    }

    /// Per row, whether and how its statement wrote it, from the indexes (and tokens) of
    /// the rows written that the batch statements `returned`: a statement that wrote two
    /// rows had a key that is not unique.
    pub(crate) fn written<Tok>(
        &self,
        table: &'static str,
        returned: Vec<(usize, Option<Tok>)>,
    ) -> Result<Vec<Option<Written<Tok>>>, Error> {
        let mut written: Vec<Option<Written<Tok>>> = self.rows.iter().map(|_| None).collect();
        for (index, token) in returned {
            let rows = written[index].as_ref().map_or(0, |w| w.rows) + 1;
            if rows > 1 {
                return Err(Error::KeyNotUnique {
                    table,
                    key: format!("{:?}", self.rows[index].key),
                    rows,
                });
            }
            written[index] = Some(Written { rows, token });
        }
        Ok(written)
    }

    /// The keys of the rows that `written` says were not written.
    pub(crate) fn missed<Tok>(&self, written: &[Option<Written<Tok>>]) -> Vec<T::Key> {
        self.rows
            .iter()
            .zip(written)
            .filter(|(_, written)| written.is_none())
            .map(|(row, _)| row.key.clone())
            .collect()
    }

    /// Each row's outcome: its new token where `written` says it was written, else the
    /// explanation of its miss given the missed rows as they are now (`current`, read by
    /// key), as a single write explains one ([`RowMoved`]); `report` says what a written
    /// row reports.
    pub(crate) fn outcomes<Out>(
        self,
        table: &'static str,
        written: Vec<Option<Written<TokenOf<T>>>>,
        mut current: Vec<T>,
        report: fn(Option<TokenOf<T>>, TokenOf<T>) -> Out,
    ) -> Result<Vec<RowOutcome<Out>>, Error> {
        self.rows
            .into_iter()
            .zip(written)
            .map(|(row, written)| {
                let (key, expected, next) = row.into_parts();
                if let Some(written) = written {
                    return Ok(RowOutcome::Written(report(written.token, next)));
                }
                let found = current.iter().position(|c| c.key() == key);
                let current = found.map(|i| current.swap_remove(i));
                let miss = RowMoved::<T>::expecting(&key, &expected);
                outcome::<Out>(Err(miss.given_in(table, current)))
            })
            .collect()
    }
}

/// A row's write result as an outcome; errors that are not about the row end the batch.
pub(crate) fn outcome<T>(result: Result<T, Error>) -> Result<RowOutcome<T>, Error> {
    match result {
        Ok(token) => Ok(RowOutcome::Written(token)),
        Err(Error::Conflict(conflict)) => Ok(RowOutcome::Conflict(conflict)),
        Err(Error::NotFound { .. }) => Ok(RowOutcome::NotFound),
        Err(Error::Refused { token, .. }) => Ok(RowOutcome::Refused(token)),
        Err(other) => Err(other),
    }
}
