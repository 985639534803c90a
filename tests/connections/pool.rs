//! The pool builders: SQLite settings, server connection checks, write transactions.

use crate::common;

use common::models::{Order, OrderLine};
use common::schema::{order_lines, orders};
use diesel::connection::InstrumentationEvent;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Text};
use diesel_occ::{Error, PoolConfig, RetryReason, WriteTransaction};
use std::cell::Cell;
use std::sync::Once;
use std::time::Duration;

#[derive(QueryableByName)]
struct TextValue {
    #[diesel(sql_type = Text)]
    value: String,
}

#[derive(QueryableByName)]
struct IntValue {
    #[diesel(sql_type = BigInt)]
    value: i64,
}

thread_local! {
    /// Statements started on this thread's connections.
    static STATEMENTS: Cell<usize> = const { Cell::new(0) };
}

/// Counts statements per thread through diesel's default instrumentation, which the
/// pools' own instrumentation passes every event on to.
fn count_statements() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        diesel::connection::set_default_instrumentation(|| {
            Some(Box::new(|event: InstrumentationEvent<'_>| {
                if let InstrumentationEvent::StartQuery { .. } = event {
                    STATEMENTS.with(|n| n.set(n.get() + 1));
                }
            }))
        })
        .unwrap();
    });
}

fn statements() -> usize {
    STATEMENTS.with(Cell::get)
}

for_each_backend! {
    /// A connection that answered within `check_after_idle` is handed out without a
    /// round trip; one idle for longer is checked first (one statement more).
    #[test]
    fn checkout_checks_only_connections_idle_for_longer_than_the_window() {
        let Some(db) = db() else { return };
        count_statements();
        let check_after_idle = Duration::from_millis(200);
        let pool = db.pool_with(&PoolConfig { max_size: 1, min_idle: 1, check_after_idle, ..common::pool_config() });
        let mut conn = pool.get().unwrap();
        orders::table.count().get_result::<i64>(&mut conn).unwrap();
        drop(conn);

        let before = statements();
        let mut conn = pool.get().unwrap();
        orders::table.count().get_result::<i64>(&mut conn).unwrap();
        drop(conn);
        let busy = statements() - before;

        std::thread::sleep(check_after_idle * 2);
        let before = statements();
        let mut conn = pool.get().unwrap();
        orders::table.count().get_result::<i64>(&mut conn).unwrap();
        let idle = statements() - before;

        assert_eq!((busy, idle), (1, 2), "statements per checkout + query: busy, then idle");
    }

    #[test]
    fn foreign_keys_are_enforced() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let orphan = OrderLine { order_id: 42, line_no: 1, sku: "s".into(), quantity: 1, version: 0 };

        let err = diesel::insert_into(order_lines::table).values(&orphan).execute(conn).unwrap_err();

        assert!(matches!(err, DieselError::DatabaseError(DatabaseErrorKind::ForeignKeyViolation, _)), "{err:?}");
    }

    #[test]
    fn write_transaction_commits_on_ok_and_rolls_back_on_err() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();

        conn.write_transaction(|conn| {
            diesel::insert_into(orders::table).values(&Order::new(1, "kept")).execute(conn)
        })
        .unwrap();
        let failed: Result<(), Error> = conn.write_transaction(|conn| {
            diesel::insert_into(orders::table).values(&Order::new(2, "dropped")).execute(conn)?;
            Err(Error::Database(DieselError::RollbackTransaction))
        });
        // Nested: the inner one is a savepoint.
        conn.write_transaction(|conn| {
            conn.write_transaction(|conn| {
                diesel::insert_into(orders::table).values(&Order::new(3, "nested")).execute(conn)
            })
        })
        .unwrap();

        assert!(failed.is_err());
        let ids: Vec<i64> = orders::table.select(orders::id).order(orders::id).load(conn).unwrap();
        assert_eq!(ids, vec![1, 3]);
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_only {
    use super::*;

    #[test]
    fn sqlite_pool_turns_on_wal_busy_timeout_and_foreign_keys() {
        let db = common::sqlite().unwrap();
        let conn = &mut db.conn();
        let mode: TextValue =
            diesel::sql_query("SELECT journal_mode AS value FROM pragma_journal_mode")
                .get_result(conn)
                .unwrap();
        let timeout: IntValue =
            diesel::sql_query("SELECT timeout AS value FROM pragma_busy_timeout")
                .get_result(conn)
                .unwrap();
        let keys: IntValue =
            diesel::sql_query("SELECT foreign_keys AS value FROM pragma_foreign_keys")
                .get_result(conn)
                .unwrap();
        assert_eq!(mode.value, "wal");
        assert_eq!(
            timeout.value as u128,
            common::pool_config().busy_timeout.as_millis()
        );
        assert_eq!(
            PoolConfig::default().busy_timeout,
            Duration::from_secs(5),
            "the documented default"
        );
        assert_eq!(keys.value, 1);
    }

    /// A private in-memory database per pooled connection is refused before any
    /// connection opens, with a message that says why.
    #[test]
    fn sqlite_pool_refuses_a_private_in_memory_database() {
        let config = diesel_occ::PoolConfig::default();
        for path in [
            ":memory:",
            "",
            "file::memory:",
            "file:scratch?mode=memory",
            "file::memory:?mode=ro",
        ] {
            match diesel_occ::sqlite_pool(path, &config) {
                Err(diesel_occ::Error::InvalidSetting {
                    what: "SQLite path",
                    reason,
                }) => {
                    assert!(
                        reason.contains("private database for every pooled connection"),
                        "{reason}"
                    )
                }
                other => panic!("{path:?}: expected InvalidSetting, got {:?}", other.err()),
            }
        }
    }

    #[test]
    fn sqlite_write_transaction_takes_the_write_lock_before_its_first_read() {
        let db = common::sqlite().unwrap();
        let path = {
            let conn = &mut db.conn();
            let file: TextValue = diesel::sql_query(
                "SELECT file AS value FROM pragma_database_list WHERE name = 'main'",
            )
            .get_result(conn)
            .unwrap();
            file.value
        };
        let impatient = diesel_occ::sqlite_pool(
            &path,
            &diesel_occ::PoolConfig {
                busy_timeout: Duration::from_millis(50),
                ..common::pool_config()
            },
        )
        .unwrap();
        let mut holder = db.conn();

        let blocked = holder.write_transaction(|conn| {
            // Only a read so far; a deferred transaction would not hold the write lock yet.
            orders::table.count().get_result::<i64>(conn)?;
            let write = diesel::insert_into(orders::table)
                .values(&Order::new(1, "other writer"))
                .execute(&mut impatient.get().unwrap());
            Ok::<_, DieselError>(write.map_err(Error::from))
        });

        let err = blocked.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                Error::Retryable {
                    reason: RetryReason::Busy,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_pool_replaces_connections_the_server_dropped() {
    let Some(db) = common::postgres() else { return };
    let id_of = |conn: &mut diesel::PgConnection| {
        let id: IntValue = diesel::sql_query("SELECT pg_backend_pid()::BIGINT AS value")
            .get_result(conn)
            .unwrap();
        id.value
    };
    let kill = |id| format!("SELECT pg_terminate_backend({id})");
    check_idle_connection_dropped_by_the_server_is_replaced(&db, id_of, kill);
    check_connection_found_lost_is_discarded_on_return(&db, id_of, kill, |conn| {
        diesel_occ::GuardedWrite::guarded_update(&Order::new(1, "x"), conn, orders::note.eq("y"))
            .map(drop)
    });
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_pool_replaces_connections_the_server_dropped() {
    let Some(db) = common::mysql() else { return };
    let id_of = |conn: &mut diesel::MysqlConnection| {
        let id: IntValue = diesel::sql_query("SELECT CAST(CONNECTION_ID() AS SIGNED) AS value")
            .get_result(conn)
            .unwrap();
        id.value
    };
    let kill = |id| format!("KILL {id}");
    check_idle_connection_dropped_by_the_server_is_replaced(&db, id_of, kill);
    check_connection_found_lost_is_discarded_on_return(&db, id_of, kill, |conn| {
        diesel_occ::GuardedWrite::guarded_update(&Order::new(1, "x"), conn, orders::note.eq("y"))
            .map(drop)
    });
}

/// The server kills a pooled connection while it sits idle (a restart, `wait_timeout`, an
/// administrator). Once it has been idle longer than `check_after_idle`, the checkout
/// checks it, notices, and hands out a new, working connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn check_idle_connection_dropped_by_the_server_is_replaced<C>(
    db: &common::TestDb<C>,
    id_of: impl Fn(&mut C) -> i64,
    kill: impl Fn(i64) -> String,
) where
    C: diesel::r2d2::R2D2Connection + 'static,
{
    use diesel::connection::SimpleConnection;
    let check_after_idle = Duration::from_millis(50);
    let pool = db.pool_with(&PoolConfig {
        max_size: 2,
        check_after_idle,
        ..common::pool_config()
    });
    let mut victim = pool.get().unwrap();
    let first = id_of(&mut victim);
    drop(victim); // back to the pool, where the server now drops it
    db.conn().batch_execute(&kill(first)).unwrap();
    // Idle for longer than the window: that, not luck, is what makes the checkout check.
    std::thread::sleep(check_after_idle * 3);

    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut conn = pool.get().unwrap();
        seen.push(id_of(&mut conn));
    }

    assert!(
        !seen.contains(&first),
        "the dropped connection {first} was handed out again: {seen:?}"
    );
}

/// A connection killed while it was still inside the no-check window is handed out; the
/// write on it fails as ambiguous (outside a transaction it may or may not have been
/// applied, as far as the client can tell), and when the connection goes back to the
/// pool it is discarded, so the next checkout works.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn check_connection_found_lost_is_discarded_on_return<C>(
    db: &common::TestDb<C>,
    id_of: impl Fn(&mut C) -> i64,
    kill: impl Fn(i64) -> String,
    write: impl Fn(&mut C) -> Result<(), Error>,
) where
    C: diesel::r2d2::R2D2Connection + 'static,
{
    use diesel::connection::SimpleConnection;
    let pool = db.pool_with(&PoolConfig {
        max_size: 1,
        min_idle: 1,
        check_after_idle: Duration::from_secs(3600),
        ..common::pool_config()
    });
    let mut victim = pool.get().unwrap();
    let id = id_of(&mut victim);
    drop(victim);
    db.conn().batch_execute(&kill(id)).unwrap();

    let mut victim = pool.get().unwrap(); // the only connection: the dead one, unchecked
    let err = write(&mut victim).unwrap_err();
    assert!(matches!(err, Error::Ambiguous { .. }), "{err:?}");
    assert!(!err.is_retryable());
    drop(victim);

    let mut next = pool.get().unwrap();
    assert_ne!(
        id_of(&mut next),
        id,
        "the lost connection was handed out again"
    );
}
