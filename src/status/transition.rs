//! Guarded status transitions: one conditional `UPDATE` whose `WHERE`
//! holds the states allowed to move to the target, so that of a cancel and a ship racing
//! on one order exactly one wins, and the loser learns the state the winner left.
//!
//! ```sql
//! UPDATE orders SET status = ?to [, extra assignments], <token advances>
//! WHERE (<key>) AND status IN (<states allowed to move to `to`>) [AND <token> = ?expected]
//! ```
//!
//! Two forms:
//! - from a loaded copy ([`transition`](GuardedTransition::transition)): the status check
//!   *and* the copy's token, which also closes the ABA gap (valid, taken, valid again
//!   between the read and the write: the status alone cannot see it, the token can).
//! - from a key alone ([`transition_by_key`](GuardedStatusTransition::transition_by_key),
//!   entities whose guard advances in SQL: a version, a timestamp, `xmin`): the status check only, no
//!   read before it; the token advances in SQL and comes back with the statement.
//!
//! Outcomes: the new token; [`Error::NotFound`]; [`Error::InvalidTransition`] with the
//! current row when its state does not allow the move (never retried: the state is what
//! it is); [`Error::Conflict`] when the state would allow it but the copy's token is stale
//! (the loaded form; read again and decide). `transition_by_key` retries transient
//! database errors (deadlock, lock timeout, SQLite busy) with its [`RetryPolicy`]: nothing
//! else can change its answer.
//!
//! The `..._then` forms run a hook on the same transaction after the move (a history row
//! with [`record`], an outbox event); if the hook fails, the transition is rolled back.

use diesel::connection::LoadConnection;
use diesel::expression::AppearsOnTable;
use diesel::query_builder::{AsChangeset, InsertStatement};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, Insertable};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::executor::{classify, CannotMiss, Miss};
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, ReadOn, RunOn};
use crate::error::{Error, InvalidTransition};
use crate::flow::compare_and_set::{refuse_status_write, CompareAndSet, Matches};
use crate::flow::miss::{unreadable_row, KeyWriteRuns, RowMoved};
use crate::guard::status::{HasStatus, Status, StatusIn};
use crate::guard::{
    AdvanceInSql, AdvanceOf, CompletionOf, GuardKind, Guarded, ReturnedTokenOf, TokenOf,
};
use crate::retry::{RetryPolicy, Stop};
use crate::sql::new_token::Counted;
use crate::sql::statement::Unguarded;
use crate::sql::statement::{And, Assignments, ColumnEq, Comma, GuardedUpdate, Joined, NoChanges};
use crate::status::condition::{TransitionCondition, When};
use crate::status::hooked::{copy_move_then, key_move_then, BlockingHook, BlockingMove};
use crate::telemetry::Call;
use crate::write::entity::{
    advance_from_in, key_write, token_read_back, write_key_statement, KeyWriteOf,
};

/// No extra assignment: the transition sets the status (and advances the token) only.
/// The table is inferred from the entity.
pub fn no_extra<T>() -> NoChanges<T> {
    NoChanges::default()
}

/// `status = ?to` and the caller's extra assignments.
pub(crate) type SetStatus<T, Ch> =
    Joined<ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>, Ch, Comma>;

/// `status IN (...)` and condition `G`.
pub(crate) type StatusAnd<T, G> =
    Joined<StatusIn<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>, G, And>;

/// The transition of a loaded copy of `T` with extra changeset `Ch`, under condition `G`
/// ([`Unguarded`] for none).
pub(crate) type TransitionOf<T, Ch, G> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    SetStatus<T, Ch>,
    AdvanceOf<T>,
    <T as Guarded>::KeyPredicate,
    StatusAnd<T, Joined<<<T as Guarded>::Guard as GuardKind>::Predicate, G, And>>,
>;

/// The key-only transition of `T` with extra changeset `Ch`, under condition `G`.
pub(crate) type KeyTransitionOf<T, Ch, G> = KeyWriteOf<
    T,
    SetStatus<T, Ch>,
    Joined<StatusIn<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>, G, And>,
>;

/// Transitions of loaded copies, for every entity with a `#[occ(status)]` field.
pub trait GuardedTransition: HasStatus + Clone {
    /// Moves this row to `to` (with the `extra` assignments, such as a ship date) if its
    /// state allows it and it still holds this copy's token; records the new state, token
    /// and stamp in the copy. A failed move leaves the copy as it was.
    fn transition<C, Ch>(
        &mut self,
        conn: &mut C,
        to: Self::Status,
        extra: Ch,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: TransitionRow<C, Ch>,
    {
        self.transition_row(conn, to, extra, Self::Status::sources(to), Unguarded, false)
    }

    /// [`transition`](Self::transition), and only while the row also meets `condition`, a
    /// boolean expression on the entity's table (`orders::paid_at.is_not_null()`), checked
    /// in the same statement. A row in an allowed state, at the copy's token, that does
    /// not meet it is [`Error::InvalidTransition`] naming the condition
    /// ([`InvalidTransition::unmet`]); a stale token is [`Error::Conflict`] first.
    fn transition_when<C, Ch, G>(
        &mut self,
        conn: &mut C,
        to: Self::Status,
        extra: Ch,
        condition: G,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: TransitionRow<C, Ch, When<G>>,
        G: AppearsOnTable<<Self as diesel::associations::HasTable>::Table>,
    {
        self.transition_row(
            conn,
            to,
            extra,
            Self::Status::sources(to),
            When(condition),
            false,
        )
    }

    /// Moves this row to `to` from whatever state it is in, if it still holds this copy's
    /// token: the escape hatch for repairing data (a row stuck where no declared
    /// transition leads out), never for business moves, which are transitions. Every
    /// other write refuses to change the status ([`Error::StatusNotWritable`]); search
    /// for `force_status` to find the places that bypass the declared moves.
    fn force_status<C, Ch>(
        &mut self,
        conn: &mut C,
        to: Self::Status,
        extra: Ch,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: TransitionRow<C, Ch>,
    {
        self.transition_row(conn, to, extra, Self::Status::ALL, Unguarded, false)
    }

    /// [`transition`](Self::transition) and then `hook` (given the state the row left and
    /// the row as moved) on the same write transaction; when the hook fails, the move is
    /// rolled back, the copy left as it was, and the hook's error comes back unchanged.
    fn transition_then<C, Ch, E>(
        &mut self,
        conn: &mut C,
        to: Self::Status,
        extra: Ch,
        hook: impl FnOnce(&mut C, Self::Status, &Self) -> Result<(), E>,
    ) -> Result<TokenOf<Self>, E>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Self: TransitionRow<C, Ch>,
        E: From<Error>,
    {
        let (moving, hook) = (BlockingMove { to, extra }, BlockingHook(hook));
        let conn = Blocking::wrap(conn);
        let (moved, token) = now(copy_move_then(conn, self.clone(), moving, hook))?;
        *self = moved;
        Ok(token)
    }
}

impl<T: HasStatus + Clone> GuardedTransition for T {}

/// The transition of a loaded copy of entity `Self` with extra changes `Ch` on
/// connection `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to
/// implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded transition with `{Ch}` on `{C}`",
    note = "the extra changes must be for the entity's table (`no_extra()` for none), the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait TransitionRow<C, Ch, G = Unguarded>: HasStatus + LoadByKey<C> {
    /// Runs the transition from one of `sources` under `condition`; [`GuardedTransition`]
    /// calls it. `own`: whether `conn`'s open transaction, if any, is the library's.
    #[doc(hidden)]
    fn transition_row(
        &mut self,
        conn: &mut C,
        to: Self::Status,
        extra: Ch,
        sources: &'static [Self::Status],
        condition: G,
        own: bool,
    ) -> Result<TokenOf<Self>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Ch, G> TransitionRow<C, Ch, G> for T
where
    T: HasStatus + LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    G: TransitionCondition<C::Backend> + Send,
    TransitionOf<T, Ch::Changeset, G>: Assignments<C::Backend> + Send,
    CompletionOf<T>: Complete<C, TransitionOf<T, Ch::Changeset, G>, TokenOf<T>>,
{
    fn transition_row(
        &mut self,
        conn: &mut C,
        to: T::Status,
        extra: Ch,
        sources: &'static [T::Status],
        condition: G,
        own: bool,
    ) -> Result<TokenOf<T>, Error> {
        let conn = Blocking::wrap(conn);
        now(transition_row(
            conn, self, to, extra, sources, condition, own,
        ))
    }
}

/// The move of `row`'s copy to `to` from one of `sources` under `condition`, on either
/// driver; on success `row` records the moved copy. Refused before anything is sent when
/// the token cannot advance or `extra` assigns the status; one call on the connection.
pub(crate) async fn transition_row<T, C, Ch, G>(
    conn: &mut C,
    row: &mut T,
    to: T::Status,
    extra: Ch,
    sources: &'static [T::Status],
    condition: G,
    own: bool,
) -> Result<TokenOf<T>, Error>
where
    C: Io,
    T: HasStatus + ReadOn<C>,
    Ch: AsChangeset<Target = T::Table>,
    G: TransitionCondition<C::Backend> + Send,
    TransitionOf<T, Ch::Changeset, G>: Assignments<C::Backend> + Send,
    for<'k> CompletionOf<T>:
        RunOn<C, TransitionOf<T, Ch::Changeset, G>, TransitionMiss<'k, T, G>, TokenOf<T>>,
{
    let key = row.key();
    let call = Call::new::<C::Backend>("transition", T::table_name(), Some(&key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let table = T::table_name();
            let plan = CopyMove::of(row, to);
            let (statement, next) =
                plan.statement::<C::Backend, Ch, G>(table, extra, sources, condition.clone())?;
            let write =
                CompareAndSet::one(statement, table, &plan.key, plan.miss(sources, condition));
            let written = conn
                .call(async |conn: &mut C| {
                    T::check_stored_precision(conn).await?;
                    <CompletionOf<T> as RunOn<C, _, _, _>>::run(conn, write, own).await
                })
                .await?;
            Ok(plan.record(row, written.token.unwrap_or(next)))
        })
        .await;
    answer
}

/// A transition of entity `T` with extra changes `Ch` under condition `G`, and the token
/// it moves the row to.
pub(crate) type TransitionAndNext<T, Ch, G> = (
    TransitionOf<T, <Ch as AsChangeset>::Changeset, G>,
    TokenOf<T>,
);

/// The move of a loaded copy to `to`: its key, its token and the stamp the move writes.
/// What the sync and the async transitions share.
pub(crate) struct CopyMove<T: HasStatus> {
    pub(crate) key: T::Key,
    expected: TokenOf<T>,
    stamp: T::Stamp,
    to: T::Status,
}

impl<T: HasStatus> CopyMove<T> {
    /// The move of `row` to `to`.
    pub(crate) fn of(row: &T, to: T::Status) -> Self {
        CopyMove {
            key: row.key(),
            expected: row.token(),
            stamp: T::stamp(),
            to,
        }
    }

    /// The statement (of `table`) that moves the row from one of `sources` under
    /// `condition`, with `extra` changes, and the token it moves the row to when the
    /// guard computes it. [`Error::VersionOverflow`] or [`Error::StatusNotWritable`]
    /// before anything is sent.
    pub(crate) fn statement<DB, Ch, G>(
        &self,
        table: &'static str,
        extra: Ch,
        sources: &'static [T::Status],
        condition: G,
    ) -> Result<TransitionAndNext<T, Ch, G>, Error>
    where
        Ch: AsChangeset<Target = T::Table>,
        TransitionOf<T, Ch::Changeset, G>: Assignments<DB>,
    {
        let (advance, next) = advance_from_in::<T>(table, &self.key, &self.expected)?;
        let statement = TransitionOf::<T, Ch::Changeset, G>::new(
            T::table(),
            Joined(ColumnEq::new(self.to), extra.as_changeset(), Comma),
            Joined(advance, self.stamp.clone(), Comma),
            T::key_predicate(&self.key),
            Joined(
                StatusIn::new(sources),
                Joined(T::Guard::predicate(&self.expected), condition, And),
                And,
            ),
        );
        refuse_status_write(table, T::STATUS_COLUMN, &statement, 1)?;
        Ok((statement, next))
    }

    /// What explains a move that matched nothing.
    pub(crate) fn miss<G>(
        &self,
        sources: &'static [T::Status],
        condition: G,
    ) -> TransitionMiss<'_, T, G> {
        TransitionMiss::new(
            RowMoved::<T>::expecting(&self.key, &self.expected),
            self.to,
            sources,
            condition,
        )
    }

    /// Records the move in `row`: its new token, state and stamp; gives the token back.
    pub(crate) fn record(self, row: &mut T, token: TokenOf<T>) -> TokenOf<T> {
        row.set_token(token.clone());
        row.set_status(self.to);
        row.set_stamp(&self.stamp);
        token
    }
}

/// Key-only transitions for entities whose guard advances in SQL (a version, a timestamp, `xmin`).
pub trait GuardedStatusTransition: HasStatus + Clone
where
    Self::Guard: AdvanceInSql,
{
    /// Moves the row with `key` to `to` (with `extra`) if its state allows it, whatever
    /// its token, in one statement with no read before it; advances the token and
    /// returns the new one. Transient database errors are retried as `policy` allows
    /// (one attempt inside a transaction you opened).
    fn transition_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<Self>, Error>
    where
        C: diesel::Connection,
        Ch: Clone,
        Self: TransitionByKey<C, Ch>,
    {
        Self::transition_key(conn, key, to, extra, Unguarded, policy)
    }

    /// [`transition_by_key`](Self::transition_by_key), and only while the row also meets
    /// `condition`, a boolean expression on the entity's table, checked in the same
    /// statement. A row in an allowed state that does not meet it is
    /// [`Error::InvalidTransition`] naming the condition ([`InvalidTransition::unmet`]).
    fn transition_by_key_when<C, Ch, G>(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<Self>, Error>
    where
        C: diesel::Connection,
        Ch: Clone,
        Self: TransitionByKey<C, Ch, When<G>>,
        G: AppearsOnTable<<Self as diesel::associations::HasTable>::Table> + Clone,
    {
        Self::transition_key(conn, key, to, extra, When(condition), policy)
    }

    /// Moves the row with `key` to `to` and runs `hook` (given the state the row left and
    /// the row as moved) on the same write transaction. The row is read with a lock first,
    /// so the hook knows the state it left; when the state does not allow the move the
    /// answer is [`Error::InvalidTransition`]; when the hook fails, everything is rolled
    /// back and its error comes back unchanged. Returns the row as moved.
    fn transition_by_key_then<C, Ch, E>(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        hook: impl FnOnce(&mut C, Self::Status, &Self) -> Result<(), E>,
    ) -> Result<Self, E>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Self: TransitionRow<C, Ch>,
        E: From<Error>,
    {
        let (moving, hook) = (BlockingMove { to, extra }, BlockingHook(hook));
        now(key_move_then(Blocking::wrap(conn), key, moving, hook))
    }
}

impl<T> GuardedStatusTransition for T
where
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
{
}

/// The key-only transition of the row with `key` to `to` (with `extra`, under
/// `condition`), on either driver: each attempt one statement built and checked before it
/// is sent, one call on the connection; transient errors retried as `policy` allows (one
/// attempt inside the caller's transaction). The new token.
pub(crate) async fn key_transition<T, C, Ch, G>(
    conn: &mut C,
    key: &T::Key,
    to: T::Status,
    extra: Ch,
    condition: G,
    policy: &RetryPolicy,
) -> Result<TokenOf<T>, Error>
where
    C: Io,
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    Ch: AsChangeset<Target = T::Table> + Clone,
    G: TransitionCondition<C::Backend> + Clone + Send,
    KeyTransitionOf<T, Ch::Changeset, G>: Assignments<C::Backend> + Send,
    for<'k> ReturnedTokenOf<T>:
        RunOn<C, KeyTransitionOf<T, Ch::Changeset, G>, TransitionMiss<'k, T, G>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>("transition_by_key", T::table_name(), Some(key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let policy = policy.one_attempt_if(conn.in_transaction());
            let mut run = policy.start().of("transition_by_key", T::table_name());
            let (mut runs, mut condition_run_again) = (KeyWriteRuns::default(), true);
            loop {
                let (changes, when, miss) =
                    key_transition_parts::<T, Ch, G>(key, to, extra.clone(), condition.clone());
                let table = T::table_name();
                let statement = key_write::<T, C::Backend, _, _>(table, key, changes, when, 1);
                let send = async |conn: &mut C| {
                    let write = write_key_statement::<ReturnedTokenOf<T>, T, C, _, _>;
                    token_read_back(write(conn, key, statement, miss).await?)
                };
                let answer = conn.call(send).await;
                if runs.again(&answer) {
                    continue;
                }
                match answer {
                    Ok(token) => return Ok(token),
                    // Found in a state it may leave but not meeting the condition: the row may
                    // have been inserted after the `UPDATE` ran, as for a refusal
                    // ([`KeyWriteRuns`]); one more run settles it.
                    Err(Error::InvalidTransition(t))
                        if t.unmet.is_some() && std::mem::take(&mut condition_run_again) => {}
                    Err(e) => conn.pause(run.wait_after(Stop::<Error>::Occ(e))?).await,
                }
            }
        })
        .await;
    answer
}

/// The key-only transition of entity `Self` with extra changes `Ch` on connection `C`, as
/// one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a key-only transition with `{Ch}` on `{C}`",
    note = "the extra changes must be for the entity's table (`no_extra()` for none), the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL (not a pre-image)",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait TransitionByKey<C, Ch, G = Unguarded>: HasStatus + LoadByKey<C> {
    /// Runs the transition under `condition`, retried as `policy` allows;
    /// [`GuardedStatusTransition`] calls it.
    #[doc(hidden)]
    fn transition_key(
        conn: &mut C,
        key: &Self::Key,
        to: Self::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<Self>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Ch, G> TransitionByKey<C, Ch, G> for T
where
    T: HasStatus + LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table> + Clone,
    G: TransitionCondition<C::Backend> + Clone + Send,
    KeyTransitionOf<T, Ch::Changeset, G>: Assignments<C::Backend> + Send,
    ReturnedTokenOf<T>: Complete<C, KeyTransitionOf<T, Ch::Changeset, G>, TokenOf<T>>,
{
    fn transition_key(
        conn: &mut C,
        key: &T::Key,
        to: T::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<T>, Error> {
        let conn = Blocking::wrap(conn);
        now(key_transition::<T, _, Ch, G>(
            conn, key, to, extra, condition, policy,
        ))
    }
}

/// A key-only transition's assignments, condition and miss: [`key_transition_parts`].
pub(crate) type KeyTransitionParts<'k, T, Ch, G> = (
    SetStatus<T, <Ch as AsChangeset>::Changeset>,
    StatusAnd<T, G>,
    TransitionMiss<'k, T, G>,
);

/// What a key-only transition of the row with `key` to `to` writes, requires and explains
/// a miss with: the status and `extra`, the allowed states and `condition`, and the miss.
pub(crate) fn key_transition_parts<T, Ch, G>(
    key: &T::Key,
    to: T::Status,
    extra: Ch,
    condition: G,
) -> KeyTransitionParts<'_, T, Ch, G>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
    Ch: AsChangeset<Target = T::Table>,
    G: Clone,
{
    let miss = TransitionMiss::new(
        RowMoved::<T>::advancing_any(key, T::Guard::at_end),
        to,
        T::Status::sources(to),
        condition.clone(),
    );
    let changes = Joined(ColumnEq::new(to), extra.as_changeset(), Comma);
    let condition = Joined(StatusIn::new(T::Status::sources(to)), condition, And);
    (changes, condition, miss)
}

/// A transition matched nothing: the latest row is gone, in a state that does not allow
/// the move ([`Error::InvalidTransition`]), at another token than the copy's
/// ([`Error::Conflict`]), short of the transition's condition ([`Error::InvalidTransition`]
/// naming it), or else whatever [`RowMoved`] finds (a version at its maximum, a refused
/// write).
pub(crate) struct TransitionMiss<'k, T: HasStatus, G> {
    row: RowMoved<'k, T>,
    to: T::Status,
    sources: &'static [T::Status],
    condition: G,
}

impl<T, C, G> Miss<C> for TransitionMiss<'_, T, G>
where
    T: HasStatus + LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    G: TransitionCondition<C::Backend>,
{
    fn explain(self, conn: &mut C) -> Error {
        let read = T::load_by_key(conn, self.key());
        self.given::<C::Backend>(T::table_name(), read, |e| classify(conn, e))
    }
}

impl<'k, T: HasStatus, G> TransitionMiss<'k, T, G> {
    /// A transition from `sources` to `to` under `condition` that `row` explains.
    pub(crate) fn new(
        row: RowMoved<'k, T>,
        to: T::Status,
        sources: &'static [T::Status],
        condition: G,
    ) -> Self {
        TransitionMiss {
            row,
            to,
            sources,
            condition,
        }
    }

    /// The key of the row the transition was for.
    pub(crate) fn key(&self) -> &'k T::Key {
        self.row.key()
    }

    /// Why the transition of a row of `table` missed, given the re-read of the row;
    /// `classify` turns a read error into the caller's error. What the sync and the async
    /// executors share.
    pub(crate) fn given<DB>(
        self,
        table: &'static str,
        read: diesel::QueryResult<Option<T>>,
        classify: impl FnOnce(diesel::result::Error) -> Error,
    ) -> Error
    where
        G: TransitionCondition<DB>,
    {
        let (key, to) = (self.row.key(), self.to);
        let refused = |current: T, unmet: Option<String>| {
            Error::InvalidTransition(Box::new(
                InvalidTransition::new(
                    table,
                    format!("{key:?}"),
                    current.status().name().to_string(),
                    to.name().to_string(),
                    current,
                )
                .with_unmet(unmet),
            ))
        };
        match read {
            Ok(Some(current)) if !self.sources.contains(&current.status()) => {
                refused(current, None)
            }
            Ok(Some(current)) if !self.row.holds_token_of(&current) => {
                self.row.given_in(table, Some(current))
            }
            Ok(Some(current)) => match self.condition.sql() {
                Ok(Some(unmet)) => refused(current, Some(unmet)),
                Ok(None) => self.row.given_in(table, Some(current)),
                Err(e) => Error::Database(e),
            },
            Ok(None) => self.row.given_in(table, None),
            Err(e) => unreadable_row(table, key, e, suspects::<T>()).unwrap_or_else(classify),
        }
    }
}

/// The columns an unreadable row is blamed on: the status first, then the guard's.
pub(crate) fn suspects<T: HasStatus>() -> String {
    let status = <T::StatusColumn as Column>::NAME;
    format!("{status} (or {})", T::GUARD_COLUMNS.join(", "))
}

/// One row of the library's transition history (`occ_transitions`); `at` is set by the
/// database's clock.
#[derive(Debug, Clone, Copy)]
pub struct HistoryEntry<'a> {
    /// The entity's table or type name.
    pub entity: &'a str,
    /// The row's key, as text.
    pub key: &'a str,
    /// The state it left.
    pub from: &'a str,
    /// The state it entered.
    pub to: &'a str,
    /// Who moved it, if known.
    pub actor: Option<&'a str>,
}

diesel::table! {
    /// The library's transition history.
    occ_transitions (id) {
        /// The order rows were written in.
        id -> BigInt,
        /// The entity's table or type name.
        entity -> Text,
        /// The row's key, as text.
        entity_key -> Text,
        /// The state it left.
        from_status -> Text,
        /// The state it entered.
        to_status -> Text,
        /// When, by the database's clock (UTC).
        at -> Timestamp,
        /// Who moved it, if known.
        actor -> Nullable<Text>,
    }
}

/// A history row as inserted (`id` and `at` are the database's).
#[doc(hidden)]
#[derive(Debug, Insertable)]
#[diesel(table_name = occ_transitions)]
pub struct NewHistoryRow {
    entity: String,
    entity_key: String,
    from_status: String,
    to_status: String,
    actor: Option<String>,
}

/// `INSERT INTO occ_transitions ...` of one history row.
pub(crate) type RecordHistory = InsertStatement<
    occ_transitions::table,
    <NewHistoryRow as Insertable<occ_transitions::table>>::Values,
>;

/// Appends `entry` to the library's transition history (`occ_transitions`, from
/// [`migrations`](crate::migrations)), stamped with the database's clock. Meant for a
/// transition hook, so that the history row commits or rolls back with the move. Every
/// text must be non-empty, free of NUL and at most
/// [`NAME_LIMIT`](crate::NAME_LIMIT) characters.
pub fn record<C>(conn: &mut C, entry: &HistoryEntry<'_>) -> Result<(), Error>
where
    C: LoadConnection,
    C::Backend: OccBackend,
    RecordHistory: Assignments<C::Backend> + ExecuteDsl<C>,
{
    history_insert(entry)?
        .run::<C, Counted, ()>(conn, false)
        .map(drop)
}

/// The insert of `entry`'s history row, its texts checked.
pub(crate) fn history_insert<'e>(
    entry: &'e HistoryEntry<'_>,
) -> Result<CompareAndSet<'e, RecordHistory, CannotMiss>, Error> {
    use crate::sql::names::check_name;
    check_name("entity", entry.entity)?;
    check_name("key", entry.key)?;
    check_name("state", entry.from)?;
    check_name("state", entry.to)?;
    if let Some(actor) = entry.actor {
        check_name("actor", actor)?;
    }
    let row = NewHistoryRow {
        entity: entry.entity.to_string(),
        entity_key: entry.key.to_string(),
        from_status: entry.from.to_string(),
        to_status: entry.to.to_string(),
        actor: entry.actor.map(str::to_string),
    };
    let insert = diesel::insert_into(occ_transitions::table).values(row);
    Ok(
        CompareAndSet::one(insert, "occ_transitions", &entry.key, CannotMiss)
            .matching(Matches::Any),
    )
}
