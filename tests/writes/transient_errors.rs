//! Transient refusals from real databases become `Error::Retryable`, never a conflict.

use crate::common;

use std::sync::Barrier;

use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, GuardedWrite, RetryReason};

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled, id: i64) {
        diesel::insert_into(orders::table).values(&Order::new(id, "new")).execute(conn).unwrap();
    }

    fn load(conn: &mut Pooled, id: i64) -> Order {
        orders::table.find(id).select(Order::as_select()).first(conn).unwrap()
    }

    /// Two transactions write orders 1 and 2 in opposite order. The servers detect the
    /// deadlock and roll one back; SQLite's second writer waits out its busy timeout. Either
    /// way exactly one transaction is refused, retryably, and the other commits.
    #[test]
    fn opposite_write_order_refuses_one_transaction_retryably() {
        let Some(db) = db() else { return };
        insert(&mut db.conn(), 1);
        insert(&mut db.conn(), 2);
        let both_hold_their_first_row = Barrier::new(2);
        let pool = &db.pool;

        let run = |first: i64, second: i64| {
            let mut conn = pool.get().unwrap();
            conn.transaction(|conn| {
                let row = load(conn, first);
                let first_write = row.guarded_update(conn, orders::note.eq(format!("from {first}")));
                both_hold_their_first_row.wait();
                first_write?;
                let row = load(conn, second);
                row.guarded_update(conn, orders::note.eq(format!("from {first}")))?;
                Ok::<_, Error>(first)
            })
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| run(1, 2));
            let b = s.spawn(|| run(2, 1));
            (a.join().unwrap(), b.join().unwrap())
        });

        let expected = if BACKEND == "sqlite" { RetryReason::Busy } else { RetryReason::Deadlock };
        let (winner, refused) = match (a, b) {
            (Ok(w), Err(e)) | (Err(e), Ok(w)) => (w, e),
            other => panic!("expected exactly one refused transaction: {other:?}"),
        };
        assert!(matches!(refused, Error::Retryable { reason, .. } if reason == expected), "{refused:?}");
        let notes = [load(&mut db.conn(), 1).note, load(&mut db.conn(), 2).note];
        let winner_note = format!("from {winner}");
        assert_eq!(notes, [winner_note.clone(), winner_note], "only the winner's writes remain");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_serialization_failure_is_retryable() {
    let Some(db) = common::postgres() else { return };
    let (conn, other) = (&mut db.conn(), &mut db.conn());
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "new"))
        .execute(conn)
        .unwrap();
    let load = |conn: &mut diesel::PgConnection| -> Order {
        orders::table
            .find(1)
            .select(Order::as_select())
            .first(conn)
            .unwrap()
    };

    let outcome = conn.build_transaction().repeatable_read().run(|conn| {
        let mine = load(conn);
        load(other)
            .guarded_update(other, orders::note.eq("theirs"))
            .unwrap();
        mine.guarded_update(conn, orders::note.eq("mine"))
    });

    let err = outcome.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Retryable {
                reason: RetryReason::SerializationFailure,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(load(conn).note, "theirs");
}
