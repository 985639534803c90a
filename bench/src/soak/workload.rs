//! The soak's workload, compiled per backend: blocking threads on the library's r2d2
//! pool and tokio tasks on bb8 and deadpool pools of diesel-async connections, mixed on
//! the same keys, each call recorded before it is sent and after it answers. A round's
//! keys are data rows ([`rows`]), orders of the claim queue ([`orders`]) and locks
//! ([`locks`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel_occ::asynchronous::AsyncConnectionSource;

use super::check::CLAIMS;
use super::history::{Recorder, What};
use super::locks::LockState;
use super::model::{Kind, Op, Ret};
use super::outcome::judged;
use super::{locks, orders, rows, SoakSettings};
use crate::backend::per_backend;

/// Hands out the operations of a run: their number, and each one's key. Keys live for
/// one round (`ops_per_round` operations on `keys_per_round` keys), then new ones begin,
/// so that each key's history stays small enough to judge exactly. It also counts the
/// pools that workers held exhausted.
pub struct Plan {
    started: AtomicU64,
    /// Set when the test bed failed under the run (an outage command that did not bring
    /// it back): the workers stop, and the run fails.
    ended: AtomicBool,
    exhaustions: AtomicU64,
    total: u64,
    deadline: Option<Instant>,
    keys_per_round: u64,
    ops_per_round: u64,
}

impl Plan {
    pub fn new(settings: &SoakSettings) -> Self {
        Plan {
            started: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            exhaustions: AtomicU64::new(0),
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
        if self.ended.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d)
        {
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

    /// The kind of `key`: of each round's keys, ten in sixteen are data rows, three orders
    /// and three locks.
    pub fn kind_of(&self, key: i64) -> Kind {
        let sixteenths = ((key - 1) as u64 % self.keys_per_round) * 16 / self.keys_per_round;
        match sixteenths {
            0..=9 => Kind::Row,
            10..=12 => Kind::Order,
            _ => Kind::Lock,
        }
    }

    /// Every key of `kind` the run can hand out.
    pub fn keys_of(&self, kind: Kind) -> impl Iterator<Item = i64> + '_ {
        let rounds = self.total / self.ops_per_round + 1;
        (1..=(rounds * self.keys_per_round) as i64).filter(move |k| self.kind_of(*k) == kind)
    }

    /// Counts a pool held exhausted (`whole`: every connection of it taken).
    pub fn count_exhaustion(&self, whole: bool) {
        if whole {
            self.exhaustions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Pools held exhausted so far.
    pub fn exhaustions(&self) -> u64 {
        self.exhaustions.load(Ordering::Relaxed)
    }

    /// Whether every operation was handed out (or the time is up).
    pub fn is_over(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
            || self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.started.load(Ordering::Relaxed) >= self.total
    }

    /// Ends the run early: no operation is handed out after this.
    pub fn end_early(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Operations handed out so far.
    pub fn done(&self) -> u64 {
        self.started.load(Ordering::Relaxed).min(self.total)
    }

    /// Waits until the workers began (the tables are there and the pools filled), or
    /// `stop`: faults start only then, so that none hits the run's own set-up.
    pub fn await_start(&self, stop: &AtomicBool) {
        while self.started.load(Ordering::Relaxed) == 0 && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Who a worker is: its id, the generation of its caller id, and its random choices.
pub struct Worker {
    pub id: u64,
    generation: u64,
    claims_made: u64,
    /// With the pool-exhaustion fault: every this many of its calls, the worker takes
    /// every connection of its pool and holds them past the pool's checkout timeout.
    pub exhaust: Option<(u64, usize)>,
    calls: u64,
    rng: fastrand::Rng,
}

impl Worker {
    pub fn new(id: u64, seed: u64) -> Self {
        Worker {
            id,
            generation: 0,
            claims_made: 0,
            exhaust: None,
            calls: 0,
            rng: fastrand::Rng::with_seed(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }

    /// How many connections to take and hold before the next call, if it is time to.
    fn exhausting(&mut self) -> Option<usize> {
        self.calls += 1;
        let (every, size) = self.exhaust?;
        (self.calls % every == 0).then_some(size)
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

/// A copy of a data row, as the worker chooses a write from it.
pub trait Versioned {
    fn version(&self) -> i64;
}

/// What a worker keeps between its calls: its copies of data rows (`R`), the orders it
/// claimed (with the owner it claimed them as), and the locks it holds (guards `G`).
pub struct State<R, G> {
    copies: HashMap<i64, R>,
    claims: Vec<(i64, String)>,
    locks: LockState<G>,
}

impl<R, G> Default for State<R, G> {
    fn default() -> Self {
        State {
            copies: HashMap::new(),
            claims: Vec::new(),
            locks: LockState::default(),
        }
    }
}

impl<R, G> State<R, G> {
    /// The next call, or `None` when the plan is over and no lock is held: once the plan
    /// is over, the release of each lock still held.
    fn next(&self, worker: &mut Worker, plan: &Plan) -> Option<(i64, Op)>
    where
        R: Versioned,
    {
        match plan.next(&mut worker.rng) {
            Some(key) => Some(self.choose(worker, plan, key)),
            None => {
                let (&key, holding) = self.locks.held.iter().next()?;
                Some((key, holding.release()))
            }
        }
    }

    /// The next call on a key the plan handed out: its key (a claim's is [`CLAIMS`], a
    /// claimed order's may be of an earlier round) and operation.
    fn choose(&self, worker: &mut Worker, plan: &Plan, key: i64) -> (i64, Op)
    where
        R: Versioned,
    {
        let rng = &mut worker.rng;
        match plan.kind_of(key) {
            Kind::Row => (
                key,
                rows::choose(rng, self.copies.get(&key).map(R::version)),
            ),
            Kind::Lock => (key, self.locks.choose(rng, key)),
            Kind::Order if !self.claims.is_empty() && rng.bool() => {
                let (order, owner) = self.claims[rng.usize(0..self.claims.len())].clone();
                if rng.u8(0..100) < 40 {
                    (order, Op::Heartbeat { owner })
                } else {
                    (order, Op::Finish { owner })
                }
            }
            Kind::Order => match rng.u8(0..100) {
                0..=29 => (
                    key,
                    Op::Place {
                        amount: rng.i64(0..1000),
                    },
                ),
                30..=49 => {
                    worker.claims_made += 1;
                    let owner = format!("w{}-{}", worker.id, worker.claims_made);
                    (CLAIMS, Op::Claim { owner })
                }
                50..=64 => (key, Op::Ship),
                65..=79 => (key, Op::Cancel),
                _ => (key, Op::LoadOrder),
            },
        }
    }

    /// What the worker learns from an answer: a copy it can no longer trust, a claim it
    /// no longer holds.
    fn learn(&mut self, key: i64, op: &Op, answer: Option<&Result<Ret, diesel_occ::Error>>) {
        let kept = matches!(
            answer,
            Some(Ok(_) | Err(diesel_occ::Error::NotFound { .. }))
        );
        match op {
            _ if op.kind() == Kind::Row && !kept => {
                self.copies.remove(&key);
            }
            Op::Finish { owner } => self.claims.retain(|c| (c.0, &c.1) != (key, owner)),
            Op::Heartbeat { owner } if !matches!(answer, Some(Ok(_))) => {
                self.claims.retain(|c| (c.0, &c.1) != (key, owner))
            }
            _ => {}
        }
    }
}

/// How the soak's async pools open connections, as a user of each backend would: on
/// MySQL with the library's session settings (on Galera, causal reads).
pub trait AsyncManager: diesel_async::AsyncConnection + 'static {
    fn manager(url: &str) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<Self>;
}

#[cfg(feature = "postgres")]
impl AsyncManager for diesel_async::AsyncPgConnection {
    fn manager(url: &str) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<Self> {
        // The blocking pools' reply timeout, on the async ones too.
        let bound = diesel_occ::PoolConfig::default()
            .reply_timeout
            .expect("a default bound");
        diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(
            url,
            diesel_occ::asynchronous::manager_config_with_reply_timeout(bound),
        )
    }
}

#[cfg(feature = "sqlite")]
impl AsyncManager
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
    fn manager(url: &str) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<Self> {
        diesel_async::pooled_connection::AsyncDieselConnectionManager::new(url)
    }
}

#[cfg(feature = "mysql")]
impl AsyncManager for diesel_async::AsyncMysqlConnection {
    fn manager(url: &str) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<Self> {
        let settings = diesel_occ::MysqlSettings {
            idle_session_timeout: diesel_occ::PoolConfig::default().idle_session_timeout,
        };
        diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(
            url,
            settings.async_manager_config(diesel_occ::PoolConfig::default().reply_timeout),
        )
    }
}

/// How long an exhausted pool stays exhausted: longer than its checkout timeout.
pub const EXHAUSTED_FOR: Duration = Duration::from_millis(2_500);

/// How long a worker waits after its pool had no connection for it (the server down, say),
/// as a client backs off, rather than spending the run's operations on a dead server.
pub const AFTER_NO_CONNECTION: Duration = Duration::from_millis(100);

/// The checkout timeout of the soak's pools.
pub const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(2);

/// Records the orders a claim for `owner` handed out, each on its own key as a call of
/// `caller` from the claim's start (`at`) to now; the claim's own answer.
fn claimed(
    recorder: &Recorder,
    caller: u64,
    at: u64,
    owner: &str,
    driver: &str,
    taken: Vec<(i64, i64)>,
    claims: &mut Vec<(i64, String)>,
) -> Ret {
    for &(order, version) in &taken {
        let op = Op::Claimed {
            owner: owner.to_string(),
        };
        recorder.record_at(
            Some(at),
            caller,
            order,
            What::Invoke {
                op,
                driver: driver.into(),
            },
        );
        let ret = Ret::Taken { version };
        recorder.record(
            caller,
            order,
            What::Return {
                ret,
                outcome: "ok".into(),
                error: None,
            },
        );
        claims.push((order, owner.to_string()));
    }
    Ret::Claims {
        taken: taken.into_iter().map(|(order, _)| order).collect(),
    }
}

per_backend! {
    uses(rows, orders, locks)

    /// A blocking worker: calls until the plan is done, then releases the locks it holds.
    pub fn blocking_worker(mut worker: Worker, pool: &Pool, plan: &Plan, recorder: &Recorder, broken: bool) {
        let lock_api = diesel_occ::Locks::new(pool.clone());
        let mut state = State::<rows::SoakRow, locks::Guard>::default();
        while let Some((key, op)) = state.next(&mut worker, plan) {
            if let Some(size) = worker.exhausting() {
                let held: Vec<_> = (0..size).filter_map(|_| pool.get().ok()).collect();
                std::thread::sleep(EXHAUSTED_FOR);
                plan.count_exhaustion(held.len() == size);
            }
            let caller = worker.caller();
            let at = recorder.record(caller, key, What::Invoke { op: op.clone(), driver: "blocking".into() });
            let connection = || pool.get().map_err(|e| diesel_occ::Error::Pool(Box::new(e)));
            let answer = match &op {
                Op::Claim { owner } => connection()
                    .and_then(|mut conn| orders::claim_blocking(&mut conn, owner))
                    .map(|taken| claimed(recorder, caller, at, owner, "blocking", taken, &mut state.claims)),
                _ => match op.kind() {
                    Kind::Row => connection().and_then(|mut conn| rows::call_blocking(&mut conn, key, &op, &mut state.copies, broken)),
                    Kind::Order => connection().and_then(|mut conn| orders::call_blocking(&mut conn, key, &op)),
                    Kind::Lock => locks::call_blocking(&lock_api, pool, &mut state.locks, key, &op),
                },
            };
            state.learn(key, &op, Some(&answer));
            if matches!(answer, Err(diesel_occ::Error::Pool(_))) {
                std::thread::sleep(AFTER_NO_CONNECTION);
            }
            worker.ended(recorder, caller, key, judged(&op, answer, rows::current_row));
        }
    }

    /// An async worker on pool `P` (bb8 or deadpool): calls until the plan is done, then
    /// releases the locks it holds. One call in `drop_one_in` is dropped after a random
    /// wait (a client that gave up): its effect is unknown.
    pub async fn async_worker<P>(mut worker: Worker, pool: P, plan: &Plan, recorder: &Recorder, drop_one_in: u32, driver: &str)
    where
        P: AsyncConnectionSource<Connection = AsyncConn>,
    {
        let lock_api = diesel_occ::asynchronous::AsyncLocks::new(pool.clone());
        let mut state = State::<rows::SoakRow, locks::AsyncGuard<P>>::default();
        while let Some((key, op)) = state.next(&mut worker, plan) {
            let ending = matches!(op, Op::Release { .. } | Op::ReleaseLease { .. }) && plan.is_over();
            if let Some(size) = worker.exhausting() {
                let mut held = Vec::new();
                for _ in 0..size {
                    held.extend(pool.checkout().await.ok());
                }
                tokio::time::sleep(EXHAUSTED_FOR).await;
                plan.count_exhaustion(held.len() == size);
            }
            let caller = worker.caller();
            // Never a release at the end: its guard would be released on drop, unrecorded.
            let give_up = (drop_one_in > 0 && !ending && worker.rng.u32(0..drop_one_in) == 0)
                .then(|| Duration::from_micros(worker.rng.u64(0..3_000)));
            let at = recorder.record(caller, key, What::Invoke { op: op.clone(), driver: driver.into() });
            let (state_ref, op_ref) = (&mut state, &op);
            let call = async {
                match op_ref {
                    Op::Claim { owner } => {
                        let mut conn = pool.checkout().await?;
                        let taken = orders::claim_async(&mut conn, owner).await?;
                        Ok(claimed(recorder, caller, at, owner, driver, taken, &mut state_ref.claims))
                    }
                    _ => match op_ref.kind() {
                        Kind::Row => rows::call_async(&mut *pool.checkout().await?, key, op_ref, &mut state_ref.copies).await,
                        Kind::Order => orders::call_async(&mut *pool.checkout().await?, key, op_ref).await,
                        Kind::Lock => locks::call_async(&lock_api, &pool, &mut state_ref.locks, key, op_ref).await,
                    },
                }
            };
            let answer = match give_up {
                Some(after) => tokio::time::timeout(after, call).await.ok(),
                None => Some(call.await),
            };
            state.learn(key, &op, answer.as_ref());
            if matches!(answer, Some(Err(diesel_occ::Error::Pool(_)))) {
                tokio::time::sleep(AFTER_NO_CONNECTION).await;
            }
            let what = match answer {
                Some(answer) => judged(&op, answer, rows::current_row),
                None => What::Unknown { outcome: "dropped".into(), error: None },
            };
            worker.ended(recorder, caller, key, what);
        }
    }

    /// Fresh tables for the run's keys.
    pub fn prepare(url: &str, plan: &Plan) -> Result<(), Box<dyn std::error::Error>> {
        let mut conn = crate::backend::establish::<Conn>(url)?;
        rows::prepare(&mut conn)?;
        orders::prepare(&mut conn)?;
        locks::prepare(&mut conn, plan.keys_of(Kind::Lock))?;
        Ok(())
    }

    /// What the lock audit says of the run.
    pub fn audit(url: &str) -> Result<super::locks::Audit, Box<dyn std::error::Error>> {
        let mut conn = crate::backend::establish::<Conn>(url)?;
        Ok(locks::audit(&mut conn)?)
    }

    /// The soak's bb8 pool of diesel-async connections.
    pub type Bb8Pool = diesel_async::pooled_connection::bb8::Pool<AsyncConn>;

    /// A bb8 pool of `size` diesel-async connections.
    pub async fn bb8_pool(url: &str, size: u32) -> Result<Bb8Pool, Box<dyn std::error::Error>> {
        let manager = <AsyncConn as AsyncManager>::manager(url);
        // bb8's defaults, as a service has them: each check-out is tested with a query,
        // which evicts a killed connection.
        Ok(diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(size)
            .connection_timeout(CHECKOUT_TIMEOUT)
            .build(manager)
            .await?)
    }

    /// A deadpool pool of `size` diesel-async connections.
    pub fn deadpool_pool(url: &str, size: usize) -> Result<diesel_async::pooled_connection::deadpool::Pool<AsyncConn>, Box<dyn std::error::Error>> {
        let manager = <AsyncConn as AsyncManager>::manager(url);
        Ok(diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(size)
            .wait_timeout(Some(CHECKOUT_TIMEOUT))
            .runtime(deadpool::Runtime::Tokio1)
            .build()?)
    }
}
