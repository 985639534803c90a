//! `#[occ(exclude)]` fields (view counters, last-seen times): their writes neither check
//! nor advance the token, and a guarded save never overwrites them. Each body runs on
//! both drivers (the blocking API and the async one).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::drivers::{race, Read, Save, Update, WriteExcluded};
use common::models::Order;
use common::schema::orders;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded};

/// The changes that count a view.
type AddView = dsl::Eq<orders::views, dsl::Add<orders::views, i64>>;
/// The changes that set the view count.
type SetViews = dsl::Eq<orders::views, i64>;
/// The changes of a note update.
type Note = dsl::Eq<orders::note, &'static str>;
/// The changes of a note update to a note made at run time.
type NoteText = dsl::Eq<orders::note, String>;
/// The changes that set the view count and the version.
type ViewsAndVersion = (dsl::Eq<orders::views, i64>, dsl::Eq<orders::version, i64>);

/// An order as a page that counts its views sees it.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct TrackedOrder {
    id: i64,
    note: String,
    #[occ(exclude)]
    views: i64,
    #[occ(version)]
    version: i64,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled) -> TrackedOrder {
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(conn).unwrap();
        load(conn)
    }

    fn load(conn: &mut Pooled) -> TrackedOrder {
        orders::table.find(1).select(TrackedOrder::as_select()).first(conn).unwrap()
    }

    fn excluded_writes_neither_check_nor_advance_the_version<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<TrackedOrder> + WriteExcluded<TrackedOrder, AddView>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut order = insert(conn);
        let stale = order.clone();
        order.note = "edited".into();
        w.save(&mut order).unwrap();

        // A stale copy may still count a view, and that leaves the version alone.
        w.update_excluded(&stale, orders::views.eq(orders::views + 1)).unwrap();
        w.update_excluded_by_key(&1, orders::views.eq(orders::views + 1)).unwrap();

        let stored = load(conn);
        assert_eq!((stored.views, stored.version), (2, 1));
        // So the editor's copy is still current.
        order.note = "edited again".into();
        assert_eq!(w.save(&mut order).unwrap(), 2);
    }

    fn guarded_save_leaves_excluded_fields_alone<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<TrackedOrder> + WriteExcluded<TrackedOrder, AddView>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut order = insert(conn);
        for _ in 0..5 {
            w.update_excluded(&order, orders::views.eq(orders::views + 1)).unwrap();
        }

        order.note = "edited".into();
        w.save(&mut order).unwrap();

        assert_eq!(order.views, 0, "this copy never saw the views");
        assert_eq!(load(conn).views, 5, "the save did not write its stale count back");
    }

    fn update_excluded_refuses_guarded_columns_before_sending<W>(db: &Db, w: impl Fn() -> W)
    where
        W: WriteExcluded<TrackedOrder, Note> + WriteExcluded<TrackedOrder, ViewsAndVersion>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let order = insert(conn);

        for err in [
            WriteExcluded::<_, Note>::update_excluded(w, &order, orders::note.eq("sneaky")).unwrap_err(),
            WriteExcluded::<_, ViewsAndVersion>::update_excluded(
                w,
                &order,
                (orders::views.eq(9i64), orders::version.eq(5i64)),
            )
            .unwrap_err(),
        ] {
            assert!(matches!(&err, Error::NotExcluded { table: "orders", .. }), "{err:?}");
        }
        assert_eq!(load(conn), order, "nothing was written");
    }

    fn update_excluded_of_a_missing_row_is_not_found<W: WriteExcluded<TrackedOrder, SetViews>>(_: &Db, w: impl Fn() -> W) {
        let err = w().update_excluded_by_key(&3, orders::views.eq(1i64)).unwrap_err();

        assert!(matches!(&err, Error::NotFound { key, .. } if key == "3"), "{err:?}");
    }

    /// Four threads count views while four edit the note through the guard: every view
    /// is counted, and the version moved exactly once per successful edit.
    fn concurrent_views_and_edits_lose_nothing<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: WriteExcluded<TrackedOrder, AddView> + Read<TrackedOrder> + Update<TrackedOrder, NoteText>,
    {
        const PER_THREAD: usize = 20;
        insert(&mut db.conn());
        let edits = AtomicUsize::new(0);

        race(8, &w, |writer, w| {
            for i in 0..PER_THREAD {
                if writer % 2 == 0 {
                    w.update_excluded_by_key(&1, orders::views.eq(orders::views + 1)).unwrap();
                    continue;
                }
                loop {
                    let order = w.read(&1).unwrap();
                    match w.update(&order, orders::note.eq(format!("{writer}-{i}"))) {
                        Ok(_) => break,
                        Err(e) if e.is_retryable() => {}
                        Err(e) => panic!("{e}"),
                    };
                }
                edits.fetch_add(1, Ordering::Relaxed);
            }
        });

        let stored = load(&mut db.conn());
        assert_eq!(stored.views, (4 * PER_THREAD) as i64, "a lost view");
        assert_eq!(stored.version, edits.into_inner() as i64);
    }

    /// A write of excluded fields racing its row's insert either finds no row
    /// (`NotFound`) or writes: never a refusal. Its `UPDATE` can match nothing just
    /// before the insert commits, and the re-read that explains the miss then finds the
    /// row; nothing tells that apart from a trigger that skipped the row, so the write
    /// runs again, as a one-statement JSON merge does.
    fn an_excluded_write_racing_its_rows_insert_writes_or_finds_nothing<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: WriteExcluded<TrackedOrder, SetViews>,
    {
        const KEYS: i64 = 300;
        let (each_key, pool) = (std::sync::Barrier::new(2), &db.pool);
        let answers = race(2, &w, |t, w| {
            let mut wrong = Vec::new();
            for key in 1..=KEYS {
                each_key.wait();
                if t == 0 {
                    std::thread::sleep(std::time::Duration::from_micros((key as u64 * 37) % 400));
                    diesel::insert_into(orders::table).values(&Order::new(key, "new")).execute(&mut pool.get().unwrap()).unwrap();
                    continue;
                }
                loop {
                    match w.update_excluded_by_key(&key, orders::views.eq(key)) {
                        Ok(()) => break,
                        Err(Error::NotFound { .. }) => {}
                        Err(other) => {
                            wrong.push(format!("key {key}: {other}"));
                            break;
                        }
                    }
                }
            }
            wrong
        });
        let wrong: Vec<_> = answers.into_iter().flatten().collect();
        assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
        let conn = &mut db.conn();
        let views: Vec<(i64, i64)> = orders::table.select((orders::id, orders::views)).order(orders::id).load(conn).unwrap();
        let wrong: Vec<_> = views.iter().filter(|(id, views)| id != views).collect();
        assert!(wrong.is_empty(), "writes that answered Ok are not in their rows: {wrong:?}");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        an_excluded_write_racing_its_rows_insert_writes_or_finds_nothing,
        excluded_writes_neither_check_nor_advance_the_version,
        guarded_save_leaves_excluded_fields_alone,
        update_excluded_refuses_guarded_columns_before_sending,
        update_excluded_of_a_missing_row_is_not_found,
        concurrent_views_and_edits_lose_nothing,
    );
}
