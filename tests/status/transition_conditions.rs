//! Transitions from any state but the target (`from(any)`), and transitions with a
//! condition on other columns of the row (`ship` only while a payment is recorded), both
//! checked in the one transition statement. Each body runs on both drivers (the blocking
//! API and the async one).

use crate::common;

use common::drivers::{race, Transition, TransitionKey, TransitionKeyWhen, TransitionWhen};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{no_extra, Error, Guarded, Pooled};
use diesel_occ::{RetryPolicy, Status};

/// No extra assignments.
type NoExtra = diesel_occ::__private::NoChanges<shipments::table>;
/// A tracking number written with the move.
type Tracking = dsl::Eq<shipments::tracking, &'static str>;
/// The condition of a shipment: paid.
type Paid = dsl::IsNotNull<shipments::payment>;

diesel::table! {
    shipments (id) {
        id -> BigInt,
        status -> Text,
        payment -> Nullable<Text>,
        tracking -> Nullable<Text>,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
enum Stage {
    Open,
    #[occ(from(Open))]
    Shipped,
    #[occ(from(Open))]
    Cancelled,
    #[occ(from(Shipped))]
    Delivered,
    #[occ(from(any))]
    Archived,
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = shipments)]
struct Shipment {
    id: i64,
    #[occ(status)]
    status: Stage,
    payment: Option<String>,
    tracking: Option<String>,
    #[occ(version)]
    version: i64,
}

#[test]
fn from_any_is_every_other_state() {
    assert_eq!(
        Stage::sources(Stage::Archived),
        &[
            Stage::Open,
            Stage::Shipped,
            Stage::Cancelled,
            Stage::Delivered
        ]
    );
    assert!(!Stage::allows(Stage::Archived, Stage::Archived));
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// One shipment per state, ids 1..=5 in the enum's order, unpaid, at version 0.
    fn setup(db: &Db) {
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE shipments (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL,
                 payment VARCHAR(40), tracking VARCHAR(40), version BIGINT NOT NULL)",
        )
        .unwrap();
        conn.batch_execute(
            "INSERT INTO shipments (id, status, version) VALUES
                 (1, 'open', 0), (2, 'shipped', 0), (3, 'cancelled', 0), (4, 'delivered', 0), (5, 'archived', 0)",
        )
        .unwrap();
    }

    fn load(conn: &mut Pooled<Conn>, id: i64) -> Shipment {
        shipments::table.find(id).select(Shipment::as_select()).first(conn).unwrap()
    }

    fn pay(conn: &mut Pooled<Conn>, id: i64) {
        diesel::update(shipments::table.find(id)).set(shipments::payment.eq("PAY-1")).execute(conn).unwrap();
    }

    /// `from(any)`: every other state moves to it, by copy and by key; the state itself
    /// does not.
    fn any_other_state_can_be_archived_but_not_an_archived_one<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Transition<Shipment, NoExtra> + TransitionKey<Shipment, NoExtra>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        for id in 1..=2 {
            let mut row = load(conn, id);
            w.transition(&mut row, Stage::Archived, no_extra()).unwrap();
            assert_eq!(load(conn, id), row);
        }
        for id in 3..=4 {
            w.transition_by_key(&id, Stage::Archived, no_extra(), &RetryPolicy::default()).unwrap();
            assert_eq!(load(conn, id).status, Stage::Archived);
        }
        let mut archived = load(conn, 5);
        match w.transition(&mut archived, Stage::Archived, no_extra()) {
            Err(Error::InvalidTransition(refused)) => {
                assert_eq!((refused.from.as_str(), refused.to.as_str(), &refused.unmet), ("archived", "archived", &None));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load(conn, 5).version, 0, "nothing written");
    }

    /// A condition on another column: met, the move and its extra changes land; not met,
    /// `InvalidTransition` names the condition, carries the row, and nothing is written.
    fn a_transition_waits_for_its_condition<W: TransitionWhen<Shipment, Tracking, Paid>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut open = load(conn, 1);
        let before = open.clone();
        let refused = w.transition_when(&mut open, Stage::Shipped, shipments::tracking.eq("T-1"), shipments::payment.is_not_null());
        match refused {
            Err(Error::InvalidTransition(refused)) => {
                assert_eq!((refused.from.as_str(), refused.to.as_str()), ("open", "shipped"));
                let unmet = refused.unmet.clone().expect("the unmet condition");
                assert!(unmet.contains("payment") && unmet.contains("IS NOT NULL"), "{unmet}");
                assert_eq!(refused.current::<Shipment>(), Some(&before));
                assert!(refused.to_string().contains("does not meet"), "{refused}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(open, before, "the copy is as it was");
        assert_eq!(load(conn, 1), before, "status, extra changes and version unchanged");

        pay(conn, 1);
        let mut paid = load(conn, 1);
        w.transition_when(&mut paid, Stage::Shipped, shipments::tracking.eq("T-1"), shipments::payment.is_not_null()).unwrap();
        let stored = load(conn, 1);
        assert_eq!((stored.status, stored.tracking.as_deref(), stored.version), (Stage::Shipped, Some("T-1"), 1));
        assert_eq!((paid.status, paid.version), (stored.status, stored.version), "the copy records state and token");
    }

    /// The state is checked first, then the copy's token, then the condition: a stale
    /// copy is a conflict even when the condition fails too, and a state that does not
    /// allow the move is reported as such whatever the condition says.
    fn state_then_token_then_condition<W: TransitionWhen<Shipment, NoExtra, Paid>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let stale = load(conn, 1);
        diesel::update(shipments::table.find(1)).set(shipments::version.eq(7)).execute(conn).unwrap();
        let mut copy = stale.clone();
        let stale_write = w.transition_when(&mut copy, Stage::Shipped, no_extra(), shipments::payment.is_not_null());
        assert!(matches!(stale_write, Err(Error::Conflict(_))), "{stale_write:?}");

        let mut delivered = load(conn, 4);
        match w.transition_when(&mut delivered, Stage::Shipped, no_extra(), shipments::payment.is_not_null()) {
            Err(Error::InvalidTransition(refused)) => assert_eq!((refused.from.as_str(), &refused.unmet), ("delivered", &None)),
            other => panic!("{other:?}"),
        }
    }

    /// The key-only form: no read before the statement, the same outcomes.
    fn a_key_only_transition_waits_for_its_condition<W: TransitionKeyWhen<Shipment, Tracking, Paid>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let policy = RetryPolicy::default();
        let mut ship = || {
            w.transition_by_key_when(&1, Stage::Shipped, shipments::tracking.eq("T-9"), shipments::payment.is_not_null(), &policy)
        };
        match ship() {
            Err(Error::InvalidTransition(refused)) => assert!(refused.unmet.is_some()),
            other => panic!("{other:?}"),
        }
        assert_eq!(load(conn, 1).version, 0);
        pay(conn, 1);
        assert_eq!(ship().unwrap(), 1);
        assert_eq!(load(conn, 1).tracking.as_deref(), Some("T-9"));
        match ship() {
            Err(Error::InvalidTransition(refused)) => assert_eq!((refused.from.as_str(), &refused.unmet), ("shipped", &None)),
            other => panic!("{other:?}"),
        }
    }

    /// 8 threads on one unpaid order, 20 rounds: 2 record the payment (other code, a
    /// plain update on a pooled connection), 3 ship it by key only while paid, 3 cancel it
    /// by key. Each round ends with exactly one move, and a shipped order is always paid.
    fn pay_ship_and_cancel_race_to_one_consistent_end<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: TransitionKeyWhen<Shipment, NoExtra, Paid> + TransitionKey<Shipment, NoExtra>,
    {
        let pool = &db.pool;
        for round in 0..20 {
            let id = 100 + round;
            diesel::sql_query(format!("INSERT INTO shipments (id, status, version) VALUES ({id}, 'open', 0)"))
                .execute(&mut db.conn())
                .unwrap();
            let moves: Vec<Option<Stage>> = race(8, &w, |t, w| {
                let policy = RetryPolicy::default();
                let moved = match t {
                    0 | 1 => {
                        pay(&mut pool.get().unwrap(), id);
                        return None;
                    }
                    2..=4 => w
                        .transition_by_key_when(&id, Stage::Shipped, no_extra(), shipments::payment.is_not_null(), &policy)
                        .map(|_| Stage::Shipped),
                    _ => w
                        .transition_by_key(&id, Stage::Cancelled, no_extra(), &policy)
                        .map(|_| Stage::Cancelled),
                };
                match moved {
                    Ok(stage) => Some(stage),
                    Err(Error::InvalidTransition(_)) => None,
                    Err(other) => panic!("{other}"),
                }
            });
            let won: Vec<Stage> = moves.into_iter().flatten().collect();
            assert_eq!(won.len(), 1, "round {round}: {won:?}");
            let stored = load(&mut db.conn(), id);
            assert_eq!((stored.status, stored.version), (won[0], 1), "round {round}");
            if stored.status == Stage::Shipped {
                assert!(stored.payment.is_some(), "round {round}: shipped unpaid");
            }
        }
    }

    tests_on_both_drivers!(
        setup;
        any_other_state_can_be_archived_but_not_an_archived_one,
        a_transition_waits_for_its_condition,
        state_then_token_then_condition,
        a_key_only_transition_waits_for_its_condition,
        pay_ship_and_cancel_race_to_one_consistent_end,
    );
}
