//! Changed-columns writes of pre-image entities ([`ChangedColumns`]): the fields a copy
//! changed, written only while the row still holds their old values.

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::ExecuteDsl;

use crate::connect::backend::OccBackend;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::compare_and_set::CompareAndSet;
use crate::flow::miss::RowMoved;
use crate::guard::pre_image::{ChangedColumns, ChangedUpdateOf};
use crate::guard::TokenOf;
use crate::operation::entity::ChangedStatement;
use crate::operation::{Operation, Run, SaveChanged};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::telemetry::Call;

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
    note = "the connection must be a diesel connection of a backend diesel-occ supports",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait SaveChanges<C>: ChangedColumns + LoadByKey<C> {
    /// Runs the write; [`GuardedChanges`] calls it.
    #[doc(hidden)]
    fn save_changed(conn: &mut C, save: SaveChanged<Self>) -> Result<bool, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C> SaveChanges<C> for T
where
    T: ChangedColumns + LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    ChangedUpdateOf<T>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
{
    fn save_changed(conn: &mut C, save: SaveChanged<T>) -> Result<bool, Error> {
        let statement = save.statement(T::table_name());
        now(save_changed::<T, _>(Blocking::wrap(conn), statement))
    }
}

/// Sends a changed-columns write, checked and built beforehand (`None`: nothing changed),
/// on either driver. Whether it wrote.
pub(crate) async fn save_changed<T, C>(
    conn: &mut C,
    statement: Result<Option<ChangedStatement<T>>, Error>,
) -> Result<bool, Error>
where
    C: Io,
    T: ChangedColumns + ReadOn<C>,
    ChangedUpdateOf<T>: Assignments<C::Backend> + Send,
    for<'k> Counted: RunOn<C, ChangedUpdateOf<T>, RowMoved<'k, T>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>("save_changed", T::table_name(), None);
    let answer = call
        .run(async move {
            let Some((statement, key, expected)) = statement? else {
                return Ok(false);
            };
            conn.refuse_broken()?;
            let miss = RowMoved::<T>::expecting(&key, &expected);
            let write = CompareAndSet::one(statement, T::table_name(), &key, miss);
            conn.call(async |conn: &mut C| {
                <Counted as RunOn<C, _, _, _>>::run(conn, write, false).await
            })
            .await
            .map(|_| true)
        })
        .await;
    answer
}

impl<T: SaveChanges<C>, C> Run<C> for SaveChanged<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::save_changed(conn, self)
    }
}
