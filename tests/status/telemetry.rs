//! What the library reports of task claims (the `tracing` and `metrics` features), on
//! both drivers and every backend: a counted claim reports the rows it took and, as a
//! warning, the rows it parked; a heartbeat reports the claim it extended; a transition
//! refused by the row's state ends its call with a report saying so.

#![cfg(all(
    feature = "tracing",
    feature = "metrics",
    feature = "locks",
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::time::Duration;

use common::claim_paths::{add_jobs, request, ClaimWorker, JobState};
use common::telemetry::{metric, record, reported, Reported};
use diesel::connection::SimpleConnection;
use diesel_occ::AttemptLimit;

const MINUTE: Duration = Duration::from_secs(60);

/// The events of `name` about claims of `owner`.
fn of_owner(name: &str, owner: &str) -> Vec<Reported> {
    reported(|e| e.name == name && e.fields.get("occ.owner").map(String::as_str) == Some(owner))
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// Three open jobs, one of them out of attempts: the counted claim takes two and parks
    /// one, and the heartbeat extends one; then a claim finished twice, whose second
    /// finish finds the claim gone.
    fn claims_heartbeats_and_parked_rows_are_reported<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        record();
        add_jobs(&mut *db.conn(), 1..=3);
        db.conn().batch_execute("UPDATE jobs SET attempts = 5 WHERE id = 3").unwrap();
        let owner = common::unique_name();
        let parked_before = metric(r#"diesel_occ_parked_rows_total{db_collection_name="jobs"}"#);
        let claimed_before = metric(r#"diesel_occ_claimed_rows_total{db_collection_name="jobs"}"#);
        let mut w = worker();

        let limit = AttemptLimit { max: 5, park_in: JobState::Parked };
        let claimed = w.claim_counted(&request(&owner, 10, MINUTE), &limit).unwrap();
        assert_eq!((claimed.rows.len(), claimed.parked.len()), (2, 1), "{}", W::PATH);
        w.extend_claim(claimed.rows[0].id, &owner, JobState::Running).unwrap();

        let [taken] = &of_owner("diesel_occ.claimed", &owner)[..] else { panic!("{}: one claim report", W::PATH) };
        assert_eq!((taken.field("occ.rows"), taken.field("db.collection.name")), ("2", "jobs"));
        assert_eq!(taken.span_field("db.operation"), Some("claim_counted"));
        let [parked] = &of_owner("diesel_occ.parked", &owner)[..] else { panic!("{}: one parked report", W::PATH) };
        assert_eq!((parked.field("occ.rows"), parked.level), ("1", tracing::Level::WARN));
        let [beat] = &of_owner("diesel_occ.claim_heartbeat", &owner)[..] else { panic!("{}: one heartbeat", W::PATH) };
        assert_eq!(beat.span_field("occ.key"), Some(claimed.rows[0].id.to_string().as_str()));
        assert_eq!(beat.span_field("db.operation"), Some("extend_claim"));
        // Tests beside this one claim `jobs` too: at least this test's.
        assert!(metric(r#"diesel_occ_parked_rows_total{db_collection_name="jobs"}"#) >= parked_before + 1.0);
        assert!(metric(r#"diesel_occ_claimed_rows_total{db_collection_name="jobs"}"#) >= claimed_before + 2.0);

        let id = claimed.rows[1].id;
        w.finish_claim(id, &owner, JobState::Running, JobState::Done, None).unwrap();
        let again = w.finish_claim(id, &owner, JobState::Running, JobState::Done, None);
        let Err(error) = again else { panic!("{}: a finished claim finished again", W::PATH) };
        let ended = reported(|e| {
            e.name == "diesel_occ.call_failed"
                && e.span_field("db.operation") == Some("finish_claim")
                && e.span_field("occ.key") == Some(id.to_string().as_str())
                && e.field("error").contains(&owner)
        });
        let [ended] = &ended[..] else { panic!("{}: one report of the refused finish: {ended:?}", W::PATH) };
        assert_eq!((ended.field("occ.outcome"), ended.level), (error.kind(), tracing::Level::DEBUG));
        // The event names its call itself: an operator's subscriber shows no spans.
        assert_eq!((ended.field("db.operation"), ended.field("db.collection.name")), ("finish_claim", "jobs"));
        assert_eq!(ended.field("occ.key"), id.to_string());
    }

    claim_tests_on_both_paths!(claims_heartbeats_and_parked_rows_are_reported);
}
