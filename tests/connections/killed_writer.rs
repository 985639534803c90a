//! A writer process killed with SIGKILL in the middle of its work (a merge, a transition
//! with its history hook): the database rolls its open transaction back, nothing is
//! half-applied, and the others carry on at once. The killed writer runs the blocking API
//! and, in alternate rounds, the async one (diesel-async).

#![cfg(unix)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{HistoryRow, KillOnDrop, PoolByUrl};
use diesel::prelude::*;
use diesel_occ::GuardedJson;
use diesel_occ::{no_extra, record, GuardedTransition, HistoryEntry};
use diesel_occ::{Error, RetryPolicy, Status};
use serde_json::json;

/// A switch that flips back and forth: every transition can run forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
#[occ(storage = "text")]
pub enum Switch {
    #[occ(from(On))]
    Off,
    #[occ(from(Off))]
    On,
}

/// The executors the killed writers run on, round by round: both where the async API is
/// built.
const CHILD_PATHS: &[&str] = if cfg!(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
)) {
    &["blocking", "async"]
} else {
    &["blocking"]
};

/// Whether this child process runs the async API.
#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
fn child_on_async() -> bool {
    std::env::var("OCC_CHILD_PATH").as_deref() == Ok("async")
}

/// What a killed child had said: the server id of its session (none on SQLite) and the
/// last number it printed after its marker.
struct ChildSaid {
    session: Option<i64>,
    last: Option<i64>,
}

/// Starts this test binary's `test` in a child process on executor `path` with `var` set
/// to `url`; what it said comes back when it is killed.
fn start_child(
    test: &str,
    path: &str,
    var: &str,
    url: &str,
    marker: &'static str,
) -> (KillOnDrop, std::thread::JoinHandle<ChildSaid>) {
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(var, url)
            .env("OCC_CHILD_PATH", path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let number_after = |line: &str, marker: &str| {
            line.split(marker)
                .nth(1)
                .and_then(|n| n.trim().parse::<i64>().ok())
        };
        let mut said = ChildSaid {
            session: None,
            last: None,
        };
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            said.session = said.session.or(number_after(&line, SESSION));
            said.last = number_after(&line, marker).or(said.last);
        }
        said
    });
    (child, reader)
}

/// What a child prints before the server id of its session.
const SESSION: &str = "SESSION ";

for_each_backend! {
    json_profiles!();

    /// Prints the server id of the child's session, for the parent to wait on.
    fn say_session(conn: &mut Conn) {
        if let Some(sql) = common::session_id_sql(BACKEND) {
            println!("{SESSION}{}", diesel::sql_query(sql).get_result::<common::Value>(conn).unwrap().value);
        }
    }

    /// Waits until the killed child's session has ended on the server, so that nothing it
    /// had already sent lands after the parent has looked.
    fn outlive(conn: &mut Conn, said: &ChildSaid) {
        if common::session_id_sql(BACKEND).is_some() {
            let session = said.session.expect("the child said its session");
            common::wait_until_session_ends(conn, BACKEND, session);
        }
    }

    /// The child: merges `{"count": n}` for n = 1, 2, ... into profile 1 as fast as it can,
    /// printing each n once it is committed.
    #[test]
    fn merging_child() {
        let Ok(url) = std::env::var(format!("OCC_MERGING_CHILD_{BACKEND}")) else { return };
        #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
        if child_on_async() {
            return on_async::merging(&url);
        }
        let mut conn = <Conn as PoolByUrl>::pool(&url).get().unwrap();
        say_session(&mut conn);
        for n in 1.. {
            Profile::merge_json(&mut conn, &1, profiles::ext, &json!({ "count": n }), &RetryPolicy::default()).unwrap();
            println!("MERGED {n}");
        }
    }

    /// Killed at a random point of its loop (often inside a transaction), the child leaves
    /// the row either at its last reported merge or one further, whole: the count and the
    /// version move together. The parent's next merge does not wait for a lock.
    #[test]
    fn a_writer_killed_mid_merge_leaves_no_half_write() {
        let Some(db) = db() else { return };
        let row = Profile { id: 1, name: "p".into(), ext: json!({"count": 0}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(&mut db.conn()).unwrap();
        // The version before the child starts: each of its merges moves it by exactly one.
        let mut start_version = 0;
        for (round, path) in CHILD_PATHS.iter().cycle().take(4).enumerate() {
            let round = round as u64;
            let (mut child, reader) = start_child(
                &common::test_name(module_path!(), "merging_child"),
                path,
                &format!("OCC_MERGING_CHILD_{BACKEND}"),
                &db.url,
                "MERGED ",
            );
            // Let it run a while, a different while each round.
            std::thread::sleep(Duration::from_millis(300 + 170 * round));
            child.0.kill().unwrap(); // SIGKILL
            child.0.wait().unwrap();
            let said = reader.join().unwrap();
            let reported = said.last.expect("the child merged before it was killed");

            let conn = &mut db.conn();
            outlive(conn, &said);
            let stored: Profile = profiles::table.find(1).select(Profile::as_select()).first(conn).unwrap();
            let count = stored.ext["count"].as_i64().unwrap();
            assert!(count == reported || count == reported + 1, "round {round} ({path}): reported {reported}, stored {count}");
            assert_eq!(stored.version, start_version + count, "round {round}: the count and the version move together");
            // The parent goes on at once: no lock is left behind, no retry needed.
            let done = Profile::merge_json(conn, &1, profiles::ext, &json!({ "count": 0 }), &RetryPolicy::never())
                .map_err(|e: Error| e.to_string())
                .unwrap();
            start_version = done.row.version;
        }
    }

    diesel::table! {
        switches (id) {
            id -> BigInt,
            state -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, diesel_occ::Guarded)]
    #[diesel(table_name = switches)]
    pub struct Light {
        id: i64,
        #[occ(status)]
        state: Switch,
        #[occ(version)]
        version: i64,
    }

    /// The child: flips switch 1 as fast as it can, each move with its history row on the
    /// same transaction, printing the new version once it is committed.
    #[test]
    fn switching_child() {
        let Ok(url) = std::env::var(format!("OCC_SWITCHING_CHILD_{BACKEND}")) else { return };
        #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
        if child_on_async() {
            return on_async::switching(&url);
        }
        let mut conn = <Conn as PoolByUrl>::pool(&url).get().unwrap();
        say_session(&mut conn);
        loop {
            let mut light: Light = switches::table.find(1).select(Light::as_select()).first(&mut conn).unwrap();
            let to = if light.state == Switch::Off { Switch::On } else { Switch::Off };
            light
                .transition_then(&mut conn, to, no_extra(), |conn, from, row| {
                    record(conn, &HistoryEntry { entity: "switches", key: "1", from: from.name(), to: row.state.name(), actor: None })
                })
                .unwrap();
            println!("MOVED {}", light.version);
        }
    }

    /// Killed at a random point of its loop, the child leaves the switch at its last
    /// reported move or one further, with exactly one history row per move, in a chain;
    /// the parent's next move needs no retry and waits for no lock.
    #[test]
    fn a_writer_killed_mid_transition_leaves_no_half_move() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        diesel::sql_query("CREATE TABLE switches (id BIGINT PRIMARY KEY, state VARCHAR(8) NOT NULL, version BIGINT NOT NULL)")
            .execute(conn)
            .unwrap();
        diesel::insert_into(switches::table).values(&Light { id: 1, state: Switch::Off, version: 0 }).execute(conn).unwrap();
        for (round, path) in CHILD_PATHS.iter().cycle().take(4).enumerate() {
            let round = round as u64;
            let (mut child, reader) = start_child(
                &common::test_name(module_path!(), "switching_child"),
                path,
                &format!("OCC_SWITCHING_CHILD_{BACKEND}"),
                &db.url,
                "MOVED ",
            );
            std::thread::sleep(Duration::from_millis(300 + 170 * round));
            child.0.kill().unwrap(); // SIGKILL
            child.0.wait().unwrap();
            let said = reader.join().unwrap();
            let reported = said.last.expect("the child moved the switch before it was killed");
            outlive(conn, &said);

            let stored: Light = switches::table.find(1).select(Light::as_select()).first(conn).unwrap();
            assert!(
                stored.version == reported || stored.version == reported + 1,
                "round {round} ({path}): reported version {reported}, stored {}", stored.version
            );
            let moves: Vec<HistoryRow> = diesel::sql_query("SELECT entity_key, from_status, to_status, actor FROM occ_transitions WHERE entity = 'switches' ORDER BY id")
                .load(conn)
                .unwrap();
            assert_eq!(moves.len() as i64, stored.version, "round {round}: one history row per move");
            let mut state = Switch::Off.name();
            for (n, row) in moves.iter().enumerate() {
                assert_eq!(row.from_status, state, "round {round}: move {n} does not start where the last ended");
                state = &row.to_status;
            }
            assert_eq!(stored.state.name(), state, "round {round}: the row and its history agree");
            // The parent goes on at once.
            let mut light = stored;
            let to = if light.state == Switch::Off { Switch::On } else { Switch::Off };
            light
                .transition_then(conn, to, no_extra(), |conn, from, row| {
                    record(conn, &HistoryEntry { entity: "switches", key: "1", from: from.name(), to: row.state.name(), actor: Some("parent") })
                })
                .map_err(|e: Error| e.to_string())
                .unwrap();
        }
    }

    /// The children on the async path: the same loops on a diesel-async connection.
    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    mod on_async {
        use super::*;
        use common::paths::AsyncOf;

        type Async = <Conn as AsyncOf>::Async;

        /// Prints the server id of the child's session, as the blocking child does.
        fn say_session(conn: &mut Async, runtime: &tokio::runtime::Runtime) {
            if let Some(sql) = common::session_id_sql(BACKEND) {
                let id = runtime.block_on(diesel_async::RunQueryDsl::get_result::<common::Value>(diesel::sql_query(sql), conn));
                println!("{SESSION}{}", id.unwrap().value);
            }
        }

        pub fn merging(url: &str) {
            let runtime = common::paths::runtime();
            let mut conn = Conn::connect(url, &runtime);
            say_session(&mut conn, &runtime);
            let policy = RetryPolicy::default();
            for n in 1.. {
                let patch = json!({ "count": n });
                let merge = <Profile as diesel_occ::asynchronous::AsyncGuardedJson>::merge_json(
                    &mut conn, &1, profiles::ext, &patch, &policy,
                );
                runtime.block_on(merge).unwrap();
                println!("MERGED {n}");
            }
        }

        pub fn switching(url: &str) {
            let runtime = common::paths::runtime();
            let mut conn = Conn::connect(url, &runtime);
            say_session(&mut conn, &runtime);
            loop {
                let read = switches::table.find(1).select(Light::as_select());
                let mut light: Light = runtime.block_on(diesel_async::RunQueryDsl::first(read, &mut conn)).unwrap();
                let to = if light.state == Switch::Off { Switch::On } else { Switch::Off };
                let moved = diesel_occ::asynchronous::AsyncGuardedTransition::transition_then(
                    &mut light,
                    &mut conn,
                    to,
                    no_extra(),
                    async |conn: &mut Async, from: Switch, row: &Light| {
                        let entry = HistoryEntry { entity: "switches", key: "1", from: from.name(), to: row.state.name(), actor: None };
                        diesel_occ::asynchronous::record(conn, &entry).await
                    },
                );
                runtime.block_on(moved).unwrap();
                println!("MOVED {}", light.version);
            }
        }
    }
}
