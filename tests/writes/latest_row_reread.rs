//! The read that explains a miss inside a transaction: it reports the latest committed row
//! (or, where the transaction's snapshot cannot act on it, a retryable refusal), and it
//! does not deadlock the common "conflict, merge, write again" pattern, at each isolation
//! level.

// Only the servers have row locks and isolation levels to choose from.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

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

/// `load` (the order as committed), `write_from_snapshot` and `wait_until_blocked` (until
/// a session waits on a lock, asked of the server) for the module's `Conn`.
macro_rules! helpers {
    () => {
        fn load(conn: &mut Pooled<Conn>) -> Order {
            orders::table
                .find(1)
                .select(Order::as_select())
                .first(conn)
                .unwrap()
        }

        /// A copy read at version 0 writes inside a transaction at `level` whose snapshot
        /// saw version 1; with `commit_after_snapshot`, another session commits version 2
        /// after the snapshot was taken. Returns the write's error.
        fn write_from_snapshot(
            db: &common::TestDb<Conn>,
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

            conn.batch_execute(&format!("{SET_ISOLATION} {level}"))
                .unwrap();
            conn.transaction::<(), Error, _>(|conn| {
                assert_eq!(load(conn).version, 1, "the snapshot");
                if commit_after_snapshot {
                    load(other)
                        .guarded_update(other, orders::note.eq("v2"))
                        .unwrap();
                }
                copy.guarded_update(conn, orders::note.eq("stale"))?;
                Ok(())
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
    };
}

/// Two transactions hold stale copies of a row a third one changed. The first gets a
/// conflict and writes its merge onto the current row; the second's stale write waits
/// behind it (checked on the server before the first goes on), then gets its own conflict
/// and merges in turn. Both succeed, in order, with real threads.
macro_rules! stale_writers_test {
    ($db:expr, $isolation:expr, $waiting_sql:expr) => {{
        let db = $db;
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
        let (mut one, mut two, mut observer) = (db.conn(), db.conn(), db.conn());
        one.batch_execute($isolation).unwrap();
        two.batch_execute($isolation).unwrap();
        // A miss outside any transaction first, on the same connection: the re-read's SQL
        // differs inside one, and a statement cache keyed wrongly would reuse this one.
        let err = first
            .guarded_update(&mut one, orders::note.eq("outside"))
            .unwrap_err();
        assert!(err.as_conflict().is_some(), "{err:?}");
        let first_has_its_conflict = Barrier::new(2);

        std::thread::scope(|s| {
            let second_writer = s.spawn(|| {
                first_has_its_conflict.wait();
                two.transaction::<_, Error, _>(|two| {
                    let err = second
                        .guarded_update(two, orders::note.eq("two"))
                        .unwrap_err();
                    let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
                    let current = conflict.current::<Order>().unwrap().clone();
                    assert_eq!(
                        current.version, 2,
                        "the conflict shows the first writer's merge"
                    );
                    current.guarded_update(two, orders::note.eq(format!("{} + two", current.note)))
                })
            });

            let merged = one.transaction::<_, Error, _>(|one| {
                let err = first
                    .guarded_update(one, orders::note.eq("one"))
                    .unwrap_err();
                let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
                let current = conflict.current::<Order>().unwrap().clone();
                assert_eq!(current.version, 1);
                first_has_its_conflict.wait();
                wait_until_blocked(&mut observer, $waiting_sql);
                current.guarded_update(one, orders::note.eq("third + one"))
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
    }};
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    type Conn = diesel::MysqlConnection;
    const SET_ISOLATION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL";
    helpers!();

    // The second writer's statement, running in this test's database. Not `INNODB_TRX`:
    // InnoDB refreshes that view only for a reader that has not read it for 100 ms, so
    // tests polling it in parallel keep each other from ever seeing the wait.
    const WAITING: &str = "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST \
                           WHERE DB = DATABASE() AND INFO LIKE 'UPDATE%' AND ID <> CONNECTION_ID()";

    #[test]
    fn stale_writers_merge_in_turn_at_read_committed() {
        let Some(db) = common::mysql() else { return };
        stale_writers_test!(&db, &format!("{SET_ISOLATION} READ COMMITTED"), WAITING);
    }

    #[test]
    fn stale_writers_merge_in_turn_at_repeatable_read() {
        let Some(db) = common::mysql() else { return };
        stale_writers_test!(&db, &format!("{SET_ISOLATION} REPEATABLE READ"), WAITING);
    }

    /// REPEATABLE READ: the transaction's snapshot holds version 1, version 2 is committed
    /// later; the conflict reports version 2.
    #[test]
    fn conflict_reports_rows_committed_after_the_snapshot() {
        let Some(db) = common::mysql() else { return };

        let err = write_from_snapshot(&db, "REPEATABLE READ", true);

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(2));
        assert_eq!(conflict.current::<Order>().unwrap().note, "v2");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    type Conn = diesel::PgConnection;
    const SET_ISOLATION: &str = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL";
    helpers!();

    const WAITING: &str = "SELECT COUNT(*) AS n FROM pg_stat_activity \
                           WHERE wait_event_type = 'Lock' AND datname = current_database() \
                           AND application_name = current_setting('application_name')";

    #[test]
    fn stale_writers_merge_in_turn_at_read_committed() {
        let Some(db) = common::postgres() else { return };
        stale_writers_test!(&db, &format!("{SET_ISOLATION} READ COMMITTED"), WAITING);
    }

    /// The copy is at version 0, the transaction's snapshot sees 1, and 2 is committed
    /// after the snapshot: the snapshot cannot act on the latest row, so the outcome is a
    /// retryable serialization failure, never a conflict carrying the snapshot's stale row.
    #[test]
    fn stale_snapshot_reports_a_serialization_failure_not_its_own_row() {
        let Some(db) = common::postgres() else { return };
        for level in ["REPEATABLE READ", "SERIALIZABLE"] {
            let err = write_from_snapshot(&db, level, true);

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
    #[test]
    fn stale_copy_in_a_current_snapshot_is_a_conflict_with_the_latest_row() {
        let Some(db) = common::postgres() else { return };

        let err = write_from_snapshot(&db, "REPEATABLE READ", false);

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(1));
    }
}
