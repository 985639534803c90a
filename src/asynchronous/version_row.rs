//! A business operation guarded by a version row, on a diesel-async connection: the
//! blocking [`guarded_operation`](crate::guarded_operation), with the operation an async
//! closure. The same row, created the same way, the same attempts and outcomes.

use diesel::query_builder::QueryFragment;

use super::entity::write_and_record;
use super::modify::{modify_with, Caller, Step};
use super::run::AsyncRun;
use super::write_transaction::{AsyncWriteConnection, TransactionWork};
use crate::drive::on_async::connection::{
    in_transaction, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use crate::drive::on_async::executor::run;
use crate::drive::on_async::send::{AsyncComplete, AsyncLoadByKey};
use crate::drive::on_async::transaction::Call;
use crate::error::Error;
use crate::operation::{Operation, Update};
use crate::retry::{RetryPolicy, Stop};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, NoChanges};
use crate::write::modify::Modified;
use crate::write::operation::{
    advance, occ_versions, CreateIfMissing, EnsureVersionRow, VersionRow,
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
pub async fn guarded_operation<C, R, E, W>(
    conn: &mut C,
    lock_name: &str,
    resource: &str,
    policy: &RetryPolicy,
    operation: W,
) -> Result<Modified<VersionRow, R>, E>
where
    C: AsyncWriteConnection + 'static,
    VersionRow: AsyncLoadByKey<C>,
    EnsureVersionRow: AsyncRun<C>,
    Update<VersionRow, NoChanges<occ_versions::table>>: AsyncRun<C>,
    W: for<'r> TransactionWork<'r, C, R, E> + Clone + Send,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let ensure = EnsureVersionRow::new(lock_name, resource)?;
    let key = ensure.key.clone();
    refuse_broken(conn)?;
    ensure.run_async(conn).await?;
    let nested = in_transaction(conn);
    let policy = EnsureVersionRow::policy(policy);
    let step = VersionedStep(operation);
    modify_with(Caller(Some(conn)), nested, &key, &policy, "version", step).await
}

/// A guarded operation's attempt: the caller's operation, then the version's advance.
struct VersionedStep<W>(W);

impl<C, W, R, E> Step<VersionRow, C, R, E> for VersionedStep<W>
where
    C: Send + 'static,
    W: for<'r> TransactionWork<'r, C, R, E> + Clone + Send,
    Update<VersionRow, NoChanges<occ_versions::table>>: AsyncRun<C>,
    R: Send + 'static,
    E: Send + 'static,
{
    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        read: &'a VersionRow,
    ) -> Result<(VersionRow, i64, R), Stop<E>> {
        let value = (self.0.clone())(conn).await.map_err(Stop::Caller)?;
        let mut row = read.clone();
        let version = write_and_record(&mut row, conn, advance(read))
            .await
            .map_err(Stop::Occ)?;
        Ok((row, version, value))
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
