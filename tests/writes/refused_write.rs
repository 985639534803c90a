//! A write that matches no row although the row is still at the expected token was
//! refused or ignored by the database: `Error::Refused`, never a retryable conflict
//! (a retry loop would never end). Each body runs on both drivers.
//!
//! MySQL / MariaDB have no way to skip an `UPDATE` silently (a trigger can only fail it,
//! and there is no row-level security), so these cases exist on PostgreSQL and SQLite.

use crate::common;

use common::drivers::Update;
use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Token};

fn assert_refused_at(err: &Error, token: i128) {
    match err {
        Error::Refused {
            table, token: t, ..
        } => {
            assert_eq!((*table, t), ("orders", &Token::Version(token)), "{err:?}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert!(!err.is_retryable());
}

/// The change the bodies send.
type NoteIs = dsl::Eq<orders::note, &'static str>;

/// Inserts an order whose status is "frozen" (which the test's trigger or policy guards)
/// on `$conn`, updates it with executor `$w`, and checks the outcome is `Refused` with
/// nothing written (read back on `$conn`).
macro_rules! assert_frozen_order_refuses_updates {
    ($conn:expr, $w:expr) => {{
        let conn = $conn;
        let order = Order {
            status: "frozen".into(),
            ..Order::new(1, "new")
        };
        diesel::insert_into(orders::table)
            .values(&order)
            .execute(conn)
            .unwrap();

        let err =
            Update::<Order, NoteIs>::update($w, &order, orders::note.eq("edited")).unwrap_err();

        assert_refused_at(&err, 0);
        let stored: Order = orders::table
            .select(Order::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, order);
    }};
}

/// PostgreSQL applies no commit late, so both drivers report `Refused` (on a Galera node
/// both ask the node and retry, see the cluster tests).
#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    use common::drivers::ExecuteSql;

    type Conn = diesel::PgConnection;
    type Db = common::TestDb<Conn>;

    fn db() -> Option<Db> {
        common::postgres()
    }

    fn update_skipped_by_a_trigger_is_refused_not_a_conflict<W: Update<Order, NoteIs>>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE FUNCTION skip_row() RETURNS trigger AS $$ BEGIN RETURN NULL; END $$ \
                 LANGUAGE plpgsql;
             CREATE TRIGGER orders_frozen BEFORE UPDATE ON orders FOR EACH ROW
                 WHEN (OLD.status = 'frozen') EXECUTE FUNCTION skip_row();",
        )
        .unwrap();

        assert_frozen_order_refuses_updates!(conn, &mut w());
    }

    /// A policy that lets a role read every row but update only open ones. Superusers
    /// bypass row-level security, so the executor's session switches to a role of its
    /// own (the order is inserted, and read back, as the superuser).
    fn update_hidden_by_row_level_security_is_refused_not_a_conflict<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Order, NoteIs> + ExecuteSql,
    {
        let conn = &mut db.conn();
        // Unique to the test: both drivers' tests run at once in one process.
        let role = format!("occ_rls_{}", common::unique_name());
        let _cleanup = DropRole(role.clone(), db.url.clone());
        conn.batch_execute(&format!(
            "DROP ROLE IF EXISTS {role};
             CREATE ROLE {role} NOLOGIN;
             DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO {role}', current_schema()); END $$;
             GRANT SELECT, INSERT, UPDATE ON orders TO {role};
             ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
             CREATE POLICY read_all ON orders FOR SELECT USING (true);
             CREATE POLICY insert_all ON orders FOR INSERT WITH CHECK (true);
             CREATE POLICY update_open ON orders FOR UPDATE USING (status <> 'frozen');"
        ))
        .unwrap();
        let w = &mut w();
        // `ExecuteSql` takes a `&'static str` (the async call may outlive the borrow);
        // one leaked statement a test.
        let set_role: &'static str = Box::leak(format!("SET ROLE {role}").into_boxed_str());
        w.execute(set_role).unwrap();

        assert_frozen_order_refuses_updates!(conn, &mut *w);
        w.execute("RESET ROLE").unwrap();
    }

    /// Drops the test's role even when the test fails; roles outlive schemas.
    struct DropRole(String, String);

    impl Drop for DropRole {
        fn drop(&mut self) {
            if let Ok(mut admin) = diesel::PgConnection::establish(&self.1) {
                let _ = admin.batch_execute(&format!(
                    "DROP OWNED BY {0}; DROP ROLE IF EXISTS {0}",
                    self.0
                ));
            }
        }
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        update_skipped_by_a_trigger_is_refused_not_a_conflict,
        update_hidden_by_row_level_security_is_refused_not_a_conflict,
    );
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    type Conn = diesel::SqliteConnection;
    type Db = common::TestDb<Conn>;

    fn db() -> Option<Db> {
        common::sqlite()
    }

    type ValueIs = dsl::Eq<counters::value, i64>;

    fn update_ignored_by_a_trigger_is_refused_not_a_conflict<W: Update<Order, NoteIs>>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TRIGGER orders_frozen BEFORE UPDATE ON orders WHEN OLD.status = 'frozen'
                 BEGIN SELECT RAISE(IGNORE); END;",
        )
        .unwrap();

        assert_frozen_order_refuses_updates!(conn, &mut w());
    }

    /// SQLite keeps 32768 in a SMALLINT column; read as `i16` it is -32768, which the
    /// stored value never equals.
    fn token_out_of_the_field_types_range_is_refused_not_a_conflict<W: Update<Counter, ValueIs>>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let conn = &mut db.conn();
        conn.batch_execute("INSERT INTO counters (name, value, revision) VALUES ('c', 0, 32768)")
            .unwrap();
        let counter: Counter = counters::table
            .select(Counter::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(counter.rev, i16::MIN);

        let err = w().update(&counter, counters::value.eq(1)).unwrap_err();

        assert!(
            matches!(
                err,
                Error::Refused {
                    table: "counters",
                    token: Token::Version(-32768),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.is_retryable());
        let value: i64 = counters::table.select(counters::value).first(conn).unwrap();
        assert_eq!(value, 0, "nothing written");
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        update_ignored_by_a_trigger_is_refused_not_a_conflict,
        token_out_of_the_field_types_range_is_refused_not_a_conflict,
    );
}
