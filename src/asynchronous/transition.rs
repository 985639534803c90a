//! Guarded status transitions on diesel-async connections: the blocking
//! [`GuardedTransition`](crate::GuardedTransition) and
//! [`GuardedStatusTransition`](crate::GuardedStatusTransition), as futures, with the same
//! statements and the same explanation of a move that did not happen.

use std::future::Future;

use diesel::expression::AppearsOnTable;
use diesel::query_builder::AsChangeset;
use diesel_async::AsyncConnection;

use super::run::AsyncRun;
use super::write_transaction::{AsyncWriteConnection, TransitionHook};
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{classifier, NativeAsyncConnection};
use crate::drive::on_async::executor::{run, AsyncMiss};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::{Io, ReadOn, RunOn};
use crate::error::Error;
use crate::guard::status::{HasStatus, Status};
use crate::guard::{AdvanceInSql, CompletionOf, ReturnedTokenOf, TokenOf};
use crate::operation::Operation;
use crate::retry::RetryPolicy;
use crate::sql::statement::{Assignments, Unguarded};
use crate::status::condition::{TransitionCondition, When};
use crate::status::hooked::{copy_move_then, key_move_then, MoveHook, MoveOn};
use crate::status::transition::transition_row;
use crate::status::transition::{
    history_insert, key_transition, HistoryEntry, KeyTransitionOf, RecordHistory, TransitionMiss,
    TransitionOf,
};
use crate::status::transition_op::{KeyTransition, Transition};

/// Guarded transitions for every entity with a `#[occ(status)]` field, on a diesel-async
/// connection; see [`GuardedTransition`](crate::GuardedTransition) and
/// [`GuardedStatusTransition`](crate::GuardedStatusTransition) for what each does and
/// answers. The hooks of the `..._then` forms are `async` closures given the connection,
/// on the move's write transaction.
pub trait AsyncGuardedTransition: HasStatus + Clone {
    /// Moves this row to `to` (with the `extra` assignments) if its state allows it and it
    /// still holds this copy's token; records the new state, token and stamp in the copy.
    fn transition<'a, C, Ch>(
        &'a mut self,
        conn: &'a mut C,
        to: Self::Status,
        extra: Ch,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Transition<Self, Ch>: AsyncRun<C>,
        Ch: 'a,
    {
        let sources = Self::Status::sources(to);
        let moving = Transition::new(self.clone(), to, extra, sources, Unguarded);
        record_move(self, moving.run_async(conn))
    }

    /// [`transition`](Self::transition), and only while the row also meets `condition`.
    fn transition_when<'a, C, Ch, G>(
        &'a mut self,
        conn: &'a mut C,
        to: Self::Status,
        extra: Ch,
        condition: G,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        G: AppearsOnTable<<Self as diesel::associations::HasTable>::Table> + 'a,
        Transition<Self, Ch, When<G>>: AsyncRun<C>,
        Ch: 'a,
    {
        let sources = Self::Status::sources(to);
        let moving = Transition::new(self.clone(), to, extra, sources, When(condition));
        record_move(self, moving.run_async(conn))
    }

    /// Moves this row to `to` from whatever state it is in, if it still holds this copy's
    /// token: the repair path; see
    /// [`GuardedTransition::force_status`](crate::GuardedTransition::force_status).
    fn force_status<'a, C, Ch>(
        &'a mut self,
        conn: &'a mut C,
        to: Self::Status,
        extra: Ch,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Transition<Self, Ch>: AsyncRun<C>,
        Ch: 'a,
    {
        let moving = Transition::new(self.clone(), to, extra, Self::Status::ALL, Unguarded);
        record_move(self, moving.run_async(conn))
    }

    /// Moves the row with `key` to `to` if its state allows it, whatever its token, in one
    /// statement; transient database errors are retried as `policy` allows.
    fn transition_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send
    where
        Self::Guard: AdvanceInSql,
        KeyTransition<Self, Ch>: AsyncRun<C>,
    {
        KeyTransition::new(key.clone(), to, extra, Unguarded, policy.clone()).run_async(conn)
    }

    /// [`transition_by_key`](Self::transition_by_key), and only while the row also meets
    /// `condition`.
    fn transition_by_key_when<C, Ch, G>(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send
    where
        Self::Guard: AdvanceInSql,
        G: AppearsOnTable<<Self as diesel::associations::HasTable>::Table>,
        KeyTransition<Self, Ch, When<G>>: AsyncRun<C>,
    {
        let moving = KeyTransition::new(key.clone(), to, extra, When(condition), policy.clone());
        moving.run_async(conn)
    }

    /// [`transition`](Self::transition) and then `hook` (given the connection, the state
    /// the row left and the row as moved) on the same write transaction; when the hook
    /// fails, the move is rolled back, the copy left as it was, and the hook's error comes
    /// back unchanged. See
    /// [`GuardedTransition::transition_then`](crate::GuardedTransition::transition_then).
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// # mod example {
    /// # use diesel::prelude::*;
    /// # diesel::table! { orders (id) { id -> BigInt, status -> Text, version -> BigInt } }
    /// # #[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
    /// # enum OrderStatus { Valid, #[occ(from(Valid))] Shipped }
    /// # #[derive(Debug, Clone, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
    /// # #[diesel(table_name = orders)]
    /// # struct Order { id: i64, #[occ(status)] status: OrderStatus, #[occ(version)] version: i64 }
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_occ::asynchronous::{prelude::*, record};
    /// use diesel_occ::{no_extra, Error, HistoryEntry, Status};
    ///
    /// async fn ship(conn: &mut AsyncPgConnection, order: &mut Order) -> Result<i64, Error> {
    ///     order
    ///         .transition_then(
    ///             conn,
    ///             OrderStatus::Shipped,
    ///             no_extra(),
    ///             async |conn: &mut AsyncPgConnection, from: OrderStatus, row: &Order| {
    ///                 let key = row.id.to_string();
    ///                 let (from, to) = (from.name(), row.status.name());
    ///                 let entry = HistoryEntry { entity: "orders", key: &key, from, to, actor: None };
    ///                 record(conn, &entry).await
    ///             },
    ///         )
    ///         .await
    /// }
    /// # }
    /// ```
    fn transition_then<'a, C, Ch, E, H>(
        &'a mut self,
        conn: &'a mut C,
        to: Self::Status,
        extra: Ch,
        hook: H,
    ) -> impl Future<Output = Result<TokenOf<Self>, E>> + Send + 'a
    where
        C: AsyncWriteConnection,
        Transition<Self, Ch>: AsyncRun<C>,
        H: for<'r> TransitionHook<'r, C, Self, E> + Send + 'a,
        E: From<Error> + Send + 'a,
        Ch: Send + 'a,
    {
        async move {
            let moving = AsyncMove { to, extra };
            let (moved, token) =
                copy_move_then(conn, self.clone(), moving, AsyncHook(hook)).await?;
            *self = moved;
            Ok(token)
        }
    }

    /// Moves the row with `key` to `to` and runs `hook` (given the connection, the state
    /// the row left and the row as moved) on the same write transaction; the row is read
    /// with a lock first. Returns the row as moved. See
    /// [`GuardedStatusTransition::transition_by_key_then`](crate::GuardedStatusTransition::transition_by_key_then).
    fn transition_by_key_then<'a, C, Ch, E, H>(
        conn: &'a mut C,
        key: &'a Self::Key,
        to: Self::Status,
        extra: Ch,
        hook: H,
    ) -> impl Future<Output = Result<Self, E>> + Send + 'a
    where
        Self::Guard: AdvanceInSql,
        C: AsyncWriteConnection,
        Self: AsyncLoadByKey<C>,
        Transition<Self, Ch>: AsyncRun<C>,
        H: for<'r> TransitionHook<'r, C, Self, E> + Send + 'a,
        E: From<Error> + Send + 'a,
        Ch: Send + 'a,
    {
        key_move_then(conn, key, AsyncMove { to, extra }, AsyncHook(hook))
    }
}

impl<T: HasStatus + Clone> AsyncGuardedTransition for T {}

/// An async move to `to` with the `extra` assignments: the [`Transition`] the bound
/// names, in the library's own transaction.
struct AsyncMove<S, Ch> {
    to: S,
    extra: Ch,
}

impl<C, T, Ch> MoveOn<C, T> for AsyncMove<T::Status, Ch>
where
    T: HasStatus,
    Transition<T, Ch>: AsyncRun<C>,
{
    fn moved(self, conn: &mut C, row: T) -> impl Future<Output = Result<(T, TokenOf<T>), Error>> {
        let sources = T::Status::sources(self.to);
        let moving = Transition::new(row, self.to, self.extra, sources, Unguarded);
        moving.in_own_transaction().run_async(conn)
    }
}

/// An async hook: a closure that returns a future.
struct AsyncHook<H>(H);

impl<C, T, E, H> MoveHook<C, T, E> for AsyncHook<H>
where
    T: HasStatus,
    H: for<'r> TransitionHook<'r, C, T, E>,
{
    fn after_move<'r>(
        self,
        conn: &'r mut C,
        from: T::Status,
        row: &'r T,
    ) -> impl Future<Output = Result<(), E>> {
        (self.0)(conn, from, row)
    }
}

/// Runs `moving`, a move of `row`'s copy, and records the moved copy in `row`; a move
/// that did not happen leaves `row` as it was.
async fn record_move<T: HasStatus>(
    row: &mut T,
    moving: impl Future<Output = Result<(T, TokenOf<T>), Error>> + Send,
) -> Result<TokenOf<T>, Error> {
    let (moved, token) = moving.await?;
    *row = moved;
    Ok(token)
}

impl<T, C, G> AsyncMiss<C> for TransitionMiss<'_, T, G>
where
    T: HasStatus + AsyncLoadByKey<C>,
    C: AsyncConnection,
    C::Backend: OccBackend,
    G: TransitionCondition<C::Backend> + Send,
{
    async fn explain(self, conn: &mut C) -> Error {
        let read = T::load_by_key(conn, self.key()).await;
        let classify = classifier(conn, read.as_ref().err()).await;
        self.given::<C::Backend>(T::table_name(), read, |e| classify.classify(e))
    }
}

impl<T, C, Ch, G> AsyncRun<C> for Transition<T, Ch, G>
where
    T: HasStatus + ReadOn<C>,
    T::Stamp: Send,
    C: Io + NativeAsyncConnection,
    Ch: AsChangeset<Target = T::Table> + Send,
    G: TransitionCondition<<C as Io>::Backend> + Send + Sync,
    TransitionOf<T, Ch::Changeset, G>: Assignments<<C as Io>::Backend> + Send,
    for<'k> CompletionOf<T>:
        RunOn<C, TransitionOf<T, Ch::Changeset, G>, TransitionMiss<'k, T, G>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let Transition {
            mut row,
            to,
            extra,
            sources,
            condition,
            own,
        } = self;
        let token = transition_row(conn, &mut row, to, extra, sources, condition, own).await?;
        Ok((row, token))
    }
}

impl<T, C, Ch, G> AsyncRun<C> for KeyTransition<T, Ch, G>
where
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    Ch: AsChangeset<Target = T::Table> + Clone + Send,
    G: TransitionCondition<<C as Io>::Backend> + Clone + Send,
    KeyTransitionOf<T, Ch::Changeset, G>: Assignments<<C as Io>::Backend> + Send,
    for<'k> ReturnedTokenOf<T>:
        RunOn<C, KeyTransitionOf<T, Ch::Changeset, G>, TransitionMiss<'k, T, G>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let KeyTransition {
            key,
            to,
            extra,
            condition,
            policy,
        } = self;
        key_transition::<T, C, Ch, G>(conn, &key, to, extra, condition, &policy).await
    }
}

/// Appends `entry` to the library's transition history on an async connection, for a
/// transition hook; see [`record`](crate::record).
pub async fn record<C>(conn: &mut C, entry: &HistoryEntry<'_>) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: crate::connect::backend::OccBackend,
    RecordHistory: Assignments<C::Backend> + diesel_async::methods::ExecuteDsl<C> + Send + 'static,
{
    let write = history_insert(entry)?;
    run::<C, _, _, crate::sql::new_token::Counted, ()>(write, conn, false)
        .await
        .map(drop)
}
