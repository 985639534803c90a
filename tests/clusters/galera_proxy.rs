//! HAProxy in front of the Galera test bed (`scripts/galera-proxy.sh`): every connection
//! goes to one node, and to the next when that one is down. On MySQL a write whose new
//! version only the database knows notes it in the session (`LAST_INSERT_ID`) and reads
//! it back with a second statement; the proxy must never let another session answer
//! that read. Here the proxy closes the connection between the two statements, as it
//! does when the node behind it is marked down: the write has landed, the read-back
//! cannot tell, and the answer must be `Error::Ambiguous`, never a version read elsewhere.
//!
//! The proxy's URL comes from `OCC_GALERA_PROXY_URL`; without it the tests are skipped,
//! unless `OCC_REQUIRE_CLUSTER` is set. The soak through the proxy, with the node in use
//! killed, runs in `scripts/test.sh`.

#![cfg(feature = "mysql")]

use crate::common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use diesel::MysqlConnection;
use diesel_occ::Error;
use serde_json::json;

type JsonSql = diesel::sql_types::Json;
crate::json_profiles!();

/// A database of the test's own, reached through the proxy, with one profile at version 1.
struct ThroughProxy {
    url: String,
    database: String,
    admin: MysqlConnection,
}

impl Drop for ThroughProxy {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP DATABASE {}", self.database));
    }
}

/// A cut closes every connection to the node in use: one test at a time.
static PROXY: Mutex<()> = Mutex::new(());

fn through_proxy() -> Option<ThroughProxy> {
    let base = match std::env::var("OCC_GALERA_PROXY_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var_os("OCC_REQUIRE_CLUSTER").is_some() => {
            panic!("OCC_GALERA_PROXY_URL is not set, but OCC_REQUIRE_CLUSTER is")
        }
        _ => {
            eprintln!("skipped: OCC_GALERA_PROXY_URL is not set (scripts/galera-proxy.sh)");
            return None;
        }
    };
    let database = common::unique_name();
    // Straight to node 1, not through the proxy: a cut would end it, and the database
    // would outlive the test.
    let node_1 = std::env::var("GALERA_URLS")
        .ok()
        .and_then(|urls| urls.split(',').next().map(str::to_string))
        .unwrap_or_else(|| base.clone());
    let mut admin = MysqlConnection::establish(&node_1).expect("node 1 answers");
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .unwrap();
    let url = common::with_database(&base, &database);
    MysqlConnection::establish(&url)
        .unwrap()
        .batch_execute(
            "CREATE TABLE profiles (id BIGINT PRIMARY KEY, name TEXT NOT NULL, ext JSON NOT NULL, \
             version BIGINT NOT NULL);
             INSERT INTO profiles VALUES (1, 'ada', '{}', 1)",
        )
        .unwrap();
    Some(ThroughProxy {
        url,
        database,
        admin,
    })
}

/// Closes the client connections of the node in use, through the proxy's admin socket,
/// right after the statement that notes a version in the session: before its read-back.
struct CutBeforeReadBack {
    cuts: Arc<AtomicUsize>,
}

impl Instrumentation for CutBeforeReadBack {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::FinishQuery {
            query, error: None, ..
        } = event
        {
            let sql = query.to_string();
            if sql.starts_with("UPDATE") && sql.contains("LAST_INSERT_ID(") {
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/galera-proxy.sh");
                let status = Command::new("bash").args([script, "cut"]).status();
                assert!(
                    status.is_ok_and(|s| s.success()),
                    "galera-proxy.sh cut failed"
                );
                self.cuts.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

fn stored(url: &str) -> (serde_json::Value, i64) {
    let (ext, version): (String, i64) = profiles::table
        .find(1)
        .select((
            diesel::dsl::sql::<diesel::sql_types::Text>("CAST(ext AS CHAR)"),
            profiles::version,
        ))
        .first(&mut MysqlConnection::establish(url).unwrap())
        .unwrap();
    (serde_json::from_str(&ext).unwrap(), version)
}

/// What must hold after the merge's connection was cut before its read-back: the merge
/// landed (version 2, the key written), its answer says it may have (`Ambiguous`), and the
/// connection answers nothing more.
fn check(
    db: &ThroughProxy,
    cuts: &AtomicUsize,
    answer: Result<i64, Error>,
    next: Result<i64, Error>,
) {
    assert_eq!(
        cuts.load(Ordering::SeqCst),
        1,
        "cut once: {answer:?}, then {next:?}"
    );
    assert!(matches!(answer, Err(Error::Ambiguous { .. })), "{answer:?}");
    assert_eq!(
        stored(&db.url),
        (json!({"vip": true}), 2),
        "the merge landed"
    );
    assert!(next.is_err(), "the cut connection answered: {next:?}");
}

#[test]
fn a_version_read_back_cut_by_the_proxy_is_ambiguous() {
    use diesel_occ::GuardedJsonMerge;
    let _one_at_a_time = PROXY.lock().unwrap_or_else(|e| e.into_inner());
    let Some(db) = through_proxy() else { return };
    let cuts = Arc::new(AtomicUsize::new(0));
    let mut conn = MysqlConnection::establish(&db.url).unwrap();
    conn.set_instrumentation(CutBeforeReadBack { cuts: cuts.clone() });
    let answer = Profile::merge_json_in_place(&mut conn, &1, profiles::ext, &json!({"vip": true}));
    let next = Profile::merge_json_in_place(&mut conn, &1, profiles::ext, &json!({"b": 1}));
    check(&db, &cuts, answer, next);
}

#[cfg(feature = "async-mysql")]
#[test]
fn an_async_version_read_back_cut_by_the_proxy_is_ambiguous() {
    use diesel_async::AsyncConnection;
    use diesel_occ::asynchronous::AsyncGuardedJson;
    let _one_at_a_time = PROXY.lock().unwrap_or_else(|e| e.into_inner());
    let Some(db) = through_proxy() else { return };
    let cuts = Arc::new(AtomicUsize::new(0));
    let runtime = common::paths::runtime();
    let (answer, next) = runtime.block_on(async {
        let mut conn = diesel_async::AsyncMysqlConnection::establish(&db.url)
            .await
            .unwrap();
        conn.set_instrumentation(CutBeforeReadBack { cuts: cuts.clone() });
        let answer =
            Profile::merge_json_in_place(&mut conn, &1, profiles::ext, &json!({"vip": true})).await;
        let next =
            Profile::merge_json_in_place(&mut conn, &1, profiles::ext, &json!({"b": 1})).await;
        (answer, next)
    });
    check(&db, &cuts, answer, next);
}
