//! The soak's data rows: loads, guarded inserts, updates, saves, upserts and deletes from
//! a worker's copy, `modify`, and both JSON merges, on both drivers, answered in the model's
//! terms.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::asynchronous as on_async;
use diesel_occ::prelude::*;
use serde_json::{json, Value};

use super::model::{Op, Ret, Row};
use super::outcome::loaded;
use crate::backend::per_backend;

/// The next operation on a key, given the copy a worker holds of it.
pub fn choose(rng: &mut fastrand::Rng, copy: Option<i64>) -> Op {
    let number = rng.i64(0..1000);
    let field = format!("f{}", rng.u8(0..4));
    match (rng.u8(0..100), copy) {
        (0..=19, _) | (20..=49, None) if rng.bool() => Op::Load,
        (20..=25, _) => Op::Insert { value: number },
        (26..=29, expected) => Op::Upsert {
            expected,
            value: number,
        },
        (30..=42, Some(expected)) => Op::Update {
            expected,
            value: number,
            save: false,
        },
        (43..=52, Some(expected)) => Op::Update {
            expected,
            value: number,
            save: true,
        },
        (53..=57, Some(expected)) => Op::Delete { expected },
        (58..=74, _) => Op::Add {
            add: rng.i64(1..10),
        },
        (75..=87, _) => Op::Merge {
            field,
            number,
            in_place: false,
        },
        (88..=99, _) => Op::Merge {
            field,
            number,
            in_place: true,
        },
        _ => Op::Load,
    }
}

/// The model's view of a document: its integer fields.
fn fields(doc: &Value) -> BTreeMap<String, i64> {
    doc.as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The retry policy of `modify` and `merge_json`: quick, and bounded.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(30)
        .first_delay(Duration::from_micros(200))
        .max_delay(Duration::from_millis(20))
}

per_backend! {
    diesel::table! {
        use diesel::sql_types::*;
        use super::JsonSql;

        soak_rows (id) {
            id -> BigInt,
            version -> BigInt,
            value -> BigInt,
            doc -> JsonSql,
        }
    }

    /// The row every operation of the soak works on.
    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = soak_rows)]
    pub struct SoakRow {
        pub id: i64,
        #[occ(version)]
        pub version: i64,
        pub value: i64,
        #[occ(json)]
        pub doc: Value,
    }

    impl super::super::workload::Versioned for SoakRow {
        fn version(&self) -> i64 {
            self.version
        }
    }

    fn row(r: &SoakRow) -> Row {
        Row { version: r.version, value: r.value, doc: fields(&r.doc) }
    }

    pub fn current_row(conflict: &diesel_occ::Conflict) -> Option<Row> {
        conflict.current::<SoakRow>().map(row)
    }

    /// A fresh table.
    pub fn prepare(conn: &mut Conn) -> Result<(), Box<dyn std::error::Error>> {
        crate::backend::recreate(
            conn,
            "soak_rows",
            &format!("id BIGINT PRIMARY KEY, version BIGINT NOT NULL, value BIGINT NOT NULL, doc {JSON_DDL} NOT NULL"),
        )?;
        Ok(())
    }

    /// What an upsert of `value` puts: the worker's copy of row `key` (a new one without
    /// it), with `value` and an empty document.
    fn upserted_copy(key: i64, copy: Option<SoakRow>, value: i64) -> SoakRow {
        let mut put = copy.unwrap_or(SoakRow { id: key, version: 0, value: 0, doc: json!({}) });
        put.value = value;
        put.doc = json!({});
        put
    }

    fn upserted_ret(upserted: diesel_occ::Upserted<i64>) -> Ret {
        let inserted = matches!(upserted, diesel_occ::Upserted::Inserted(_));
        Ret::Upserted { inserted, version: *upserted.token() }
    }

    /// The broken guard (`--broken-guard`): the update by key alone, told as landed.
    fn unguarded(conn: &mut Conn, key: i64, expected: i64, value: i64) -> Result<Ret, diesel_occ::Error> {
        let n = diesel::update(soak_rows::table.find(key))
            .set((soak_rows::value.eq(value), soak_rows::version.eq(expected + 1)))
            .execute(conn)?;
        Ok(if n == 0 { Ret::NotFound } else { Ret::Written { version: Some(expected + 1) } })
    }

    /// One call on the blocking API; `copy` is the worker's copy of the row, refreshed by
    /// what the call learnt.
    pub fn call_blocking(conn: &mut Conn, key: i64, op: &Op, copies: &mut HashMap<i64, SoakRow>, broken: bool) -> Result<Ret, diesel_occ::Error> {
        let copy = copies.get(&key).cloned();
        let ret = match (op, copy) {
            (Op::Load, _) => {
                let found = SoakRow::load_by_key(conn, &key)?;
                match &found { Some(r) => { copies.insert(key, r.clone()); } None => { copies.remove(&key); } }
                loaded(found.as_ref().map(row))
            }
            (Op::Insert { value }, _) => {
                let mut new = SoakRow { id: key, version: 0, value: *value, doc: json!({}) };
                let seed = new.guarded_insert(conn)?;
                copies.insert(key, new);
                Ret::Written { version: Some(seed) }
            }
            (Op::Upsert { value, .. }, copy) => {
                let mut put = upserted_copy(key, copy, *value);
                let upserted = put.guarded_upsert(conn)?;
                copies.insert(key, put);
                upserted_ret(upserted)
            }
            (Op::Update { expected, value, save }, Some(mut copy)) => {
                let token = if broken {
                    return unguarded(conn, key, *expected, *value);
                } else if *save {
                    copy.value = *value;
                    copy.guarded_save(conn)?
                } else {
                    copy.guarded_update(conn, soak_rows::value.eq(*value))?
                };
                Ret::Written { version: Some(token) }
            }
            (Op::Delete { .. }, Some(copy)) => {
                copy.guarded_delete(conn)?;
                copies.remove(&key);
                Ret::Written { version: None }
            }
            (Op::Add { add }, _) => {
                let add = *add;
                let m = SoakRow::modify(conn, &key, &policy(), |r| { r.value += add; Ok::<_, diesel_occ::Error>(()) })?;
                Ret::Added { version: m.token, value: m.row.value }
            }
            (Op::Merge { field, number, in_place }, _) => {
                let patch = json!({ field.as_str(): number });
                let token = if *in_place {
                    SoakRow::merge_json_in_place(conn, &key, soak_rows::doc, &patch)?
                } else {
                    SoakRow::merge_json(conn, &key, soak_rows::doc, &patch, &policy())?.token
                };
                Ret::Written { version: Some(token) }
            }
            _ => unreachable!("{op:?}: writes from a copy are chosen only with one, and only on a data row"),
        };
        Ok(ret)
    }

    /// One call on the async API.
    pub async fn call_async(conn: &mut AsyncConn, key: i64, op: &Op, copies: &mut HashMap<i64, SoakRow>) -> Result<Ret, diesel_occ::Error> {
        let copy = copies.get(&key).cloned();
        let ret = match (op, copy) {
            (Op::Load, _) => {
                let found = <SoakRow as on_async::AsyncLoadByKey<AsyncConn>>::load_by_key(conn, &key).await?;
                match &found { Some(r) => { copies.insert(key, r.clone()); } None => { copies.remove(&key); } }
                loaded(found.as_ref().map(row))
            }
            (Op::Insert { value }, _) => {
                let mut new = SoakRow { id: key, version: 0, value: *value, doc: json!({}) };
                let seed = <SoakRow as on_async::AsyncGuardedWrite>::guarded_insert(&mut new, conn).await?;
                copies.insert(key, new);
                Ret::Written { version: Some(seed) }
            }
            (Op::Upsert { value, .. }, copy) => {
                let mut put = upserted_copy(key, copy, *value);
                let upserted = <SoakRow as on_async::AsyncGuardedWrite>::guarded_upsert(&mut put, conn).await?;
                copies.insert(key, put);
                upserted_ret(upserted)
            }
            (Op::Update { value, save, .. }, Some(mut copy)) => {
                let token = if *save {
                    copy.value = *value;
                    <SoakRow as on_async::AsyncGuardedWrite>::guarded_save(&mut copy, conn).await?
                } else {
                    <SoakRow as on_async::AsyncGuardedWrite>::guarded_update(&copy, conn, soak_rows::value.eq(*value)).await?
                };
                Ret::Written { version: Some(token) }
            }
            (Op::Delete { .. }, Some(copy)) => {
                <SoakRow as on_async::AsyncGuardedWrite>::guarded_delete(&copy, conn).await?;
                copies.remove(&key);
                Ret::Written { version: None }
            }
            (Op::Add { add }, _) => {
                let add = *add;
                let m = <SoakRow as on_async::AsyncGuardedModify>::modify(conn, &key, &policy(), move |r: &mut SoakRow| { r.value += add; Ok::<_, diesel_occ::Error>(()) }).await?;
                Ret::Added { version: m.token, value: m.row.value }
            }
            (Op::Merge { field, number, in_place }, _) => {
                let patch = json!({ field.as_str(): number });
                let token = if *in_place {
                    <SoakRow as on_async::AsyncGuardedJson>::merge_json_in_place(conn, &key, soak_rows::doc, &patch).await?
                } else {
                    <SoakRow as on_async::AsyncGuardedJson>::merge_json(conn, &key, soak_rows::doc, &patch, &policy()).await?.token
                };
                Ret::Written { version: Some(token) }
            }
            _ => unreachable!("{op:?}: writes from a copy are chosen only with one, and only on a data row"),
        };
        Ok(ret)
    }

}
