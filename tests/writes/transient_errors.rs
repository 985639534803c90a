//! Transient refusals from real databases become `Error::Retryable`, never a conflict.
//! Each body runs on both drivers (the blocking API and the async one).

use crate::common;

use std::sync::Barrier;

use common::drivers::{race, Blocking};
use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, GuardedWrite, RetryReason};

/// Guarded writes of notes inside one transaction, on either driver.
trait NotesInOneTransaction {
    /// In one transaction: reads order `first` and sets its note to `note` by a guarded
    /// update; waits at `between`, whatever that write answered; then stops with that
    /// write's failure (rolled back), or reads order `second` and sets its note too, and
    /// commits.
    fn set_notes_in_order(
        &mut self,
        first: i64,
        second: i64,
        note: String,
        between: &Barrier,
    ) -> Result<(), Error>;
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    impl NotesInOneTransaction for Blocking<Pooled> {
        fn set_notes_in_order(&mut self, first: i64, second: i64, note: String, between: &Barrier) -> Result<(), Error> {
            self.0.transaction(|conn| {
                let row = load(conn, first);
                let first_write = row.guarded_update(conn, orders::note.eq(note.clone()));
                between.wait();
                first_write?;
                let row = load(conn, second);
                row.guarded_update(conn, orders::note.eq(note))?;
                Ok::<_, Error>(())
            })
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl NotesInOneTransaction for common::drivers::Async<Async_> {
        fn set_notes_in_order(&mut self, first: i64, second: i64, note: String, between: &Barrier) -> Result<(), Error> {
            use diesel_async::AsyncConnection;
            use diesel_occ::asynchronous::AsyncGuardedWrite;
            let work = self.conn.transaction::<_, Error, _>(async move |conn: &mut Async_| {
                let row: Order = diesel_async::RunQueryDsl::first(orders::table.find(first).select(Order::as_select()), conn).await.unwrap();
                let first_write = AsyncGuardedWrite::guarded_update(&row, conn, orders::note.eq(note.clone())).await;
                between.wait();
                first_write?;
                let row: Order = diesel_async::RunQueryDsl::first(orders::table.find(second).select(Order::as_select()), conn).await.unwrap();
                AsyncGuardedWrite::guarded_update(&row, conn, orders::note.eq(note)).await?;
                Ok(())
            });
            self.runtime.block_on(work)
        }
    }

    fn insert(conn: &mut Pooled, id: i64) {
        diesel::insert_into(orders::table).values(&Order::new(id, "new")).execute(conn).unwrap();
    }

    fn load(conn: &mut Pooled, id: i64) -> Order {
        orders::table.find(id).select(Order::as_select()).first(conn).unwrap()
    }

    /// Two transactions write orders 1 and 2 in opposite order. The servers detect the
    /// deadlock and roll one back; SQLite's second writer waits out its busy timeout. Either
    /// way exactly one transaction is refused, retryably, and the other commits.
    fn opposite_write_order_refuses_one_transaction_retryably<W: NotesInOneTransaction>(db: &Db, w: impl Fn() -> W + Sync) {
        insert(&mut db.conn(), 1);
        insert(&mut db.conn(), 2);
        let both_hold_their_first_row = Barrier::new(2);

        let results = race(2, w, |t, w| {
            let (first, second) = if t == 0 { (1, 2) } else { (2, 1) };
            w.set_notes_in_order(first, second, format!("from {first}"), &both_hold_their_first_row)
                .map(|()| first)
        });
        let [a, b]: [Result<i64, Error>; 2] = results.try_into().unwrap();

        let expected = if BACKEND == "sqlite" { RetryReason::Busy } else { RetryReason::Deadlock };
        let (winner, refused) = match (a, b) {
            (Ok(w), Err(e)) | (Err(e), Ok(w)) => (w, e),
            other => panic!("expected exactly one refused transaction: {other:?}"),
        };
        assert!(matches!(refused, Error::Retryable { reason, .. } if reason == expected), "{refused:?}");
        let notes = [load(&mut db.conn(), 1).note, load(&mut db.conn(), 2).note];
        let winner_note = format!("from {winner}");
        assert_eq!(notes, [winner_note.clone(), winner_note], "only the winner's writes remain");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        opposite_write_order_refuses_one_transaction_retryably,
    );
}

/// PostgreSQL's REPEATABLE READ refuses a write to a row changed since the transaction's
/// snapshot: a serialization failure, retryable.
#[cfg(feature = "postgres")]
mod postgres_serialization {
    use super::*;

    type Conn = diesel::PgConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::postgres()
    }

    /// A guarded write in a REPEATABLE READ transaction, on either driver.
    trait RepeatableRead {
        /// In one REPEATABLE READ transaction: reads order `id`, runs `between`, then sets
        /// the note of the copy read to `note` by a guarded update.
        fn note_in_repeatable_read(
            &mut self,
            id: i64,
            note: &'static str,
            between: impl FnOnce() + Send,
        ) -> Result<i64, Error>;
    }

    impl RepeatableRead for Blocking<diesel_occ::Pooled<Conn>> {
        fn note_in_repeatable_read(
            &mut self,
            id: i64,
            note: &'static str,
            between: impl FnOnce() + Send,
        ) -> Result<i64, Error> {
            self.0.build_transaction().repeatable_read().run(|conn| {
                let mine = load(conn, id);
                between();
                mine.guarded_update(conn, orders::note.eq(note))
            })
        }
    }

    #[cfg(all(
        feature = "async",
        any(not(feature = "mysql"), feature = "async-mysql")
    ))]
    impl RepeatableRead for common::drivers::Async<diesel_async::AsyncPgConnection> {
        fn note_in_repeatable_read(
            &mut self,
            id: i64,
            note: &'static str,
            between: impl FnOnce() + Send,
        ) -> Result<i64, Error> {
            use diesel_async::AsyncPgConnection;
            use diesel_occ::asynchronous::AsyncGuardedWrite;
            let mut transaction = self.conn.build_transaction().repeatable_read();
            let work = transaction.run(async move |conn: &mut AsyncPgConnection| {
                let read = orders::table.find(id).select(Order::as_select());
                let mine: Order = diesel_async::RunQueryDsl::first(read, conn).await.unwrap();
                between();
                AsyncGuardedWrite::guarded_update(&mine, conn, orders::note.eq(note)).await
            });
            self.runtime.block_on(work)
        }
    }

    fn load(conn: &mut Conn, id: i64) -> Order {
        orders::table
            .find(id)
            .select(Order::as_select())
            .first(conn)
            .unwrap()
    }

    /// Another connection's guarded write (a blocking one: other code of the caller's)
    /// lands after this transaction's snapshot; this transaction's write is refused.
    fn serialization_failure_is_retryable<W: RepeatableRead>(db: &Db, w: impl Fn() -> W) {
        let (conn, other) = (&mut db.conn(), &mut db.conn());
        diesel::insert_into(orders::table)
            .values(&Order::new(1, "new"))
            .execute(conn)
            .unwrap();

        let outcome = w().note_in_repeatable_read(1, "mine", || {
            load(other, 1)
                .guarded_update(other, orders::note.eq("theirs"))
                .unwrap();
        });

        let err = outcome.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Retryable {
                    reason: RetryReason::SerializationFailure,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(load(conn, 1).note, "theirs");
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        serialization_failure_is_retryable,
    );
}
