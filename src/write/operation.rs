//! A version row guarding a business operation: a row
//! `(lock_name, resource, version)` in the library's `occ_versions` table stands for
//! something larger than one row (an invoice run, a customer's whole cart). Each run of
//! the operation reads the version, does its reads and writes, and ends by advancing the
//! version under the guard; when another run advanced it meanwhile, the guard misses, the
//! whole transaction rolls back (every write the operation made) and it starts again.
//!
//! The row is created on first use (`INSERT ... ON CONFLICT DO NOTHING`, MySQL's
//! `ON DUPLICATE KEY UPDATE`), so two first users at once both find one row. Names are
//! data: bound, compared exactly (bytes, `VARBINARY`, on MySQL), and refused before
//! anything is sent when longer than [`NAME_LIMIT`] characters, empty, or holding a NUL.
//! Needs the library's tables ([`migrations`](crate::migrations)).

use std::future::{ready, Future};

use diesel::connection::LoadConnection;
use diesel::prelude::*;

use diesel::query_builder::InsertStatement;
use diesel::query_dsl::methods::ExecuteDsl;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::blocking::Sourced;
use crate::drive::read_modify_write::{read_modify_write, Step};
use crate::drive::{now, Blocking, UpdateOn};
use crate::error::Error;
use crate::flow::compare_and_set::{CompareAndSet, Matches};
use crate::guard::Guarded;
use crate::operation::{Operation, Run, Update};
use crate::retry::{Contention, RetryPolicy, Stop};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, InsertIfMissing, NoChanges};
use crate::write::entity::{write_and_record, UpdateRow};
use crate::write::modify::Modified;

diesel::table! {
    /// The library's version rows.
    occ_versions (lock_name, resource) {
        /// What kind of operation the row guards ("invoice-run").
        lock_name -> Text,
        /// Which instance of it ("customer-42").
        resource -> Text,
        /// Advanced by every completed run.
        version -> BigInt,
    }
}

/// One version row.
#[derive(
    Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, crate::Guarded,
)]
#[diesel(table_name = occ_versions, primary_key(lock_name, resource))]
pub struct VersionRow {
    /// What kind of operation the row guards.
    pub lock_name: String,
    /// Which instance of it.
    pub resource: String,
    /// How many runs completed.
    #[occ(version)]
    pub version: i64,
}

/// `INSERT` of the row at version 0 unless it exists.
pub(crate) type CreateIfMissing = InsertIfMissing<
    InsertStatement<occ_versions::table, <VersionRow as Insertable<occ_versions::table>>::Values>,
    occ_versions::version,
>;

/// The creation of the version row `(lock_name, resource)` at version 0 unless it exists:
/// the first step of a guarded operation, before its attempts. Names are checked when it
/// is made.
pub struct EnsureVersionRow {
    pub(crate) key: (String, String),
}

impl EnsureVersionRow {
    /// The creation of `(lock_name, resource)`; refused when a name is longer than
    /// [`NAME_LIMIT`](crate::NAME_LIMIT) characters, empty, or holds a NUL.
    pub(crate) fn new(lock_name: &str, resource: &str) -> Result<Self, Error> {
        crate::sql::names::check_name("lock name", lock_name)?;
        crate::sql::names::check_name("resource", resource)?;
        Ok(Self {
            key: (lock_name.to_string(), resource.to_string()),
        })
    }

    /// The compare-and-set that creates the row: any count of rows is a success.
    pub(crate) fn write(&self) -> CompareAndSet<'_, CreateIfMissing, CannotMiss> {
        let create =
            CreateIfMissing::new(diesel::insert_into(occ_versions::table).values(VersionRow {
                lock_name: self.key.0.clone(),
                resource: self.key.1.clone(),
                version: 0,
            }));
        CompareAndSet::one(create, "occ_versions", &self.key, CannotMiss).matching(Matches::Any)
    }

    /// The policy of the operation's attempts: `policy`, optimistic whatever it says.
    /// The operation locks the rows it writes before the version row is updated, so an
    /// attempt that read the version row with its lock first would take the two in the
    /// opposite order and deadlock with the others.
    pub(crate) fn policy(policy: &RetryPolicy) -> RetryPolicy {
        policy.clone().contention(Contention::Optimistic)
    }
}

impl Operation for EnsureVersionRow {
    type Output = ();
    type Error = Error;
}

impl<C> Run<C> for EnsureVersionRow
where
    C: LoadConnection,
    C::Backend: OccBackend,
    CreateIfMissing: Assignments<C::Backend> + ExecuteDsl<C>,
{
    fn run(self, conn: &mut C) -> Result<(), Error> {
        self.write().run::<C, Counted, i64>(conn, false).map(drop)
    }
}

/// The end of an attempt: the advance of the version row from `read`, the version the
/// attempt read, inside the attempt's transaction.
pub(crate) fn advance(read: &VersionRow) -> Update<VersionRow, NoChanges<occ_versions::table>> {
    Update::new(read.key(), read.version, NoChanges::default())
        .saving(read)
        .owned_transaction(true)
}

/// Runs `operation` guarded by the version row `(lock_name, resource)`: each attempt in a
/// fresh write transaction reads the row's version, runs `operation` on the transaction,
/// and advances the version if it is still the one read. When another run advanced it
/// meanwhile, everything `operation` wrote is rolled back and, as `policy` allows, the
/// attempt starts again; so `operation` must keep its effects inside the transaction.
/// `operation` may stop with the caller's own error: its writes are rolled back and the
/// error comes back unchanged.
///
/// Inside a transaction the caller opened, one attempt runs (see
/// [`GuardedModify`](crate::GuardedModify)). Attempts always read the version row without a lock
/// ([`Contention::Optimistic`]): the operation's own writes lock their rows first, and a
/// locked read of the version row would take locks in the opposite order. For a resource
/// so hot that retries pile up, take a lock (`Locks`) instead. Returns the operation's value, the new version and the
/// number of attempts.
pub fn guarded_operation<C, R, E>(
    conn: &mut C,
    lock_name: &str,
    resource: &str,
    policy: &RetryPolicy,
    mut operation: impl FnMut(&mut C) -> Result<R, E>,
) -> Result<Modified<VersionRow, R>, E>
where
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    EnsureVersionRow: Run<C>,
    VersionRow: UpdateRow<C, NoChanges<occ_versions::table>>,
    E: From<Error>,
{
    let ensure = EnsureVersionRow::new(lock_name, resource)?;
    let key = ensure.key.clone();
    ensure.run(conn)?;
    let policy = EnsureVersionRow::policy(policy);
    let step = Versioned(OnBlocking(&mut operation));
    now(read_modify_write(
        Sourced(conn),
        &key,
        &policy,
        "version",
        step,
    ))
}

/// A guarded operation's attempt, on either driver: the caller's operation on the
/// attempt's transaction, then the version's advance.
pub(crate) struct Versioned<W>(pub(crate) W);

/// The caller's operation of a guarded operation, on connection `C`.
pub(crate) trait Work<C, R, E> {
    /// Runs it once on `conn`.
    fn work<'a>(&'a mut self, conn: &'a mut C) -> impl Future<Output = Result<R, E>>;
}

/// A blocking operation, a closure of the connection.
pub(crate) struct OnBlocking<'f, F>(&'f mut F);

impl<C, F, R, E> Work<Blocking<C>, R, E> for OnBlocking<'_, F>
where
    F: FnMut(&mut C) -> Result<R, E>,
{
    fn work<'a>(&'a mut self, conn: &'a mut Blocking<C>) -> impl Future<Output = Result<R, E>> {
        ready((self.0)(conn.inner()))
    }
}

impl<C, W, R, E> Step<VersionRow, C, R, E> for Versioned<W>
where
    W: Work<C, R, E>,
    VersionRow: UpdateOn<C, NoChanges<occ_versions::table>>,
{
    const OPERATION: &'static str = "guarded_operation";

    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        read: &'a VersionRow,
    ) -> Result<(VersionRow, i64, R), Stop<E>> {
        let value = self.0.work(conn).await.map_err(Stop::Caller)?;
        let mut row = read.clone();
        let version = write_and_record(&mut row, conn, advance(read)).await?;
        Ok((row, version, value))
    }
}
