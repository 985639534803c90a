//! A write that matches no row although the row is still at the expected token was
//! refused or ignored by the database: `Error::Refused`, never a retryable conflict
//! (a retry loop would never end).
//!
//! MySQL / MariaDB have no way to skip an `UPDATE` silently (a trigger can only fail it,
//! and there is no row-level security), so these cases exist on PostgreSQL and SQLite.

use crate::common;

use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Error, GuardedWrite, Token};

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

/// Inserts an order whose status is "frozen" (which the test's trigger or policy guards),
/// updates it (on `$conn`, or with `$update`, given the connection and the order: the
/// async path), and checks the outcome is `Refused` with nothing written.
macro_rules! assert_frozen_order_refuses_updates {
    ($conn:expr) => {
        assert_frozen_order_refuses_updates!($conn, |conn: &mut _, order: &Order| order
            .guarded_update(conn, orders::note.eq("edited")))
    };
    ($conn:expr, $update:expr) => {{
        let conn = $conn;
        let order = Order {
            status: "frozen".into(),
            ..Order::new(1, "new")
        };
        diesel::insert_into(orders::table)
            .values(&order)
            .execute(conn)
            .unwrap();

        let err = ($update)(&mut *conn, &order).unwrap_err();

        assert_refused_at(&err, 0);
        let stored: Order = orders::table
            .select(Order::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, order);
    }};
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[test]
    fn update_skipped_by_a_trigger_is_refused_not_a_conflict() {
        let Some(db) = common::postgres() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE FUNCTION skip_row() RETURNS trigger AS $$ BEGIN RETURN NULL; END $$ \
                 LANGUAGE plpgsql;
             CREATE TRIGGER orders_frozen BEFORE UPDATE ON orders FOR EACH ROW
                 WHEN (OLD.status = 'frozen') EXECUTE FUNCTION skip_row();",
        )
        .unwrap();

        assert_frozen_order_refuses_updates!(conn);
    }

    /// The same refusal on the async path: PostgreSQL applies no commit late, so the
    /// async driver, like the blocking one, reports `Refused` (on a Galera node both ask
    /// the node and retry, see the cluster tests).
    #[cfg(all(
        feature = "async",
        any(not(feature = "mysql"), feature = "async-mysql")
    ))]
    #[test]
    fn update_skipped_by_a_trigger_is_refused_not_a_conflict_on_the_async_path() {
        use diesel_occ::asynchronous::AsyncGuardedWrite;
        let Some(db) = common::postgres() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE FUNCTION skip_row() RETURNS trigger AS $$ BEGIN RETURN NULL; END $$ \
                 LANGUAGE plpgsql;
             CREATE TRIGGER orders_frozen BEFORE UPDATE ON orders FOR EACH ROW
                 WHEN (OLD.status = 'frozen') EXECUTE FUNCTION skip_row();",
        )
        .unwrap();
        let runtime = common::paths::runtime();
        let mut async_conn =
            <diesel::PgConnection as common::paths::AsyncOf>::connect(&db.url, &runtime);

        assert_frozen_order_refuses_updates!(conn, |_: &mut _, order: &Order| runtime.block_on(
            AsyncGuardedWrite::guarded_update(order, &mut async_conn, orders::note.eq("edited"))
        ));
    }

    /// A policy that lets a role read every row but update only open ones. Superusers
    /// bypass row-level security, so the test switches to a role of its own.
    #[test]
    fn update_hidden_by_row_level_security_is_refused_not_a_conflict() {
        let Some(db) = common::postgres() else { return };
        let conn = &mut db.conn();
        let role = format!("occ_rls_{}", std::process::id());
        let _cleanup = DropRole(role.clone(), db.url.clone());
        conn.batch_execute(&format!(
            "DROP ROLE IF EXISTS {role};
             CREATE ROLE {role} NOLOGIN;
             DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO {role}', current_schema()); END $$;
             GRANT SELECT, INSERT, UPDATE ON orders TO {role};
             ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
             CREATE POLICY read_all ON orders FOR SELECT USING (true);
             CREATE POLICY insert_all ON orders FOR INSERT WITH CHECK (true);
             CREATE POLICY update_open ON orders FOR UPDATE USING (status <> 'frozen');
             SET ROLE {role};"
        ))
        .unwrap();

        assert_frozen_order_refuses_updates!(&mut *conn);
        conn.batch_execute("RESET ROLE").unwrap();
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
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    #[test]
    fn update_ignored_by_a_trigger_is_refused_not_a_conflict() {
        let db = common::sqlite().unwrap();
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TRIGGER orders_frozen BEFORE UPDATE ON orders WHEN OLD.status = 'frozen'
                 BEGIN SELECT RAISE(IGNORE); END;",
        )
        .unwrap();

        assert_frozen_order_refuses_updates!(conn);
    }

    /// SQLite keeps 32768 in a SMALLINT column; read as `i16` it is -32768, which the
    /// stored value never equals.
    #[test]
    fn token_out_of_the_field_types_range_is_refused_not_a_conflict() {
        let db = common::sqlite().unwrap();
        let conn = &mut db.conn();
        conn.batch_execute("INSERT INTO counters (name, value, revision) VALUES ('c', 0, 32768)")
            .unwrap();
        let counter: Counter = counters::table
            .select(Counter::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(counter.rev, i16::MIN);

        let err = counter
            .guarded_update(conn, counters::value.eq(1))
            .unwrap_err();

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
    }
}
