//! A read-modify-write with retry: the caller's change of a copy of the row, saved under
//! the row's guard, again from a fresh read while the guard finds the row moved on.

use std::marker::PhantomData;

use crate::error::Error;
use crate::guard::{Guarded, TokenOf};
use crate::retry::RetryPolicy;

use super::Operation;

/// Reads the row with `key`, hands it to `change` (a `FnMut(&mut T) -> Result<R, E>`) and
/// saves the changed copy, each attempt in a transaction of its own, retried under
/// `policy`. Answers the row as saved, its token, the change's value and the attempts.
pub struct Modify<T: Guarded, F, R, E> {
    pub(crate) key: T::Key,
    pub(crate) policy: RetryPolicy,
    pub(crate) change: F,
    answers: PhantomData<fn() -> (R, E)>,
}

impl<T: Guarded, F, R, E> Modify<T, F, R, E> {
    /// The read-modify-write of the row with `key` by `change`, retried under `policy`.
    pub(crate) fn new(key: T::Key, policy: RetryPolicy, change: F) -> Self {
        Self {
            key,
            policy,
            change,
            answers: PhantomData,
        }
    }
}

impl<T: Guarded, F, R, E: From<Error>> Operation for Modify<T, F, R, E> {
    type Output = Modified<T, R>;
    type Error = E;
}

/// What a successful read-modify-write gives back.
#[derive(Debug)]
#[non_exhaustive]
pub struct Modified<T: Guarded, R> {
    /// The row as written, holding its new token.
    pub row: T,
    /// The row's new token.
    pub token: TokenOf<T>,
    /// What the caller's closure returned on the attempt that was written.
    pub value: R,
    /// How many attempts it took (1 when nothing conflicted).
    pub attempts: u32,
}

impl<T: Guarded, R> Modified<T, R> {
    /// The report of a read-modify-write flow's outcome: the attempt that was written (the
    /// row, its token, the caller's value) and how many attempts it took.
    pub(crate) fn of(((row, token, value), attempts): ((T, TokenOf<T>, R), u32)) -> Self {
        Modified {
            row,
            token,
            value,
            attempts,
        }
    }
}
