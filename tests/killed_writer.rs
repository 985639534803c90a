//! A writer process killed with SIGKILL in the middle of its work: the database rolls its
//! open transaction back, nothing is half-applied, and the others carry on at once.

#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{KillOnDrop, PoolByUrl};
use diesel::prelude::*;
use diesel_occ::json::GuardedJson;
use diesel_occ::{Error, RetryPolicy};
use serde_json::json;

for_each_backend! {
    json_profiles!();

    /// The child: merges `{"count": n}` for n = 1, 2, ... into profile 1 as fast as it can,
    /// printing each n once it is committed.
    #[test]
    fn merging_child() {
        let Ok(url) = std::env::var(format!("OCC_MERGING_CHILD_{BACKEND}")) else { return };
        let mut conn = <Conn as PoolByUrl>::pool(&url).get().unwrap();
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
        for round in 0..3 {
            let mut child = KillOnDrop(
                Command::new(std::env::current_exe().unwrap())
                    .args([&format!("{BACKEND}::merging_child"), "--exact", "--nocapture", "--test-threads=1"])
                    .env(format!("OCC_MERGING_CHILD_{BACKEND}"), &db.url)
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let stdout = child.0.stdout.take().unwrap();
            let reader = std::thread::spawn(move || {
                BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .filter_map(|line| line.split("MERGED ").nth(1).and_then(|n| n.trim().parse::<i64>().ok()))
                    .last()
            });
            // Let it run a while, a different while each round.
            std::thread::sleep(Duration::from_millis(300 + 170 * round));
            child.0.kill().unwrap(); // SIGKILL
            child.0.wait().unwrap();
            let reported = reader.join().unwrap().expect("the child merged before it was killed");

            let conn = &mut db.conn();
            let stored: Profile = profiles::table.find(1).select(Profile::as_select()).first(conn).unwrap();
            let count = stored.ext["count"].as_i64().unwrap();
            assert!(count == reported || count == reported + 1, "round {round}: reported {reported}, stored {count}");
            assert_eq!(stored.version, start_version + count, "round {round}: the count and the version move together");
            // The parent goes on at once: no lock is left behind, no retry needed.
            let done = Profile::merge_json(conn, &1, profiles::ext, &json!({ "count": 0 }), &RetryPolicy::never())
                .map_err(|e: Error| e.to_string())
                .unwrap();
            start_version = done.row.version;
        }
    }
}
