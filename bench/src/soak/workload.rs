//! The soak's workload, compiled per backend: blocking threads on the library's r2d2
//! pool and tokio tasks on a bb8 pool of diesel-async connections, mixed, each call
//! recorded before it is sent and after it answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_occ::asynchronous as on_async;
use diesel_occ::prelude::*;
use serde_json::{json, Value};

use super::history::{Recorder, What};
use super::model::{Op, Ret, Row};
use super::outcome::{judged, loaded};
use super::SoakSettings;
use crate::backend::per_backend;

/// Hands out the operations of a run: their number, and each one's key. Keys live for
/// one round (`ops_per_round` operations on `keys_per_round` keys), then new ones begin,
/// so that each key's history stays small enough to judge exactly.
pub struct Plan {
    started: AtomicU64,
    total: u64,
    deadline: Option<Instant>,
    keys_per_round: u64,
    ops_per_round: u64,
}

impl Plan {
    pub fn new(settings: &SoakSettings) -> Self {
        Plan {
            started: AtomicU64::new(0),
            total: settings.ops,
            deadline: settings
                .seconds
                .map(|s| Instant::now() + Duration::from_secs_f64(s)),
            keys_per_round: settings.keys_per_round,
            ops_per_round: settings.ops_per_round,
        }
    }

    /// The key of the next operation, or `None` when the run is over.
    pub fn next(&self, rng: &mut fastrand::Rng) -> Option<i64> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        if n >= self.total {
            return None;
        }
        let round = n / self.ops_per_round;
        Some((round * self.keys_per_round + rng.u64(0..self.keys_per_round)) as i64 + 1)
    }

    /// The keys the operations of the current round address.
    pub fn current_keys(&self) -> std::ops::Range<i64> {
        let round = self.started.load(Ordering::Relaxed) / self.ops_per_round;
        let first = (round * self.keys_per_round) as i64 + 1;
        first..first + self.keys_per_round as i64
    }

    /// Operations handed out so far.
    pub fn done(&self) -> u64 {
        self.started.load(Ordering::Relaxed).min(self.total)
    }
}

/// The next operation on a key, given the copy a worker holds of it.
fn choose(rng: &mut fastrand::Rng, copy: Option<i64>) -> Op {
    let number = rng.i64(0..1000);
    let field = format!("f{}", rng.u8(0..4));
    match (rng.u8(0..100), copy) {
        (0..=19, _) | (20..=49, None) if rng.bool() => Op::Load,
        (20..=29, _) => Op::Insert { value: number },
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

/// What a worker keeps between its calls.
pub struct Worker {
    pub id: u64,
    generation: u64,
    rng: fastrand::Rng,
}

impl Worker {
    pub fn new(id: u64, seed: u64) -> Self {
        Worker {
            id,
            generation: 0,
            rng: fastrand::Rng::with_seed(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }

    /// The caller id of this worker's next call.
    fn caller(&self) -> u64 {
        self.id << 24 | self.generation
    }

    /// Records the end of a call; a call that never answered for certain retires this
    /// caller id (its call may still land while the worker goes on).
    fn ended(&mut self, recorder: &Recorder, caller: u64, key: i64, what: What) {
        let unknown = matches!(what, What::Unknown { .. });
        recorder.record(caller, key, what);
        if unknown {
            self.generation += 1;
        }
    }
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

    pub type AsyncPool = diesel_async::pooled_connection::bb8::Pool<AsyncConn>;

    fn row(r: &SoakRow) -> Row {
        Row { version: r.version, value: r.value, doc: fields(&r.doc) }
    }

    fn current_row(conflict: &diesel_occ::Conflict) -> Option<Row> {
        conflict.current::<SoakRow>().map(row)
    }

    /// A fresh table.
    pub fn prepare(url: &str) -> Result<(), Box<dyn std::error::Error>> {
        let mut conn = Conn::establish(url)?;
        crate::backend::recreate(
            &mut conn,
            "soak_rows",
            &format!("id BIGINT PRIMARY KEY, version BIGINT NOT NULL, value BIGINT NOT NULL, doc {JSON_DDL} NOT NULL"),
        )?;
        Ok(())
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
    fn call_blocking(conn: &mut Conn, key: i64, op: &Op, copies: &mut HashMap<i64, SoakRow>, broken: bool) -> Result<Ret, diesel_occ::Error> {
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
            (_, None) => unreachable!("writes from a copy are chosen only with one"),
        };
        Ok(ret)
    }

    /// A blocking worker: calls until the plan is done.
    pub fn blocking_worker(mut worker: Worker, pool: &Pool, plan: &Plan, recorder: &Recorder, broken: bool) {
        let mut copies = HashMap::new();
        while let Some(key) = plan.next(&mut worker.rng) {
            let op = choose(&mut worker.rng, copies.get(&key).map(|c: &SoakRow| c.version));
            let caller = worker.caller();
            recorder.record(caller, key, What::Invoke { op: op.clone(), driver: "blocking".into() });
            let answer = match pool.get() {
                Ok(mut conn) => call_blocking(&mut conn, key, &op, &mut copies, broken),
                Err(e) => Err(diesel_occ::Error::Pool(Box::new(e))),
            };
            if !matches!(answer, Ok(_) | Err(diesel_occ::Error::NotFound { .. })) {
                copies.remove(&key);
            }
            worker.ended(recorder, caller, key, judged(answer, current_row));
        }
    }

    /// One call on the async API.
    async fn call_async(conn: &mut AsyncConn, key: i64, op: &Op, copies: &mut HashMap<i64, SoakRow>) -> Result<Ret, diesel_occ::Error> {
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
            (_, None) => unreachable!("writes from a copy are chosen only with one"),
        };
        Ok(ret)
    }

    /// An async worker: calls until the plan is done. One call in `drop_one_in` is
    /// dropped after a random wait (a client that gave up): its effect is unknown.
    pub async fn async_worker(mut worker: Worker, pool: AsyncPool, plan: &Plan, recorder: &Recorder, drop_one_in: u32) {
        let mut copies = HashMap::new();
        while let Some(key) = plan.next(&mut worker.rng) {
            let op = choose(&mut worker.rng, copies.get(&key).map(|c: &SoakRow| c.version));
            let caller = worker.caller();
            let give_up = (drop_one_in > 0 && worker.rng.u32(0..drop_one_in) == 0)
                .then(|| Duration::from_micros(worker.rng.u64(0..3_000)));
            recorder.record(caller, key, What::Invoke { op: op.clone(), driver: "async".into() });
            let call = async {
                match pool.get().await {
                    Ok(mut conn) => call_async(&mut conn, key, &op, &mut copies).await,
                    Err(e) => Err(diesel_occ::Error::Pool(Box::new(e))),
                }
            };
            let answer = match give_up {
                Some(after) => tokio::time::timeout(after, call).await.ok(),
                None => Some(call.await),
            };
            let what = match answer {
                Some(answer) => {
                    if !matches!(answer, Ok(_) | Err(diesel_occ::Error::NotFound { .. })) {
                        copies.remove(&key);
                    }
                    judged(answer, current_row)
                }
                None => {
                    copies.remove(&key);
                    What::Unknown { outcome: "dropped".into() }
                }
            };
            worker.ended(recorder, caller, key, what);
        }
    }

    /// A bb8 pool of `size` diesel-async connections.
    pub async fn async_pool(url: &str, size: u32) -> Result<AsyncPool, Box<dyn std::error::Error>> {
        let manager = diesel_async::pooled_connection::AsyncDieselConnectionManager::<AsyncConn>::new(url);
        // bb8's defaults, as a service has them: each check-out is tested with a query,
        // which evicts a killed connection (and, on MySQL, is not safe to drop half way:
        // RELIABILITY.md).
        Ok(diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(size)
            .connection_timeout(Duration::from_secs(10))
            .build(manager)
            .await?)
    }
}
