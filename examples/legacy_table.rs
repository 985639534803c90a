//! Guarding a legacy table that has no version column, with pre-images.
//!
//! A customer cancels order #1 while an operator, looking at a stale screen, clicks
//! "ship": the ship is guarded by the status the operator saw, so it is refused with the
//! order as it is now ("cancelled"). Meanwhile page views are counted without ever
//! conflicting, and a support agent's note is saved column by column, keeping another
//! writer's change to the quantity.
//!
//! Run it (embedded SQLite, nothing to set up): `cargo run --example legacy_table`

use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use diesel_occ::{Error, Guarded, GuardedChanges, GuardedWrite, PoolConfig};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

diesel::table! {
    orders (id) {
        id -> BigInt,
        customer -> Text,
        note -> Text,
        status -> Text,
        quantity -> Integer,
        gift_message -> Nullable<Text>,
        version -> BigInt,
        views -> BigInt,
    }
}

/// The operator's screen: only the status decides whether shipping is still right.
#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Shipment {
    id: i64,
    #[occ(compare)]
    status: String,
}

/// The support agent's form: every column is compared, but for the view counter.
#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
#[occ(pre_image)]
struct SupportView {
    id: i64,
    customer: String,
    note: String,
    status: String,
    quantity: i32,
    gift_message: Option<String>,
    #[occ(exclude)]
    views: i64,
}

fn main() -> Result<()> {
    let path =
        std::env::temp_dir().join(format!("diesel-occ-legacy-{}.sqlite3", std::process::id()));
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

fn demo(pool: &diesel_occ::SqlitePool) -> Result<()> {
    let conn = &mut pool.get()?;
    diesel::sql_query(
        "INSERT INTO orders (id, customer, note, status, quantity) VALUES (1, 'Ada', '', 'valid', 1)",
    )
    .execute(conn)?;
    let count_view = |conn: &mut _| {
        SupportView::update_excluded_by_key(conn, &1, orders::views.eq(orders::views + 1))
    };

    // The operator's screen and the agent's form are loaded; the page is viewed.
    let operator: Shipment = orders::table
        .find(1)
        .select(Shipment::as_select())
        .first(conn)?;
    let agent_read: SupportView = orders::table
        .find(1)
        .select(SupportView::as_select())
        .first(conn)?;
    count_view(conn)?;
    println!(
        "The operator and the support agent open order #1 (status {:?}).",
        operator.status
    );

    // The customer cancels, guarded by the status they saw.
    let customer: Shipment = orders::table
        .find(1)
        .select(Shipment::as_select())
        .first(conn)?;
    customer.guarded_update(conn, orders::status.eq("cancelled"))?;
    count_view(conn)?;
    println!("The customer cancels.");

    // The operator clicks "ship" on the stale screen.
    match operator.guarded_update(conn, orders::status.eq("shipped")) {
        Err(Error::Conflict(conflict)) => {
            let now = conflict
                .current::<Shipment>()
                .ok_or("unexpected row type")?;
            println!(
                "The operator clicks \"ship\": refused, the order is {:?} now.",
                now.status
            );
        }
        other => return Err(format!("expected a conflict, got {other:?}").into()),
    }

    // Someone else corrects the quantity; the agent adds a note to the form read before.
    diesel::update(orders::table.find(1))
        .set(orders::quantity.eq(2))
        .execute(conn)?;
    let mut agent = agent_read.clone();
    agent.note = "customer asked for a refund".into();
    agent.guarded_save_changes_from(conn, &agent_read)?;
    println!("The agent saves a note: only the note is compared and written.");

    let stored: SupportView = orders::table
        .find(1)
        .select(SupportView::as_select())
        .first(conn)?;
    println!(
        "Order #1: status {:?}, note {:?}, quantity {}, {} views: every change kept.",
        stored.status, stored.note, stored.quantity, stored.views
    );
    assert_eq!(
        (
            stored.status.as_str(),
            stored.note.as_str(),
            stored.quantity,
            stored.views
        ),
        ("cancelled", "customer asked for a refund", 2, 2)
    );
    Ok(())
}
