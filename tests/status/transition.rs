//! Guarded status transitions: cancel vs ship has exactly one winner, the loser learns the
//! winner's state, hooks commit or roll back with the move. Each body runs on both
//! drivers (the blocking API and the async one).

use crate::common;

use std::sync::Barrier;

use common::drivers::{race, Blocking, Transition, TransitionKey};
use common::models::Order;
use common::schema::orders;
use common::HistoryRow;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{no_extra, record, GuardedStatusTransition, GuardedTransition, HistoryEntry};
use diesel_occ::{Error, Guarded, RetryPolicy, Status};

/// No extra assignments.
type NoExtra = diesel_occ::__private::NoChanges<orders::table>;
/// A note written with the move.
type Note = dsl::Eq<orders::note, &'static str>;

/// An order's life: held orders can be released again, which is the ABA case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
#[occ(storage = "text")]
pub enum OrderStatus {
    #[occ(from(Held))]
    Valid,
    #[occ(from(Valid))]
    Held,
    #[occ(from(Valid))]
    Shipped,
    #[occ(from(Valid, Held), rename = "canceled")]
    Cancelled,
    #[occ(from(Shipped))]
    Delivered,
}

/// A workflow state stored as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
#[occ(storage = "integer")]
pub enum TaskState {
    Open = 1,
    #[occ(from(Open))]
    Running = 2,
    #[occ(from(Running))]
    Done = 3,
}

#[derive(Debug)]
enum ShopError {
    LabelPrinterDown,
    Occ(Error),
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Occ(e)
    }
}

#[test]
fn states_know_their_sources_and_stored_names() {
    assert_eq!(
        OrderStatus::sources(OrderStatus::Cancelled),
        &[OrderStatus::Valid, OrderStatus::Held]
    );
    assert!(OrderStatus::sources(OrderStatus::Valid) == [OrderStatus::Held]);
    assert!(OrderStatus::allows(
        OrderStatus::Shipped,
        OrderStatus::Delivered
    ));
    assert!(!OrderStatus::allows(
        OrderStatus::Cancelled,
        OrderStatus::Shipped
    ));
    assert_eq!(OrderStatus::Cancelled.name(), "canceled");
    assert_eq!(OrderStatus::Held.name(), "held");
    assert_eq!(TaskState::Done.name(), "3");
    assert_eq!(
        TaskState::ALL,
        [TaskState::Open, TaskState::Running, TaskState::Done]
    );
}

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

    /// Moves whose hook records the move in the history, on either driver.
    trait RecordedMoves {
        /// Ships order `id` by key; the hook records the move with actor `operator-7`.
        fn ship_by_key_recorded(&mut self, id: i64) -> Result<ShopOrder, ShopError>;
        /// Ships `row`; the hook records the move, then fails (the label printer is down).
        fn ship_recorded_then_fail(&mut self, row: &mut ShopOrder) -> Result<i64, ShopError>;
    }

    impl RecordedMoves for Blocking<Pooled> {
        fn ship_by_key_recorded(&mut self, id: i64) -> Result<ShopOrder, ShopError> {
            ShopOrder::transition_by_key_then(&mut self.0, &id, OrderStatus::Shipped, no_extra(), |conn, from, row| {
                let key = row.id.to_string();
                record(conn, &HistoryEntry { entity: "orders", key: &key, from: from.name(), to: row.status.name(), actor: Some("operator-7") })
                    .map_err(ShopError::from)
            })
        }
        fn ship_recorded_then_fail(&mut self, row: &mut ShopOrder) -> Result<i64, ShopError> {
            row.transition_then(&mut self.0, OrderStatus::Shipped, no_extra(), |conn, from, row| {
                let key = row.id.to_string();
                record(conn, &HistoryEntry { entity: "orders", key: &key, from: from.name(), to: row.status.name(), actor: None })?;
                Err(ShopError::LabelPrinterDown)
            })
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl RecordedMoves for common::drivers::Async<Async_> {
        fn ship_by_key_recorded(&mut self, id: i64) -> Result<ShopOrder, ShopError> {
            use diesel_occ::asynchronous::AsyncGuardedTransition;
            let moved = <ShopOrder as AsyncGuardedTransition>::transition_by_key_then(
                &mut self.conn,
                &id,
                OrderStatus::Shipped,
                no_extra(),
                async move |conn: &mut Async_, from: OrderStatus, row: &ShopOrder| {
                    let key = row.id.to_string();
                    let entry = HistoryEntry { entity: "orders", key: &key, from: from.name(), to: row.status.name(), actor: Some("operator-7") };
                    diesel_occ::asynchronous::record(conn, &entry).await.map_err(ShopError::from)
                },
            );
            self.runtime.block_on(moved)
        }
        fn ship_recorded_then_fail(&mut self, row: &mut ShopOrder) -> Result<i64, ShopError> {
            use diesel_occ::asynchronous::AsyncGuardedTransition;
            let moved = AsyncGuardedTransition::transition_then(
                row,
                &mut self.conn,
                OrderStatus::Shipped,
                no_extra(),
                async move |conn: &mut Async_, from: OrderStatus, row: &ShopOrder| {
                    let key = row.id.to_string();
                    let entry = HistoryEntry { entity: "orders", key: &key, from: from.name(), to: row.status.name(), actor: None };
                    diesel_occ::asynchronous::record(conn, &entry).await?;
                    Err(ShopError::LabelPrinterDown)
                },
            );
            self.runtime.block_on(moved)
        }
    }

    fn insert_orders(conn: &mut Pooled, count: i64) {
        let rows: Vec<Order> = (1..=count).map(|id| Order::new(id, "new")).collect();
        for chunk in rows.chunks(500) {
            diesel::insert_into(orders::table).values(chunk).execute(conn).unwrap();
        }
    }

    fn load(conn: &mut Pooled, id: i64) -> ShopOrder {
        orders::table.find(id).select(ShopOrder::as_select()).first(conn).unwrap()
    }

    /// 1,000 orders; for each, a cancel and a ship on two threads with their own
    /// connections, released together by a barrier.
    fn cancel_vs_ship_has_exactly_one_winner_per_order<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: TransitionKey<ShopOrder, Note>,
    {
        const ORDERS: i64 = 1000;
        insert_orders(&mut db.conn(), ORDERS);
        let start = Barrier::new(2);
        let policy = RetryPolicy::default().max_attempts(100);

        let outcomes: Vec<Vec<Result<i64, Error>>> = race(2, w, |racer, w| {
            let to = [OrderStatus::Cancelled, OrderStatus::Shipped][racer];
            (1..=ORDERS)
                .map(|id| {
                    start.wait();
                    w.transition_by_key(&id, to, orders::note.eq(to.name()), &policy)
                })
                .collect()
        });

        let conn = &mut db.conn();
        let (mut cancelled, mut shipped) = (0, 0);
        for id in 1..=ORDERS {
            let (cancel, ship) = (&outcomes[0][id as usize - 1], &outcomes[1][id as usize - 1]);
            let row = load(conn, id);
            assert_eq!(row.version, 1, "order {id}: the token advanced exactly once");
            let (winner, loser) = match (cancel, ship) {
                (Ok(1), Err(e)) => { cancelled += 1; (OrderStatus::Cancelled, e) }
                (Err(e), Ok(1)) => { shipped += 1; (OrderStatus::Shipped, e) }
                other => panic!("order {id}: not exactly one winner: {other:?}"),
            };
            assert_eq!(row.status, winner, "order {id}");
            assert_eq!(row.note, winner.name(), "order {id}: the winner's extra assignment");
            match loser {
                Error::InvalidTransition(refused) => {
                    assert_eq!(refused.from, winner.name(), "order {id}: the loser learns the winner's state");
                    assert_eq!(refused.current::<ShopOrder>().map(|r| r.status), Some(winner));
                }
                other => panic!("order {id}: the loser got {other}"),
            }
        }
        assert_eq!(cancelled + shipped, ORDERS);
        println!("{BACKEND}: {ORDERS} races, {cancelled} cancels won, {shipped} ships won, 0 violations");
    }

    /// Valid, held, valid again between a copy's read and its write: the status alone
    /// cannot see it; the copy's token can.
    fn a_loaded_copy_sees_the_aba_case_that_the_status_alone_cannot<W>(db: &Db, w: impl Fn() -> W)
    where
        W: TransitionKey<ShopOrder, NoExtra> + Transition<ShopOrder, NoExtra> + Transition<ShopOrder, Note>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        insert_orders(conn, 1);
        let mut stale = load(conn, 1);
        let before = stale.clone();
        let policy = RetryPolicy::default();
        w.transition_by_key(&1, OrderStatus::Held, no_extra(), &policy).unwrap();
        w.transition_by_key(&1, OrderStatus::Valid, no_extra(), &policy).unwrap();

        let err = Transition::<_, NoExtra>::transition(w, &mut stale, OrderStatus::Shipped, no_extra()).unwrap_err();

        match &err {
            Error::Conflict(c) => assert_eq!(c.found, diesel_occ::Token::Version(2)),
            other => panic!("{other}"),
        }
        assert_eq!(stale, before, "a failed transition leaves the copy as it was");
        // The fresh copy moves, and records the new state and token.
        let mut fresh = load(conn, 1);
        assert_eq!(Transition::<_, Note>::transition(w, &mut fresh, OrderStatus::Shipped, orders::note.eq("TRACK-1")).unwrap(), 3);
        assert_eq!((fresh.status, fresh.version), (OrderStatus::Shipped, 3));
        let stored = load(conn, 1);
        assert_eq!((stored.status, stored.version, stored.note.as_str()), (OrderStatus::Shipped, 3, "TRACK-1"));
    }

    fn an_invalid_transition_names_the_current_state_and_writes_nothing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: TransitionKey<ShopOrder, NoExtra> + Transition<ShopOrder, NoExtra>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        insert_orders(conn, 1);
        let mut order = load(conn, 1);
        w.transition(&mut order, OrderStatus::Cancelled, no_extra()).unwrap();

        let err = w.transition(&mut order, OrderStatus::Shipped, no_extra()).unwrap_err();
        let by_key = w.transition_by_key(&1, OrderStatus::Delivered, no_extra(), &RetryPolicy::default()).unwrap_err();
        let missing = w.transition_by_key(&9, OrderStatus::Shipped, no_extra(), &RetryPolicy::default()).unwrap_err();

        for err in [&err, &by_key] {
            match err {
                Error::InvalidTransition(refused) => assert_eq!(refused.from, "canceled", "{refused}"),
                other => panic!("{other}"),
            }
        }
        assert!(err.to_string().contains("cannot become `shipped`"), "{err}");
        assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
        assert_eq!((load(conn, 1).status, load(conn, 1).version), (OrderStatus::Cancelled, 1));
    }

    /// The hook writes the history row on the move's transaction; when it fails, the move
    /// is rolled back with it.
    fn a_hook_commits_or_rolls_back_with_the_transition<W: RecordedMoves>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        insert_orders(conn, 2);

        let moved = w.ship_by_key_recorded(1).unwrap_or_else(|e| match e {
            ShopError::Occ(e) => panic!("{e}"),
            ShopError::LabelPrinterDown => panic!("the first hook does not fail"),
        });
        let mut second = load(conn, 2);
        let failed = w.ship_recorded_then_fail(&mut second);

        assert_eq!((moved.status, moved.version), (OrderStatus::Shipped, 1));
        assert!(matches!(failed, Err(ShopError::LabelPrinterDown)), "{failed:?}");
        assert_eq!((second.status, second.version), (OrderStatus::Valid, 0), "the copy is as it was");
        assert_eq!((load(conn, 2).status, load(conn, 2).version), (OrderStatus::Valid, 0), "rolled back");
        let history: Vec<(String, String, String, Option<String>)> = diesel::sql_query(
            "SELECT entity_key, from_status, to_status, actor FROM occ_transitions ORDER BY id",
        )
        .load::<HistoryRow>(conn)
        .unwrap()
        .into_iter()
        .map(|r| (r.entity_key, r.from_status, r.to_status, r.actor))
        .collect();
        assert_eq!(history, [("1".into(), "valid".into(), "shipped".into(), Some("operator-7".into()))]);
    }

    /// A stored state that is no variant fails clearly, with the raw value, table and
    /// column; nothing is written.
    fn an_unknown_stored_state_is_a_clear_error<W: TransitionKey<ShopOrder, NoExtra>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_orders(conn, 1);
        diesel::update(orders::table).set(orders::status.eq("lost in transit")).execute(conn).unwrap();

        let read = orders::table.find(1).select(ShopOrder::as_select()).first::<ShopOrder>(conn).unwrap_err();
        let err = w().transition_by_key(&1, OrderStatus::Shipped, no_extra(), &RetryPolicy::default()).unwrap_err();

        let cause = std::error::Error::source(&read).map(|e| e.to_string()).unwrap_or_default();
        assert!(cause.contains("\"lost in transit\" is not a `OrderStatus`"), "{read}: {cause}");
        match &err {
            Error::InvalidData { table: "orders", column, reason } => {
                assert!(column.starts_with("status"), "{column}");
                assert!(reason.contains("lost in transit") && reason.contains("row 1"), "{reason}");
            }
            other => panic!("{other}"),
        }
        let raw: (String, i64) = orders::table.find(1).select((orders::status, orders::version)).first(conn).unwrap();
        assert_eq!(raw, ("lost in transit".into(), 0));
    }

    diesel::table! {
        jobs (id) {
            id -> BigInt,
            state -> Integer,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = jobs)]
    pub struct Job {
        id: i64,
        #[occ(status)]
        state: TaskState,
        #[occ(version)]
        version: i64,
    }

    /// No extra assignments to a job.
    type NoJobExtra = diesel_occ::__private::NoChanges<jobs::table>;

    /// Integer storage: the discriminants are stored, and an unknown number is refused.
    fn integer_states_round_trip_and_transition<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<Job, NoJobExtra> + TransitionKey<Job, NoJobExtra>,
    {
        use diesel::connection::SimpleConnection;
        let conn = &mut db.conn();
        let w = &mut w();
        conn.batch_execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY, state INTEGER NOT NULL, version BIGINT NOT NULL)").unwrap();
        diesel::insert_into(jobs::table).values(&Job { id: 1, state: TaskState::Open, version: 0 }).execute(conn).unwrap();

        let mut job: Job = jobs::table.find(1).select(Job::as_select()).first(conn).unwrap();
        w.transition(&mut job, TaskState::Running, no_extra()).unwrap();
        let skipped = w.transition_by_key(&1, TaskState::Open, no_extra(), &RetryPolicy::default()).unwrap_err();

        let stored: i32 = jobs::table.find(1).select(jobs::state).first(conn).unwrap();
        assert_eq!(stored, 2);
        assert!(matches!(skipped, Error::InvalidTransition(_)), "{skipped}");
        diesel::update(jobs::table).set(jobs::state.eq(7)).execute(conn).unwrap();
        let err = jobs::table.find(1).select(Job::as_select()).first::<Job>(conn).unwrap_err();
        let cause = std::error::Error::source(&err).map(|e| e.to_string()).unwrap_or_default();
        assert!(cause.contains("7 is not a `TaskState`"), "{err}: {cause}");
    }

    /// A transition by key racing the insert of its row either finds no row (`NotFound`)
    /// or moves it: never a refusal. Its `UPDATE` can match nothing just before the insert
    /// commits and its re-read then find the row in a state it may leave.
    fn a_transition_racing_its_rows_insert_moves_it_or_finds_nothing<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: TransitionKey<ShopOrder, Note>,
    {
        const ORDERS: i64 = 300;
        let (each_order, pool) = (Barrier::new(2), &db.pool);
        let policy = RetryPolicy::never();
        let wrong: Vec<String> = race(2, w, |racer, w| {
            let mut wrong = Vec::new();
            for id in 1..=ORDERS {
                each_order.wait();
                if racer == 0 {
                    std::thread::sleep(std::time::Duration::from_micros((id as u64 * 37) % 400));
                    let order = Order::new(id, "new");
                    diesel::insert_into(orders::table).values(&order).execute(&mut pool.get().unwrap()).unwrap();
                    continue;
                }
                loop {
                    let to = OrderStatus::Shipped;
                    match w.transition_by_key(&id, to, orders::note.eq(to.name()), &policy) {
                        Ok(_) => break,
                        Err(Error::NotFound { .. }) => {}
                        Err(other) => {
                            wrong.push(format!("order {id}: {other}"));
                            break;
                        }
                    }
                }
            }
            wrong
        })
        .into_iter()
        .flatten()
        .collect();
        assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
        let conn = &mut db.conn();
        for id in 1..=ORDERS {
            assert_eq!(load(conn, id).status, OrderStatus::Shipped, "order {id}");
        }
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        a_transition_racing_its_rows_insert_moves_it_or_finds_nothing,
        cancel_vs_ship_has_exactly_one_winner_per_order,
        a_loaded_copy_sees_the_aba_case_that_the_status_alone_cannot,
        an_invalid_transition_names_the_current_state_and_writes_nothing,
        a_hook_commits_or_rolls_back_with_the_transition,
        an_unknown_stored_state_is_a_clear_error,
        integer_states_round_trip_and_transition,
    );
}
