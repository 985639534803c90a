//! Fenced writes on a diesel-async connection: the blocking
//! [`FencedWrite`](crate::FencedWrite), the same statement and the same explanation of a
//! miss (a newer fence in the row is [`Error::StaleFence`]), the statement awaited.
//! SQLite's connection runs the blocking write whole on its own thread, behind this
//! process's other writers, as every SQLite write of the library does.

use std::future::Future;

use diesel::query_builder::AsChangeset;
use diesel::sql_types::BigInt;
use diesel::{Column, OptionalExtension};
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::connection::{classify, refuse_broken, NativeAsync, NativeAsyncConnection};
use super::executor::{run, AsyncMiss};
use super::send::{AsyncComplete, AsyncLoadByKey};
use super::transaction::Call;
use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::Guarded;
use crate::locks::fence::{fenced_write, FenceMoved, FencedUpdateOf};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, ColumnOfRow};

/// Fenced writes on a diesel-async connection for every [`Guarded`] entity whose table has
/// a `BIGINT` fence column; see [`FencedWrite`](crate::FencedWrite).
pub trait AsyncFencedWrite: Guarded {
    /// Applies `changes` to the row with `key` and records `fence` in `fence_column`,
    /// unless the row has already seen a newer fence: then [`Error::StaleFence`] with the
    /// newest one, and nothing is written; see
    /// [`FencedWrite::write_fenced`](crate::FencedWrite::write_fenced).
    fn write_fenced<'a, C, F, Ch>(
        conn: &'a mut C,
        key: &'a Self::Key,
        fence_column: F,
        fence: i64,
        changes: Ch,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Self: AsyncWriteFenced<C, F, Ch>,
        Ch: 'a,
    {
        let _ = fence_column;
        Self::write_fenced_row(conn, key, fence, changes)
    }
}

impl<T: Guarded> AsyncFencedWrite for T {}

/// A fenced write of entity `Self` with fence column `F` and changes `Ch` on async
/// connection `C`, as one bound; not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a fenced write on `{F}` with `{Ch}` on `{C}`",
    note = "the fence column must be a `BigInt` column of the entity's table, the changes for that table, and the connection a diesel-async connection of a backend diesel-occ supports"
)]
pub trait AsyncWriteFenced<C, F, Ch>: Guarded {
    /// Runs the write; [`AsyncFencedWrite`] calls it.
    #[doc(hidden)]
    fn write_fenced_row<'a>(
        conn: &'a mut C,
        key: &'a Self::Key,
        fence: i64,
        changes: Ch,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Ch: 'a;
}

impl<T, C, F, Ch> AsyncWriteFenced<C, F, Ch> for T
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection + Send,
    C::Backend: NativeAsync,
    F: Column<Table = T::Table, SqlType = BigInt> + Send,
    Ch: AsChangeset<Target = T::Table> + Send,
    <T::Table as diesel::QuerySource>::FromClause: Clone,
    T::KeyPredicate: Clone,
    FencedUpdateOf<T, Ch::Changeset, F>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, FencedUpdateOf<T, Ch::Changeset, F>, ()>,
    ColumnOfRow<T::Table, T::KeyPredicate, F>: LoadQuery<'static, C, i64> + Send + 'static,
{
    async fn write_fenced_row<'a>(
        conn: &'a mut C,
        key: &'a T::Key,
        fence: i64,
        changes: Ch,
    ) -> Result<(), Error>
    where
        Ch: 'a,
    {
        refuse_broken(conn)?;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let write = fenced_write::<C::Backend, T, Ch, F>(table, key, fence, changes)?;
        // A call dropped half way leaves a MySQL connection marked broken, never half read.
        let mut call = Call::start(conn);
        let written = run::<C, _, _, Counted, ()>(write, call.conn(), false).await;
        call.finish(written).map(drop)
    }
}

impl<C, Q> AsyncMiss<C> for FenceMoved<'_, Q>
where
    C: AsyncConnection + Send,
    C::Backend: OccBackend,
    Q: LoadQuery<'static, C, i64> + Send + 'static,
{
    async fn explain(self, conn: &mut C) -> Error {
        let (read, moved) = self.split();
        match read.get_result::<i64>(conn).await.optional() {
            Ok(newest) => moved.given(newest),
            Err(e) => classify(conn, e).await,
        }
    }
}
