//! A claim as one statement, where an `UPDATE` can hand back the rows it wrote
//! (PostgreSQL, SQLite):
//!
//! ```sql
//! WITH "occ_claimable" AS (
//!     SELECT <key columns> FROM tasks WHERE <claimable> LIMIT ? FOR UPDATE SKIP LOCKED)
//! UPDATE tasks SET state = ?running, owner = ?me, claimed_at = <database now>,
//!                  version = version + 1
//! WHERE ((<key columns>) IN (SELECT * FROM "occ_claimable")) AND version < ?max
//! RETURNING <the entity's columns>
//! ```
//!
//! One round trip and no transaction of the library's, where the locked read, the
//! `UPDATE` and the read of the rows as written (MySQL, which has no `RETURNING`) take
//! five with `BEGIN` and `COMMIT`. The read is a common table expression rather than a
//! subquery of the `IN` because PostgreSQL evaluates a CTE that locks rows once, so the
//! `LIMIT` bounds the rows taken whatever plan the `UPDATE` gets; a subquery may be run
//! again by a plan that rescans it. The `UPDATE` only writes rows the read locked, so it
//! waits for nobody, and the claim time is the statement's own.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::query_source::QuerySource;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType};
use diesel::{QueryResult, Selectable, SelectableHelper, Table};

use crate::connect::backend::OccBackend;
use crate::guard::AdvanceInSql;
use crate::sql::statement::Returning;
use crate::status::claim::{claim_update, ClaimChanges, ClaimRequest, Claimable, ClaimableOf};
use crate::status::HasStatus;
use crate::write::bulk::BulkUpdateOf;

/// The name of the claim's common table expression: the keys of the rows it locked.
const CLAIMABLE: &str = "occ_claimable";

/// `WITH "occ_claimable" AS (SELECT <key> FROM <table> WHERE <filter> LIMIT ?<lock>)
/// <update>`: the update of the rows the read locked.
#[derive(Debug, Clone)]
pub struct WithClaimable<T: Table, Filter, Update> {
    from: T::FromClause,
    key: T::PrimaryKey,
    filter: Filter,
    limit: i64,
    pub(crate) update: Update,
}

/// `(<key columns>) IN (SELECT * FROM "occ_claimable")`: the rows the claim's read locked.
#[derive(Debug, Clone, Copy)]
pub struct InClaimable<Key>(Key);

impl<Key: QueryFragment<DB>, DB: Backend> QueryFragment<DB> for InClaimable<Key> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(") IN (SELECT * FROM ");
        out.push_identifier(CLAIMABLE)?;
        out.push_sql(")");
        Ok(())
    }
}

impl<T, Filter, Update, DB> QueryFragment<DB> for WithClaimable<T, Filter, Update>
where
    DB: OccBackend + HasSqlType<BigInt>,
    i64: ToSql<BigInt, DB>,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    T::PrimaryKey: QueryFragment<DB>,
    Filter: QueryFragment<DB>,
    Update: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("WITH ");
        out.push_identifier(CLAIMABLE)?;
        out.push_sql(" AS (SELECT ");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(" FROM ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE ");
        self.filter.walk_ast(out.reborrow())?;
        out.push_sql(" LIMIT ");
        out.push_bind_param::<BigInt, i64>(&self.limit)?;
        out.push_sql(DB::SKIP_LOCKED);
        out.push_sql(") ");
        self.update.walk_ast(out)
    }
}

type TableOf<T> = <T as diesel::associations::HasTable>::Table;

/// The `UPDATE` of the one-statement claim of entity `T`'s rows.
pub(crate) type ClaimInOneUpdateOf<T, OwnerCol, AtCol> = BulkUpdateOf<
    T,
    ClaimChanges<T, OwnerCol, AtCol>,
    InClaimable<<TableOf<T> as Table>::PrimaryKey>,
>;

/// The one-statement claim of entity `T`'s rows on backend `DB`.
pub(crate) type ClaimInOneOf<T, OwnerCol, AtCol, DB> = Returning<
    WithClaimable<TableOf<T>, ClaimableOf<T, AtCol>, ClaimInOneUpdateOf<T, OwnerCol, AtCol>>,
    diesel::dsl::AsSelect<T, DB>,
>;

/// The one statement that claims what `request` asks for and answers with the rows as
/// written.
pub(crate) fn claim_in_one<T, OwnerCol, AtCol, DB>(
    request: &ClaimRequest<'_, T::Status>,
) -> ClaimInOneOf<T, OwnerCol, AtCol, DB>
where
    T: HasStatus + Selectable<DB>,
    T::Guard: AdvanceInSql,
    DB: Backend,
{
    let table = T::table();
    let update = WithClaimable {
        from: table.from_clause(),
        key: table.primary_key(),
        filter: Claimable::of(request, T::Guard::can_advance()),
        limit: i64::try_from(request.limit).unwrap_or(i64::MAX),
        update: claim_update::<T, OwnerCol, AtCol, _>(request, InClaimable(table.primary_key())),
    };
    Returning::new(update, T::as_select())
}
