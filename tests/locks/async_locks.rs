//! What only the async locks do, on every backend, checked from the lock table: waiters on
//! a current-thread runtime take a lock in turns (no wait blocks the one thread), lock
//! futures dropped at random points leave no lock held, and leader election as tokio
//! tasks: one leader, its job cancelled and gone before the lock is freed, a lead lost to
//! a taken row, the next leader with a larger fence.

#![cfg(all(
    feature = "locks",
    feature = "bb8",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::paths::runtime;
use diesel::prelude::*;
use diesel_occ::asynchronous::{AsyncCandidate, AsyncLocks};
use diesel_occ::{occ_locks, ElectionTiming, Error, Held, LeaderEvent, Leadership, RetryPolicy};

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(10))
}

fn timing() -> ElectionTiming {
    ElectionTiming {
        lease: Duration::from_millis(900),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(150),
    }
}

/// The lock row's holder and fence, as the database has them.
type Holding = (Option<String>, i64);

/// Per leader's job: its candidate, the lock row as its future was dropped, its fence.
type Dropped = Arc<Mutex<Vec<(String, Option<Holding>, i64)>>>;

for_each_backend! {
    async_pools!();

    type TestPool = diesel::r2d2::Pool<diesel_occ::CheckedManager<Conn>>;

    fn holding_in(pool: &TestPool, name: &str) -> Option<Holding> {
        occ_locks::table
            .filter(occ_locks::lock_name.eq(name))
            .select((occ_locks::holder, occ_locks::fence))
            .first::<Holding>(&mut pool.get().unwrap())
            .optional()
            .unwrap()
    }

    fn holding(db: &common::TestDb<Conn>, name: &str) -> Option<Holding> {
        holding_in(&db.pool, name)
    }

    /// 4 waiters x 5 rounds as tasks of one current-thread runtime: the one thread serves
    /// them all (a wait that blocked it would stall the holder's release and time out),
    /// never two inside at once, and the database counted every grant.
    #[test]
    fn waiters_on_a_current_thread_runtime_take_the_lock_in_turns() {
        const WAITERS: usize = 4;
        const ROUNDS: usize = 5;
        let Some(db) = db() else { return };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let pool = runtime.block_on(async {
            diesel_async::pooled_connection::bb8::Pool::builder().max_size(WAITERS as u32).build(manager(&db.url)).await.unwrap()
        });
        let locks = AsyncLocks::new(pool);
        let inside = Arc::new(AtomicBool::new(false));
        let fences = runtime.block_on(async {
            let tasks: Vec<_> = (0..WAITERS)
                .map(|w| {
                    let (locks, inside) = (locks.clone(), Arc::clone(&inside));
                    tokio::spawn(async move {
                        let mut fences = Vec::new();
                        for _ in 0..ROUNDS {
                            let guard = locks
                                .lock("turns", "main", Duration::from_secs(30), Some(&format!("waiter {w}")), Duration::from_secs(60), &quick())
                                .await
                                .unwrap();
                            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                            fences.push(guard.fence());
                            // Hold it across a pause on the timer, so the others really wait.
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            inside.store(false, Ordering::SeqCst);
                            guard.release().await.unwrap();
                        }
                        fences
                    })
                })
                .collect();
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.unwrap());
            }
            all
        });
        let mut sorted = fences.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), WAITERS * ROUNDS, "every grant has a fence of its own");
        let (holder, fence) = holding(&db, "turns").unwrap();
        assert_eq!((holder, common::fences_issued(fence)), (None, (WAITERS * ROUNDS) as i64));
    }

    /// 1,000 `try_lock`, `lock` and `with_lock` futures, each dropped after 0-3 ms (often
    /// in the middle of its statements): afterwards no lock is left held (grants whose
    /// caller left are released by their own task), and the lock is free to take at once.
    #[test]
    fn lock_futures_dropped_at_random_points_leave_no_lock_held() {
        let Some(db) = db() else { return };
        let runtime = runtime();
        // Every connection made up front: PostgreSQL's connections each have a task of
        // their own, counted below.
        let pool = runtime.block_on(async {
            diesel_async::pooled_connection::bb8::Pool::builder().max_size(8).min_idle(Some(8)).build(manager(&db.url)).await.unwrap()
        });
        let locks = AsyncLocks::new(pool);
        let mut finished = 0;
        // The pool's own tasks; every task beyond these is a lock's.
        let baseline = runtime.metrics().num_alive_tasks();
        runtime.block_on(async {
            for i in 0..1_000u64 {
                let cut = Duration::from_micros((i * 7_919) % 3_000);
                let ttl = Duration::from_secs(60);
                let done = match i % 3 {
                    0 => tokio::time::timeout(cut, locks.try_lock("cancelled", "main", ttl, Some("try"))).await.map(drop),
                    1 => tokio::time::timeout(cut, locks.lock("cancelled", "main", ttl, Some("wait"), Duration::from_secs(5), &quick())).await.map(drop),
                    _ => tokio::time::timeout(
                        cut,
                        locks.with_lock("cancelled", "main", ttl, Some("work"), |held: Held| async move {
                            tokio::time::sleep(Duration::from_micros(500)).await;
                            held.check()
                        }),
                    )
                    .await
                    .map(drop::<Result<(), Error>>),
                };
                finished += usize::from(done.is_ok());
            }
        });
        // Acquisitions whose callers left, and releases of the guards nobody received, run
        // on as tasks of their own: wait for every one of them to end, then look.
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while runtime.metrics().num_alive_tasks() > baseline {
            assert!(std::time::Instant::now() < until, "the lock's tasks did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (holder, _) = holding(&db, "cancelled").unwrap();
        assert_eq!(holder, None, "a lock is left held after every task ended");
        assert!(finished < 1_000, "some futures must have been cut short");
        let (_, fence) = holding(&db, "cancelled").unwrap();
        let locks = AsyncLocks::new(bb8_pool(&db.url, 2, &runtime));
        let guard = runtime.block_on(locks.try_lock("cancelled", "main", Duration::from_secs(5), Some("after"))).unwrap();
        assert!(guard.fence() > fence);
        runtime.block_on(guard.release()).unwrap();
    }

    /// Three async candidates: exactly one leads, and the database's lock row agrees. The
    /// leader's job is cancelled and gone while the lock is still its own (checked from the
    /// row at the moment the job's future is dropped), then it steps down, and another is
    /// elected with a larger fence. A lead lost to a row taken by hand ends the job too.
    #[test]
    fn async_candidates_elect_one_leader_and_cancel_its_job_before_the_lock_is_freed() {
        let Some(db) = db() else { return };
        let runtime = runtime();
        let locks = AsyncLocks::new(bb8_pool(&db.url, 8, &runtime));
        // Per candidate: the lock row as the job's future was dropped, and its own fence.
        let dropped: Dropped = Arc::default();

        /// Records the lock row when the job's future is dropped.
        struct OnDrop {
            label: String,
            fence: i64,
            pool: TestPool,
            dropped: Dropped,
        }
        impl Drop for OnDrop {
            fn drop(&mut self) {
                let row = holding_in(&self.pool, "leader");
                self.dropped.lock().unwrap().push((self.label.clone(), row, self.fence));
            }
        }

        let mut candidates: Vec<AsyncCandidate> = runtime.block_on(async {
            (0..3)
                .map(|c| {
                    let (pool, dropped, label) = (db.pool.clone(), Arc::clone(&dropped), format!("c{c}"));
                    AsyncCandidate::start_with_job(locks.clone(), "leader", "main", &label.clone(), timing(), move |held: Held| {
                        let on_drop = OnDrop { label: label.clone(), fence: held.fence(), pool: pool.clone(), dropped: Arc::clone(&dropped) };
                        async move {
                            let _on_drop = on_drop;
                            // Works for ever; only the end of the term stops it.
                            loop {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    })
                    .unwrap()
                })
                .collect()
        });

        let leading = |candidates: &[AsyncCandidate]| -> Vec<usize> {
            (0..candidates.len()).filter(|&c| candidates[c].is_leader()).collect()
        };
        let wait_for_leader = |candidates: &[AsyncCandidate]| -> usize {
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), async {
                    loop {
                        let now = leading(candidates);
                        if now.len() == 1 {
                            return now[0];
                        }
                        assert!(now.len() < 2, "two leaders: {now:?}");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .expect("a leader within 10 s")
            })
        };

        let first = wait_for_leader(&candidates);
        let first_fence = candidates[first].fence();
        assert_eq!(*candidates[first].leadership().borrow(), Leadership::Leading { fence: first_fence });
        assert_eq!(holding(&db, "leader").unwrap().1, first_fence);
        assert_eq!(leading(&candidates), vec![first], "one leader");

        // Stepping down: job cancelled while the lock is still this term's, then freed.
        let leader = candidates.remove(first);
        let events = runtime.block_on(leader.stop());
        assert_eq!(events.last(), Some(&LeaderEvent::SteppedDown), "{events:?}");
        {
            let dropped = dropped.lock().unwrap();
            let (_, row, fence) = dropped.last().expect("the job was dropped");
            assert_eq!(*fence, first_fence);
            let (holder, row_fence) = row.clone().unwrap();
            assert!(holder.is_some(), "the lock was freed before the job was gone");
            assert_eq!(row_fence, first_fence);
        }

        let second = wait_for_leader(&candidates);
        let second_fence = candidates[second].fence();
        assert!(second_fence > first_fence);

        // A lead lost to a row taken by hand (an operator, a clock gone wrong).
        let jobs_before = dropped.lock().unwrap().len();
        diesel::update(occ_locks::table.filter(occ_locks::lock_name.eq("leader")))
            .set((occ_locks::holder.eq("thief"), occ_locks::fence.eq(second_fence + 100)))
            .execute(&mut db.conn())
            .unwrap();
        let lost = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match candidates[second].next_event().await {
                        Some(LeaderEvent::Lost { reason }) => return reason,
                        Some(_) => {}
                        None => panic!("the runner ended"),
                    }
                }
            })
            .await
            .expect("the lead is lost within 10 s")
        });
        assert!(lost.contains("fence"), "{lost}");
        assert!(!candidates[second].is_leader());
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), async {
                while dropped.lock().unwrap().len() == jobs_before {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the lost leader's job is cancelled");
        });
        for candidate in candidates {
            runtime.block_on(candidate.stop());
        }
    }
}
