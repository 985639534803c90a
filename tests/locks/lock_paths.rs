//! Locks on both executors: one test body per behaviour, run on the blocking `Locks` (r2d2)
//! and on `AsyncLocks` (a bb8 pool of diesel-async connections), on every backend, checked
//! from the database: contenders never hold a lock together, a held lock is refused and
//! named, renew and release are owner-checked, renewals move the lease by the database's
//! clock, a dropped guard frees the lock, a kept-alive lease outlives its TTL, and bad
//! names write nothing.

#![cfg(all(
    feature = "locks",
    feature = "bb8",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use common::fenced::{protected, Protected};
use common::lock_paths::{AsyncLocksOn, BlockingLocks, LockPath};
use common::paths::runtime;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::asynchronous::AsyncLocks;
use diesel_occ::{occ_locks, Error, FencedWrite, Locks, RetryPolicy};

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(10))
}

/// The lock row of `name`: holder, label, fence, holder changes, expiry.
type LockRow = (
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<chrono::NaiveDateTime>,
);

/// Each behaviour as one body, run on `$path`'s executor.
macro_rules! lock_bodies {
    () => {
        /// 8 threads x 10 rounds wait for one lock: never two inside at once, fences rise
        /// with every grant, and a read-then-write under the lock loses nothing.
        fn contenders_never_hold_the_lock_together<P: LockPath>(
            db: &common::TestDb<Conn>,
            path: &P,
        ) {
            const THREADS: usize = 8;
            const ROUNDS: usize = 10;
            let inside = AtomicBool::new(false);
            let fences = Mutex::new(Vec::new());
            db.race(THREADS, |t, conn| {
                for _ in 0..ROUNDS {
                    let guard = path
                        .lock(
                            "report",
                            Duration::from_secs(30),
                            &format!("contender {t}"),
                            Duration::from_secs(120),
                            &quick(),
                        )
                        .unwrap();
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "{}: two holders at once",
                        P::PATH
                    );
                    let fence = P::fence(&guard);
                    fences.lock().unwrap().push(fence);
                    let current: i64 = protected::table
                        .find(1)
                        .select(protected::value)
                        .first(conn)
                        .unwrap();
                    Protected::write_fenced(
                        conn,
                        &1,
                        protected::last_fence,
                        fence,
                        protected::value.eq(current + 1),
                    )
                    .unwrap();
                    inside.store(false, Ordering::SeqCst);
                    path.release(guard).unwrap();
                }
            });
            let fences = fences.into_inner().unwrap();
            let holds = (THREADS * ROUNDS) as i64;
            assert!(
                fences.windows(2).all(|w| w[0] < w[1]),
                "{}: fences rise: {fences:?}",
                P::PATH
            );
            let row: (i64, i64) = protected::table
                .find(1)
                .select((protected::value, protected::last_fence))
                .first(&mut db.conn())
                .unwrap();
            assert_eq!(row, (holds, *fences.last().unwrap()), "{}", P::PATH);
            let (holder, _, fence, changes, _) = lock_row(db, "report").unwrap();
            assert_eq!(
                (holder, common::fences_issued(fence), changes),
                (None, holds, holds),
                "{}",
                P::PATH
            );
        }

        /// A held lock is refused with its holder's label and lease end; once released,
        /// the next holder gets a larger fence.
        fn a_held_lock_is_refused_and_named<P: LockPath>(db: &common::TestDb<Conn>, path: &P) {
            let first = path
                .try_lock("named", Duration::from_secs(30), "first")
                .unwrap();
            match path.try_lock("named", Duration::from_secs(30), "second") {
                Err(Error::LockHeld { holder, until, .. }) => {
                    assert_eq!(holder.as_deref(), Some("first"), "{}", P::PATH);
                    assert!(until.is_some(), "{}", P::PATH);
                }
                other => panic!(
                    "{}: expected LockHeld, got {:?}",
                    P::PATH,
                    other.map(|g| P::fence(&g))
                ),
            }
            let first_fence = P::fence(&first);
            path.release(first).unwrap();
            let second = path
                .try_lock("named", Duration::from_secs(30), "second")
                .unwrap();
            assert!(P::fence(&second) > first_fence, "{}", P::PATH);
            let (holder, label, fence, changes, _) = lock_row(db, "named").unwrap();
            assert!(holder.is_some(), "{}", P::PATH);
            assert_eq!(
                (label.as_deref(), fence, changes),
                (Some("second"), P::fence(&second), 2),
                "{}",
                P::PATH
            );
            path.release(second).unwrap();
            assert_eq!(lock_row(db, "named").unwrap().0, None, "{}", P::PATH);
        }

        /// A holder whose lease ended and was taken over learns it on renew and release
        /// (naming the new holder), and neither frees the new holder's lock.
        fn renew_and_release_are_owner_checked<P: LockPath>(db: &common::TestDb<Conn>, path: &P) {
            let mut old = path
                .try_lock("owned", Duration::from_millis(300), "old")
                .unwrap();
            std::thread::sleep(Duration::from_millis(450));
            assert!(!P::is_held(&old), "{}: the local deadline passed", P::PATH);
            let new = path
                .try_lock("owned", Duration::from_secs(30), "new")
                .unwrap();
            match path.renew(&mut old) {
                Err(Error::LockLost { .. }) => {}
                other => panic!("{}: expected LockLost on renew, got {other:?}", P::PATH),
            }
            match path.release(old) {
                Err(Error::LockLost { why, .. }) => {
                    assert!(why.contains("new"), "{}: {why}", P::PATH)
                }
                other => panic!("{}: expected LockLost on release, got {other:?}", P::PATH),
            }
            let (holder, label, fence, _, _) = lock_row(db, "owned").unwrap();
            assert!(
                holder.is_some(),
                "{}: the new holder still holds it",
                P::PATH
            );
            assert_eq!(
                (label.as_deref(), fence),
                (Some("new"), P::fence(&new)),
                "{}",
                P::PATH
            );
            path.release(new).unwrap();
        }

        /// A renewal moves the lease end on, by the database's clock.
        fn renewals_move_the_lease_on<P: LockPath>(db: &common::TestDb<Conn>, path: &P) {
            let mut guard = path
                .try_lock("renewed", Duration::from_secs(5), "holder")
                .unwrap();
            let before = lock_row(db, "renewed").unwrap().4.unwrap();
            std::thread::sleep(Duration::from_millis(50));
            path.renew(&mut guard).unwrap();
            let after = lock_row(db, "renewed").unwrap().4.unwrap();
            assert!(after > before, "{}: {before} -> {after}", P::PATH);
            assert!(P::is_held(&guard), "{}", P::PATH);
            path.release(guard).unwrap();
        }

        /// A guard dropped without a release frees the lock (the async one from a task).
        fn a_dropped_guard_frees_the_lock<P: LockPath>(db: &common::TestDb<Conn>, path: &P) {
            let guard = path
                .try_lock("dropped", Duration::from_secs(30), "holder")
                .unwrap();
            assert!(lock_row(db, "dropped").unwrap().0.is_some());
            path.drop_guard(guard);
            let until = Instant::now() + Duration::from_secs(10);
            while lock_row(db, "dropped").unwrap().0.is_some() {
                assert!(
                    Instant::now() < until,
                    "{}: the dropped guard's lock is still held",
                    P::PATH
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            path.release(
                path.try_lock("dropped", Duration::from_secs(30), "next")
                    .unwrap(),
            )
            .unwrap();
        }

        /// A kept-alive lease of 300 ms is held for a second: never believed lost, refused
        /// to another holder in the middle, and free after.
        fn a_kept_alive_lease_outlives_its_ttl<P: LockPath>(db: &common::TestDb<Conn>, path: &P) {
            let ttl = Duration::from_millis(300);
            std::thread::scope(|s| {
                let holder = s.spawn(|| path.hold_alive("alive", ttl, Duration::from_secs(1)));
                // Well past the TTL, while the lease is kept alive.
                std::thread::sleep(Duration::from_millis(700));
                match path.try_lock("alive", ttl, "intruder") {
                    Err(Error::LockHeld { holder, .. }) => {
                        assert_eq!(holder.as_deref(), Some("alive"), "{}", P::PATH)
                    }
                    other => panic!(
                        "{}: expected LockHeld, got {:?}",
                        P::PATH,
                        other.map(|g| P::fence(&g))
                    ),
                }
                let (_, held_throughout) = holder.join().unwrap().unwrap();
                assert!(held_throughout, "{}: the lease was believed lost", P::PATH);
            });
            let (holder, _, _, changes, _) = lock_row(db, "alive").unwrap();
            assert_eq!((holder, changes), (None, 1), "{}", P::PATH);
        }

        /// Hostile input: a 10 kB name, an empty one, a zero lease; refused with what is
        /// wrong, and no lock row written.
        fn bad_input_is_refused_and_writes_nothing<P: LockPath>(
            db: &common::TestDb<Conn>,
            path: &P,
        ) {
            let long = "x".repeat(10_000);
            assert!(
                matches!(
                    path.try_lock(&long, Duration::from_secs(1), "l"),
                    Err(Error::InvalidName { .. })
                ),
                "{}",
                P::PATH
            );
            assert!(
                matches!(
                    path.try_lock("", Duration::from_secs(1), "l"),
                    Err(Error::InvalidName { .. })
                ),
                "{}",
                P::PATH
            );
            assert!(
                matches!(
                    path.try_lock("zero", Duration::ZERO, "l"),
                    Err(Error::InvalidSetting { .. })
                ),
                "{}",
                P::PATH
            );
            let rows: i64 = occ_locks::table.count().get_result(&mut db.conn()).unwrap();
            assert_eq!(rows, 0, "{}", P::PATH);
        }
    };
}

/// A protected write's own error, or diesel-occ's.
#[derive(Debug, PartialEq)]
enum JobError {
    Refused,
    Occ(String),
}

impl From<Error> for JobError {
    fn from(e: Error) -> Self {
        JobError::Occ(e.to_string())
    }
}

/// Runs each body on both executors, as `<body>_blocking` and `<body>_async` tests.
macro_rules! on_both_paths {
    ($($body:ident),*) => {$(
        mod $body {
            use super::*;

            #[test]
            fn blocking() {
                let Some(db) = setup() else { return };
                $body(&db, &BlockingLocks(Locks::new(db.pool.clone())));
            }

            #[test]
            fn on_async() {
                let Some(db) = setup() else { return };
                let runtime = runtime();
                let pool = bb8_pool(&db.url, 10, &runtime);
                let path = AsyncLocksOn { locks: AsyncLocks::new(pool), runtime: runtime.handle().clone() };
                $body(&db, &path);
            }
        }
    )*};
}

for_each_backend! {
    async_pools!();

    fn setup() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        db.conn().batch_execute(common::fenced::CREATE).unwrap();
        Some(db)
    }

    fn lock_row(db: &common::TestDb<Conn>, name: &str) -> Option<LockRow> {
        occ_locks::table
            .filter(occ_locks::lock_name.eq(name))
            .select((occ_locks::holder, occ_locks::label, occ_locks::fence, occ_locks::holder_changes, occ_locks::expires_at))
            .first::<LockRow>(&mut db.conn())
            .optional()
            .unwrap()
    }

    lock_bodies!();

    type R2d2Pool = r2d2::Pool<diesel_occ::CheckedManager<Conn>>;
    type Bb8Pool = diesel_async::pooled_connection::bb8::Pool<Async_>;

    /// A lock holder's writes to a protected table of `db`, on one executor.
    trait HolderWrites: LockPath {
        /// Sets the protected row's value, committed only while `guard` holds the lock
        /// (`write_while_held`); `fail` makes the write return its own error after it ran.
        fn write_while_held(&self, db: &common::TestDb<Conn>, guard: &Self::Guard, value: i64, fail: bool) -> Result<(), JobError>;
        /// Sets the value of protected row `id`, carrying `fence` (`write_fenced`).
        fn write_fenced(&self, db: &common::TestDb<Conn>, id: i64, fence: i64, value: i64) -> Result<(), Error>;
    }

    impl HolderWrites for BlockingLocks<R2d2Pool> {
        fn write_while_held(&self, db: &common::TestDb<Conn>, guard: &Self::Guard, value: i64, fail: bool) -> Result<(), JobError> {
            let conn = &mut db.conn();
            guard.write_while_held(conn, |conn| {
                diesel::update(protected::table.find(1)).set(protected::value.eq(value)).execute(conn).map_err(Error::from)?;
                if fail { Err(JobError::Refused) } else { Ok(()) }
            })
        }
        fn write_fenced(&self, db: &common::TestDb<Conn>, id: i64, fence: i64, value: i64) -> Result<(), Error> {
            let conn = &mut db.conn();
            Protected::write_fenced(conn, &id, protected::last_fence, fence, protected::value.eq(value))
        }
    }

    impl HolderWrites for AsyncLocksOn<Bb8Pool> {
        fn write_while_held(&self, db: &common::TestDb<Conn>, guard: &Self::Guard, value: i64, fail: bool) -> Result<(), JobError> {
            self.runtime.block_on(async {
                let mut conn = <Async_ as diesel_async::AsyncConnection>::establish(&db.url).await.unwrap();
                guard
                    .write_while_held(&mut conn, async move |conn: &mut Async_| {
                        let update = diesel::update(protected::table.find(1)).set(protected::value.eq(value));
                        diesel_async::RunQueryDsl::execute(update, conn).await.map_err(Error::from)?;
                        if fail { Err(JobError::Refused) } else { Ok(()) }
                    })
                    .await
            })
        }
        fn write_fenced(&self, db: &common::TestDb<Conn>, id: i64, fence: i64, value: i64) -> Result<(), Error> {
            use diesel_occ::asynchronous::AsyncFencedWrite;
            self.runtime.block_on(async {
                let mut conn = <Async_ as diesel_async::AsyncConnection>::establish(&db.url).await.unwrap();
                <Protected as AsyncFencedWrite>::write_fenced(&mut conn, &id, protected::last_fence, fence, protected::value.eq(value)).await
            })
        }
    }

    /// A holder's writes land while it holds the lock; once another holder took the lock
    /// over, its write while held is `LockLost` (and its belief ends), its fenced write
    /// `StaleFence`, and neither lands. Checked from the database.
    fn a_replaced_holders_writes_are_refused<P: HolderWrites>(db: &common::TestDb<Conn>, path: &P) {
        let stored = || protected::table.find(1).select(Protected::as_select()).first(&mut db.conn()).unwrap();
        let ttl = Duration::from_secs(30);
        let first = path.try_lock("job", ttl, "first").unwrap();
        let f1 = P::fence(&first);
        path.write_while_held(db, &first, 10, false).unwrap();
        assert_eq!(stored().value, 10, "{}", P::PATH);
        let refused = path.write_while_held(db, &first, 99, true);
        assert_eq!(refused, Err(JobError::Refused), "{}: the write's own error, unchanged", P::PATH);
        assert_eq!(stored().value, 10, "{}: rolled back", P::PATH);
        path.write_fenced(db, 1, f1, 11).unwrap();
        assert_eq!((stored().value, stored().last_fence), (11, f1), "{}", P::PATH);

        // The first holder's lease ends (a pause, as the database sees it); a second takes
        // the lock over with a newer fence and writes with it.
        diesel::sql_query("UPDATE occ_locks SET expires_at = '2000-01-01 00:00:00.000' WHERE lock_name = 'job'")
            .execute(&mut db.conn())
            .unwrap();
        let second = path.try_lock("job", ttl, "second").unwrap();
        let f2 = P::fence(&second);
        assert!(f2 > f1, "{}: {f2} after {f1}", P::PATH);
        path.write_fenced(db, 1, f2, 20).unwrap();

        let lost = path.write_while_held(db, &first, 12, false);
        assert!(
            matches!(&lost, Err(JobError::Occ(why)) if why.contains("no longer held") && why.contains("second holds it now")),
            "{}: LockLost naming the new holder: {lost:?}",
            P::PATH
        );
        assert!(!P::is_held(&first), "{}: the check ended the first holder's belief", P::PATH);
        let stale = path.write_fenced(db, 1, f1, 13);
        assert!(
            matches!(stale, Err(Error::StaleFence { presented, current }) if presented == f1 && current == f2),
            "{}: {stale:?}",
            P::PATH
        );
        assert_eq!((stored().value, stored().last_fence), (20, f2), "{}: neither stale write landed", P::PATH);
        let missing = path.write_fenced(db, 7, f2, 1);
        assert!(matches!(missing, Err(Error::NotFound { .. })), "{}: {missing:?}", P::PATH);

        path.write_while_held(db, &second, 21, false).unwrap();
        assert_eq!(stored().value, 21, "{}", P::PATH);
        path.drop_guard(first);
        path.release(second).unwrap();
    }

    on_both_paths!(
        a_replaced_holders_writes_are_refused,
        contenders_never_hold_the_lock_together,
        a_held_lock_is_refused_and_named,
        renew_and_release_are_owner_checked,
        renewals_move_the_lease_on,
        a_dropped_guard_frees_the_lock,
        a_kept_alive_lease_outlives_its_ttl,
        bad_input_is_refused_and_writes_nothing
    );
}
