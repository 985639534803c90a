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

use diesel::connection::LoadConnection;
use diesel::prelude::*;

use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::Text;

use crate::backend::{Duplicates, OccBackend};
use crate::completion::Complete;
use crate::connection::WriteTransaction;
use crate::error::Error;
use crate::guard::CompletionOf;
use crate::modify::{read_modify_write, Modified};
use crate::retry::{Contention, RetryPolicy, Stop};
use crate::statement::{CompareAndSet, NoChanges};
use crate::update::{GuardedWrite, UpdateOf};

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

/// The longest name or resource, in characters: what MySQL indexes in a two-column key of
/// `VARCHAR(191)` utf8mb4 columns. A longer name is refused rather than cut, since a cut
/// could make two names one.
pub const NAME_LIMIT: usize = 191;

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

/// Checks a name before it is sent: not empty, no NUL, at most [`NAME_LIMIT`] characters.
pub fn check_name(what: &'static str, name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "it is empty".to_string()
    } else if name.contains('\0') {
        "it holds a NUL character, which PostgreSQL cannot store".to_string()
    } else if name.chars().count() > NAME_LIMIT {
        format!(
            "it has {} characters, over the limit of {NAME_LIMIT}",
            name.chars().count()
        )
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what,
        name: name.chars().take(64).collect(),
        reason,
    })
}

/// `INSERT` of the row at version 0 unless it exists: one statement, so that two first
/// users at once find one row.
#[derive(Debug)]
pub struct CreateIfMissing<'a> {
    lock_name: &'a str,
    resource: &'a str,
}

impl<DB: OccBackend> QueryFragment<DB> for CreateIfMissing<'_>
where
    str: ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("INSERT INTO occ_versions (lock_name, resource, version) VALUES (");
        out.push_bind_param::<Text, str>(self.lock_name)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.resource)?;
        out.push_sql(", 0)");
        out.push_sql(match DB::DUPLICATES {
            Duplicates::OnConflict => " ON CONFLICT DO NOTHING",
            Duplicates::OnDuplicateKey => " ON DUPLICATE KEY UPDATE version = version",
        });
        Ok(())
    }
}

impl QueryId for CreateIfMissing<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
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
/// [`modify`](crate::modify)). Attempts always read the version row without a lock
/// ([`Contention::Optimistic`]): the operation's own writes lock their rows first, and a
/// locked read of the version row would take locks in the opposite order. For a resource
/// so hot that retries pile up, take a lock (`lock::Locks`) instead. Returns the operation's value, the new version and the
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
    VersionRow: GuardedWrite + crate::update::LoadByKey<C>,
    for<'a> CreateIfMissing<'a>: QueryFragment<C::Backend>,
    UpdateOf<VersionRow, NoChanges<occ_versions::table>>: CompareAndSet<C::Backend>,
    CompletionOf<VersionRow>:
        Complete<C, UpdateOf<VersionRow, NoChanges<occ_versions::table>>, i64>,
    E: From<Error>,
{
    check_name("lock name", lock_name)?;
    check_name("resource", resource)?;
    let create = CreateIfMissing {
        lock_name,
        resource,
    };
    conn.execute_returning_count(&create)
        .map_err(|e| crate::update::classify(conn, e))?;
    let key = (lock_name.to_string(), resource.to_string());
    // Optimistic whatever the policy says: `operation` locks the rows it writes before the
    // version row is updated, so an attempt that read the version row with its lock first
    // would take the two in the opposite order and deadlock with the others.
    let policy = policy.clone().contention(Contention::Optimistic);
    read_modify_write(conn, &key, &policy, "version", |conn, read: &VersionRow| {
        let value = operation(conn).map_err(Stop::Caller)?;
        let mut row = read.clone();
        let version = row.guarded_touch(conn)?;
        Ok((row, version, value))
    })
}
