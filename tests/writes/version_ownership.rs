//! The version column belongs to the library: a changeset may not assign it, and a
//! version changed behind the library's back is caught, never overwritten. Each body runs
//! on both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{Save, Update};
use common::models::Order;
use common::schema::orders;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Token};

/// The changes of a note and version update.
type NoteAndVersion = (
    dsl::Eq<orders::note, &'static str>,
    dsl::Eq<orders::version, i64>,
);
/// The changes of a version update.
type SetVersion = dsl::Eq<orders::version, i64>;
/// The changes that add to the quantity.
type AddQuantity = dsl::Eq<orders::quantity, dsl::Add<orders::quantity, i32>>;

/// An entity that derives diesel's `AsChangeset` and so writes its version too.
#[derive(Debug, Clone, AsChangeset)]
#[diesel(table_name = orders)]
struct NoteWithVersion {
    note: String,
    version: i64,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn insert_order(conn: &mut diesel_occ::Pooled<Conn>, id: i64) -> Order {
        let order = Order::new(id, "new");
        diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();
        order
    }

    fn load_order(conn: &mut diesel_occ::Pooled<Conn>, id: i64) -> Order {
        orders::table.find(id).select(Order::as_select()).first(conn).unwrap()
    }

    /// PostgreSQL would fail with "multiple assignments to same column"; MySQL and SQLite
    /// would keep one of the two values silently. Every backend refuses it the same way.
    fn changeset_that_sets_the_version_is_refused_before_sending<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Order, &'static NoteWithVersion>
            + Update<Order, NoteAndVersion>
            + Update<Order, SetVersion>
            + Update<Order, AddQuantity>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let order = insert_order(conn, 1);

        // `'static`, as the async driver's changes on SQLite must be.
        let derived: &'static NoteWithVersion =
            Box::leak(Box::new(NoteWithVersion { note: "edited".into(), version: 41 }));
        let tuple = (orders::note.eq("edited"), orders::version.eq(41i64));
        for err in [
            Update::<_, &NoteWithVersion>::update(w, &order, derived).unwrap_err(),
            Update::<_, NoteAndVersion>::update(w, &order, tuple).unwrap_err(),
            Update::<_, SetVersion>::update(w, &order, orders::version.eq(41i64)).unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::ChangesetAssignsGuard { table: "orders", column } if column == "version"),
                "{err:?}"
            );
            assert!(!err.is_retryable());
        }
        assert_eq!(load_order(conn, 1), order, "nothing was written");

        // Expressions that merely read the version are fine.
        let version = Update::<_, AddQuantity>::update(w, &order, orders::quantity.eq(orders::quantity + 6)).unwrap();
        assert_eq!((version, load_order(conn, 1).quantity), (1, 7));
    }

    /// The library owns the version column: it binds the next version itself and returns
    /// it without a re-read. A trigger that changes the version behind its back makes the
    /// returned version stale; the next write of that copy then conflicts (it never
    /// overwrites), and reports the version the row really has.
    fn version_changed_by_a_trigger_is_caught_by_the_next_write<W: Save<Order>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let trigger = match BACKEND {
            "postgres" => "CREATE FUNCTION bump_twice() RETURNS trigger AS $$
                               BEGIN NEW.version := OLD.version + 2; RETURN NEW; END $$ LANGUAGE plpgsql;
                           CREATE TRIGGER orders_bump BEFORE UPDATE ON orders FOR EACH ROW
                               EXECUTE FUNCTION bump_twice();",
            "mysql" => "CREATE TRIGGER orders_bump BEFORE UPDATE ON orders FOR EACH ROW
                            SET NEW.version = OLD.version + 2",
            _ => "CREATE TRIGGER orders_bump AFTER UPDATE ON orders
                      BEGIN UPDATE orders SET version = OLD.version + 2 WHERE id = NEW.id; END;",
        };
        diesel::connection::SimpleConnection::batch_execute(&mut **conn, trigger).unwrap();
        let mut order = insert_order(conn, 1);
        let w = &mut w();

        order.note = "first".into();
        assert_eq!(w.save(&mut order).unwrap(), 1, "what the library wrote");
        assert_eq!(load_order(conn, 1).version, 2, "what the trigger made of it");

        order.note = "second".into();
        let err = w.save(&mut order).unwrap_err();
        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!((&conflict.expected, &conflict.found), (&Token::Version(1), &Token::Version(2)));
        assert_eq!(load_order(conn, 1).note, "first");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        changeset_that_sets_the_version_is_refused_before_sending,
        version_changed_by_a_trigger_is_caught_by_the_next_write,
    );
}
