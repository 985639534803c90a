//! Writes that advance a token they never read: bulk updates, key-only transitions,
//! one-statement JSON merges and task claims, on timestamp guards (the caller's clock and
//! the database's), on every backend. Each must move every row it writes past the token
//! the row held, so that a copy read before it conflicts, even when the clock has not
//! moved since that token was written. Each body runs on both drivers (the blocking API
//! and the async one).

#![cfg(all(feature = "chrono", feature = "locks"))]

use crate::common;

use std::collections::BTreeSet;

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use common::drivers::{race, BulkUpdate, MergeJsonInPlace, Save, TransitionKey, Update};
use common::models::FrozenDocument;
use common::schema::documents;
use common::FrozenClock;
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::no_extra;
use diesel_occ::{ClaimOrder, ClaimRequest, GuardedClaim};
use diesel_occ::{Error, Guarded, RetryPolicy, Status};
use serde_json::json;

/// The filter of a bulk update of every document.
type AllDocuments = dsl::Gt<documents::id, i64>;
/// The changes of a document's hit count.
type Hits = dsl::Eq<documents::hits, i64>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
pub enum Stage {
    #[occ(from(Running))]
    Open,
    #[occ(from(Open, Running))]
    Running,
    #[occ(from(Running))]
    Done,
}

fn frozen_at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T10:00:00.250000Z")
        .unwrap()
        .to_utc()
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    diesel::table! {
        use diesel::sql_types::*;
        use super::JsonSql;

        jobs (id) {
            id -> BigInt,
            stage -> Text,
            owner -> Nullable<Text>,
            claimed_at -> Nullable<Timestamp>,
            ext -> JsonSql,
            changed_at -> Timestamp,
        }
    }

    /// Stamped by the database's clock: every write's token comes from the server.
    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = jobs)]
    pub struct Job {
        id: i64,
        #[occ(status)]
        stage: Stage,
        owner: Option<String>,
        claimed_at: Option<NaiveDateTime>,
        #[occ(json)]
        ext: serde_json::Value,
        #[occ(last_modified(clock = database))]
        changed_at: NaiveDateTime,
    }

    /// The filter of a bulk update of every job.
    type AllJobs = dsl::Gt<jobs::id, i64>;
    /// The changes of a job's owner.
    type Owner = dsl::Eq<jobs::owner, &'static str>;
    /// A transition with no extra assignments.
    type NoExtra = diesel_occ::__private::NoChanges<jobs::table>;

    /// The claim calls of these tests, on the `jobs` table, on either driver.
    trait Claims {
        fn claim(&mut self, request: &ClaimRequest<'_, Stage>) -> Result<Vec<Job>, Error>;
        fn finish_claim(&mut self, id: &i64, owner: &str, held: Stage, to: Stage, next_owner: Option<&str>) -> Result<(), Error>;
    }

    impl Claims for common::drivers::Blocking<Pooled> {
        fn claim(&mut self, request: &ClaimRequest<'_, Stage>) -> Result<Vec<Job>, Error> {
            <Job as GuardedClaim>::claim(&mut self.0, jobs::owner, jobs::claimed_at, request)
        }
        fn finish_claim(&mut self, id: &i64, owner: &str, held: Stage, to: Stage, next_owner: Option<&str>) -> Result<(), Error> {
            <Job as GuardedClaim>::finish_claim(&mut self.0, id, jobs::owner, owner, held, to, next_owner)
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type AsyncConn = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl Claims for common::drivers::Async<AsyncConn> {
        fn claim(&mut self, request: &ClaimRequest<'_, Stage>) -> Result<Vec<Job>, Error> {
            use diesel_occ::asynchronous::AsyncGuardedClaim;
            self.runtime.block_on(<Job as AsyncGuardedClaim>::claim(&mut self.conn, jobs::owner, jobs::claimed_at, request))
        }
        fn finish_claim(&mut self, id: &i64, owner: &str, held: Stage, to: Stage, next_owner: Option<&str>) -> Result<(), Error> {
            use diesel_occ::asynchronous::AsyncGuardedClaim;
            self.runtime.block_on(<Job as AsyncGuardedClaim>::finish_claim(&mut self.conn, id, jobs::owner, owner, held, to, next_owner))
        }
    }

    /// Creates the `jobs` table with `count` open jobs, all stamped `at` (a time in the
    /// future of the server's clock when `at` is later than now, so that only the step
    /// past the row's own token can move it on).
    fn add_jobs(db: &Db, count: i64, at: NaiveDateTime) {
        let conn = &mut db.conn();
        let (json, stamp) = match BACKEND {
            "postgres" => ("JSONB", "TIMESTAMP"),
            "mysql" => ("JSON", "DATETIME(6)"),
            _ => ("TEXT", "TIMESTAMP"),
        };
        conn.batch_execute(&format!(
            "CREATE TABLE jobs (id BIGINT PRIMARY KEY, stage TEXT NOT NULL, owner TEXT, \
             claimed_at {stamp}, ext {json} NOT NULL, changed_at {stamp} NOT NULL)"
        ))
        .unwrap();
        let rows: Vec<Job> = (1..=count)
            .map(|id| Job {
                id,
                stage: Stage::Open,
                owner: None,
                claimed_at: None,
                ext: json!({}),
                changed_at: at,
            })
            .collect();
        diesel::insert_into(jobs::table).values(&rows).execute(conn).unwrap();
    }

    fn all_jobs(conn: &mut Pooled) -> Vec<Job> {
        jobs::table.order(jobs::id).select(Job::as_select()).load(conn).unwrap()
    }

    /// A day ahead of every clock: a write can only move it on by stepping past it.
    fn tomorrow() -> NaiveDateTime {
        (Utc::now() + TimeDelta::days(1)).naive_utc()
    }

    /// With the caller's clock standing still at the rows' own timestamp (and one row
    /// ahead of it), a bulk update still moves every row on, and every copy read before
    /// it conflicts. (On SQLite the async call reads the clock on the connection's thread,
    /// which shares the test thread's frozen clock.)
    fn bulk_update_moves_every_timestamp_on_when_the_clock_stands_still<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<FrozenDocument, AllDocuments, Hits> + Save<FrozenDocument>,
    {
        let conn = &mut db.conn();
        let now = frozen_at();
        FrozenClock::freeze(now);
        let w = &mut w();
        let stamps = [now, now, now + TimeDelta::hours(1)].map(|t| t.naive_utc());
        for (id, at) in (1..).zip(stamps) {
            let row = FrozenDocument { id, body: "draft".into(), hits: 0, last_modified: at };
            diesel::insert_into(documents::table).values(&row).execute(conn).unwrap();
        }
        let before: Vec<FrozenDocument> =
            documents::table.order(documents::id).select(FrozenDocument::as_select()).load(conn).unwrap();

        let report = w.bulk_update(documents::id.gt(0), documents::hits.eq(7)).unwrap();

        assert_eq!((report.updated, report.at_maximum), (3, 0));
        let after: Vec<FrozenDocument> =
            documents::table.order(documents::id).select(FrozenDocument::as_select()).load(conn).unwrap();
        for (old, new) in before.iter().zip(&after) {
            assert_eq!(new.hits, 7);
            assert!(new.last_modified > old.last_modified, "{} > {}", new.last_modified, old.last_modified);
            let mut stale = old.clone();
            stale.body = "stale".into();
            match w.save(&mut stale) {
                Err(Error::Conflict(conflict)) => {
                    assert_eq!(conflict.current::<FrozenDocument>(), Some(new));
                }
                other => panic!("a copy read before the bulk update must conflict: {other:?}"),
            }
        }
    }

    /// On the database's clock a bulk update stamps each row with the server's now, or
    /// one tick past its own when that is later.
    fn bulk_update_on_the_database_clock_moves_every_row_on<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<Job, AllJobs, Owner> + Update<Job, Owner>,
    {
        add_jobs(db, 0, tomorrow());
        let conn = &mut db.conn();
        let w = &mut w();
        let ahead = tomorrow();
        let past = (Utc::now() - TimeDelta::days(1)).naive_utc();
        for (id, at) in [(1, past), (2, ahead)] {
            let row = Job { id, stage: Stage::Open, owner: None, claimed_at: None, ext: json!({}), changed_at: at };
            diesel::insert_into(jobs::table).values(&row).execute(conn).unwrap();
        }
        let before = all_jobs(conn);

        let report = w.bulk_update(jobs::id.gt(0), jobs::owner.eq("ops")).unwrap();

        assert_eq!((report.updated, report.at_maximum), (2, 0));
        let after = all_jobs(conn);
        assert!(after[0].changed_at > past && after[0].changed_at < ahead, "the server's now: {}", after[0].changed_at);
        assert!(after[1].changed_at > ahead, "past its own token: {} > {ahead}", after[1].changed_at);
        for (old, new) in before.iter().zip(&after) {
            assert_eq!(new.owner.as_deref(), Some("ops"));
            let result = w.update(old, jobs::owner.eq("stale"));
            assert!(matches!(result, Err(Error::Conflict(_))), "{result:?}");
        }
    }

    /// The key-only transition learns the token the server wrote; a copy read before it
    /// conflicts; a move the state does not allow names the current state.
    fn key_only_transition_on_a_timestamp_returns_the_stored_token<W>(db: &Db, w: impl Fn() -> W)
    where
        W: TransitionKey<Job, NoExtra> + Update<Job, Owner>,
    {
        add_jobs(db, 1, tomorrow());
        let conn = &mut db.conn();
        let w = &mut w();
        let before = all_jobs(conn).remove(0);
        let policy = RetryPolicy::default();

        let running = w.transition_by_key(&1, Stage::Running, no_extra(), &policy).unwrap();
        let stored = all_jobs(conn).remove(0);
        assert_eq!((stored.stage, stored.changed_at), (Stage::Running, running));
        assert!(running > before.changed_at);

        let done = w.transition_by_key(&1, Stage::Done, no_extra(), &policy).unwrap();
        assert!(done > running, "{done} > {running}");
        match w.transition_by_key(&1, Stage::Running, no_extra(), &policy) {
            Err(Error::InvalidTransition(refused)) => assert_eq!(refused.from, "done"),
            other => panic!("Done cannot move back: {other:?}"),
        }
        let missing = w.transition_by_key(&9, Stage::Running, no_extra(), &policy);
        assert!(matches!(missing, Err(Error::NotFound { .. })), "{missing:?}");
        let stale = w.update(&before, jobs::owner.eq("late"));
        assert!(matches!(stale, Err(Error::Conflict(_))), "{stale:?}");
        assert_eq!(all_jobs(conn).remove(0).changed_at, done, "nothing else was written");
    }

    /// Two threads merge 20 keys each into one row at once: every key is kept, and every
    /// merge hands back a token of its own, each later than the row's first.
    fn concurrent_merges_in_place_keep_every_key_and_each_get_a_new_token<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: MergeJsonInPlace<Job, jobs::ext>,
    {
        add_jobs(db, 1, tomorrow());
        let first = all_jobs(&mut db.conn()).remove(0).changed_at;

        let tokens: Vec<NaiveDateTime> = race(2, w, |writer, w| {
            (0..20)
                .map(|i| {
                    let patch = json!({ format!("w{writer}-{i}"): i });
                    w.merge_json_in_place(&1, jobs::ext, &patch).unwrap()
                })
                .collect::<Vec<_>>()
        })
        .concat();

        let row = all_jobs(&mut db.conn()).remove(0);
        let keys = row.ext.as_object().unwrap();
        assert_eq!(keys.len(), 40, "{keys:?}");
        let distinct: BTreeSet<_> = tokens.iter().collect();
        assert_eq!(distinct.len(), 40, "every merge moved the token on: {tokens:?}");
        assert!(tokens.iter().all(|t| *t > first));
        assert_eq!(Some(&row.changed_at), distinct.last().copied(), "the row holds the last token");
    }

    /// Two workers claim 40 jobs 5 at a time: each job goes to one of them, every claimed
    /// row's token moves on, and only the holder can finish its claim.
    fn claims_on_a_timestamp_guard_take_each_row_once<W: Claims>(db: &Db, w: impl Fn() -> W + Sync) {
        let ahead = tomorrow();
        add_jobs(db, 40, ahead);

        let claimed: Vec<(i64, String)> = race(2, &w, |worker, w| {
            let me = format!("worker-{worker}");
            let request = ClaimRequest { from: Stage::Open, to: Stage::Running, owner: &me, limit: 5, reclaim_after: None, order: ClaimOrder::Any };
            let mut claimed = Vec::new();
            loop {
                let batch = w.claim(&request).unwrap();
                if batch.is_empty() {
                    break;
                }
                claimed.extend(batch.into_iter().map(|job| (job.id, me.clone())));
            }
            claimed
        })
        .concat();
        let ids: BTreeSet<i64> = claimed.iter().map(|(id, _)| *id).collect();
        assert_eq!((claimed.len(), ids.len()), (40, 40), "each job claimed once");

        let conn = &mut db.conn();
        let rows = all_jobs(conn);
        for (row, (id, owner)) in rows.iter().zip({
            let mut by_id = claimed.clone();
            by_id.sort();
            by_id
        }) {
            assert_eq!((row.id, row.stage, row.owner.as_deref()), (id, Stage::Running, Some(owner.as_str())));
            assert!(row.changed_at > ahead, "past its own token: {} > {ahead}", row.changed_at);
        }
        let w = &mut w();
        let (id, owner) = &claimed[0];
        let intruder = w.finish_claim(id, "intruder", Stage::Running, Stage::Done, None);
        assert!(matches!(intruder, Err(Error::LockLost { .. })), "{intruder:?}");
        w.finish_claim(id, owner, Stage::Running, Stage::Done, None).unwrap();
        let done = all_jobs(conn).into_iter().find(|row| row.id == *id).unwrap();
        assert_eq!((done.stage, done.owner), (Stage::Done, None));
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        bulk_update_moves_every_timestamp_on_when_the_clock_stands_still,
        bulk_update_on_the_database_clock_moves_every_row_on,
        key_only_transition_on_a_timestamp_returns_the_stored_token,
        concurrent_merges_in_place_keep_every_key_and_each_get_a_new_token,
        claims_on_a_timestamp_guard_take_each_row_once,
    );
}
