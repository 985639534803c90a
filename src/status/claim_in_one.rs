//! A claim as one statement, where an `UPDATE` can hand back the rows it wrote
//! (PostgreSQL, SQLite):
//!
//! ```sql
//! WITH "occ_claimable" AS (
//!     SELECT <key columns> FROM tasks WHERE <claimable> [ORDER BY <key columns>]
//!     LIMIT <n> FOR UPDATE SKIP LOCKED)
//! UPDATE tasks SET state = ?running, owner = ?me, claimed_at = <database now>,
//!                  version = version + 1
//! WHERE ((<key columns>) IN (SELECT * FROM "occ_claimable")) AND version <> ?max
//! RETURNING <the entity's columns>
//! ```
//!
//! One round trip and no transaction of the library's, where the locked read, the
//! `UPDATE` and the read of the rows as written (MySQL, which has no `RETURNING`) take
//! five with `BEGIN` and `COMMIT`. Where the read locks rows (PostgreSQL) it is a common
//! table expression rather than a subquery of the `IN`, because PostgreSQL evaluates a
//! CTE that locks rows once, so the `LIMIT` bounds the rows taken whatever plan the
//! `UPDATE` gets; a subquery may be run again by a plan that rescans it. SQLite takes no
//! row locks and runs the subquery once; there it stays a subquery of the `IN`, which
//! its planner runs faster than the CTE (80 against 90-112 µs per claim of one row,
//! measured on a 20,000-row queue). The `UPDATE` only writes rows the read took, so it
//! waits for nobody, and the claim time is the statement's own.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::{QueryResult, Selectable, SelectableHelper, Table};

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::flow::compare_and_set::refuse_double_assignment;
use crate::guard::status::HasStatus;
use crate::guard::AdvanceInSql;
use crate::sql::statement::{Assignments, Returning};
use crate::status::claim::{claim_update, ClaimChanges, ClaimRequest, Claimable, ClaimableOf};
use crate::status::claim_filter::ClaimFilter;
use crate::status::claimable_rows::ClaimableRows;
use crate::write::bulk::BulkUpdateOf;

/// The name of the claim's common table expression: the keys of the rows it locked.
const CLAIMABLE: &str = "occ_claimable";

/// Whether backend `DB`'s claim reads its rows in a CTE: where the read locks them.
fn in_cte<DB: OccBackend>() -> bool {
    !DB::SKIP_LOCKED.is_empty()
}

/// The keys of the rows a claim takes.
type ClaimableKeys<T, Filter> = ClaimableRows<T, <T as Table>::PrimaryKey, Filter>;

/// `WITH "occ_claimable" AS (<keys>) <update>` where the read locks rows; the `<update>`
/// alone elsewhere (its `IN` holds the read).
pub struct WithClaimable<T: Table, Filter, Update> {
    keys: ClaimableKeys<T, Filter>,
    pub(crate) update: Update,
}

impl<T, Filter, Update, DB> QueryFragment<DB> for WithClaimable<T, Filter, Update>
where
    DB: OccBackend,
    T: Table,
    ClaimableKeys<T, Filter>: QueryFragment<DB>,
    Update: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if in_cte::<DB>() {
            out.push_sql("WITH ");
            out.push_identifier(CLAIMABLE)?;
            out.push_sql(" AS (");
            self.keys.walk_ast(out.reborrow())?;
            out.push_sql(") ");
        }
        self.update.walk_ast(out)
    }
}

/// `(<key columns>) IN (SELECT * FROM "occ_claimable")` where the read locks rows,
/// `(<key columns>) IN (<keys>)` elsewhere: the rows the claim's read took.
pub struct InClaimable<T: Table, Filter> {
    key: T::PrimaryKey,
    keys: ClaimableKeys<T, Filter>,
}

impl<T, Filter, DB> QueryFragment<DB> for InClaimable<T, Filter>
where
    DB: OccBackend,
    T: Table,
    T::PrimaryKey: QueryFragment<DB>,
    ClaimableKeys<T, Filter>: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(") IN (");
        if in_cte::<DB>() {
            out.push_sql("SELECT * FROM ");
            out.push_identifier(CLAIMABLE)?;
        } else {
            self.keys.walk_ast(out.reborrow())?;
        }
        out.push_sql(")");
        Ok(())
    }
}

type TableOf<T> = <T as diesel::associations::HasTable>::Table;

/// The `UPDATE` of the one-statement claim of entity `T`'s rows.
pub(crate) type ClaimInOneUpdateOf<T, OwnerCol, AtCol> = BulkUpdateOf<
    T,
    ClaimChanges<T, OwnerCol, AtCol>,
    InClaimable<TableOf<T>, ClaimableOf<T, AtCol>>,
>;

/// The one-statement claim of entity `T`'s rows on backend `DB`.
pub(crate) type ClaimInOneOf<T, OwnerCol, AtCol, DB> = Returning<
    WithClaimable<TableOf<T>, ClaimableOf<T, AtCol>, ClaimInOneUpdateOf<T, OwnerCol, AtCol>>,
    diesel::dsl::AsSelect<T, DB>,
>;

/// The one statement that claims what `request` asks for (in `table`) and answers with
/// the rows as written; [`Error::ChangesetAssignsGuard`] before anything is sent when its
/// update assigns a column twice.
pub(crate) fn claim_in_one<T, OwnerCol, AtCol, DB>(
    table: &'static str,
    request: &ClaimRequest<'_, T::Status>,
    filter: Option<&ClaimFilter>,
) -> Result<ClaimInOneOf<T, OwnerCol, AtCol, DB>, Error>
where
    T: HasStatus + Selectable<DB>,
    T::Guard: AdvanceInSql,
    DB: Backend,
    ClaimInOneUpdateOf<T, OwnerCol, AtCol>: Assignments<DB>,
{
    // Built twice: the CTE or the `IN` renders it, by backend.
    let keys = || {
        let filter = Claimable::of(request, filter, T::Guard::can_advance());
        ClaimableRows::new(
            T::table(),
            T::table().primary_key(),
            filter,
            request.order,
            request.limit,
        )
    };
    let taken = InClaimable {
        key: T::table().primary_key(),
        keys: keys(),
    };
    let update = WithClaimable {
        keys: keys(),
        update: claim_update::<T, OwnerCol, AtCol, _>(request, taken),
    };
    refuse_double_assignment(table, &update.update)?;
    Ok(Returning::new(update, T::as_select()))
}
