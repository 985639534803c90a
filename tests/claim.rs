//! Task claiming: each task goes to exactly one worker, none is left behind, an abandoned
//! claim is taken again, and only the holder can finish its claim.

#![cfg(feature = "locks")]

mod common;

use std::collections::BTreeSet;
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{ClaimRequest, GuardedClaim};
use diesel_occ::{Error, Guarded, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
pub enum TaskState {
    #[occ(from(Running))]
    Open,
    #[occ(from(Open, Running))]
    Running,
    #[occ(from(Running))]
    Done,
}

diesel::table! {
    tasks (id) {
        id -> BigInt,
        state -> Text,
        owner -> Nullable<Text>,
        claimed_at -> Nullable<Timestamp>,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = tasks)]
pub struct Task {
    id: i64,
    #[occ(status)]
    state: TaskState,
    owner: Option<String>,
    claimed_at: Option<NaiveDateTime>,
    #[occ(version)]
    version: i64,
}

fn request(owner: &str, limit: usize) -> ClaimRequest<'_, TaskState> {
    ClaimRequest {
        from: TaskState::Open,
        to: TaskState::Running,
        owner,
        limit,
        reclaim_after: Some(Duration::from_secs(60)),
    }
}

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    fn setup(count: i64) -> Option<common::TestDb<Conn>> {
        let db = db()?;
        let conn = &mut db.conn();
        let stamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        conn.batch_execute(&format!(
            "CREATE TABLE tasks (id BIGINT PRIMARY KEY, state TEXT NOT NULL, owner TEXT, \
             claimed_at {stamp}, version BIGINT NOT NULL)"
        ))
        .unwrap();
        let rows: Vec<Task> = (1..=count)
            .map(|id| Task { id, state: TaskState::Open, owner: None, claimed_at: None, version: 0 })
            .collect();
        for chunk in rows.chunks(500) {
            diesel::insert_into(tasks::table).values(chunk).execute(conn).unwrap();
        }
        Some(db)
    }

    fn all(conn: &mut Pooled) -> Vec<Task> {
        tasks::table.order(tasks::id).select(Task::as_select()).load(conn).unwrap()
    }

    /// 4 workers claim 1,000 tasks 25 at a time, each finishing what it claimed.
    #[test]
    fn four_workers_claim_every_task_exactly_once() {
        const TASKS: i64 = 1000;
        let Some(db) = setup(TASKS) else { return };
        let start = Barrier::new(4);
        let claimed = Mutex::new(Vec::new());
        let pool = &db.pool;

        std::thread::scope(|s| {
            for worker in 0..4 {
                let (start, claimed) = (&start, &claimed);
                s.spawn(move || {
                    let me = format!("worker-{worker}");
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    loop {
                        let batch = Task::claim(&mut conn, tasks::owner, tasks::claimed_at, &request(&me, 25)).unwrap();
                        if batch.is_empty() {
                            break;
                        }
                        for task in &batch {
                            assert_eq!((task.state, task.owner.as_deref()), (TaskState::Running, Some(me.as_str())));
                            assert!(task.claimed_at.is_some());
                            Task::finish_claim(&mut conn, &task.id, tasks::owner, &me, TaskState::Running, TaskState::Done, Some(&me)).unwrap();
                        }
                        claimed.lock().unwrap().extend(batch.iter().map(|t| (t.id, me.clone())));
                    }
                });
            }
        });

        let claimed = claimed.into_inner().unwrap();
        let ids: BTreeSet<i64> = claimed.iter().map(|(id, _)| *id).collect();
        assert_eq!(claimed.len(), TASKS as usize, "a task was claimed twice");
        assert_eq!(ids, (1..=TASKS).collect(), "a task was left behind");
        for task in all(&mut db.conn()) {
            let by = claimed.iter().find(|(id, _)| *id == task.id).map(|(_, w)| w.clone());
            assert_eq!((task.state, task.owner.clone(), task.version), (TaskState::Done, by, 2), "{task:?}");
        }
        let per_worker: Vec<usize> = (0..4)
            .map(|w| claimed.iter().filter(|(_, by)| *by == format!("worker-{w}")).count())
            .collect();
        println!("{BACKEND}: {TASKS} tasks claimed once each by 4 workers: {per_worker:?}");
    }

    /// A claim whose worker vanished is taken again once it is older than
    /// `reclaim_after` by the database's clock; the first worker can no longer finish it.
    #[test]
    fn an_abandoned_claim_is_reclaimed_and_the_old_owner_is_locked_out() {
        let Some(db) = setup(3) else { return };
        let conn = &mut db.conn();
        let first = Task::claim(conn, tasks::owner, tasks::claimed_at, &request("crashed", 10)).unwrap();
        assert_eq!(first.len(), 3);
        // Fresh claims are not taken over.
        assert!(Task::claim(conn, tasks::owner, tasks::claimed_at, &request("rescuer", 10)).unwrap().is_empty());

        let long_ago = chrono::DateTime::UNIX_EPOCH.naive_utc();
        diesel::update(tasks::table.filter(tasks::id.eq(2)))
            .set(tasks::claimed_at.eq(Some(long_ago)))
            .execute(conn)
            .unwrap();
        let rescued = Task::claim(conn, tasks::owner, tasks::claimed_at, &request("rescuer", 10)).unwrap();

        assert_eq!(rescued.iter().map(|t| (t.id, t.owner.clone().unwrap())).collect::<Vec<_>>(), [(2, "rescuer".to_string())]);
        let lost = Task::finish_claim(conn, &2, tasks::owner, "crashed", TaskState::Running, TaskState::Done, None).unwrap_err();
        assert!(matches!(lost, Error::LockLost { .. }), "{lost}");
        Task::finish_claim(conn, &2, tasks::owner, "rescuer", TaskState::Running, TaskState::Open, None).unwrap();
        let missing = Task::finish_claim(conn, &9, tasks::owner, "rescuer", TaskState::Running, TaskState::Done, None).unwrap_err();
        assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
        let states: Vec<(i64, TaskState, Option<String>)> = all(conn).into_iter().map(|t| (t.id, t.state, t.owner)).collect();
        assert_eq!(states, [
            (1, TaskState::Running, Some("crashed".into())),
            (2, TaskState::Open, None),
            (3, TaskState::Running, Some("crashed".into())),
        ]);
    }

    #[test]
    fn a_claim_without_work_or_with_a_bad_owner_writes_nothing() {
        let Some(db) = setup(0) else { return };
        let conn = &mut db.conn();
        assert!(Task::claim(conn, tasks::owner, tasks::claimed_at, &request("w", 10)).unwrap().is_empty());
        let err = Task::claim(conn, tasks::owner, tasks::claimed_at, &request(&"w".repeat(10_000), 10)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { what: "owner", .. }), "{err}");
    }

    /// A row whose version cannot advance is not handed out: the claim fails with the
    /// overflow and rolls back, so no row of it is claimed (before, the version wrapped
    /// past its type: an error on PostgreSQL and MySQL, a float on SQLite).
    #[test]
    fn a_row_at_the_last_version_is_not_claimed_and_nothing_else_is_either() {
        let Some(db) = setup(3) else { return };
        let conn = &mut db.conn();
        diesel::update(tasks::table.filter(tasks::id.eq(2))).set(tasks::version.eq(i64::MAX)).execute(conn).unwrap();

        let err = Task::claim(conn, tasks::owner, tasks::claimed_at, &request("w", 10)).unwrap_err();

        assert!(matches!(&err, Error::VersionOverflow { key, .. } if key == "2"), "{err}");
        let rows: Vec<(i64, TaskState, Option<String>, i64)> =
            all(conn).into_iter().map(|t| (t.id, t.state, t.owner, t.version)).collect();
        assert_eq!(rows, [(1, TaskState::Open, None, 0), (2, TaskState::Open, None, i64::MAX), (3, TaskState::Open, None, 0)]);
    }
}
