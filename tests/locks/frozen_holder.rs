//! A lease holder frozen with SIGSTOP past its lease: another process takes the lock over,
//! and when the first is resumed with SIGCONT its fenced write is refused and it learns
//! that it lost the lease. Real processes, real signals, every backend.

#![cfg(all(feature = "locks", unix))]

use crate::common;

use common::drivers::{KeepAlive, WriteFencedPooled};
use common::fenced::{protected, Protected};

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::{KillOnDrop, PoolByUrl};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::FencedWrite;
use diesel_occ::Locks;

const TTL: Duration = Duration::from_millis(1000);

/// The change the fenced writes send.
type ValueIs = diesel::dsl::Eq<protected::value, i64>;

/// Sends `signal` (`STOP`, `CONT`) to process `pid` with the system's `kill`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The next line of the child's output that starts with `prefix` (the test harness may
/// print its own text first).
fn expect(lines: &Receiver<String>, prefix: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no {prefix} line"));
        if let Some(rest) = line.split(prefix).nth(1) {
            return rest.trim().to_string();
        }
    }
}

for_each_backend! {
    /// The child, on either driver: takes the lock with a kept-alive lease, says so, and
    /// on each line of input checks its lease and tries a fenced write, printing both
    /// outcomes.
    fn hold_and_answer<W>(w: &W)
    where
        W: KeepAlive + WriteFencedPooled<Protected, protected::last_fence, ValueIs>,
    {
        let lease = w.keep_alive(w.try_lock("frozen", "main", TTL, Some("child")).unwrap());
        println!("HOLDING {}", W::lease_fence(&lease));
        for _ in std::io::stdin().lock().lines() {
            let check = W::lease_check(&lease).err().map_or("ok".to_string(), |e| format!("{e:?}"));
            let write = w.write_fenced(&1, protected::last_fence, W::lease_fence(&lease), protected::value.eq(666))
                .err()
                .map_or("ok".to_string(), |e| format!("{e:?}"));
            println!("CHECK {check}");
            println!("WRITE {write}");
        }
    }

    /// The child on the blocking API: the lease kept alive by a thread, on an r2d2 pool.
    #[test]
    fn frozen_holder_child() {
        let Ok(url) = std::env::var(format!("OCC_FROZEN_CHILD_{BACKEND}")) else { return };
        hold_and_answer(&common::drivers::BlockingPool(<Conn as PoolByUrl>::pool(&url)));
    }

    /// The child on the async API (feature `async` and a diesel-async pool): the lease
    /// kept alive by a tokio task, on a bb8 pool.
    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn frozen_async_holder_child() {
        let Ok(url) = std::env::var(format!("OCC_FROZEN_CHILD_{BACKEND}")) else { return };
        hold_and_answer(&common::drivers::bb8_pool_on::<<Conn as common::paths::AsyncOf>::Async>(&url, BACKEND, 2));
    }

    #[test]
    fn a_holder_frozen_past_its_lease_is_fenced_off_when_it_wakes() {
        frozen_past_its_lease("frozen_holder_child");
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn an_async_holder_frozen_past_its_lease_is_fenced_off_when_it_wakes() {
        frozen_past_its_lease("frozen_async_holder_child");
    }

    /// The parent: starts `child`, freezes it past its lease, takes the lock over and
    /// writes, then wakes it: its check says the lease is lost and its fenced write is
    /// refused, checked from the row.
    fn frozen_past_its_lease(child: &str) {
        let Some(db) = db() else { return };
        diesel_occ::migrations::run(&mut *db.conn()).unwrap();
        db.conn()
            .batch_execute(common::fenced::CREATE)
            .unwrap();
        let mut child = KillOnDrop(
            Command::new(std::env::current_exe().unwrap())
                .args([&common::test_name(module_path!(), child), "--exact", "--nocapture", "--test-threads=1"])
                .env(format!("OCC_FROZEN_CHILD_{BACKEND}"), &db.url)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let (lines_in, lines) = std::sync::mpsc::channel();
        let stdout = child.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_in.send(line);
            }
        });
        let child_fence: i64 = expect(&lines, "HOLDING ").parse().unwrap();
        let locks = Locks::new(db.pool.clone());
        assert!(locks.try_lock("frozen", "main", TTL, Some("parent")).is_err(), "the child holds it");

        signal(child.0.id(), "STOP");
        std::thread::sleep(TTL + Duration::from_millis(500));
        let successor = locks.try_lock("frozen", "main", Duration::from_secs(30), Some("parent")).unwrap();
        assert!(successor.fence() > child_fence);
        Protected::write_fenced(&mut db.conn(), &1, protected::last_fence, successor.fence(), protected::value.eq(7)).unwrap();

        signal(child.0.id(), "CONT");
        writeln!(child.0.stdin.as_mut().unwrap(), "go").unwrap();
        let check = expect(&lines, "CHECK ");
        let write = expect(&lines, "WRITE ");
        assert!(check.starts_with("LockLost"), "{check}");
        assert!(write.starts_with("StaleFence"), "{write}");

        let row: (i64, i64) = protected::table.find(1).select((protected::value, protected::last_fence)).first(&mut db.conn()).unwrap();
        assert_eq!(row, (7, successor.fence()), "the frozen holder's write was refused");
        successor.release().unwrap();
    }
}
