//! Two people edit the same order; neither loses the other's change. Then a customer's
//! cancel and an operator's ship race on 200 orders: each order has exactly one winner.
//!
//! Alice and Bob open order #1 at the same time. Alice saves first. Bob's save is refused
//! with a conflict that carries the order as Alice left it, so Bob re-applies his change
//! to that row and saves again. The order ends with both changes.
//!
//! In the race, two threads on their own pooled connections move each order at the same
//! moment, one to `cancelled`, one to `shipped`, each with one guarded statement: one wins,
//! the other learns the state the winner left, and no cancelled order ships.
//!
//! Run it (embedded SQLite, nothing to set up): `cargo run --example two_editors`

use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use diesel_occ::{no_extra, GuardedStatusTransition};
use diesel_occ::{Error, Guarded, GuardedWrite, PoolConfig, RetryPolicy, Status};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

diesel::table! {
    orders (id) {
        id -> BigInt,
        customer -> Text,
        note -> Text,
        status -> Text,
        quantity -> Integer,
        gift_message -> Nullable<Text>,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    customer: String,
    note: String,
    status: String,
    quantity: i32,
    gift_message: Option<String>,
    #[occ(version)]
    version: i64,
}

/// The states an order goes through, and which may move to which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
enum OrderStatus {
    Valid,
    #[occ(from(Valid))]
    Shipped,
    #[occ(from(Valid))]
    Cancelled,
}

/// The part of an order the race moves.
#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct OrderState {
    id: i64,
    #[occ(status)]
    status: OrderStatus,
    #[occ(version)]
    version: i64,
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::temp_dir().join(format!("diesel-occ-demo-{}.sqlite3", std::process::id()));
    let pool = diesel_occ::sqlite_pool(
        path.to_str().ok_or("temp dir is not UTF-8")?,
        &PoolConfig::default(),
    )?;
    pool.get()?.run_pending_migrations(MIGRATIONS)?;
    let result = demo(&pool).and_then(|()| cancel_vs_ship(&pool));
    drop(pool);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

fn demo(pool: &diesel_occ::SqlitePool) -> DemoResult {
    let (mut alice_conn, mut bob_conn) = (pool.get()?, pool.get()?);
    diesel::insert_into(orders::table)
        .values(&Order {
            id: 1,
            customer: "Ada".into(),
            note: "".into(),
            status: "valid".into(),
            quantity: 1,
            gift_message: None,
            version: 0,
        })
        .execute(&mut alice_conn)?;

    let load = |conn: &mut _| orders::table.find(1).select(Order::as_select()).first(conn);
    let mut alice: Order = load(&mut alice_conn)?;
    let mut bob: Order = load(&mut bob_conn)?;
    println!(
        "Alice and Bob both open order #1 at version {}.",
        alice.version
    );

    alice.note = "gift wrap, please".into();
    alice.guarded_save(&mut alice_conn)?;
    println!(
        "Alice sets the note and saves: order #1 is now at version {}.",
        alice.version
    );

    bob.quantity = 3;
    let current = match bob.guarded_save(&mut bob_conn) {
        Err(Error::Conflict(conflict)) => {
            println!("Bob sets the quantity to 3 and saves: refused.\n  {conflict}");
            conflict
                .into_current::<Order>()
                .map_err(|c| format!("unexpected row type: {c}"))?
        }
        other => return Err(format!("expected a conflict, got {other:?}").into()),
    };
    println!(
        "  The conflict carries the order as it is now: note {:?}, quantity {}, version {}.",
        current.note, current.quantity, current.version
    );

    bob = Order {
        quantity: 3,
        ..current
    };
    bob.guarded_save(&mut bob_conn)?;
    println!(
        "Bob re-applies his change to that row and saves: version {}.",
        bob.version
    );

    let stored = load(&mut alice_conn)?;
    println!(
        "Order #1 in the database: note {:?}, quantity {}, version {}: both changes kept.",
        stored.note, stored.quantity, stored.version
    );
    assert_eq!(
        (stored.note.as_str(), stored.quantity, stored.version),
        ("gift wrap, please", 3, 2)
    );
    Ok(())
}

type DemoResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// 200 orders; for each, a cancel and a ship released together. Prints the tally.
fn cancel_vs_ship(pool: &diesel_occ::SqlitePool) -> DemoResult {
    const ORDERS: i64 = 200;
    let rows: Vec<Order> = (100..100 + ORDERS)
        .map(|id| Order {
            id,
            customer: "Ada".into(),
            note: "".into(),
            status: "valid".into(),
            quantity: 1,
            gift_message: None,
            version: 0,
        })
        .collect();
    diesel::insert_into(orders::table)
        .values(&rows)
        .execute(&mut pool.get()?)?;
    let start = std::sync::Barrier::new(2);
    let policy = RetryPolicy::default();

    let results = std::thread::scope(|s| {
        let racers: Vec<_> = [OrderStatus::Cancelled, OrderStatus::Shipped]
            .into_iter()
            .map(|to| {
                let (start, policy) = (&start, &policy);
                s.spawn(move || -> Result<Vec<Result<i64, Error>>, Error> {
                    let mut conn = pool.get()?;
                    Ok((100..100 + ORDERS)
                        .map(|id| {
                            start.wait();
                            OrderState::transition_by_key(&mut conn, &id, to, no_extra(), policy)
                        })
                        .collect())
                })
            })
            .collect();
        racers
            .into_iter()
            .map(|r| r.join().expect("a racer panicked"))
            .collect::<Result<Vec<_>, Error>>()
    })?;

    let (mut cancelled, mut shipped, mut violations) = (0, 0, 0);
    let mut conn = pool.get()?;
    for (i, id) in (100..100 + ORDERS).enumerate() {
        let state: OrderState = orders::table
            .find(id)
            .select(OrderState::as_select())
            .first(&mut conn)?;
        let winners = [&results[0][i], &results[1][i]]
            .iter()
            .filter(|r| r.is_ok())
            .count();
        let loser_saw_winner = [&results[0][i], &results[1][i]].iter().any(
            |r| matches!(r, Err(Error::InvalidTransition(t)) if t.from == state.status.name()),
        );
        match state.status {
            OrderStatus::Cancelled => cancelled += 1,
            OrderStatus::Shipped => shipped += 1,
            OrderStatus::Valid => {}
        }
        if winners != 1 || !loser_saw_winner || state.version != 1 {
            violations += 1;
        }
    }
    println!(
        "Cancel vs ship on {ORDERS} orders: {cancelled} cancelled, {shipped} shipped, \
         {violations} violations (each order has exactly one winner, and the loser was told \
         the winner's state)."
    );
    if violations > 0 {
        return Err(format!("{violations} orders without exactly one winner").into());
    }
    Ok(())
}
