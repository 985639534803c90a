//! A fenced write as an operation ([`crate::op`]).

use std::marker::PhantomData;

use crate::error::Error;
use crate::guard::Guarded;
use crate::locks::fence::WriteFenced;
use crate::operation::{Operation, Run};

/// Applies `changes` to the row with `key` and records `fence` in the fence column `F`,
/// unless the row has already seen a newer fence ([`Error::StaleFence`]).
pub struct FencedUpdate<T: Guarded, F, Ch> {
    pub(crate) key: T::Key,
    pub(crate) fence: i64,
    pub(crate) changes: Ch,
    column: PhantomData<fn() -> F>,
}

impl<T: Guarded, F, Ch> FencedUpdate<T, F, Ch> {
    /// The write of `changes` to the row with `key` under `fence`.
    #[cfg(feature = "async")]
    pub(crate) fn new(key: T::Key, fence: i64, changes: Ch) -> Self {
        Self {
            key,
            fence,
            changes,
            column: PhantomData,
        }
    }
}

impl<T: Guarded, F, Ch> Operation for FencedUpdate<T, F, Ch> {
    type Output = ();
    type Error = Error;
}

impl<T: WriteFenced<C, F, Ch>, C, F, Ch> Run<C> for FencedUpdate<T, F, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::write_fenced_row(conn, &self.key, self.fence, self.changes)
    }
}
