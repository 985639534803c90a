//! Pessimistic helpers: work on a row locked for the transaction; a held row is refused
//! at once with `NoWait`. Each body runs on both drivers (the blocking API and the async
//! one), on every backend.

use crate::common;

use std::sync::{Barrier, Mutex};

use common::drivers::{race, Blocking, Save};
use common::models::Counter;
use common::schema::counters;
use diesel::prelude::*;
use diesel_occ::Error;
use diesel_occ::{LockWait, Pessimistic};

/// What work on a locked counter writes, unguarded: its `Some` fields.
#[derive(Debug, Default, AsChangeset)]
#[diesel(table_name = counters)]
struct Set {
    value: Option<i64>,
    revision: Option<i16>,
}

/// Pessimistic work on a counter, on either driver: `look` sees the locked row and says
/// what the work writes on the lock's transaction, unguarded (if anything), and what it
/// answers.
trait LockedCounter {
    /// `with_row_locked` on the counter `name`.
    fn row_locked<R: Send>(
        &mut self,
        name: &str,
        wait: LockWait,
        look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
    ) -> Result<R, Error>;
    /// `with_copy_locked` on `copy`.
    fn copy_locked<R: Send>(
        &mut self,
        copy: &Counter,
        wait: LockWait,
        look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
    ) -> Result<R, Error>;
    /// The server's id of this connection's session (a server backend's).
    fn session(&mut self) -> i64;
}

/// The SQL that gives a server session's id, as a `BIGINT`.
fn session_id_sql(backend: &str) -> &'static str {
    match backend {
        "postgres" => "CAST(pg_backend_pid() AS BIGINT)",
        _ => "CAST(CONNECTION_ID() AS SIGNED)",
    }
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    impl LockedCounter for Blocking<diesel_occ::Pooled<Conn>> {
        fn row_locked<R: Send>(
            &mut self,
            name: &str,
            wait: LockWait,
            look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
        ) -> Result<R, Error> {
            <Counter as Pessimistic>::with_row_locked(&mut self.0, &name.to_string(), wait, |conn, row| {
                let (set, answer) = look(&row);
                if let Some(set) = set {
                    diesel::update(counters::table.find(&row.name)).set(set).execute(conn)?;
                }
                Ok(answer)
            })
        }
        fn copy_locked<R: Send>(
            &mut self,
            copy: &Counter,
            wait: LockWait,
            look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
        ) -> Result<R, Error> {
            Pessimistic::with_copy_locked(copy, &mut self.0, wait, |conn, row| {
                let (set, answer) = look(&row);
                if let Some(set) = set {
                    diesel::update(counters::table.find(&row.name)).set(set).execute(conn)?;
                }
                Ok(answer)
            })
        }
        fn session(&mut self) -> i64 {
            let sql = diesel::dsl::sql::<diesel::sql_types::BigInt>(session_id_sql(BACKEND));
            diesel::select(sql).get_result(&mut self.0).unwrap()
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl LockedCounter for common::drivers::Async<Async_> {
        fn row_locked<R: Send>(
            &mut self,
            name: &str,
            wait: LockWait,
            look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
        ) -> Result<R, Error> {
            use diesel_occ::asynchronous::AsyncPessimistic;
            let key = name.to_string();
            let work = <Counter as AsyncPessimistic>::with_row_locked(
                &mut self.conn,
                &key,
                wait,
                async move |conn: &mut Async_, row: Counter| {
                    let (set, answer) = look(&row);
                    if let Some(set) = set {
                        let write = diesel::update(counters::table.find(&row.name)).set(set);
                        diesel_async::RunQueryDsl::execute(write, conn).await?;
                    }
                    Ok::<_, Error>(answer)
                },
            );
            self.runtime.block_on(work)
        }
        fn copy_locked<R: Send>(
            &mut self,
            copy: &Counter,
            wait: LockWait,
            look: impl FnOnce(&Counter) -> (Option<Set>, R) + Send,
        ) -> Result<R, Error> {
            use diesel_occ::asynchronous::AsyncPessimistic;
            let work = AsyncPessimistic::with_copy_locked(
                copy,
                &mut self.conn,
                wait,
                async move |conn: &mut Async_, row: Counter| {
                    let (set, answer) = look(&row);
                    if let Some(set) = set {
                        let write = diesel::update(counters::table.find(&row.name)).set(set);
                        diesel_async::RunQueryDsl::execute(write, conn).await?;
                    }
                    Ok::<_, Error>(answer)
                },
            );
            self.runtime.block_on(work)
        }
        fn session(&mut self) -> i64 {
            let sql = diesel::dsl::sql::<diesel::sql_types::BigInt>(session_id_sql(BACKEND));
            let id = diesel_async::RunQueryDsl::get_result(diesel::select(sql), &mut self.conn);
            self.runtime.block_on(id).unwrap()
        }
    }

    fn insert(db: &Db) {
        diesel::insert_into(counters::table)
            .values(&Counter { name: "hits".into(), value: 0, rev: 0 })
            .execute(&mut db.conn())
            .unwrap();
    }

    fn load(conn: &mut diesel_occ::Pooled<Conn>) -> Counter {
        counters::table.find("hits").select(Counter::as_select()).first(conn).unwrap()
    }

    /// 8 threads x 25 unguarded read-then-write increments, each on the locked row.
    fn work_on_a_locked_row_loses_no_update<W: LockedCounter>(db: &Db, w: impl Fn() -> W + Sync) {
        insert(db);

        race(8, w, |_, w| {
            for _ in 0..25 {
                w.row_locked("hits", LockWait::Wait, |row| {
                    (Some(Set { value: Some(row.value + 1), ..Set::default() }), ())
                })
                .unwrap();
            }
        });

        let value: i64 = counters::table.find("hits").select(counters::value).first(&mut db.conn()).unwrap();
        assert_eq!(value, 200);
    }

    /// While one transaction holds the row, `NoWait` is refused at once (PostgreSQL,
    /// MySQL); a missing row is `NotFound`. The holder runs on the same driver.
    fn no_wait_is_refused_while_another_holds_the_row<W: LockedCounter>(db: &Db, w: impl Fn() -> W + Sync) {
        insert(db);
        let missing = w().row_locked("none", LockWait::NoWait, |_| (None, ()));
        assert!(matches!(missing, Err(Error::NotFound { .. })), "{missing:?}");
        if BACKEND == "sqlite" {
            return; // SQLite's exclusive write transaction waits for the busy timeout.
        }
        let (held, checked) = (Barrier::new(2), Barrier::new(2));
        let refused = Mutex::new(None);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut holder = w();
                holder
                    .row_locked("hits", LockWait::Wait, |_| {
                        held.wait();
                        checked.wait();
                        (None, ())
                    })
                    .unwrap();
            });
            held.wait();
            let mut w = w();
            *refused.lock().unwrap() = Some(w.row_locked("hits", LockWait::NoWait, |_| (None, ())));
            checked.wait();
        });
        let refused = refused.into_inner().unwrap().unwrap();
        assert!(matches!(refused, Err(Error::LockHeld { .. })), "{refused:?}");
    }

    /// A loaded copy is locked only while the row still holds its token: a current copy
    /// runs the work; a copy the row moved on from is a conflict with the current row,
    /// and its work never runs.
    fn a_copy_is_locked_only_while_current<W: LockedCounter + Save<Counter>>(db: &Db, w: impl Fn() -> W) {
        insert(db);
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut copy = load(conn);
        let seen = w.copy_locked(&copy, LockWait::Wait, |row| (None, row.clone())).unwrap();
        assert_eq!(seen, copy);

        let stale = copy.clone();
        copy.value = 5;
        w.save(&mut copy).unwrap();
        let mut ran = false;
        let refused = w.copy_locked(&stale, LockWait::NoWait, |_| {
            ran = true;
            (None, ())
        });
        match refused {
            Err(Error::Conflict(conflict)) => assert_eq!(conflict.current::<Counter>(), Some(&copy)),
            other => panic!("{other:?}"),
        }
        assert!(!ran);
        let gone = Counter { name: "none".into(), value: 0, rev: 0 };
        assert!(matches!(w.copy_locked(&gone, LockWait::Wait, |_| (None, ())), Err(Error::NotFound { .. })));
    }

    /// 8 threads confirm the same loaded copy at once: the first to lock it applies its
    /// unguarded write; every other thread finds the row moved on (the lock waits, then
    /// sees the latest row) and gets a conflict. The row took exactly one write.
    fn racing_confirmations_of_one_copy_apply_once<W: LockedCounter>(db: &Db, w: impl Fn() -> W + Sync) {
        insert(db);
        let copy = load(&mut db.conn());
        let results: Vec<Result<(), Error>> = race(8, w, |_, w| {
            w.copy_locked(&copy, LockWait::Wait, |row| {
                (Some(Set { value: Some(row.value + 1), revision: Some(row.rev + 1) }), ())
            })
        });
        let applied = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(applied, 1, "{results:?}");
        for result in &results {
            assert!(matches!(result, Ok(()) | Err(Error::Conflict(_))), "{result:?}");
        }
        let stored = load(&mut db.conn());
        assert_eq!((stored.value, stored.rev), (1, 1));
    }

    /// A session killed before the lock's transaction began wrote nothing: the answer is a
    /// database error (retryable or not), never `Ambiguous` ("may have been applied"), and
    /// the work never ran. SQLite has no session to lose.
    fn a_session_lost_before_the_lock_began_is_not_ambiguous<W: LockedCounter>(db: &Db, w: impl Fn() -> W) {
        if BACKEND == "sqlite" {
            return;
        }
        insert(db);
        let mut holder = w();
        let id = holder.session();
        let kill = match BACKEND {
            "postgres" => format!("SELECT pg_terminate_backend({id})"),
            _ => format!("KILL {id}"),
        };
        let admin = &mut db.conn();
        diesel::connection::SimpleConnection::batch_execute(admin, &kill).unwrap();
        // The server ends the session on its own time: wait until it is gone.
        let alive = match BACKEND {
            "postgres" => format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {id}"),
            _ => format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}"),
        };
        let sessions = || {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!("({alive})")))
                .get_result::<i64>(&mut db.conn())
                .unwrap()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while sessions() > 0 {
            assert!(std::time::Instant::now() < deadline, "session {id} outlived its kill");
            std::thread::yield_now();
        }
        let ran = std::sync::atomic::AtomicBool::new(false);
        let result = holder.row_locked("hits", LockWait::Wait, |_| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            (Some(Set { value: Some(99), revision: None }), ())
        });
        assert!(matches!(result, Err(Error::Database(_) | Error::Retryable { .. })), "{result:?}");
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "the work ran on a lost session");
        assert_eq!(load(&mut db.conn()).value, 0, "nothing was written");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        work_on_a_locked_row_loses_no_update,
        no_wait_is_refused_while_another_holds_the_row,
        a_copy_is_locked_only_while_current,
        racing_confirmations_of_one_copy_apply_once,
        a_session_lost_before_the_lock_began_is_not_ambiguous,
    );
}
