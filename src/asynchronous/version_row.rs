//! A business operation guarded by a version row, on a diesel-async connection: the
//! blocking [`guarded_operation`](crate::guarded_operation), with the operation an async
//! closure. The same row, created the same way, the same attempts and outcomes.

use std::future::Future;

use diesel::query_builder::QueryFragment;

use super::run::AsyncRun;
use super::write_transaction::{AsyncWriteConnection, TransactionWork};
use crate::drive::on_async::connection::{refuse_broken, NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::executor::run;
use crate::drive::on_async::send::{AsyncComplete, AsyncLoadByKey};
use crate::drive::on_async::transaction::Call;
use crate::drive::on_async::Caller;
use crate::drive::read_modify_write::read_modify_write;
use crate::error::Error;
use crate::operation::{Operation, Update};
use crate::retry::RetryPolicy;
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, NoChanges};
use crate::write::modify::Modified;
use crate::write::operation::{
    occ_versions, CreateIfMissing, EnsureVersionRow, VersionRow, Versioned, Work,
};

/// Runs `operation` guarded by the version row `(lock_name, resource)`, as
/// [`guarded_operation`](crate::guarded_operation) does on a blocking connection: each
/// attempt in a fresh write transaction reads the row's version, runs `operation` on the
/// transaction, and advances the version if it is still the one read; when another run
/// advanced it meanwhile, everything `operation` wrote is rolled back and, as `policy`
/// allows, the attempt starts again. `operation` is an `async` closure,
/// `async |conn: &mut AsyncPgConnection| { ... }` (the parameter's type written out), cloned for each attempt (so what it captures must be `Clone`,
/// a shared reference for instance), and its value and error own their data (`'static`);
/// its own error rolls back and comes back unchanged. Inside a transaction the caller
/// opened, one attempt runs.
///
/// Dropped during an attempt, the attempt's transaction leaves the connection marked
/// broken (see the [module documentation](crate::asynchronous)) and nothing of the
/// attempt commits; dropped between attempts, nothing is open. The version row, created
/// first, may then exist at its version.
// Not an `async fn`: its future is declared `Send` here, where the compiler can prove
// it for every connection (rust-lang/rust#100013 keeps it from proving it at a call site).
#[allow(clippy::manual_async_fn)]
pub fn guarded_operation<'a, C, R, E, W>(
    conn: &'a mut C,
    lock_name: &'a str,
    resource: &'a str,
    policy: &'a RetryPolicy,
    operation: W,
) -> impl Future<Output = Result<Modified<VersionRow, R>, E>> + Send + 'a
where
    C: AsyncWriteConnection + 'static,
    VersionRow: AsyncLoadByKey<C>,
    EnsureVersionRow: AsyncRun<C>,
    Update<VersionRow, NoChanges<occ_versions::table>>: AsyncRun<C>,
    W: for<'r> TransactionWork<'r, C, R, E> + Clone + Send + 'a,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    async move {
        let ensure = EnsureVersionRow::new(lock_name, resource)?;
        let key = ensure.key.clone();
        refuse_broken(conn)?;
        ensure.run_async(conn).await?;
        let policy = EnsureVersionRow::policy(policy);
        let step = Versioned(OnAsync(operation));
        read_modify_write(Caller(conn), &key, &policy, "version", step).await
    }
}

/// An async operation, an async closure of the connection cloned for each attempt.
struct OnAsync<W>(W);

impl<C, W, R, E> Work<C, R, E> for OnAsync<W>
where
    W: for<'r> TransactionWork<'r, C, R, E> + Clone,
{
    fn work<'a>(&'a mut self, conn: &'a mut C) -> impl Future<Output = Result<R, E>> {
        (self.0.clone())(conn)
    }
}

impl<C> AsyncRun<C> for EnsureVersionRow
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    CreateIfMissing: Assignments<C::Backend> + QueryFragment<C::Backend> + Send,
    Counted: AsyncComplete<C, CreateIfMissing, i64>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        refuse_broken(conn)?;
        let mut call = Call::start(conn);
        let written = run::<C, _, _, Counted, i64>(self.write(), call.conn(), false).await;
        call.finish(written).map(drop)
    }
}
