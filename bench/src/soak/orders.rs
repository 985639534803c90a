//! The soak's claim queue: orders placed, claimed two at a time by workers that heartbeat
//! and finish their claims, and shipped (with a condition) or cancelled by key by others
//! meanwhile. Each call on both drivers, answered in the model's terms.

use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::asynchronous as on_async;
use diesel_occ::prelude::*;
use diesel_occ::{no_extra, ClaimOrder, ClaimRequest};

use super::model::order::SHIP_BELOW;
use super::model::{Op, Order, Ret};
use crate::backend::per_backend;

/// A claim takes at most this many orders.
const CLAIM_LIMIT: usize = 2;

/// The retry policy of transitions: quick, and bounded.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(30)
        .first_delay(Duration::from_micros(200))
        .max_delay(Duration::from_millis(20))
}

/// The states of an order: placed, packing while claimed, then shipped or cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
pub enum OrderState {
    Placed,
    #[occ(from(Placed))]
    Packing,
    #[occ(from(Placed, Packing))]
    Shipped,
    #[occ(from(Placed, Packing))]
    Cancelled,
}

/// The request of every claim of the soak: the lowest placed keys first, never an
/// abandoned claim (an owner's claim is lost only to a cancel or a ship by key).
fn request(owner: &str) -> ClaimRequest<'_, OrderState> {
    ClaimRequest {
        from: OrderState::Placed,
        to: OrderState::Packing,
        owner,
        limit: CLAIM_LIMIT,
        reclaim_after: None,
        order: ClaimOrder::ByKey,
    }
}

per_backend! {
    diesel::table! {
        soak_orders (id) {
            id -> BigInt,
            version -> BigInt,
            state -> Text,
            owner -> Nullable<Text>,
            claimed_at -> Nullable<Timestamp>,
            amount -> BigInt,
        }
    }

    /// An order of the queue.
    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = soak_orders)]
    pub struct SoakOrder {
        pub id: i64,
        #[occ(version)]
        pub version: i64,
        #[occ(status)]
        pub state: OrderState,
        pub owner: Option<String>,
        pub claimed_at: Option<chrono::NaiveDateTime>,
        pub amount: i64,
    }

    fn order(o: &SoakOrder) -> Order {
        Order { status: o.state.name().into(), owner: o.owner.clone(), amount: o.amount, version: o.version }
    }

    /// A fresh queue, with the index a claim in key order walks.
    pub fn prepare(conn: &mut Conn) -> Result<(), Box<dyn std::error::Error>> {
        let stamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        crate::backend::recreate(
            conn,
            "soak_orders",
            &format!("id BIGINT PRIMARY KEY, version BIGINT NOT NULL, state VARCHAR(16) NOT NULL, \
                      owner VARCHAR(64), claimed_at {stamp}, amount BIGINT NOT NULL"),
        )?;
        let queue = if BACKEND == "postgres" { "(state, id)" } else { "(state)" };
        diesel::connection::SimpleConnection::batch_execute(conn, &format!("CREATE INDEX soak_orders_queue ON soak_orders {queue}"))?;
        Ok(())
    }

    fn placed(key: i64, amount: i64) -> SoakOrder {
        SoakOrder { id: key, version: 0, state: OrderState::Placed, owner: None, claimed_at: None, amount }
    }

    /// A claim for `owner` on the blocking API: the orders it took.
    pub fn claim_blocking(conn: &mut Conn, owner: &str) -> Result<Vec<(i64, i64)>, diesel_occ::Error> {
        let taken = SoakOrder::claim(conn, soak_orders::owner, soak_orders::claimed_at, &request(owner))?;
        Ok(taken.iter().map(|o| (o.id, o.version)).collect())
    }

    /// One call on an order, on the blocking API.
    pub fn call_blocking(conn: &mut Conn, key: i64, op: &Op) -> Result<Ret, diesel_occ::Error> {
        Ok(match op {
            Op::Place { amount } => Ret::Written { version: Some(placed(key, *amount).guarded_insert(conn)?) },
            Op::Ship => {
                let cheap = soak_orders::amount.lt(SHIP_BELOW);
                let version = SoakOrder::transition_by_key_when(conn, &key, OrderState::Shipped, no_extra::<soak_orders::table>(), cheap, &policy())?;
                Ret::Moved { version }
            }
            Op::Cancel => Ret::Moved { version: SoakOrder::transition_by_key(conn, &key, OrderState::Cancelled, no_extra::<soak_orders::table>(), &policy())? },
            Op::Heartbeat { owner } => {
                let row = SoakOrder::extend_claim(conn, &key, soak_orders::owner, soak_orders::claimed_at, owner, OrderState::Packing)?;
                Ret::Moved { version: row.version }
            }
            Op::Finish { owner } => {
                SoakOrder::finish_claim(conn, &key, soak_orders::owner, owner, OrderState::Packing, OrderState::Shipped, None)?;
                Ret::Done
            }
            Op::LoadOrder => Ret::OrderRead { order: SoakOrder::load_by_key(conn, &key)?.as_ref().map(order) },
            _ => unreachable!("{op:?} is not an operation on an order"),
        })
    }

    /// A claim for `owner` on the async API.
    pub async fn claim_async(conn: &mut AsyncConn, owner: &str) -> Result<Vec<(i64, i64)>, diesel_occ::Error> {
        let request = request(owner);
        let taken = <SoakOrder as on_async::AsyncGuardedClaim>::claim(conn, soak_orders::owner, soak_orders::claimed_at, &request).await?;
        Ok(taken.iter().map(|o| (o.id, o.version)).collect())
    }

    /// One call on an order, on the async API.
    pub async fn call_async(conn: &mut AsyncConn, key: i64, op: &Op) -> Result<Ret, diesel_occ::Error> {
        use on_async::{AsyncGuardedClaim, AsyncGuardedTransition, AsyncGuardedWrite, AsyncLoadByKey};
        Ok(match op {
            Op::Place { amount } => {
                let mut new = placed(key, *amount);
                Ret::Written { version: Some(<SoakOrder as AsyncGuardedWrite>::guarded_insert(&mut new, conn).await?) }
            }
            Op::Ship => {
                let cheap = soak_orders::amount.lt(SHIP_BELOW);
                let version = <SoakOrder as AsyncGuardedTransition>::transition_by_key_when(conn, &key, OrderState::Shipped, no_extra::<soak_orders::table>(), cheap, &policy()).await?;
                Ret::Moved { version }
            }
            Op::Cancel => {
                let version = <SoakOrder as AsyncGuardedTransition>::transition_by_key(conn, &key, OrderState::Cancelled, no_extra::<soak_orders::table>(), &policy()).await?;
                Ret::Moved { version }
            }
            Op::Heartbeat { owner } => {
                let row = <SoakOrder as AsyncGuardedClaim>::extend_claim(conn, &key, soak_orders::owner, soak_orders::claimed_at, owner, OrderState::Packing).await?;
                Ret::Moved { version: row.version }
            }
            Op::Finish { owner } => {
                <SoakOrder as AsyncGuardedClaim>::finish_claim(conn, &key, soak_orders::owner, owner, OrderState::Packing, OrderState::Shipped, None).await?;
                Ret::Done
            }
            Op::LoadOrder => {
                let found = <SoakOrder as AsyncLoadByKey<AsyncConn>>::load_by_key(conn, &key).await?;
                Ret::OrderRead { order: found.as_ref().map(order) }
            }
            _ => unreachable!("{op:?} is not an operation on an order"),
        })
    }
}
