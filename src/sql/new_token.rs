//! How a guarded statement runs, and how the writer learns the row's new token.
//!
//! Most guard kinds compute the next token before sending (a version, a timestamp), so
//! the statement is executed and its rows counted ([`Counted`]). A token only the
//! database knows (PostgreSQL's `xmin`, a database-clock stamp) is read back by the
//! statement itself (`... RETURNING <column>`, [`ReturnedBy`]): one round trip either
//! way, except on MySQL, which has no `RETURNING` and reads the column in the same
//! transaction.

use std::marker::PhantomData;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::backend::Backend;
use diesel::connection::Connection;
use diesel::query_builder::QueryFragment;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::query_builder::{AstPass, Query, QueryId};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, QueryResult, RunQueryDsl};

use crate::connect::backend::OccBackend;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::sql::statement::{ColumnOfRow, GuardedUpdate};
use crate::sql::values_update::{RowAndToken, RowOnly, Template, ValuesUpdate};

/// How backend `DB` learns the next token of statement `S` for the completion kind `Self`
/// (a guard's [`Completion`](crate::guard::GuardKind) or read-back): what is sent, as a
/// plan both drivers send the same way. Each backend's choice is made here, once.
#[diagnostic::on_unimplemented(
    message = "this guard cannot learn its new token on `{DB}`",
    note = "an `xmin` guard is PostgreSQL's; the statement, its guard's assignments or the token's column type do not fit this backend"
)]
pub trait TokenPlan<DB, S, Tok> {
    /// The statements sent, and how their answers give the rows and the token.
    type Plan;
    /// The plan for `statement`.
    #[doc(hidden)]
    fn plan(statement: S) -> Self::Plan;
}

/// The next token was computed before sending: execute and count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted;

/// The next token is column `Col` as the statement left it: `... RETURNING <Col>` on
/// PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement and a read of
/// the column in one transaction ([`ReadAfterWrite`]).
#[derive(Debug, Clone, Copy, Default)]
#[allow(unreachable_pub)] // reached through the guards of features `chrono` and `postgres`
pub struct ReturnedBy<Col>(PhantomData<Col>);

/// The next token is version column `Col` as the statement advanced it: `... RETURNING
/// <Col>` on PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement
/// notes the version in the session's `LAST_INSERT_ID` and one `SELECT` reads it and puts
/// the caller's last insert id back ([`NotedThenRead`]). Two round trips and no
/// transaction, where reading the row back takes four (`BEGIN`, the statement, the read,
/// `COMMIT`): the session's own value cannot be changed by another writer.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReturnedVersion<Col>(PhantomData<Col>);

/// The next token is column `Col` as the database left it after the statement and its
/// triggers (a token other code maintains): `RETURNING` on PostgreSQL, where a `BEFORE`
/// trigger's value is the returned one; on SQLite, whose `RETURNING` reports the values
/// before its triggers ran, and on MySQL, the statement and a read of the column in one
/// transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadAfter<Col>(PhantomData<Col>);

/// Execute the statement and count the rows it matched.
#[doc(hidden)]
#[derive(Debug)]
pub struct Executed<S>(pub(crate) S);

/// The statement, then the read of the column it set (`read`), in one transaction (a
/// savepoint inside the caller's) so that no other writer's value comes between; the
/// row stays locked by the write.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct ReadAfterWrite<S, R> {
    pub(crate) write: S,
    pub(crate) read: R,
}

/// MySQL: the statement noting the version it set in the session, then the read of the
/// note, which also restores the caller's last insert id.
#[cfg(feature = "mysql")]
#[doc(hidden)]
#[derive(Debug)]
#[allow(unreachable_pub)] // reached through the version guard on MySQL
pub struct NotedThenRead<S>(pub(crate) S);

impl<DB, S, Tok> TokenPlan<DB, S, Tok> for Counted {
    type Plan = Executed<S>;
    fn plan(statement: S) -> Self::Plan {
        Executed(statement)
    }
}

/// Implements [`TokenPlan`] for completion kind `$kind` on `$backend` by `RETURNING`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! planned_by_returning {
    ($kind:ident, $backend:ty) => {
        impl<S, Col, Tok> TokenPlan<$backend, S, Tok> for $kind<Col> {
            type Plan = Returning<S, Col>;
            fn plan(statement: S) -> Self::Plan {
                Returning::new(statement)
            }
        }
    };
}

/// Implements [`TokenPlan`] for completion kind `$kind` on `$backend` by the statement
/// and a read of the column in one transaction.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! planned_by_reading {
    ($kind:ident, $backend:ty) => {
        impl<T, Changes, Advance, Key, Guard, Col, Tok>
            TokenPlan<$backend, GuardedUpdate<T, Changes, Advance, Key, Guard>, Tok> for $kind<Col>
        where
            T: diesel::Table,
            T::FromClause: Clone,
            Key: Clone,
        {
            type Plan = ReadAfterWrite<
                GuardedUpdate<T, Changes, Advance, Key, Guard>,
                ColumnOfRow<T, Key, Col>,
            >;
            fn plan(statement: GuardedUpdate<T, Changes, Advance, Key, Guard>) -> Self::Plan {
                let read = statement.read_back::<Col>();
                ReadAfterWrite {
                    write: statement,
                    read,
                }
            }
        }
    };
}

#[cfg(feature = "postgres")]
planned_by_returning!(ReturnedBy, diesel::pg::Pg);
#[cfg(feature = "postgres")]
planned_by_returning!(ReturnedVersion, diesel::pg::Pg);
// PostgreSQL's `RETURNING` sees what `BEFORE` triggers set.
#[cfg(feature = "postgres")]
planned_by_returning!(ReadAfter, diesel::pg::Pg);
#[cfg(feature = "sqlite")]
planned_by_returning!(ReturnedBy, diesel::sqlite::Sqlite);
#[cfg(feature = "sqlite")]
planned_by_returning!(ReturnedVersion, diesel::sqlite::Sqlite);
// SQLite's `RETURNING` reports the values from before its triggers ran.
#[cfg(feature = "sqlite")]
planned_by_reading!(ReadAfter, diesel::sqlite::Sqlite);
#[cfg(feature = "mysql")]
planned_by_reading!(ReturnedBy, diesel::mysql::Mysql);
#[cfg(feature = "mysql")]
planned_by_reading!(ReadAfter, diesel::mysql::Mysql);

/// MySQL's version, noted by the statement in the session.
#[cfg(feature = "mysql")]
impl<T, Changes, Advance, Key, Guard, Col, Tok>
    TokenPlan<diesel::mysql::Mysql, GuardedUpdate<T, Changes, Advance, Key, Guard>, Tok>
    for ReturnedVersion<Col>
where
    T: diesel::Table,
{
    type Plan =
        NotedThenRead<crate::sql::statement::NotingVersion<T, Changes, Advance, Key, Guard, Col>>;
    fn plan(statement: GuardedUpdate<T, Changes, Advance, Key, Guard>) -> Self::Plan {
        NotedThenRead(statement.noting_version::<Col>())
    }
}

/// Runs a guarded statement on connection `C`: the rows it matched and, for kinds whose
/// next token only the database knows, that token. The blocking driver of [`TokenPlan`].
#[diagnostic::on_unimplemented(
    message = "this guard cannot run its statement on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait Complete<C, S, Tok> {
    /// Runs `statement` on `conn`; `own`: whether `conn`'s open transaction, if any, is
    /// the library's.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

impl<C, S, Tok, K> Complete<C, S, Tok> for K
where
    C: Connection,
    K: TokenPlan<C::Backend, S, Tok>,
    K::Plan: SendPlan<C, Tok>,
{
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        K::plan(statement).send(conn, own)
    }
}

/// How the blocking driver sends a plan of [`TokenPlan`] on connection `C`.
#[diagnostic::on_unimplemented(
    message = "this guard's statements cannot be sent on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait SendPlan<C, Tok> {
    /// Sends the plan on `conn`: the rows the statement matched and the token it left.
    #[doc(hidden)]
    fn send(self, conn: &mut C, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

impl<C, S, Tok> SendPlan<C, Tok> for Executed<S>
where
    C: Connection,
    S: ExecuteDsl<C>,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(self.0, conn).map(|rows| (rows, None))
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<C, S, Col, Tok> SendPlan<C, Tok> for Returning<S, Col>
where
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        Ok(returned(self.load(conn)?))
    }
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<C, S, R, Tok> SendPlan<C, Tok> for ReadAfterWrite<S, R>
where
    C: Connection,
    S: ExecuteDsl<C>,
    R: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn send(self, conn: &mut C, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        let ReadAfterWrite { write, read } = self;
        let read_back = ReadBack::after_write(own, crate::write::executor::in_transaction(conn));
        let write_then_read = |conn: &mut C| {
            let rows = ExecuteDsl::execute(write, conn)?;
            match read_back.written(rows) {
                true => read_back.read(read.get_result(conn)),
                false => Ok((rows, None)),
            }
        };
        if read_back.nests() {
            crate::connect::transaction::nested(conn, write_then_read)
        } else {
            write_then_read(conn)
        }
    }
}

#[cfg(feature = "mysql")]
impl<C, S, Tok> SendPlan<C, Tok> for NotedThenRead<S>
where
    C: Connection<Backend = diesel::mysql::Mysql> + diesel::connection::LoadConnection,
    S: ExecuteDsl<C>,
    Tok: crate::guard::version::VersionNumber,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        use crate::sql::statement::{NotedVersion, ReadNotedVersion};
        let rows = ExecuteDsl::execute(self.0, conn)?;
        if !ReadBack::NOTE.written(rows) {
            return Ok((rows, None));
        }
        ReadBack::note(rows, ReadNotedVersion.get_result::<NotedVersion>(conn))
    }
}

/// The rows a `... RETURNING <token>` statement matched and the token of the first.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn returned<Tok>(tokens: Vec<Tok>) -> (usize, Option<Tok>) {
    (tokens.len(), tokens.into_iter().next())
}

/// The decisions of a token read after its write, for both drivers: whether the read
/// needs a transaction of its own, whether it is sent, and what its answer means.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadBack {
    nests: bool,
    /// Read only after the write matched one row (a column of the row); else after any
    /// write that matched a row (the session's note, which also restores the caller's
    /// value).
    one_row: bool,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl ReadBack {
    /// The session's note of the version set: no transaction, since no other writer can
    /// change it; read whenever the write matched a row (a key of several rows is
    /// refused, and the caller's last insert id is restored all the same).
    #[cfg(feature = "mysql")]
    pub(crate) const NOTE: ReadBack = ReadBack {
        nests: false,
        one_row: false,
    };

    /// A column of the row the write set. Inside a transaction the library opened
    /// (`own`), the two already go or stay together; elsewhere they take a savepoint (in
    /// the caller's transaction) or a transaction, so that no other writer comes between.
    /// A savepoint in the library's own would only add a statement a cluster's abort can
    /// fail in (a Galera node that aborted the transaction answers `SAVEPOINT ... does not
    /// exist`).
    pub(crate) fn after_write(own: bool, in_transaction: bool) -> ReadBack {
        ReadBack {
            nests: !(own && in_transaction),
            one_row: true,
        }
    }

    /// Whether the write and its read run in a transaction (or savepoint) of their own.
    pub(crate) fn nests(&self) -> bool {
        self.nests
    }

    /// Whether the read is sent after a write that matched `rows` rows.
    pub(crate) fn written(&self, rows: usize) -> bool {
        if self.one_row {
            rows == 1
        } else {
            rows > 0
        }
    }

    /// What the read of the column gave: the token of the one row written. A row that is
    /// gone right after this transaction wrote it: the server aborted the transaction under
    /// it (a Galera node, for a conflicting write from another node, whose reply to the
    /// write claimed success). Retryable: nothing of it stays.
    pub(crate) fn read<Tok>(&self, read: QueryResult<Tok>) -> QueryResult<(usize, Option<Tok>)> {
        match read {
            Ok(token) => Ok((1, Some(token))),
            Err(diesel::result::Error::NotFound) => Err(aborted_under_write()),
            Err(other) => Err(other),
        }
    }

    /// What the read of the session's note gave after a write that matched `rows`: the
    /// version of the one row written; for several (refused later) only the restore
    /// counted.
    #[cfg(feature = "mysql")]
    pub(crate) fn note<Tok: crate::guard::version::VersionNumber>(
        rows: usize,
        noted: QueryResult<crate::sql::statement::NotedVersion>,
    ) -> QueryResult<(usize, Option<Tok>)> {
        let noted = noted?;
        match rows {
            1 => Ok((1, Some(noted.version()?))),
            rows => Ok((rows, None)),
        }
    }
}

/// The row a statement wrote a moment ago in this transaction is gone: the server aborted
/// the transaction under it (a Galera node, for a conflicting write from another node,
/// whose reply to the write claimed success). Retryable: nothing of it stays.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn aborted_under_write() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(
            "the row just written is not there: the server aborted the transaction".to_string(),
        ),
    )
}

/// Runs guarded statements of distinct rows in as few statements as the backend allows
/// ([`ValuesUpdate`]): the index of each statement that wrote its row and, for kinds
/// whose next token only the database knows, that token.
pub trait CompleteEach<C, S, Tok> {
    /// Runs `updates` on `conn`; they must not share a key.
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>>;
}

impl<C, S, Tok> CompleteEach<C, S, Tok> for Counted
where
    C: Connection,
    C::Backend: OccBackend,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowOnly>: diesel::query_dsl::LoadQuery<'static, C, i32>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        let mut written = Vec::new();
        for statement in ValuesUpdate::<S, RowOnly>::group::<C::Backend>(updates)? {
            let rows: Vec<i32> = statement.load(conn)?;
            written.extend(rows.into_iter().map(|row| (row as usize, None)));
        }
        Ok(written)
    }
}

/// Several statements in one: only PostgreSQL combines them, and its `RETURNING` sees
/// what `BEFORE` triggers set.
impl<C, S, Col, Tok> CompleteEach<C, S, Tok> for ReadAfter<Col>
where
    C: Connection,
    C::Backend: OccBackend,
    Col: Column,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowAndToken<Col>>: diesel::query_dsl::LoadQuery<'static, C, (i32, Tok)>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        ReturnedBy::<Col>::run_each(conn, updates)
    }
}

impl<C, S, Col, Tok> CompleteEach<C, S, Tok> for ReturnedBy<Col>
where
    C: Connection,
    C::Backend: OccBackend,
    Col: Column,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowAndToken<Col>>: diesel::query_dsl::LoadQuery<'static, C, (i32, Tok)>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        let mut written = Vec::new();
        for statement in ValuesUpdate::<S, RowAndToken<Col>>::group::<C::Backend>(updates)? {
            let rows: Vec<(i32, Tok)> = statement.load(conn)?;
            written.extend(
                rows.into_iter()
                    .map(|(row, token)| (row as usize, Some(token))),
            );
        }
        Ok(written)
    }
}

/// `<statement> RETURNING <Col>`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub struct Returning<S, Col> {
    statement: S,
    column: PhantomData<Col>,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col> Returning<S, Col> {
    /// `statement RETURNING <Col>`.
    pub(crate) fn new(statement: S) -> Self {
        Returning {
            statement,
            column: PhantomData,
        }
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col: Column> Query for Returning<S, Col> {
    type SqlType = Col::SqlType;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col, DB> QueryFragment<DB> for Returning<S, Col>
where
    DB: Backend,
    S: QueryFragment<DB>,
    Col: Column,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.statement.walk_ast(out.reborrow())?;
        out.push_sql(" RETURNING ");
        out.push_identifier(Col::NAME)
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col> QueryId for Returning<S, Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col, Conn> RunQueryDsl<Conn> for Returning<S, Col> {}

#[cfg(all(test, any(feature = "mysql", feature = "sqlite")))]
mod tests {
    use super::ReadBack;
    use diesel::result::{DatabaseErrorKind, Error as DieselError};

    #[test]
    fn a_column_is_read_in_a_transaction_of_its_own_unless_the_librarys_holds_the_write() {
        assert!(!ReadBack::after_write(true, true).nests());
        assert!(ReadBack::after_write(true, false).nests());
        assert!(
            ReadBack::after_write(false, true).nests(),
            "the caller's: a savepoint"
        );
        assert!(ReadBack::after_write(false, false).nests());
    }

    #[test]
    fn a_column_is_read_only_after_a_write_of_one_row() {
        let read_back = ReadBack::after_write(false, false);
        assert_eq!(
            [0, 1, 2].map(|rows| read_back.written(rows)),
            [false, true, false]
        );
    }

    #[test]
    fn a_row_gone_right_after_its_write_is_a_retryable_abort() {
        let read_back = ReadBack::after_write(true, true);
        assert_eq!(read_back.read(Ok(7_i64)), Ok((1, Some(7))));
        match read_back.read::<i64>(Err(DieselError::NotFound)) {
            Err(DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _)) => {}
            other => panic!("{other:?}"),
        }
        let broken = read_back.read::<i64>(Err(DieselError::BrokenTransactionManager));
        assert!(matches!(broken, Err(DieselError::BrokenTransactionManager)));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn the_note_is_read_after_any_write_that_matched_and_counts_for_one_row_only() {
        use crate::sql::statement::NotedVersion;
        let noted = || {
            Ok(NotedVersion {
                noted: 42,
                _restored: Some(9),
            })
        };
        assert_eq!(
            [0, 1, 2].map(|rows| ReadBack::NOTE.written(rows)),
            [false, true, true]
        );
        assert_eq!(ReadBack::note::<i64>(1, noted()), Ok((1, Some(42))));
        assert_eq!(ReadBack::note::<i64>(2, noted()), Ok((2, None)));
        let failed = ReadBack::note::<i64>(1, Err(DieselError::BrokenTransactionManager));
        assert!(matches!(failed, Err(DieselError::BrokenTransactionManager)));
    }
}
