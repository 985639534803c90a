//! The executor of guarded writes and the version-guarded writes built on it.

use diesel::connection::{Connection, LoadConnection, TransactionManager};
use diesel::dsl::{AsSelect, Filter, Select};
use diesel::query_builder::{AsChangeset, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, LoadQuery, SelectDsl};
use diesel::query_source::QuerySource;
use diesel::result::Error as DieselError;
use diesel::{OptionalExtension, QueryResult, RunQueryDsl, Selectable, SelectableHelper};

use crate::backend::OccBackend;
use crate::error::{Conflict, Error, Token};
use crate::guard::{Guarded, VersionNumber};
use crate::names::table_name;
use crate::statement::{
    ColumnEq, CompareAndSet, GuardedDelete, GuardedUpdate, LatestRead, NoChanges,
};

/// Runs one compare-and-set statement and classifies its outcome.
///
/// - a changeset that assigns a column the guard sets: [`Error::ChangesetAssignsGuard`],
///   before anything is sent.
/// - 1 row: `Ok(())`.
/// - 0 rows: `on_miss` explains why (it usually reads the row again by key).
/// - more rows: [`Error::KeyNotUnique`]; the key does not address one row.
/// - a database error: [`Error::Ambiguous`] when the connection died outside a
///   transaction, [`Error::Retryable`] when the backend says a fresh attempt can succeed
///   ([`OccBackend::retry_reason`]), else [`Error::Database`].
///
/// Every guard kind runs through here, so they all report outcomes the same way.
/// `describe` names the table and key for messages; it runs only on the error paths.
pub fn execute_guarded<C, S>(
    conn: &mut C,
    statement: S,
    describe: impl FnOnce() -> (&'static str, String),
    on_miss: impl FnOnce(&mut C) -> Error,
) -> Result<(), Error>
where
    C: LoadConnection,
    C::Backend: OccBackend,
    S: ExecuteDsl<C> + CompareAndSet<C::Backend>,
{
    if let Some(column) = statement.assigned_twice()? {
        let (table, _) = describe();
        return Err(Error::ChangesetAssignsGuard { table, column });
    }
    match ExecuteDsl::execute(statement, conn) {
        Ok(1) => Ok(()),
        Ok(0) => Err(on_miss(conn)),
        Ok(rows) => {
            let (table, key) = describe();
            Err(Error::KeyNotUnique { table, key, rows })
        }
        Err(e) => Err(classify(conn, e)),
    }
}

/// Classifies an error that a statement just returned on `conn` (see [`execute_guarded`]).
pub fn classify<C>(conn: &mut C, error: DieselError) -> Error
where
    C: LoadConnection,
    C::Backend: OccBackend,
{
    if !in_transaction(conn) && crate::error::connection_lost(&error) {
        return Error::Ambiguous { source: error };
    }
    Error::classified(error, |e| C::Backend::retry_reason(conn, e))
}

/// Whether `conn` has an open transaction (so a dropped connection rolls the write back).
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map(|depth| depth.is_some())
        // A broken transaction manager means the connection is in an unknown state:
        // treat the write as possibly applied.
        .unwrap_or(false)
}

/// The version-guarded `UPDATE` of entity `T` with changeset `Ch`.
pub type VersionedUpdate<T, Ch> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    VersionEq<T>,
    <T as Guarded>::KeyPredicate,
    VersionEq<T>,
>;

/// The version-guarded `DELETE` of entity `T`.
pub type VersionedDelete<T> = GuardedDelete<
    <T as diesel::associations::HasTable>::Table,
    <T as Guarded>::KeyPredicate,
    VersionEq<T>,
>;

/// `version = ?` for entity `T`.
pub type VersionEq<T> = ColumnEq<<T as Guarded>::VersionColumn, <T as Guarded>::Version>;

/// What the executor needs of an entity on connection `C`: its table's name and a read
/// of the latest committed row by key (see [`LatestRead`]), to explain a write that
/// matched no row. Implemented for every [`Guarded`] + [`Selectable`] entity whose query
/// fits `C`.
pub trait LoadByKey<C>: Guarded {
    /// The row with `key`, if it exists, as last committed. Inside a transaction the read
    /// locks the row until the transaction ends.
    fn load_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>>;

    /// The table's SQL name, for messages.
    fn table_name() -> &'static str;
}

impl<T, C> LoadByKey<C> for T
where
    T: Guarded + Selectable<C::Backend>,
    C: LoadConnection,
    C::Backend: OccBackend,
    T::Table: 'static,
    <T::Table as QuerySource>::FromClause: QueryFragment<C::Backend>,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeyPredicate>,
    Filter<T::Table, T::KeyPredicate>: SelectDsl<AsSelect<T, C::Backend>>,
    LatestRead<Select<Filter<T::Table, T::KeyPredicate>, AsSelect<T, C::Backend>>>:
        LoadQuery<'static, C, T>,
{
    fn load_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>> {
        let locking = in_transaction(conn);
        let filtered = FilterDsl::filter(T::table(), T::key_predicate(key));
        LatestRead::new(SelectDsl::select(filtered, T::as_select()), locking)
            .get_result(conn)
            .optional()
    }

    fn table_name() -> &'static str {
        table_name::<T::Table, C::Backend>(&T::table())
    }
}

/// Version-guarded writes for every [`Guarded`] entity.
///
/// Each write is one statement, `... WHERE <key> AND version = <the version this copy was
/// read at>`, that also sets the next version. It returns the new version without reading
/// the row back. When it matches no row the row is read once by key to report
/// [`Error::NotFound`] or [`Error::Conflict`] with the current row. Nothing opens a
/// transaction: inside the caller's transaction the write is part of it.
///
/// At the version type's maximum every write fails with [`Error::VersionOverflow`] before
/// anything is sent: versions never wrap, since a wrapped version could repeat a token a
/// stale copy still holds.
pub trait GuardedWrite: Guarded {
    /// Applies `changes` to this row if it is still at this copy's version, and advances
    /// the version. An empty changeset (all fields `None`) just advances the version.
    ///
    /// The copy itself is not modified: its other fields do not reflect `changes`.
    fn guarded_update<C, Ch>(&self, conn: &mut C, changes: Ch) -> Result<Self::Version, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        Ch: AsChangeset<Target = Self::Table>,
        VersionedUpdate<Self, Ch::Changeset>: ExecuteDsl<C> + CompareAndSet<C::Backend>,
        Self: LoadByKey<C>,
    {
        let next = next_version::<Self, C>(self)?;
        let statement = VersionedUpdate::<Self, Ch::Changeset>::new(
            Self::table(),
            changes.as_changeset(),
            ColumnEq::new(next),
            Self::key_predicate(&self.key()),
            ColumnEq::new(self.version()),
        );
        run_versioned(self, conn, statement)?;
        Ok(next)
    }

    /// Writes every updatable field of this copy if the row is still at its version, and
    /// records the new version in the copy.
    fn guarded_save<C>(&mut self, conn: &mut C) -> Result<Self::Version, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        VersionedUpdate<Self, <Self::Changes as AsChangeset>::Changeset>:
            ExecuteDsl<C> + CompareAndSet<C::Backend>,
        Self: LoadByKey<C>,
    {
        let next = self.guarded_update(conn, self.changes())?;
        self.set_version(next);
        Ok(next)
    }

    /// Advances the version without changing anything else ("force increment"), e.g. to
    /// mark an aggregate root changed when only its children were. Records the new
    /// version in the copy.
    fn guarded_touch<C>(&mut self, conn: &mut C) -> Result<Self::Version, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        VersionedUpdate<Self, NoChanges<Self::Table>>: ExecuteDsl<C> + CompareAndSet<C::Backend>,
        Self: LoadByKey<C>,
    {
        let next = self.guarded_update(conn, NoChanges::default())?;
        self.set_version(next);
        Ok(next)
    }

    /// Deletes the row if it is still at this copy's version.
    fn guarded_delete<C>(&self, conn: &mut C) -> Result<(), Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        VersionedDelete<Self>: ExecuteDsl<C> + CompareAndSet<C::Backend>,
        Self: LoadByKey<C>,
    {
        let statement = VersionedDelete::<Self>::new(
            Self::table(),
            Self::key_predicate(&self.key()),
            ColumnEq::new(self.version()),
        );
        run_versioned(self, conn, statement)
    }
}

impl<T: Guarded> GuardedWrite for T {}

/// The version after `row`'s, or [`Error::VersionOverflow`].
fn next_version<T: LoadByKey<C>, C>(row: &T) -> Result<T::Version, Error> {
    row.version().next().ok_or_else(|| Error::VersionOverflow {
        table: T::table_name(),
        key: format!("{:?}", row.key()),
        current: row.version().widen(),
    })
}

/// Runs a version-guarded `statement` for `row`; a miss is explained by reading the row
/// again: gone is [`Error::NotFound`]; at another version, [`Error::Conflict`] with it; at
/// the very version expected, [`Error::Refused`] (nobody else won: the database ignored
/// the write).
fn run_versioned<T, C, S>(row: &T, conn: &mut C, statement: S) -> Result<(), Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    S: ExecuteDsl<C> + CompareAndSet<C::Backend>,
{
    let key = row.key();
    execute_guarded(
        conn,
        statement,
        || (T::table_name(), format!("{key:?}")),
        |conn| match T::load_by_key(conn, &key) {
            Ok(None) => Error::NotFound {
                table: T::table_name(),
                key: format!("{key:?}"),
            },
            Ok(Some(current)) if current.version() == row.version() => Error::Refused {
                table: T::table_name(),
                key: format!("{key:?}"),
                token: Token::Version(current.version().widen()),
            },
            Ok(Some(current)) => Error::Conflict(Box::new(Conflict::new(
                T::table_name(),
                format!("{key:?}"),
                Token::Version(row.version().widen()),
                Token::Version(current.version().widen()),
                current,
            ))),
            Err(e) => classify(conn, e),
        },
    )
}
