//! Writes by key and the token a client sent back (a form, an `If-Match` header), without
//! loading the row first: the same outcomes as writes of a loaded copy. Each body runs on
//! both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{DeleteByKey, UpdateByKey};
use common::models::Order;
use common::schema::orders;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Token};

/// The changes of a note update.
type Note = dsl::Eq<orders::note, &'static str>;

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn insert_order(conn: &mut diesel_occ::Pooled<Conn>, id: i64) {
        diesel::insert_into(orders::table).values(&Order::new(id, "new")).execute(conn).unwrap();
    }

    fn load_order(conn: &mut diesel_occ::Pooled<Conn>, id: i64) -> Option<Order> {
        orders::table.find(id).select(Order::as_select()).first(conn).optional().unwrap()
    }

    fn update_by_key_with_the_token_the_client_saw_writes_and_returns_the_next<W>(db: &Db, w: impl Fn() -> W)
    where
        W: UpdateByKey<Order, Note>,
    {
        let conn = &mut db.conn();
        insert_order(conn, 1);

        let next = w().update_by_key(&1, &0, orders::note.eq("from the form")).unwrap();

        assert_eq!(next, 1);
        let stored = load_order(conn, 1).unwrap();
        assert_eq!((stored.note.as_str(), stored.version), ("from the form", 1));
    }

    fn update_by_key_with_a_stale_token_conflicts_and_writes_nothing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: UpdateByKey<Order, Note>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        insert_order(conn, 1);
        w.update_by_key(&1, &0, orders::note.eq("first tab")).unwrap();

        let err = w.update_by_key(&1, &0, orders::note.eq("second tab")).unwrap_err();

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!((&conflict.expected, &conflict.found), (&Token::Version(0), &Token::Version(1)));
        assert_eq!(conflict.current::<Order>().unwrap().note, "first tab");
        assert_eq!(load_order(conn, 1).unwrap().note, "first tab");
    }

    fn update_by_key_of_a_missing_row_is_not_found<W: UpdateByKey<Order, Note>>(_: &Db, w: impl Fn() -> W) {
        let err = w().update_by_key(&7, &0, orders::note.eq("x")).unwrap_err();

        assert!(matches!(&err, Error::NotFound { table: "orders", key } if key == "7"), "{err:?}");
    }

    fn delete_by_key_needs_the_current_token<W>(db: &Db, w: impl Fn() -> W)
    where
        W: UpdateByKey<Order, Note> + DeleteByKey<Order>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        insert_order(conn, 1);
        w.update_by_key(&1, &0, orders::note.eq("edited")).unwrap();

        let stale = w.delete_by_key(&1, &0).unwrap_err();
        assert!(stale.as_conflict().is_some(), "{stale:?}");
        assert!(load_order(conn, 1).is_some());

        w.delete_by_key(&1, &1).unwrap();
        assert_eq!(load_order(conn, 1), None);
        let gone = w.delete_by_key(&1, &1).unwrap_err();
        assert!(matches!(gone, Error::NotFound { .. }), "{gone:?}");
    }

    fn a_token_at_its_maximum_is_refused_before_sending<W: UpdateByKey<Order, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, 1);

        let err = w().update_by_key(&1, &i64::MAX, orders::note.eq("x")).unwrap_err();

        assert!(matches!(&err, Error::VersionOverflow { current: Token::Version(v), .. } if *v == i128::from(i64::MAX)), "{err:?}");
        assert_eq!(load_order(conn, 1).unwrap().note, "new");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        update_by_key_with_the_token_the_client_saw_writes_and_returns_the_next,
        update_by_key_with_a_stale_token_conflicts_and_writes_nothing,
        update_by_key_of_a_missing_row_is_not_found,
        delete_by_key_needs_the_current_token,
        a_token_at_its_maximum_is_refused_before_sending,
    );
}
