//! Changed-columns writes of pre-image entities ([`ChangedColumns`]): the fields a copy
//! changed, written only while the row still holds their old values.

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::ExecuteDsl;

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::guard::pre_image::{ChangedColumns, ChangedUpdateOf};
use crate::operation::{Operation, Run, SaveChanged};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::entity::{run_guarded, LoadByKey};

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
        let stamp = Self::stamp();
        if SaveChanged::new(self, original, stamp.clone()).run(conn)? {
            self.set_stamp(&stamp);
        }
        Ok(())
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
    fn save_changed(conn: &mut C, save: SaveChanged<Self>) -> Result<bool, Error>;
}

impl<T, C> SaveChanges<C> for T
where
    T: ChangedColumns + LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    ChangedUpdateOf<T>: ExecuteDsl<C> + Assignments<C::Backend>,
{
    fn save_changed(conn: &mut C, save: SaveChanged<T>) -> Result<bool, Error> {
        let Some((statement, key, expected)) = save.statement(T::table_name())? else {
            return Ok(false);
        };
        let miss = RowMoved::<T>::expecting(&key, &expected);
        run_guarded::<T, C, _, Counted>(conn, miss, statement, false)?;
        Ok(true)
    }
}

impl<T: SaveChanges<C>, C> Run<C> for SaveChanged<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::save_changed(conn, self)
    }
}
