//! The read that explains a miss inside a transaction: it reports the latest committed row
//! (or, where the transaction's snapshot cannot act on it, a retryable refusal), and it
//! does not deadlock the common "conflict, merge, write again" pattern, at each isolation
//! level. Each body runs on both drivers (the blocking API and the async one); other
//! code's writes and the server-side lock checks stay on blocking connections.

// Only the servers have row locks and isolation levels to choose from.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::drivers::Blocking;
use common::models::Order;
use common::schema::orders;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel_occ::{Error, GuardedWrite, Pooled, RetryReason, Token};

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Guarded writes of an order's note in and out of transactions, on either driver.
trait NoteWrites {
    /// Runs `sql` (no bind values) on the executor's connection.
    fn execute(&mut self, sql: &str);
    /// A guarded update of `copy`'s note, outside any transaction.
    fn update_note(&mut self, copy: &Order, note: &'static str) -> Result<i64, Error>;
    /// In one transaction: reads order 1 (`read` sees it), then a guarded update of
    /// `copy`'s note; commits, or rolls back with the update's error.
    fn update_note_after_read(
        &mut self,
        copy: &Order,
        note: &'static str,
        read: impl FnOnce(&Order) + Send,
    ) -> Result<i64, Error>;
    /// In one transaction: a guarded update of `stale`'s note, which must be a conflict;
    /// then a guarded update of the conflict's current row with the note `merge` makes
    /// from it; commits, or rolls back with that update's error.
    fn merge_after_conflict(
        &mut self,
        stale: &Order,
        note: &'static str,
        merge: impl FnOnce(&Order) -> String + Send,
    ) -> Result<i64, Error>;
}

/// The current row of the conflict `answer` must be.
fn current_of(answer: Result<i64, Error>) -> Order {
    let err = answer.unwrap_err();
    let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
    conflict.current::<Order>().unwrap().clone()
}

/// For the module's `Conn`: `db`, `load` (the order as committed), the [`NoteWrites`] of
/// both drivers, `write_from_snapshot`, `wait_until_blocked` (until a session waits on a
/// lock, asked of the server) and `stale_writers_merge_in_turn`.
macro_rules! helpers {
    () => {
        type Db = common::TestDb<Conn>;

        fn load(conn: &mut Pooled<Conn>) -> Order {
            orders::table
                .find(1)
                .select(Order::as_select())
                .first(conn)
                .unwrap()
        }

        impl NoteWrites for Blocking<Pooled<Conn>> {
            fn execute(&mut self, sql: &str) {
                self.0.batch_execute(sql).unwrap();
            }
            fn update_note(&mut self, copy: &Order, note: &'static str) -> Result<i64, Error> {
                copy.guarded_update(&mut self.0, orders::note.eq(note))
            }
            fn update_note_after_read(
                &mut self,
                copy: &Order,
                note: &'static str,
                read: impl FnOnce(&Order) + Send,
            ) -> Result<i64, Error> {
                self.0.transaction::<_, Error, _>(|conn| {
                    read(&load(conn));
                    copy.guarded_update(conn, orders::note.eq(note))
                })
            }
            fn merge_after_conflict(
                &mut self,
                stale: &Order,
                note: &'static str,
                merge: impl FnOnce(&Order) -> String + Send,
            ) -> Result<i64, Error> {
                self.0.transaction::<_, Error, _>(|conn| {
                    let current = current_of(stale.guarded_update(conn, orders::note.eq(note)));
                    let merged = merge(&current);
                    current.guarded_update(conn, orders::note.eq(merged))
                })
            }
        }

        #[cfg(all(
            feature = "async",
            any(not(feature = "mysql"), feature = "async-mysql")
        ))]
        type Async_ = <Conn as common::paths::AsyncOf>::Async;

        #[cfg(all(
            feature = "async",
            any(not(feature = "mysql"), feature = "async-mysql")
        ))]
        impl NoteWrites for common::drivers::Async<Async_> {
            fn execute(&mut self, sql: &str) {
                let sent = diesel_async::SimpleAsyncConnection::batch_execute(&mut self.conn, sql);
                self.runtime.block_on(sent).unwrap();
            }
            fn update_note(&mut self, copy: &Order, note: &'static str) -> Result<i64, Error> {
                use diesel_occ::asynchronous::AsyncGuardedWrite;
                self.runtime.block_on(AsyncGuardedWrite::guarded_update(
                    copy,
                    &mut self.conn,
                    orders::note.eq(note),
                ))
            }
            fn update_note_after_read(
                &mut self,
                copy: &Order,
                note: &'static str,
                read: impl FnOnce(&Order) + Send,
            ) -> Result<i64, Error> {
                use diesel_async::AsyncConnection;
                use diesel_occ::asynchronous::AsyncGuardedWrite;
                let work = self
                    .conn
                    .transaction::<_, Error, _>(async move |conn: &mut Async_| {
                        let row = orders::table.find(1).select(Order::as_select());
                        read(&diesel_async::RunQueryDsl::first(row, conn).await.unwrap());
                        AsyncGuardedWrite::guarded_update(copy, conn, orders::note.eq(note)).await
                    });
                self.runtime.block_on(work)
            }
            fn merge_after_conflict(
                &mut self,
                stale: &Order,
                note: &'static str,
                merge: impl FnOnce(&Order) -> String + Send,
            ) -> Result<i64, Error> {
                use diesel_async::AsyncConnection;
                use diesel_occ::asynchronous::AsyncGuardedWrite;
                let work = self
                    .conn
                    .transaction::<_, Error, _>(async move |conn: &mut Async_| {
                        let stale_write =
                            AsyncGuardedWrite::guarded_update(stale, conn, orders::note.eq(note));
                        let current = current_of(stale_write.await);
                        let merged = merge(&current);
                        AsyncGuardedWrite::guarded_update(&current, conn, orders::note.eq(merged))
                            .await
                    });
                self.runtime.block_on(work)
            }
        }

        /// A copy read at version 0 writes inside a transaction at `level` whose snapshot
        /// saw version 1; with `commit_after_snapshot`, another session commits version 2
        /// after the snapshot was taken. Returns the write's error.
        fn write_from_snapshot<W: NoteWrites>(
            db: &Db,
            w: &mut W,
            level: &str,
            commit_after_snapshot: bool,
        ) -> Error {
            let (conn, other) = (&mut db.conn(), &mut db.conn());
            conn.batch_execute("DELETE FROM orders").unwrap();
            let copy = Order::new(1, "new");
            diesel::insert_into(orders::table)
                .values(&copy)
                .execute(conn)
                .unwrap();
            copy.guarded_update(other, orders::note.eq("v1")).unwrap();

            w.execute(&format!("{SET_ISOLATION} {level}"));
            w.update_note_after_read(&copy, "stale", |snapshot| {
                assert_eq!(snapshot.version, 1, "the snapshot");
                if commit_after_snapshot {
                    load(other)
                        .guarded_update(other, orders::note.eq("v2"))
                        .unwrap();
                }
            })
            .unwrap_err()
        }

        fn wait_until_blocked(observer: &mut Pooled<Conn>, waiting_sql: &str) {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let blocked: Count = diesel::sql_query(waiting_sql).get_result(observer).unwrap();
                if blocked.n > 0 {
                    return;
                }
                assert!(Instant::now() < deadline, "the second writer never blocked");
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        /// Two transactions hold stale copies of a row a third one changed. The first
        /// gets a conflict and writes its merge onto the current row; the second's stale
        /// write waits behind it (checked on the server before the first goes on), then
        /// gets its own conflict and merges in turn. Both succeed, in order, with real
        /// threads, each writer on an executor of the driver's.
        fn stale_writers_merge_in_turn<W: NoteWrites + Send>(
            db: &Db,
            w: impl Fn() -> W,
            isolation: &str,
        ) {
            let (first, second) = {
                let conn = &mut db.conn();
                let order = Order::new(1, "new");
                diesel::insert_into(orders::table)
                    .values(&order)
                    .execute(conn)
                    .unwrap();
                order
                    .guarded_update(conn, orders::note.eq("third"))
                    .unwrap();
                (order.clone(), order)
            };
            let (mut one, mut two, mut observer) = (w(), w(), db.conn());
            one.execute(isolation);
            two.execute(isolation);
            // A miss outside any transaction first, on the same connection: the re-read's
            // SQL differs inside one, and a statement cache keyed wrongly would reuse this
            // one.
            let err = one.update_note(&first, "outside").unwrap_err();
            assert!(err.as_conflict().is_some(), "{err:?}");
            let first_has_its_conflict = Barrier::new(2);

            std::thread::scope(|s| {
                let second_writer = s.spawn(|| {
                    first_has_its_conflict.wait();
                    two.merge_after_conflict(&second, "two", |current| {
                        assert_eq!(
                            current.version, 2,
                            "the conflict shows the first writer's merge"
                        );
                        format!("{} + two", current.note)
                    })
                });

                let merged = one.merge_after_conflict(&first, "one", |current| {
                    assert_eq!(current.version, 1);
                    first_has_its_conflict.wait();
                    wait_until_blocked(&mut observer, WAITING);
                    "third + one".to_string()
                });
                assert_eq!(merged.unwrap(), 2, "the first writer's merge");
                assert_eq!(
                    second_writer.join().unwrap().unwrap(),
                    3,
                    "the second writer's merge"
                );
            });
            let stored = load(&mut db.conn());
            assert_eq!(
                (stored.note.as_str(), stored.version),
                ("third + one + two", 3)
            );
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    type Conn = diesel::MysqlConnection;
    const SET_ISOLATION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL";
    fn db() -> Option<Db> {
        common::mysql()
    }
    helpers!();

    // The second writer's statement, running in this test's database. Not `INNODB_TRX`:
    // InnoDB refreshes that view only for a reader that has not read it for 100 ms, so
    // tests polling it in parallel keep each other from ever seeing the wait.
    const WAITING: &str = "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST \
                           WHERE DB = DATABASE() AND INFO LIKE 'UPDATE%' AND ID <> CONNECTION_ID()";

    fn stale_writers_merge_in_turn_at_read_committed<W: NoteWrites + Send>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        stale_writers_merge_in_turn(db, w, &format!("{SET_ISOLATION} READ COMMITTED"));
    }

    fn stale_writers_merge_in_turn_at_repeatable_read<W: NoteWrites + Send>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        stale_writers_merge_in_turn(db, w, &format!("{SET_ISOLATION} REPEATABLE READ"));
    }

    /// REPEATABLE READ: the transaction's snapshot holds version 1, version 2 is committed
    /// later; the conflict reports version 2.
    fn conflict_reports_rows_committed_after_the_snapshot<W: NoteWrites>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let err = write_from_snapshot(db, &mut w(), "REPEATABLE READ", true);

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(2));
        assert_eq!(conflict.current::<Order>().unwrap().note, "v2");
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        stale_writers_merge_in_turn_at_read_committed,
        stale_writers_merge_in_turn_at_repeatable_read,
        conflict_reports_rows_committed_after_the_snapshot,
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    type Conn = diesel::PgConnection;
    const SET_ISOLATION: &str = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL";
    fn db() -> Option<Db> {
        common::postgres()
    }
    helpers!();

    const WAITING: &str = "SELECT COUNT(*) AS n FROM pg_stat_activity \
                           WHERE wait_event_type = 'Lock' AND datname = current_database() \
                           AND application_name = current_setting('application_name')";

    fn stale_writers_merge_in_turn_at_read_committed<W: NoteWrites + Send>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        stale_writers_merge_in_turn(db, w, &format!("{SET_ISOLATION} READ COMMITTED"));
    }

    /// The copy is at version 0, the transaction's snapshot sees 1, and 2 is committed
    /// after the snapshot: the snapshot cannot act on the latest row, so the outcome is a
    /// retryable serialization failure, never a conflict carrying the snapshot's stale row.
    fn stale_snapshot_reports_a_serialization_failure_not_its_own_row<W: NoteWrites>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        for level in ["REPEATABLE READ", "SERIALIZABLE"] {
            let err = write_from_snapshot(db, &mut w(), level, true);

            assert!(
                matches!(
                    err,
                    Error::Retryable {
                        reason: RetryReason::SerializationFailure,
                        ..
                    }
                ),
                "{level}: {err:?}"
            );
        }
    }

    /// Without a later commit the snapshot's row is the latest one: a plain conflict.
    fn stale_copy_in_a_current_snapshot_is_a_conflict_with_the_latest_row<W: NoteWrites>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let err = write_from_snapshot(db, &mut w(), "REPEATABLE READ", false);

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(1));
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        stale_writers_merge_in_turn_at_read_committed,
        stale_snapshot_reports_a_serialization_failure_not_its_own_row,
        stale_copy_in_a_current_snapshot_is_a_conflict_with_the_latest_row,
    );
}
