//! A move and the caller's hook on one write transaction of the library's, written once
//! for both drivers: the `..._then` transitions. The move is the guarded statement every
//! transition sends; the hook runs after it, on the same transaction, and its failure
//! rolls the move back.

use std::future::{ready, Future};

use crate::drive::{settled, Blocking, End, ReadRow, WriteAttempt};
use crate::error::Error;
use crate::guard::status::{HasStatus, Status};
use crate::guard::TokenOf;
use crate::retry::Stop;
use crate::sql::statement::{RowLock, Unguarded};
use crate::status::transition::{suspects, TransitionRow};
use crate::write::pessimistic::read_locked_on;

/// The move of a row to a state, on connection `C`, inside a write transaction of the
/// library's: the same statement on either driver, reached through the bound each API
/// names.
pub(crate) trait MoveOn<C, T: HasStatus> {
    /// Moves `row` from one of its state's sources; the row as moved and its new token.
    fn moved(self, conn: &mut C, row: T) -> impl Future<Output = Result<(T, TokenOf<T>), Error>>;
}

/// The caller's hook on connection `C`: a closure on the blocking driver, a future on the
/// async one. Given the state the row left and the row as moved.
pub(crate) trait MoveHook<C, T: HasStatus, E> {
    /// Runs it on the move's transaction.
    fn after_move<'r>(
        self,
        conn: &'r mut C,
        from: T::Status,
        row: &'r T,
    ) -> impl Future<Output = Result<(), E>>;
}

/// A blocking move to `to` with the `extra` assignments.
pub(crate) struct BlockingMove<S, Ch> {
    pub(crate) to: S,
    pub(crate) extra: Ch,
}

impl<C, T, Ch> MoveOn<Blocking<C>, T> for BlockingMove<T::Status, Ch>
where
    T: TransitionRow<C, Ch>,
{
    fn moved(
        self,
        conn: &mut Blocking<C>,
        mut row: T,
    ) -> impl Future<Output = Result<(T, TokenOf<T>), Error>> {
        let sources = T::Status::sources(self.to);
        let moved = row.transition_row(conn.inner(), self.to, self.extra, sources, Unguarded, true);
        ready(moved.map(|token| (row, token)))
    }
}

/// A blocking hook: a closure given the connection.
pub(crate) struct BlockingHook<F>(pub(crate) F);

impl<C, T, E, F> MoveHook<Blocking<C>, T, E> for BlockingHook<F>
where
    T: HasStatus,
    F: FnOnce(&mut C, T::Status, &T) -> Result<(), E>,
{
    fn after_move<'r>(
        self,
        conn: &'r mut Blocking<C>,
        from: T::Status,
        row: &'r T,
    ) -> impl Future<Output = Result<(), E>> {
        ready((self.0)(conn.inner(), from, row))
    }
}

/// Moves `row` (a loaded copy) to `to` and runs `hook` on the same write transaction;
/// the row as moved and its token once committed. A failed move or hook rolls back and
/// leaves the copy to the caller unchanged.
pub(crate) async fn copy_move_then<T, C, M, H, E>(
    conn: &mut C,
    row: T,
    moving: M,
    hook: H,
) -> Result<(T, TokenOf<T>), E>
where
    C: WriteAttempt,
    T: HasStatus,
    M: MoveOn<C, T>,
    H: MoveHook<C, T, E>,
    E: From<Error>,
{
    let nested = conn.caller_transaction()?;
    let body = async |conn: &mut C| {
        let result = async {
            let from = row.status();
            let (moved, token) = moving.moved(conn, row).await?;
            hook.after_move(conn, from, &moved)
                .await
                .map_err(Stop::Caller)?;
            Ok((moved, token))
        }
        .await;
        (End::after(&result), result)
    };
    settled(conn.write_transaction(body).await, nested).map_err(Stop::into_error)
}

/// Reads the row with `key` with the lock that reads the latest row (PostgreSQL's
/// `FOR NO KEY UPDATE`, which lets other sessions insert rows referencing it), held to
/// the end, moves it and runs `hook`, all on one write transaction; the row as moved.
pub(crate) async fn key_move_then<T, C, M, H, E>(
    conn: &mut C,
    key: &T::Key,
    moving: M,
    hook: H,
) -> Result<T, E>
where
    C: WriteAttempt,
    T: HasStatus + ReadRow<C>,
    M: MoveOn<C, T>,
    H: MoveHook<C, T, E>,
    E: From<Error>,
{
    let nested = conn.caller_transaction()?;
    let suspects = suspects::<T>();
    let body = async |conn: &mut C| {
        let result = async {
            let row = read_locked_on::<T, C>(conn, key, RowLock::Latest, &suspects).await?;
            let from = row.status();
            let (moved, _) = moving.moved(conn, row).await?;
            hook.after_move(conn, from, &moved)
                .await
                .map_err(Stop::Caller)?;
            Ok(moved)
        }
        .await;
        (End::after(&result), result)
    };
    settled(conn.write_transaction(body).await, nested).map_err(Stop::into_error)
}
