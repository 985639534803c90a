//! Writes that commit only while a lock is held, on a diesel-async connection: the
//! blocking [`Held::write_while_held`], with the write an async closure and every
//! statement awaited. The same transaction, the same check of the lock row before the
//! `COMMIT`, and the same end of the holder's belief when the check finds the lock lost
//! ([`Held::settled`]).

use super::write_transaction::{AsyncWriteConnection, TransactionWork};
use crate::drive::on_async::connection::refuse_broken;
use crate::drive::on_async::transaction::OwnTransaction;
use crate::error::Error;
use crate::locks::held::Held;
use crate::retry::Stop;

impl Held {
    /// [`write_while_held`](Self::write_while_held) on a diesel-async connection:
    /// `write` runs in a transaction that commits only if this process still holds the
    /// lock by the database's own account, checked on the lock row before the `COMMIT`;
    /// otherwise it rolls back and the answer is [`Error::LockLost`], and this holder's
    /// belief ends. `write`'s own error rolls back and comes back unchanged.
    ///
    /// Dropped before its `COMMIT` was sent, it leaves the connection marked broken (its
    /// transaction is ended by closing it) and nothing it wrote is committed; dropped
    /// while the `COMMIT` is on its way, the write may have committed (after the check
    /// passed), as a lost connection at `COMMIT` may have.
    pub async fn write_while_held_async<C, T, E, W>(&self, conn: &mut C, write: W) -> Result<T, E>
    where
        C: AsyncWriteConnection,
        W: for<'r> TransactionWork<'r, C, T, E>,
        E: From<Error>,
    {
        // Refused without a round trip when the belief already ended.
        self.check()?;
        refuse_broken(conn)?;
        let (key, holder, fence) = self.checked_by();
        let mut transaction = OwnTransaction::begin_write(conn).await?;
        let result = async {
            let value = write(transaction.conn()).await.map_err(Stop::Caller)?;
            transaction.conn().check_held(key, holder, fence).await?;
            Ok(value)
        }
        .await;
        let result = transaction.settle(result).await;
        self.settled(result)
    }
}
