//! Status transitions as operations ([`crate::op`]): a loaded copy's move, and a move by
//! key alone.

use crate::error::Error;
use crate::guard::status::HasStatus;
use crate::guard::TokenOf;
use crate::operation::{Operation, Run};
use crate::retry::RetryPolicy;
use crate::sql::statement::Unguarded;
use crate::status::transition::{TransitionByKey, TransitionRow};

/// Moves a copy's row to state `to` (with the `extra` assignments) from one of `sources`,
/// under `condition`, if the row still holds the copy's token. Answers the copy as moved
/// (its new state, token and stamp recorded) and the token.
pub struct Transition<T: HasStatus, Ch, G = Unguarded> {
    pub(crate) row: T,
    pub(crate) to: T::Status,
    pub(crate) extra: Ch,
    pub(crate) sources: &'static [T::Status],
    pub(crate) condition: G,
    /// Inside a transaction of the library's (a hook's).
    pub(crate) own: bool,
}

impl<T: HasStatus, Ch, G> Transition<T, Ch, G> {
    /// The move of `row` to `to` from one of `sources`, under `condition`.
    #[cfg(feature = "async")]
    pub(crate) fn new(
        row: T,
        to: T::Status,
        extra: Ch,
        sources: &'static [T::Status],
        condition: G,
    ) -> Self {
        Self {
            row,
            to,
            extra,
            sources,
            condition,
            own: false,
        }
    }

    /// Inside a transaction of the library's.
    #[cfg(feature = "async")]
    pub(crate) fn in_own_transaction(mut self) -> Self {
        self.own = true;
        self
    }
}

impl<T: HasStatus, Ch, G> Operation for Transition<T, Ch, G> {
    type Output = (T, TokenOf<T>);
    type Error = Error;
}

impl<T: TransitionRow<C, Ch, G>, C, Ch, G> Run<C> for Transition<T, Ch, G> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let mut row = self.row;
        let (to, sources, own) = (self.to, self.sources, self.own);
        let token = row.transition_row(conn, to, self.extra, sources, self.condition, own)?;
        Ok((row, token))
    }
}

/// Moves the row with `key` to state `to` if its state allows it and it meets `condition`,
/// whatever its token, in one statement; transient errors retried under `policy`.
/// Answers the new token.
pub struct KeyTransition<T: HasStatus, Ch, G = Unguarded> {
    pub(crate) key: T::Key,
    pub(crate) to: T::Status,
    pub(crate) extra: Ch,
    pub(crate) condition: G,
    pub(crate) policy: RetryPolicy,
}

impl<T: HasStatus, Ch, G> KeyTransition<T, Ch, G> {
    /// The move of the row with `key` to `to` under `condition`.
    #[cfg(feature = "async")]
    pub(crate) fn new(
        key: T::Key,
        to: T::Status,
        extra: Ch,
        condition: G,
        policy: RetryPolicy,
    ) -> Self {
        Self {
            key,
            to,
            extra,
            condition,
            policy,
        }
    }
}

impl<T: HasStatus, Ch, G> Operation for KeyTransition<T, Ch, G> {
    type Output = TokenOf<T>;
    type Error = Error;
}

impl<T, C, Ch, G> Run<C> for KeyTransition<T, Ch, G>
where
    T: TransitionByKey<C, Ch, G>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let (key, policy) = (&self.key, &self.policy);
        T::transition_key(conn, key, self.to, self.extra, self.condition, policy)
    }
}
