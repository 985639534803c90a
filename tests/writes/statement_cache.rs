//! Guarded updates are prepared once per changeset shape and reused, like hand-written
//! diesel queries with a static shape, and a changeset whose `None` fields leave columns
//! out never reuses the statement of another shape. Each body runs on both drivers (the
//! blocking API and the async one).

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::drivers::{Instrument, Update};
use common::models::{Order, OrderPatch};
use common::schema::orders;
use diesel::connection::InstrumentationEvent;
use diesel::prelude::*;

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn each_changeset_shape_is_prepared_once_and_reused_correctly<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Instrument + Update<Order, &'static OrderPatch>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let prepared = Arc::new(Mutex::new(Vec::<String>::new()));
        let recorder = Arc::clone(&prepared);
        w.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::CacheQuery { sql, .. } = event {
                recorder.lock().unwrap().push(sql.to_owned());
            }
        });
        let mut order = Order::new(1, "new");
        diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();

        // `'static`, as the async driver's changes on SQLite must be.
        let patches: &'static [OrderPatch; 7] = Box::leak(Box::new([
            OrderPatch { note: Some("a".into()), quantity: None },
            OrderPatch { note: Some("b".into()), quantity: None },
            OrderPatch { note: None, quantity: Some(2) },
            OrderPatch { note: Some("c".into()), quantity: Some(3) },
            OrderPatch { note: None, quantity: None },
            OrderPatch { note: Some("d".into()), quantity: None },
            OrderPatch { note: None, quantity: Some(4) },
        ]));
        for patch in patches {
            order.version = w.update(&order, patch).unwrap();
            order.note = patch.note.clone().unwrap_or(order.note);
            order.quantity = patch.quantity.unwrap_or(order.quantity);
            let stored: Order = orders::table.find(1).select(Order::as_select()).first(conn).unwrap();
            assert_eq!(stored, order, "after {patch:?}");
        }

        let updates: Vec<String> = prepared
            .lock()
            .unwrap()
            .iter()
            .filter(|sql| sql.starts_with("UPDATE"))
            .cloned()
            .collect();
        let shapes: BTreeSet<&String> = updates.iter().collect();
        assert_eq!(updates.len(), 4, "one statement per shape (note, quantity, both, neither): {updates:#?}");
        assert_eq!(shapes.len(), 4, "no shape prepared twice: {updates:#?}");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        each_changeset_shape_is_prepared_once_and_reused_correctly,
    );
}
