//! One-statement JSON merges: the database applies an RFC 7396 merge patch to the stored
//! document itself, so a pure merge never conflicts and never retries, however many
//! writers merge into one row at once.
//!
//! ```sql
//! UPDATE t SET ext = <merge(ext, ?patch)>, version = version + 1
//! WHERE (<key>) AND version <> ?max [RETURNING version]
//! ```
//!
//! - SQLite: `json_patch(ext, ?)`, SQLite's own RFC 7396 merge.
//! - MySQL / MariaDB: `JSON_MERGE_PATCH(ext, ?)`.
//! - PostgreSQL has no RFC 7396 merge (`||` is shallow). A flat patch (no member is an
//!   object, the common case) is applied by one statement whose text is the same for
//!   every flat patch, so it is prepared once per connection: remove the keys of the
//!   `null` members, then `||` the others. Any other patch is spelled out for its shape,
//!   built from its keys (and prepared each time): `- key` for each `null`,
//!   `|| jsonb_build_object(key, <merge of the value into ext -> key>)` for each other
//!   value, a non-object target read as `{}`. Keys and values are bound parameters. This
//!   needs nothing installed in the database (no function from a migration), and works on
//!   `jsonb` and `json` columns. The patch's keys are bound once per level below them,
//!   so a patch should stay well under PostgreSQL's 65,535 parameters.
//!
//! The statement also advances the row's token, so optimistic readers of the row see
//! that it changed, and hands the new token back: with `RETURNING` on PostgreSQL and
//! SQLite. MySQL has no `RETURNING`: a version is noted by the statement in the session's
//! `LAST_INSERT_ID` and read by one `SELECT` that also puts the caller's value back (two
//! round trips, no transaction); other tokens are read back in a transaction. Callers
//! that do not need the token use the `_without_token` form: one round trip everywhere.
//! Offered for every guard whose token advances in SQL (a version, a timestamp, `xmin`);
//! a pre-image has no token to advance.

use std::marker::PhantomData;

use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, AstPass, QueryFragment};
use diesel::{Column, QueryResult};
use serde_json::Value;

use crate::connect::backend::OccBackend;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::miss::{KeyWriteRuns, RowMoved};
use crate::guard::{AdvanceInSql, Guarded, ReturnedTokenOf, TokenOf};
use crate::json::document::{JsonDocument, Place};
use crate::operation::{JsonMerge, JsonMergeNoToken, Operation, Run};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Unguarded};
use crate::telemetry::Call;
use crate::write::entity::{key_write, token_read_back, write_key_statement, KeyWriteOf};

/// `"col" = <the document of "col" merged with ?patch>`, in the backend's SQL.
#[derive(Debug, Clone)]
pub struct MergePatch<Col> {
    patch: Value,
    column: PhantomData<Col>,
}

impl<Col> MergePatch<Col> {
    /// The assignment merging `patch` into column `Col`.
    pub fn new(patch: Value) -> Self {
        MergePatch {
            patch,
            column: PhantomData,
        }
    }
}

impl<Col: Column> AsChangeset for MergePatch<Col> {
    type Target = Col::Table;
    type Changeset = Self;

    fn as_changeset(self) -> Self {
        self
    }
}

#[cfg(feature = "sqlite")]
impl<Col> QueryFragment<diesel::sqlite::Sqlite> for MergePatch<Col>
where
    Col: Column<SqlType = diesel::sql_types::Json>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::sqlite::Sqlite>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = json_patch(");
        out.push_identifier(Col::NAME)?;
        out.push_sql(", ");
        out.push_bind_param::<diesel::sql_types::Json, Value>(&self.patch)?;
        out.push_sql(")");
        Ok(())
    }
}

#[cfg(feature = "mysql")]
impl<Col> QueryFragment<diesel::mysql::Mysql> for MergePatch<Col>
where
    Col: Column<SqlType = diesel::sql_types::Json>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = JSON_MERGE_PATCH(");
        out.push_identifier(Col::NAME)?;
        out.push_sql(", ");
        out.push_bind_param::<diesel::sql_types::Json, Value>(&self.patch)?;
        out.push_sql(")");
        Ok(())
    }
}

/// A PostgreSQL JSON column type: `jsonb` or `json` (merged as `jsonb`, then cast back).
#[cfg(feature = "postgres")]
pub trait PgJson {
    /// The cast back to the column's type after the merge, if any.
    const CAST_BACK: &'static str;
}

#[cfg(feature = "postgres")]
impl PgJson for diesel::sql_types::Jsonb {
    const CAST_BACK: &'static str = "";
}

#[cfg(feature = "postgres")]
impl PgJson for diesel::sql_types::Json {
    const CAST_BACK: &'static str = "::json";
}

#[cfg(feature = "postgres")]
impl<Col> QueryFragment<diesel::pg::Pg> for MergePatch<Col>
where
    Col: Column,
    Col::SqlType: PgJson,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = (");
        if is_flat(&self.patch) {
            pg_flat_merge::<Col>(&mut out, &self.patch)?;
        } else {
            // The SQL follows the patch's shape: never cache it by its text, or every
            // new shape would leave one more prepared statement on the connection.
            out.unsafe_to_cache_prepared();
            pg_merge::<Col>(&mut out, &mut Vec::new(), &self.patch)?;
        }
        out.push_sql(")");
        out.push_sql(<Col::SqlType as PgJson>::CAST_BACK);
        Ok(())
    }
}

/// Whether `patch` is an object none of whose values is an object: then merging it is
/// removing its `null` members' keys and setting the others, whatever its keys.
#[cfg(feature = "postgres")]
fn is_flat(patch: &Value) -> bool {
    patch
        .as_object()
        .is_some_and(|members| members.values().all(|v| !v.is_object()))
}

/// The merge of a flat `patch` (see [`is_flat`]) as SQL whose text is the same for every
/// such patch, so that diesel prepares it once per connection and each merge is one round
/// trip: the patch is one bound `jsonb`, its `null` members name the keys to remove, the
/// others are set. A non-object document is read as `{}`, as RFC 7396 says.
#[cfg(feature = "postgres")]
fn pg_flat_merge<'b, Col: Column>(
    out: &mut AstPass<'_, 'b, diesel::pg::Pg>,
    patch: &'b Value,
) -> QueryResult<()> {
    use diesel::sql_types::Jsonb;
    out.push_sql("(CASE WHEN jsonb_typeof(");
    pg_target::<Col>(out, &[])?;
    out.push_sql(") = 'object' THEN ");
    pg_target::<Col>(out, &[])?;
    out.push_sql(" ELSE '{}'::jsonb END - ARRAY(SELECT key FROM jsonb_each(");
    out.push_bind_param::<Jsonb, Value>(patch)?;
    out.push_sql(") WHERE jsonb_typeof(value) = 'null')) || COALESCE((SELECT jsonb_object_agg(key, value) FROM jsonb_each(");
    out.push_bind_param::<Jsonb, Value>(patch)?;
    out.push_sql(") WHERE jsonb_typeof(value) <> 'null'), '{}'::jsonb)");
    Ok(())
}

/// The merge of `patch` into the document at `path` below column `Col` (RFC 7396).
#[cfg(feature = "postgres")]
fn pg_merge<'b, Col: Column>(
    out: &mut AstPass<'_, 'b, diesel::pg::Pg>,
    path: &mut Vec<&'b String>,
    patch: &'b Value,
) -> QueryResult<()> {
    use diesel::sql_types::{Jsonb, Text};
    let Value::Object(members) = patch else {
        // Not an object: the value replaces the target.
        return out.push_bind_param::<Jsonb, Value>(patch);
    };
    // One parenthesis per member, each closed by the step that applies the member.
    out.push_sql(&"(".repeat(members.len()));
    out.push_sql("CASE WHEN jsonb_typeof(");
    pg_target::<Col>(out, path)?;
    out.push_sql(") = 'object' THEN ");
    pg_target::<Col>(out, path)?;
    out.push_sql(" ELSE '{}'::jsonb END");
    for (key, value) in members {
        if value.is_null() {
            out.push_sql(" - ");
            out.push_bind_param::<Text, String>(key)?;
        } else {
            out.push_sql(" || jsonb_build_object(");
            out.push_bind_param::<Text, String>(key)?;
            out.push_sql(", ");
            path.push(key);
            pg_merge::<Col>(out, path, value)?;
            path.pop();
            out.push_sql(")");
        }
        out.push_sql(")");
    }
    Ok(())
}

/// `("col"::jsonb -> $k1 -> $k2 ...)`: the document below column `Col` at `path`.
#[cfg(feature = "postgres")]
fn pg_target<'b, Col: Column>(
    out: &mut AstPass<'_, 'b, diesel::pg::Pg>,
    path: &[&'b String],
) -> QueryResult<()> {
    out.push_sql("(");
    out.push_identifier(Col::NAME)?;
    out.push_sql("::jsonb");
    for key in path {
        out.push_sql(" -> ");
        out.push_bind_param::<diesel::sql_types::Text, String>(key)?;
    }
    out.push_sql(")");
    Ok(())
}

/// The one-statement merge of entity `T` into JSON column `Col`.
pub(crate) type MergeInPlaceOf<T, Col> = KeyWriteOf<T, MergePatch<Col>, Unguarded>;

/// One-statement merges for entities whose guard advances in SQL (a version, a timestamp, `xmin`).
pub trait GuardedJsonMerge: Guarded
where
    Self::Guard: AdvanceInSql,
{
    /// Merges the RFC 7396 `patch` (an object) into the document of column `Col` of the
    /// row with `key` and advances the row's token, in one statement: no read, no
    /// conflict, no retry. Returns the new token. The result equals
    /// [`merge_json`](crate::json::document::GuardedJson::merge_json)'s for the same document and
    /// patch. A patch that is not an object, or over
    /// [`DOCUMENT_LIMIT_BYTES`](crate::json::document::DOCUMENT_LIMIT_BYTES), is
    /// [`Error::InvalidPatch`]; a stored document the database cannot parse fails the
    /// statement ([`Error::Database`]); either way nothing is written.
    fn merge_json_in_place<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: MergeInPlace<C, Col>,
    {
        let _ = column;
        Self::merge_in_place(conn, key, patch)
    }

    /// [`merge_json_in_place`](Self::merge_json_in_place) without reading the new token
    /// back, for callers that do not need it: the same statement, the same errors. On
    /// MySQL, which has no `RETURNING`, this saves the second round trip (and leaves the
    /// session's last insert id alone); elsewhere it is the same one round trip.
    fn merge_json_in_place_without_token<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
    ) -> Result<(), Error>
    where
        Self: MergeInPlace<C, Col>,
    {
        let _ = column;
        Self::merge_in_place_without_token(conn, key, patch)
    }
}

impl<T> GuardedJsonMerge for T
where
    T: Guarded,
    T::Guard: AdvanceInSql,
{
}

/// The one-statement merge into column `Col` of entity `Self` on connection `C`, as one
/// bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot merge into `{Col}` in one statement on `{C}`",
    note = "the column must be the entity's `#[occ(json)]` field, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL (not a pre-image)",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait MergeInPlace<C, Col>: JsonDocument<Col> + LoadByKey<C> {
    /// Runs the merge; [`GuardedJsonMerge`] calls it.
    #[doc(hidden)]
    fn merge_in_place(conn: &mut C, key: &Self::Key, patch: &Value)
        -> Result<TokenOf<Self>, Error>;

    /// Runs the merge without reading the new token back.
    #[doc(hidden)]
    fn merge_in_place_without_token(
        conn: &mut C,
        key: &Self::Key,
        patch: &Value,
    ) -> Result<(), Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Col> MergeInPlace<C, Col> for T
where
    T: JsonDocument<Col> + LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    Col: Column,
    MergeInPlaceOf<T, Col>: Assignments<C::Backend> + Send,
    ReturnedTokenOf<T>: Complete<C, MergeInPlaceOf<T, Col>, TokenOf<T>>,
    Counted: Complete<C, MergeInPlaceOf<T, Col>, TokenOf<T>>,
{
    fn merge_in_place(conn: &mut C, key: &T::Key, patch: &Value) -> Result<TokenOf<T>, Error> {
        let merge = merge_completed::<ReturnedTokenOf<T>, T, _, Col>;
        token_read_back(now(merge(Blocking::wrap(conn), key, patch))?)
    }

    fn merge_in_place_without_token(
        conn: &mut C,
        key: &T::Key,
        patch: &Value,
    ) -> Result<(), Error> {
        let merge = merge_completed::<Counted, T, _, Col>;
        now(merge(Blocking::wrap(conn), key, patch)).map(drop)
    }
}

impl<T: MergeInPlace<C, Col>, C, Col> Run<C> for JsonMerge<T, Col> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::merge_in_place(conn, &self.key, &self.patch)
    }
}

impl<T: MergeInPlace<C, Col>, C, Col> Run<C> for JsonMergeNoToken<T, Col> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::merge_in_place_without_token(conn, &self.0.key, &self.0.patch)
    }
}

/// The checked patch merged by one statement run and completed by `Done`, on either
/// driver: one call on the connection (dropped half way on MySQL, a reply half read or
/// the version noted and not yet read back, it marks the connection broken).
pub(crate) async fn merge_completed<Done, T, C, Col>(
    conn: &mut C,
    key: &T::Key,
    patch: &Value,
) -> Result<Option<TokenOf<T>>, Error>
where
    C: Io,
    T: JsonDocument<Col> + ReadOn<C>,
    T::Guard: AdvanceInSql,
    Col: Column,
    MergeInPlaceOf<T, Col>: Assignments<C::Backend> + Send,
    for<'k> Done: RunOn<C, MergeInPlaceOf<T, Col>, RowMoved<'k, T>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>("merge_json_in_place", T::table_name(), Some(key));
    let answer = call
        .run(async move {
            let table = T::table_name();
            Place::<T, Col>::new(table, key).check_merge_patch(patch)?;
            conn.refuse_broken()?;
            let merge = async |conn: &mut C| {
                let miss = RowMoved::<T>::advancing_any(key, T::Guard::at_end);
                let changes = MergePatch::<Col>::new(patch.clone());
                let statement = key_write::<T, C::Backend, _, _>(table, key, changes, Unguarded, 0);
                write_key_statement::<Done, T, C, _, _>(conn, key, statement, miss).await
            };
            let mut runs = KeyWriteRuns::default();
            loop {
                let answer = conn.call(merge).await;
                if !runs.again(&answer) {
                    return answer;
                }
            }
        })
        .await;
    answer
}
