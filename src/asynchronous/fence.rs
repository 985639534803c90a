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

use super::run::AsyncRun;
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{classify, NativeAsyncConnection};
use crate::drive::on_async::executor::AsyncMiss;
use crate::drive::{Io, ReadOn, RunOn};
use crate::error::Error;
use crate::guard::Guarded;
use crate::locks::fence::{fenced_write, send_fenced, FenceMoved, FencedUpdateOf};
use crate::locks::fence_op::FencedUpdate;
use crate::operation::Operation;
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, ColumnOfRow};

/// Fenced writes on a diesel-async connection for every [`Guarded`] entity whose table has
/// a `BIGINT` fence column; see [`FencedWrite`](crate::FencedWrite).
pub trait AsyncFencedWrite: Guarded {
    /// The write of `changes` to the row with `key` under `fence` ([`Error::StaleFence`]
    /// once the row saw a newer one); see
    /// [`FencedWrite::write_fenced`](crate::FencedWrite::write_fenced).
    fn write_fenced<C, F, Ch>(
        conn: &mut C,
        key: &Self::Key,
        fence_column: F,
        fence: i64,
        changes: Ch,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        FencedUpdate<Self, F, Ch>: AsyncRun<C>,
    {
        let _ = fence_column;
        FencedUpdate::new(key.clone(), fence, changes).run_async(conn)
    }
}

impl<T: Guarded> AsyncFencedWrite for T {}

impl<T, C, F, Ch> AsyncRun<C> for FencedUpdate<T, F, Ch>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    F: Column<Table = T::Table, SqlType = BigInt> + Send,
    Ch: AsChangeset<Target = T::Table> + Send,
    <T::Table as diesel::QuerySource>::FromClause: Clone,
    T::KeyPredicate: Clone,
    FencedUpdateOf<T, Ch::Changeset, F>: Assignments<<C as Io>::Backend> + Send,
    ColumnOfRow<T::Table, T::KeyPredicate, F>: Send,
    for<'k> Counted: RunOn<
        C,
        FencedUpdateOf<T, Ch::Changeset, F>,
        FenceMoved<'k, ColumnOfRow<T::Table, T::KeyPredicate, F>>,
        (),
    >,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let FencedUpdate {
            key,
            fence,
            changes,
            ..
        } = self;
        let table = T::table_name();
        let write = fenced_write::<<C as Io>::Backend, T, Ch, F>(table, &key, fence, changes)?;
        send_fenced(conn, write).await
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
