//! The status column is moved by transitions only: every other write that would change it
//! (a changeset, a saved copy, a batch, a bulk update, a fenced write, a transition's
//! extra changes) is refused before anything is written, and `force_status` is the one
//! explicit way around the declared moves. End states are read from the database. Each
//! body runs on both drivers.

use crate::common;

use std::sync::Barrier;

use common::drivers::{
    BatchUpdate, BulkUpdate, ForceStatus, Modify, Read, Save, SaveFrom, Transition, TransitionKey,
    Update, UpdateByKey,
};
use common::models::Order;
use common::schema::orders;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{no_extra, BatchMode, Error, Guarded, RetryPolicy, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
#[occ(storage = "text")]
pub enum OrderStatus {
    Valid,
    #[occ(from(Valid))]
    Shipped,
    #[occ(from(Valid), rename = "canceled")]
    Cancelled,
    #[occ(from(Shipped))]
    Delivered,
}

/// What a refused write must say: the column, and that transitions move it.
fn assert_status_refused(result: Result<impl std::fmt::Debug, Error>) {
    match result {
        Err(Error::StatusNotWritable { table, column, .. }) => {
            assert_eq!((table, column.as_str()), ("orders", "status"));
        }
        other => panic!("expected StatusNotWritable, got {other:?}"),
    }
}

/// The changes the bodies send.
type StatusText = dsl::Eq<orders::status, &'static str>;
type StatusIs = dsl::Eq<orders::status, OrderStatus>;
type NoteIs = dsl::Eq<orders::note, &'static str>;
type NoteAndStatus = (NoteIs, StatusIs);
type NoExtra = diesel_occ::__private::NoChanges<orders::table>;
type AllRows = dsl::Gt<orders::id, i64>;

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
    #[diesel(table_name = orders)]
    pub struct ShopOrder {
        id: i64,
        note: String,
        #[occ(status)]
        status: OrderStatus,
        #[occ(version)]
        version: i64,
    }

    /// Orders 1 to 3, `valid`, at version 0.
    fn three_orders(db: &Db) {
        let rows: Vec<Order> = (1..=3).map(|id| Order::new(id, "new")).collect();
        diesel::insert_into(orders::table).values(&rows).execute(&mut db.conn()).unwrap();
    }

    /// (status, version, note) as stored.
    fn stored(conn: &mut Pooled, id: i64) -> (String, i64, String) {
        orders::table
            .find(id)
            .select((orders::status, orders::version, orders::note))
            .first(conn)
            .unwrap()
    }

    fn load(conn: &mut Pooled, id: i64) -> ShopOrder {
        orders::table.find(id).select(ShopOrder::as_select()).first(conn).unwrap()
    }

    /// A shipped order cannot be moved back to `valid` by an ordinary update, by key or
    /// by copy, with the enum or with raw text; nothing is written.
    fn a_changeset_that_assigns_the_status_is_refused<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<ShopOrder, NoExtra>
            + Update<ShopOrder, StatusText>
            + Update<ShopOrder, NoteAndStatus>
            + Update<ShopOrder, NoteIs>
            + UpdateByKey<ShopOrder, StatusText>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut order = load(conn, 1);
        w.transition(&mut order, OrderStatus::Shipped, no_extra()).unwrap();

        assert_status_refused(w.update(&order, orders::status.eq("valid")));
        assert_status_refused(w.update(&order, (orders::note.eq("x"), orders::status.eq(OrderStatus::Valid))));
        assert_status_refused(w.update_by_key(&1, &1, orders::status.eq("valid")));

        assert_eq!(stored(conn, 1), ("shipped".into(), 1, "new".into()), "nothing written");
        // Other columns are written as before, the state left alone.
        assert_eq!(w.update(&order, orders::note.eq("gift wrap")).unwrap(), 2);
        assert_eq!(stored(conn, 1), ("shipped".into(), 2, "gift wrap".into()));
    }

    /// A saved copy never writes its state: a copy whose state was changed in memory is
    /// refused (and names both states), an unchanged one saves its other fields.
    fn a_saved_copy_cannot_change_the_status<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<ShopOrder, NoExtra> + Save<ShopOrder> + SaveFrom<ShopOrder>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut shipped = load(conn, 1);
        w.transition(&mut shipped, OrderStatus::Shipped, no_extra()).unwrap();

        let mut edited = load(conn, 1);
        edited.status = OrderStatus::Valid;
        edited.note = "moved back".into();
        let refused = w.save(&mut edited);
        let message = format!("{}", refused.as_ref().unwrap_err());
        assert!(message.contains("`valid`") && message.contains("`shipped`"), "{message}");
        assert_status_refused(refused);
        assert_eq!(edited.version, 1, "the refused copy keeps its token");

        let original = load(conn, 1);
        assert_status_refused(w.save_from(&mut edited, &original));
        assert_eq!(stored(conn, 1), ("shipped".into(), 1, "new".into()), "nothing written");

        let mut kept = load(conn, 1);
        kept.note = "left at the door".into();
        assert_eq!(w.save(&mut kept).unwrap(), 2);
        assert_eq!(stored(conn, 1), ("shipped".into(), 2, "left at the door".into()));
    }

    /// A read-modify-write whose closure changes the state is refused on its first
    /// attempt, not retried, and writes nothing.
    fn modify_cannot_change_the_status<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Modify<ShopOrder, (), Error>,
    {
        let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = attempts.clone();
        let result = w().modify(&1, &RetryPolicy::default(), move |order| -> Result<(), Error> {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            order.status = OrderStatus::Delivered;
            order.note = "skipped shipping".into();
            Ok(())
        });
        assert_status_refused(result.map(|m| m.row));
        assert_eq!(attempts.load(std::sync::atomic::Ordering::Relaxed), 1, "not retried");
        assert_eq!(stored(&mut db.conn(), 1), ("valid".into(), 0, "new".into()));
    }

    /// Batches and bulk updates refuse the status column before sending anything.
    fn batches_and_bulk_updates_cannot_change_the_status<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BatchUpdate<ShopOrder, StatusText> + BulkUpdate<ShopOrder, AllRows, StatusText>,
    {
        let w = &mut w();
        for mode in [BatchMode::AllOrNothing, BatchMode::Partial] {
            let rows = (1..=3).map(|id| (id, 0, orders::status.eq("delivered"))).collect();
            assert_status_refused(w.update_batch(rows, mode).map(|r| r.rows.len()));
        }
        assert_status_refused(w.bulk_update(orders::id.gt(0), orders::status.eq("delivered")).map(|r| r.updated));
        let conn = &mut db.conn();
        for id in 1..=3 {
            assert_eq!(stored(conn, id), ("valid".into(), 0, "new".into()), "row {id}");
        }
    }

    /// A transition's extra changes cannot set the status a second time (MySQL and SQLite
    /// would keep one of the two values silently).
    fn a_transitions_extra_changes_cannot_assign_the_status<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<ShopOrder, StatusText> + TransitionKey<ShopOrder, StatusText>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut order = load(conn, 1);
        assert_status_refused(w.transition(&mut order, OrderStatus::Shipped, orders::status.eq("delivered")));
        assert_status_refused(w.transition_by_key(
            &1, OrderStatus::Shipped, orders::status.eq("delivered"), &RetryPolicy::default(),
        ));
        assert_eq!(order.status, OrderStatus::Valid, "the copy is as it was");
        assert_eq!(stored(conn, 1), ("valid".into(), 0, "new".into()));
    }

    /// `force_status` moves a row where no declared transition leads (delivered back to
    /// valid), checked by the copy's token like every guarded write.
    fn force_status_repairs_a_row_under_the_token_guard<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<ShopOrder, NoExtra> + ForceStatus<ShopOrder, NoteIs> + ForceStatus<ShopOrder, NoExtra>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut order = load(conn, 1);
        w.transition(&mut order, OrderStatus::Shipped, no_extra()).unwrap();
        w.transition(&mut order, OrderStatus::Delivered, no_extra()).unwrap();
        let stale = load(conn, 1);
        assert!(matches!(w.transition(&mut order, OrderStatus::Valid, no_extra()), Err(Error::InvalidTransition(_))));

        assert_eq!(w.force_status(&mut order, OrderStatus::Valid, orders::note.eq("repaired: ticket 42")).unwrap(), 3);
        assert_eq!((order.status, order.version), (OrderStatus::Valid, 3));
        assert_eq!(stored(conn, 1), ("valid".into(), 3, "repaired: ticket 42".into()));

        let mut stale = stale;
        assert!(matches!(w.force_status(&mut stale, OrderStatus::Cancelled, no_extra()), Err(Error::Conflict(_))));
        assert_eq!(stored(conn, 1), ("valid".into(), 3, "repaired: ticket 42".into()), "the stale copy wrote nothing");
    }

    /// 8 threads on one row: 4 edit the note by read-modify-write, 3 save copies whose
    /// state they changed in memory (back to `valid`), 1 ships the order. The ship lands
    /// once and is never undone; every hostile save is refused; every note edit lands.
    fn racing_saves_never_undo_a_transition<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: TransitionKey<ShopOrder, NoExtra> + Modify<ShopOrder, (), Error> + Save<ShopOrder> + Read<ShopOrder>,
    {
        const EDITS: usize = 25;
        let (start, w) = (Barrier::new(8), &w);
        let policy = RetryPolicy::default().max_attempts(1_000);
        let hostile_landed = std::thread::scope(|s| {
            let mut hostile = Vec::new();
            for t in 0..8 {
                let (start, policy) = (&start, &policy);
                let handle = s.spawn(move || {
                    let mut driver = w();
                    start.wait();
                    let mut landed = 0;
                    match t {
                        0 => {
                            driver.transition_by_key(&1, OrderStatus::Shipped, no_extra(), policy).unwrap();
                        }
                        1..=4 => {
                            for _ in 0..EDITS {
                                driver
                                    .modify(&1, policy, |o| -> Result<(), Error> {
                                        o.note.push('+');
                                        Ok(())
                                    })
                                    .unwrap();
                            }
                        }
                        _ => {
                            for _ in 0..EDITS {
                                let mut copy = driver.read(&1).expect("order 1");
                                copy.status = OrderStatus::Valid;
                                match driver.save(&mut copy) {
                                    Ok(_) => landed += 1,
                                    Err(Error::StatusNotWritable { .. } | Error::Conflict(_)) => {}
                                    Err(Error::Retryable { .. }) => {}
                                    Err(other) => panic!("{other}"),
                                }
                            }
                        }
                    }
                    landed
                });
                hostile.push(handle);
            }
            hostile.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        let conn = &mut db.conn();
        let (status, version, note) = stored(conn, 1);
        assert_eq!(status, "shipped", "the ship was never undone");
        assert_eq!(note, format!("new{}", "+".repeat(4 * EDITS)), "every note edit landed");
        // Saves whose copy was still `valid` (read before the ship) and current land, and
        // write the note they read: each one is a version step.
        let saves: usize = hostile_landed.iter().sum();
        assert_eq!(version as usize, 1 + 4 * EDITS + saves, "one version step per landed write");
        println!("{BACKEND}: {saves} saves of copies still valid landed, all others refused");
    }

    tests_on_both_drivers!(
        three_orders;
        a_changeset_that_assigns_the_status_is_refused,
        a_saved_copy_cannot_change_the_status,
        modify_cannot_change_the_status,
        batches_and_bulk_updates_cannot_change_the_status,
        a_transitions_extra_changes_cannot_assign_the_status,
        force_status_repairs_a_row_under_the_token_guard,
        racing_saves_never_undo_a_transition,
    );
}
