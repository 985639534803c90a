//! PgBouncer in transaction pooling mode in front of the local PostgreSQL
//! (`scripts/pgbouncer.sh`): consecutive transactions of one client run on whichever
//! server session the pooler has free. Two poolers: Debian 12's PgBouncer 1.18, which
//! keeps no prepared statement across sessions, and PgBouncer 1.24 with
//! `max_prepared_statements`, which prepares a client's statements again where they run.
//!
//! What must hold (the guide's chapter "Running behind poolers, proxies and failover"):
//! - the library's statements need no session state: with diesel's statement cache off,
//!   the blocking API works behind 1.18, on both kinds of PgBouncer;
//! - a statement cache that meets another session is named in a typed error
//!   ([`Error::StatementLostByPooler`]), and nothing is executed;
//! - the async API (diesel-async names every statement) needs 1.24's prepared
//!   statements; behind 1.18 it gets the same typed error.
//!
//! A client is moved to another session on purpose: a connection that holds the session
//! it used last in an open transaction makes the client's next statement run on another
//! one.
//!
//! The URLs come from `OCC_PGBOUNCER_URLS` (1.18's, then 1.24's); without it the tests
//! are skipped, unless `OCC_REQUIRE_CLUSTER` is set. The whole suite, faults and a
//! restart of the poolers included, runs in the soak (`scripts/test.sh`).

#![cfg(all(feature = "postgres", feature = "locks"))]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::drivers::{Insert, LockWrites, ModifyPooled, Update};
use common::models::Order;
use common::schema::orders;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::PgConnection;
use diesel_occ::{Error, PoolConfig, RetryPolicy};

type Db = common::TestDb<PgConnection>;

/// Which PgBouncer: Debian's 1.18, or 1.24 with `max_prepared_statements`.
#[derive(Clone, Copy, PartialEq)]
enum Pooler {
    WithoutPreparedStatements,
    WithPreparedStatements,
}

fn pooler_url(pooler: Pooler) -> Option<String> {
    let Ok(urls) = std::env::var("OCC_PGBOUNCER_URLS") else {
        if std::env::var_os("OCC_REQUIRE_CLUSTER").is_some() {
            panic!("OCC_PGBOUNCER_URLS is not set, but OCC_REQUIRE_CLUSTER is");
        }
        eprintln!("skipped: OCC_PGBOUNCER_URLS is not set (scripts/pgbouncer.sh)");
        return None;
    };
    let (old, new) = urls.trim().split_once(',').expect("two URLs");
    Some(
        match pooler {
            Pooler::WithoutPreparedStatements => old,
            Pooler::WithPreparedStatements => new,
        }
        .to_string(),
    )
}

/// A database of the test's own, reached through `pooler`; the pool's connections keep
/// diesel's statement cache only where the pooler keeps prepared statements.
fn db(pooler: Pooler) -> Option<Db> {
    let config = PoolConfig {
        statement_cache: pooler == Pooler::WithPreparedStatements,
        // No connection opened in the pool's background: its set-up statements would take
        // the session a test expects its client to get back.
        min_idle: 0,
        ..common::pool_config()
    };
    let db = common::postgres_through(&pooler_url(pooler)?, &config)?;
    common::drivers::Blocking(db.conn())
        .insert(&mut Order::new(1, "new"))
        .expect("an order");
    Some(db)
}

/// A connection of its own through the pooler holding, in an open transaction, the
/// server session `pid`: until it is given back (`give_back`), the pooler gives every
/// other client another session.
///
/// The pooler hands out its idle sessions newest first, so the first try usually gets
/// the session a client used last. Not always: the async client (tokio-postgres) closes
/// a prepared statement diesel-async does not keep in its background after its answer
/// came, which keeps that session busy for a moment. A connection that got another
/// session keeps it until one gets `pid`; with the pooler's 8 sessions per database
/// taken (`default_pool_size` in scripts/pgbouncer.sh), the last waits until `pid` is
/// idle.
fn hold_session(db: &Db, pid: i32) -> PgConnection {
    let mut others = Vec::new();
    for _ in 0..8 {
        let mut hog = PgConnection::establish(&db.url).expect("a connection through the pooler");
        hog.batch_execute("BEGIN").unwrap();
        let held: i32 = diesel::select(backend_pid()).get_result(&mut hog).unwrap();
        if held == pid {
            others.into_iter().for_each(give_back);
            return hog;
        }
        others.push(hog);
    }
    panic!("8 connections through the pooler never got session {pid}");
}

/// Ends the hog's transaction, so that the pooler takes its session back rather than
/// closing it.
fn give_back(mut hog: PgConnection) {
    hog.batch_execute("ROLLBACK").unwrap();
}

fn backend_pid() -> diesel::expression::SqlLiteral<diesel::sql_types::Integer> {
    diesel::dsl::sql("pg_backend_pid()")
}

/// The backend pid of the server session the client's last statement ran on. Behind a
/// pooler that keeps no prepared statement, the async client's query is prepared and run
/// in two exchanges, which may meet two sessions: then it is asked again.
trait SessionPid {
    /// Whether the client's next statement runs on the session its last one used unless
    /// a hog takes it: the blocking client's does; the async one closes statements in its
    /// background, which can move it by itself (see `hold_session`).
    const STAYS_ON_ITS_SESSION: bool;

    fn try_session_pid(&mut self) -> QueryResult<i32>;

    fn session_pid(&mut self) -> i32 {
        let mut tries = 0;
        loop {
            match self.try_session_pid() {
                Ok(pid) => return pid,
                Err(error) if tries == 20 => panic!("no backend pid in 20 tries: {error}"),
                Err(_) => tries += 1,
            }
        }
    }
}

impl SessionPid for common::drivers::Blocking<PgConnection> {
    const STAYS_ON_ITS_SESSION: bool = true;

    fn try_session_pid(&mut self) -> QueryResult<i32> {
        diesel::select(backend_pid()).get_result(&mut self.0)
    }
}

#[cfg(feature = "async")]
impl SessionPid for common::drivers::Async<diesel_async::AsyncPgConnection> {
    const STAYS_ON_ITS_SESSION: bool = false;

    fn try_session_pid(&mut self) -> QueryResult<i32> {
        let query = diesel::select(backend_pid());
        self.runtime
            .block_on(diesel_async::RunQueryDsl::get_result(query, &mut self.conn))
    }
}

fn stored(db: &Db) -> Order {
    orders::table
        .find(1)
        .select(Order::as_select())
        .first(&mut db.conn())
        .unwrap()
}

/// One client writes the row, is moved to another server session, and writes it again
/// with the same statement. `kept`: whether its statements survive the move (then both
/// writes land), or not: then the write after the move fails with the typed error that
/// names the pooler setting, with nothing written (for the async client, some write within
/// 20 rounds; see below).
fn a_client_moved_to_another_session<W>(db: &Db, mut client: W, kept: bool)
where
    W: Update<Order, diesel::dsl::Eq<orders::note, &'static str>> + SessionPid,
{
    if kept {
        let first = stored(db);
        let version = client
            .update(&first, orders::note.eq("first"))
            .expect("the first write");
        let used = client.session_pid();
        let hog = hold_session(db, used);
        let second = Order { version, ..first };
        let answer = client.update(&second, orders::note.eq("second"));
        give_back(hog);
        assert_eq!(
            answer.expect("the second write, on another session"),
            version + 1
        );
        let row = stored(db);
        assert_eq!((row.note.as_str(), row.version), ("second", version + 1));
        return;
    }
    // Every answer must be a write that landed or the typed error with nothing written.
    // The blocking client's first write lands and the one after the move is refused.
    // Without the pooler's prepared statements, any statement of the async client may
    // meet a session that lacks it, not only the one after the move: rounds go on until
    // one of its writes was refused.
    for _ in 0..20 {
        let lost_first =
            landed_or_lost(db, |before| client.update(before, orders::note.eq("first")));
        let used = client.session_pid();
        let hog = hold_session(db, used);
        let lost_second = landed_or_lost(db, |before| {
            client.update(before, orders::note.eq("second"))
        });
        give_back(hog);
        if W::STAYS_ON_ITS_SESSION {
            assert!(
                !lost_first,
                "the first write, on the session it was prepared on"
            );
            assert!(lost_second, "the write after the move lost its statement");
            return;
        }
        if lost_first || lost_second {
            return;
        }
    }
    panic!("in 20 rounds, no write of the client lost its statement");
}

/// Runs `write` on the stored row and checks its answer against the row afterwards:
/// either it landed (one version up), or it is [`Error::StatementLostByPooler`], naming
/// the settings that fix it, and nothing was written. Whether it was lost.
fn landed_or_lost(db: &Db, write: impl FnOnce(&Order) -> Result<i64, Error>) -> bool {
    let before = stored(db);
    let answer = write(&before);
    let row = stored(db);
    match answer {
        Ok(version) => {
            assert_eq!((version, row.version), (before.version + 1, version));
            false
        }
        Err(error @ Error::StatementLostByPooler { .. }) => {
            let message = error.to_string();
            assert!(message.contains("max_prepared_statements"), "{message}");
            assert!(message.contains("statement_cache"), "{message}");
            assert_eq!(row, before, "nothing written");
            true
        }
        Err(other) => panic!("expected StatementLostByPooler, got {other:?}"),
    }
}

/// A blocking connection of its own through the pooler, with or without diesel's
/// statement cache.
fn blocking(db: &Db, statement_cache: bool) -> common::drivers::Blocking<PgConnection> {
    let mut conn = PgConnection::establish(&db.url).expect("a connection through the pooler");
    if !statement_cache {
        conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }
    common::drivers::Blocking(conn)
}

#[test]
fn the_statement_cache_behind_a_pooler_without_prepared_statements_is_named() {
    let Some(db) = db(Pooler::WithoutPreparedStatements) else {
        return;
    };
    a_client_moved_to_another_session(&db, blocking(&db, true), false);
}

#[test]
fn without_the_statement_cache_the_blocking_api_works_behind_any_pgbouncer() {
    for pooler in [
        Pooler::WithoutPreparedStatements,
        Pooler::WithPreparedStatements,
    ] {
        let Some(db) = db(pooler) else { return };
        a_client_moved_to_another_session(&db, blocking(&db, false), true);
    }
}

#[test]
fn the_statement_cache_works_behind_a_pooler_with_prepared_statements() {
    let Some(db) = db(Pooler::WithPreparedStatements) else {
        return;
    };
    a_client_moved_to_another_session(&db, blocking(&db, true), true);
}

#[cfg(feature = "async")]
mod on_async {
    use super::*;
    use common::paths::AsyncOf;

    fn client(db: &Db) -> common::drivers::Async<diesel_async::AsyncPgConnection> {
        let runtime = common::paths::runtime();
        common::drivers::Async {
            conn: PgConnection::connect(&db.url, &runtime),
            runtime,
        }
    }

    #[test]
    fn the_async_api_behind_a_pooler_without_prepared_statements_is_named() {
        let Some(db) = db(Pooler::WithoutPreparedStatements) else {
            return;
        };
        a_client_moved_to_another_session(&db, client(&db), false);
    }

    #[test]
    fn the_async_api_works_behind_a_pooler_with_prepared_statements() {
        let Some(db) = db(Pooler::WithPreparedStatements) else {
            return;
        };
        a_client_moved_to_another_session(&db, client(&db), true);
    }
}

/// 8 threads increment the order's quantity by read-modify-writes on the pool, while
/// another thread keeps taking sessions away in short transactions, so the writers'
/// statements keep moving between server sessions; then 4 threads take turns on one lock
/// (its statements bound their waits with transaction-local settings), each holder
/// writing under its fence. Nothing is lost, no two holders overlap, fences rise.
fn writes_and_locks_through_the_pooler_lose_nothing<P>(db: &Db, pool: &P)
where
    P: ModifyPooled<Order, (), Error> + LockWrites,
{
    let url = db.url.as_str();
    let policy = RetryPolicy::default().max_attempts(50);
    let done = AtomicUsize::new(0);
    let writers_left = AtomicUsize::new(8);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut hog = PgConnection::establish(url).unwrap();
            while writers_left.load(Ordering::SeqCst) > 0 {
                hog.batch_execute("BEGIN; SELECT pg_sleep(0.002); COMMIT")
                    .unwrap();
            }
        });
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..25 {
                    pool.modify_pooled(&1, &policy, |order: &mut Order| {
                        order.quantity += 1;
                        Ok(())
                    })
                    .expect("a read-modify-write through the pooler");
                    done.fetch_add(1, Ordering::SeqCst);
                }
                writers_left.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    let stored = || stored(db);
    assert_eq!(stored().quantity, 1 + done.load(Ordering::SeqCst) as i32);
    assert_eq!(done.load(Ordering::SeqCst), 200);

    let holders = AtomicUsize::new(0);
    let fences = std::sync::Mutex::new(Vec::new());
    let wait = RetryPolicy::default().max_attempts(1_000);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10 {
                    let guard = pool
                        .lock(
                            "pooler",
                            "round",
                            Duration::from_secs(10),
                            None,
                            Duration::from_secs(30),
                            &wait,
                        )
                        .expect("the lock, in turn");
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    fences.lock().unwrap().push(P::fence(&guard));
                    let sql = "UPDATE orders SET quantity = quantity + 1 WHERE id = 1";
                    assert_eq!(
                        pool.write_while_held(&guard, "", "", sql, false).unwrap(),
                        1
                    );
                    holders.fetch_sub(1, Ordering::SeqCst);
                    pool.release(guard).expect("an owner-checked release");
                }
            });
        }
    });
    let fences = fences.into_inner().unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences rise: {fences:?}"
    );
    assert_eq!(stored().quantity, 1 + 200 + 40);
}

#[test]
fn blocking_writes_and_locks_through_a_pooler_without_prepared_statements() {
    let Some(db) = db(Pooler::WithoutPreparedStatements) else {
        return;
    };
    writes_and_locks_through_the_pooler_lose_nothing(
        &db,
        &common::drivers::BlockingPool(db.pool.clone()),
    );
}

#[test]
fn blocking_writes_and_locks_through_a_pooler_with_prepared_statements() {
    let Some(db) = db(Pooler::WithPreparedStatements) else {
        return;
    };
    writes_and_locks_through_the_pooler_lose_nothing(
        &db,
        &common::drivers::BlockingPool(db.pool.clone()),
    );
}

#[cfg(feature = "bb8")]
#[test]
fn async_writes_and_locks_through_a_pooler_with_prepared_statements() {
    let Some(db) = db(Pooler::WithPreparedStatements) else {
        return;
    };
    let manager = common::drivers::manager::<diesel_async::AsyncPgConnection>(&db.url, "postgres");
    let pool = common::drivers::AsyncPool::build(async move {
        diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(10)
            .build(manager)
            .await
            .expect("a bb8 pool through the pooler")
    });
    writes_and_locks_through_the_pooler_lose_nothing(&db, &pool);
}
