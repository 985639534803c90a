//! Maintenance writes of the `#[occ(updated_at)]` column, outside the guard.
//!
//! A job that re-indexes rows, or a migration that marks them changed, may set the update
//! time without being a modification of the row's data: it must not conflict with the
//! users editing the row, nor make their copies stale. So the write neither checks nor
//! advances the token: `UPDATE ... SET updated_at = ? WHERE <key>`.

use diesel::connection::LoadConnection;
use diesel::query_builder::QueryFragment;
use diesel::query_dsl::methods::ExecuteDsl;

use crate::connect::backend::OccBackend;
use crate::drive::blocking::load::LoadByKey;
use crate::error::Error;
use crate::operation::{Operation, Run, TouchStamp};
use crate::sql::statement::{Assignments, ColumnEq};
use crate::write::entity::{write_unguarded_by_key, UnguardedUpdateOf};

/// The stamp of an entity with an `#[occ(updated_at)]` field; entities without one have
/// nothing to touch.
#[diagnostic::on_unimplemented(
    message = "this entity has no `#[occ(updated_at)]` field to touch",
    note = "mark the update-time field with `#[occ(updated_at)]`; to advance the guard's own token, use `guarded_touch`"
)]
pub trait UpdatedAtStamp {}

impl<Col, Ts> UpdatedAtStamp for ColumnEq<Col, Ts> {}

/// A maintenance touch of entity `Self`'s `#[occ(updated_at)]` column on connection `C`,
/// as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot touch its update time on `{C}`",
    note = "the entity needs an `#[occ(updated_at)]` field and the connection must be a diesel connection of a backend diesel-occ supports",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait TouchUpdatedAt<C>: LoadByKey<C> {
    /// Runs the write; [`GuardedWrite`](crate::GuardedWrite) calls it.
    #[doc(hidden)]
    fn touch_updated_at_row(conn: &mut C, key: &Self::Key, stamp: Self::Stamp)
        -> Result<(), Error>;
}

impl<T, C> TouchUpdatedAt<C> for T
where
    T: LoadByKey<C>,
    T::Stamp: UpdatedAtStamp,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    UnguardedUpdateOf<T, T::Stamp>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
    T::Stamp: QueryFragment<C::Backend>,
{
    fn touch_updated_at_row(conn: &mut C, key: &T::Key, stamp: T::Stamp) -> Result<(), Error> {
        write_unguarded_by_key::<T, C, _>(conn, key, stamp)
    }
}

impl<T: TouchUpdatedAt<C>, C> Run<C> for TouchStamp<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::touch_updated_at_row(conn, &self.key, self.stamp)
    }
}
