//! Changed-columns writes of pre-image entities ([`ChangedColumns`]): the fields a copy
//! changed, written only while the row still holds their old values.

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::ExecuteDsl;

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::pre_image::{ChangedColumns, ChangedUpdateOf};
use diesel::query_builder::AsChangeset;

use crate::sql::statement::{Assignments, Unguarded};
use crate::write::entity::LoadByKey;

/// Changed-columns writes for every [`ChangedColumns`] entity.
pub trait GuardedChanges: ChangedColumns {
    /// Writes the fields this modified copy changed since `original`, if the row still
    /// holds their old values; fields it did not change may have been changed by others
    /// meanwhile and are neither compared nor overwritten. Nothing changed: nothing is
    /// sent. A miss is reported as by [`GuardedWrite`](crate::GuardedWrite): `NotFound`,
    /// `Conflict` with the current row, or `Refused`.
    fn guarded_save_changes_from<C>(&mut self, conn: &mut C, original: &Self) -> Result<(), Error>
    where
        Self: SaveChanges<C>,
    {
        self.save_changes_from(conn, original)
    }
}

impl<T: ChangedColumns> GuardedChanges for T {}

/// A changed-columns write of entity `Self` on connection `C`, as one bound; like
/// [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot save its changed columns on `{C}`",
    note = "the connection must be a diesel connection of a backend diesel-occ supports"
)]
pub trait SaveChanges<C>: ChangedColumns + LoadByKey<C> {
    /// Runs the write; [`GuardedChanges`] calls it.
    #[doc(hidden)]
    fn save_changes_from(&mut self, conn: &mut C, original: &Self) -> Result<(), Error>;
}

impl<T, C> SaveChanges<C> for T
where
    T: ChangedColumns + LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    ChangedUpdateOf<T>: ExecuteDsl<C> + Assignments<C::Backend>,
{
    fn save_changes_from(&mut self, conn: &mut C, original: &T) -> Result<(), Error> {
        crate::write::entity::refuse_status_move(self, original, T::table_name())?;
        let Some((changes, predicate)) = self.changed_since(original) else {
            return Ok(());
        };
        let stamp = T::stamp();
        let statement = ChangedUpdateOf::<T>::new(
            T::table(),
            changes.as_changeset(),
            crate::sql::statement::Joined(Unguarded, stamp.clone(), crate::sql::statement::Comma),
            T::key_predicate(&original.key()),
            predicate,
        );
        let (key, token) = (original.key(), original.token());
        let miss = crate::write::entity::RowMoved::<T>::expecting(&key, &token);
        crate::write::entity::run_guarded::<T, C, _, crate::sql::new_token::Counted>(
            conn, miss, statement, false,
        )?;
        self.set_stamp(&stamp);
        Ok(())
    }
}
