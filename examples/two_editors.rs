//! Two people edit the same order; neither loses the other's change.
//!
//! Alice and Bob open order #1 at the same time. Alice saves first. Bob's save is refused
//! with a conflict that carries the order as Alice left it, so Bob re-applies his change
//! to that row and saves again. The order ends with both changes.
//!
//! Run it (embedded SQLite, nothing to set up): `cargo run --example two_editors`

use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use diesel_occ::{Error, Guarded, GuardedWrite, PoolConfig};

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

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::temp_dir().join(format!("diesel-occ-demo-{}.sqlite3", std::process::id()));
    let pool = diesel_occ::sqlite_pool(
        path.to_str().ok_or("temp dir is not UTF-8")?,
        &PoolConfig::default(),
    )?;
    pool.get()?.run_pending_migrations(MIGRATIONS)?;
    let result = demo(&pool);
    drop(pool);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

fn demo(pool: &diesel_occ::SqlitePool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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
