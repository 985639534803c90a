//! Fenced writes: storage that refuses a write carrying a fencing token older than the
//! newest it has seen (Kleppmann's fencing), so that a lock holder paused past its lease
//! cannot write after another holder took over.
//!
//! The protected row keeps the newest fence it accepted in a column of its own:
//! `UPDATE t SET <changes>, last_fence = ?fence WHERE <key> AND last_fence <= ?fence`.
//! A miss reads that column back: a newer fence there is [`Error::StaleFence`].

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, AstPass, QueryFragment, QueryId};
use diesel::query_dsl::methods::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType};
use diesel::{Column, OptionalExtension, QueryResult};

use crate::connect::backend::OccBackend;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::error::Error;
use crate::flow::compare_and_set::{refuse_status_write, CompareAndSet};
use crate::guard::Guarded;
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, ColumnEq, ColumnOfRow, GuardedUpdate};
use crate::telemetry::Call;

use crate::drive::blocking::executor::{classify, Miss};
use crate::drive::{now, Blocking, Io, RunOn};

/// `"last_fence" <= ?`: the write's fence is not older than the newest seen.
#[derive(Debug, Clone, Copy)]
pub struct FenceAtMost<Col> {
    fence: i64,
    column: PhantomData<Col>,
}

impl<Col, DB> QueryFragment<DB> for FenceAtMost<Col>
where
    DB: Backend + HasSqlType<BigInt>,
    Col: Column<SqlType = BigInt>,
    i64: ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" <= ");
        out.push_bind_param::<BigInt, i64>(&self.fence)
    }
}

impl<Col> QueryId for FenceAtMost<Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// The fenced `UPDATE` of entity `T` with changes `Ch` and fence column `F`.
pub(crate) type FencedUpdateOf<T, Ch, F> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    ColumnEq<F, i64>,
    <T as Guarded>::KeyPredicate,
    FenceAtMost<F>,
>;

/// Fenced writes for every [`Guarded`] entity whose table has a `BIGINT` fence column.
pub trait FencedWrite: Guarded {
    /// Applies `changes` to the row with `key` and records `fence` in `fence_column`,
    /// unless the row has already seen a newer fence: then [`Error::StaleFence`] with the
    /// newest one, and nothing is written. The row's own guard is not checked: the fence
    /// is the guard here.
    fn write_fenced<C, F, Ch>(
        conn: &mut C,
        key: &Self::Key,
        fence_column: F,
        fence: i64,
        changes: Ch,
    ) -> Result<(), Error>
    where
        Self: WriteFenced<C, F, Ch>,
    {
        let _ = fence_column;
        Self::write_fenced_row(conn, key, fence, changes)
    }
}

/// A fenced write of entity `Self` with fence column `F` and changes `Ch` on connection
/// `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a fenced write on `{F}` with `{Ch}` on `{C}`",
    note = "the fence column must be a `BigInt` column of the entity's table, the changes for that table, and the connection a diesel connection of a backend diesel-occ supports",
    note = "on a diesel-async connection, use `diesel_occ::asynchronous::AsyncFencedWrite::write_fenced` (in `diesel_occ::asynchronous::prelude`) and `.await` it"
)]
pub trait WriteFenced<C, F, Ch>: LoadByKey<C> {
    /// Runs the write; [`FencedWrite`] calls it.
    #[doc(hidden)]
    fn write_fenced_row(
        conn: &mut C,
        key: &Self::Key,
        fence: i64,
        changes: Ch,
    ) -> Result<(), Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, F, Ch> WriteFenced<C, F, Ch> for T
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    F: Column<Table = T::Table, SqlType = BigInt>,
    Ch: AsChangeset<Target = T::Table>,
    <T::Table as diesel::QuerySource>::FromClause: Clone,
    T::KeyPredicate: Clone,
    FencedUpdateOf<T, Ch::Changeset, F>: Assignments<C::Backend> + Send,
    Counted: Complete<C, FencedUpdateOf<T, Ch::Changeset, F>, ()>,
    ColumnOfRow<T::Table, T::KeyPredicate, F>: LoadQuery<'static, C, i64> + Send,
{
    fn write_fenced_row(conn: &mut C, key: &T::Key, fence: i64, changes: Ch) -> Result<(), Error> {
        let write = fenced_write::<C::Backend, T, Ch, F>(T::table_name(), key, fence, changes)?;
        now(send_fenced(Blocking::wrap(conn), write))
    }
}

/// A fenced write's compare-and-set (checked by [`fenced_write`]), sent on either driver
/// as one call: dropped half way, it leaves a MySQL connection marked broken, never half
/// read.
pub(crate) async fn send_fenced<C, S, Q>(
    conn: &mut C,
    write: CompareAndSet<'_, S, FenceMoved<'_, Q>>,
) -> Result<(), Error>
where
    C: Io,
    S: Send,
    Q: Send,
    for<'k> Counted: RunOn<C, S, FenceMoved<'k, Q>, ()>,
{
    let (table, key) = write.target();
    let call = Call::new::<C::Backend>("write_fenced", table, Some(&key));
    call.run(async move {
        conn.refuse_broken()?;
        let send =
            async |conn: &mut C| <Counted as RunOn<C, _, _, ()>>::run(conn, write, false).await;
        conn.call(send).await.map(drop)
    })
    .await
}

/// The compare-and-set of a fenced write of `changes` to the row of entity `T` (in
/// `table`) with `key`, recording `fence` in column `F`; checked before anything is sent
/// (a change of the status column is refused). What the blocking and the async paths both
/// send.
#[allow(clippy::type_complexity)]
pub(crate) fn fenced_write<'k, DB, T, Ch, F>(
    table: &'static str,
    key: &'k T::Key,
    fence: i64,
    changes: Ch,
) -> Result<
    CompareAndSet<
        'k,
        FencedUpdateOf<T, Ch::Changeset, F>,
        FenceMoved<'k, ColumnOfRow<T::Table, T::KeyPredicate, F>>,
    >,
    Error,
>
where
    T: Guarded,
    F: Column<Table = T::Table, SqlType = BigInt>,
    Ch: AsChangeset<Target = T::Table>,
    <T::Table as diesel::QuerySource>::FromClause: Clone,
    T::KeyPredicate: Clone,
    FencedUpdateOf<T, Ch::Changeset, F>: Assignments<DB>,
{
    let statement = FencedUpdateOf::<T, Ch::Changeset, F>::new(
        T::table(),
        changes.as_changeset(),
        ColumnEq::new(fence),
        T::key_predicate(key),
        FenceAtMost {
            fence,
            column: PhantomData,
        },
    );
    refuse_status_write(table, T::STATUS_COLUMN, &statement, 0)?;
    let miss = FenceMoved {
        newest: statement.read_back::<F>(),
        presented: fence,
        table,
        key,
    };
    Ok(CompareAndSet::one(statement, table, key, miss))
}

/// A fenced write matched nothing: the row's newest fence, read back, is newer than the
/// one presented ([`Error::StaleFence`]), or the row is gone.
pub(crate) struct FenceMoved<'k, Q> {
    newest: Q,
    presented: i64,
    table: &'static str,
    key: &'k (dyn std::fmt::Debug + Sync),
}

impl<'k, Q> FenceMoved<'k, Q> {
    /// The read of the row's newest fence, and what explains the miss given its answer.
    pub(crate) fn split(self) -> (Q, FenceMoved<'k, ()>) {
        let FenceMoved {
            newest,
            presented,
            table,
            key,
        } = self;
        let rest = FenceMoved {
            newest: (),
            presented,
            table,
            key,
        };
        (newest, rest)
    }

    /// The miss explained by the row's newest fence as read back (`None`: no row).
    pub(crate) fn given(&self, newest: Option<i64>) -> Error {
        match newest {
            Some(current) => Error::StaleFence {
                presented: self.presented,
                current,
            },
            None => Error::NotFound {
                table: self.table,
                key: format!("{:?}", self.key),
            },
        }
    }
}

impl<C, Q> Miss<C> for FenceMoved<'_, Q>
where
    C: LoadConnection,
    C::Backend: OccBackend,
    Q: LoadQuery<'static, C, i64>,
{
    fn explain(self, conn: &mut C) -> Error {
        let (read, moved) = self.split();
        match read.get_result::<i64>(conn).optional() {
            Ok(newest) => moved.given(newest),
            Err(e) => classify(conn, e),
        }
    }
}

impl<T: Guarded> FencedWrite for T {}
