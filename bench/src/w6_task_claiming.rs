//! W6, task claiming at scale: a queue of Q open tasks, 8 workers each claiming a batch
//! of N, finishing it, and claiming again, until the time is up or the queue is empty.
//!
//! Strategies: the queue statements each backend's users write by hand, oldest task
//! first (PostgreSQL's `UPDATE ... WHERE id IN (SELECT ... ORDER BY id LIMIT n FOR UPDATE
//! SKIP LOCKED) RETURNING ...`, MySQL's locking read and `UPDATE` in a transaction,
//! SQLite's `UPDATE ... WHERE id IN (SELECT ... ORDER BY id LIMIT n) RETURNING ...`; the
//! finish one owner-checked `UPDATE` of the batch), and the library's `claim` in key
//! order and `finish_claims`. The table has the index such a queue needs: `(state, id)`
//! on PostgreSQL; `(state)` on MySQL and SQLite, which end it with the key themselves
//! (on SQLite the key is the rowid, an `INTEGER PRIMARY KEY`).
//!
//! Each point runs the strategies in the order A B B A, each run on a fresh queue (see
//! [`ROUND_ORDER`]). Reported per point: rows finished per second, the p99 latency of a claim, the rate at
//! Q = 1,000,000 against the rate at Q = 10,000 (it should not fall: the claim must walk
//! the queue's index and stop after N entries), and exactness read back
//! from the database: no row claimed twice, every claimed row done once by its claimer.
//! The query plans of both strategies' statements are in the summary.

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::prelude::*;
use diesel_occ::{ClaimOrder, ClaimRequest, Guarded, GuardedClaim, Status};

use crate::backend::{per_backend, recreate};
use crate::measure::Latencies;
use crate::report::{Record, Report};
use crate::Settings;

const STRATEGIES: [&str; 2] = [
    "hand-written queue statements",
    "library claim + finish_claims",
];

/// Workers claiming at once.
const WORKERS: usize = 8;

/// The order of the runs at each point, by index into [`STRATEGIES`]: each strategy runs
/// twice, first and last in turn (A B B A), and its rate is that of both runs together.
/// One run after the other, the second ran 10-15 % faster on MariaDB whichever strategy
/// it was (N = 10 on 1,000,000 rows, four pairs in both orders), which a single pair
/// would have counted as the strategies' difference.
const ROUND_ORDER: [usize; 4] = [0, 1, 1, 0];

diesel::table! {
    bench_tasks (id) {
        id -> BigInt,
        state -> Text,
        owner -> Nullable<Text>,
        claimed_at -> Nullable<Timestamp>,
        version -> BigInt,
        payload -> Text,
    }
}

/// The states of a task.
#[derive(Clone, Copy, PartialEq, Eq, Status)]
pub enum TaskState {
    #[occ(from(Running))]
    Open,
    #[occ(from(Open))]
    Running,
    #[occ(from(Running))]
    Done,
}

/// As its SQL literal: the plans inline the statements' bound values from their `Debug`.
impl std::fmt::Debug for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.name())
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = bench_tasks)]
pub struct Task {
    pub id: i64,
    #[occ(status)]
    pub state: TaskState,
    pub owner: Option<String>,
    pub claimed_at: Option<chrono::NaiveDateTime>,
    #[occ(version)]
    pub version: i64,
    pub payload: String,
}

/// What the hand-written claim writes: running, the owner, the database's now, the next
/// version.
#[allow(clippy::type_complexity)]
fn claimed_by(
    me: &str,
) -> (
    diesel::dsl::Eq<bench_tasks::state, &'static str>,
    diesel::dsl::Eq<bench_tasks::owner, &str>,
    diesel::dsl::Eq<bench_tasks::claimed_at, diesel::dsl::Nullable<diesel::dsl::now>>,
    diesel::dsl::Eq<bench_tasks::version, diesel::dsl::Add<bench_tasks::version, i64>>,
) {
    use bench_tasks as t;
    (
        t::state.eq("running"),
        t::owner.eq(me),
        t::claimed_at.eq(diesel::dsl::now.nullable()),
        t::version.eq(t::version + 1),
    )
}

/// The hand-written claim of each backend: what its users write.
trait HandQueue {
    fn claim_by_hand(&mut self, me: &str, n: i64) -> QueryResult<Vec<Task>>;
}

#[cfg(feature = "postgres")]
impl HandQueue for PgConnection {
    fn claim_by_hand(&mut self, me: &str, n: i64) -> QueryResult<Vec<Task>> {
        use crate::w6_task_claiming::bench_tasks as t;
        // diesel needs an alias to read the table it updates in a subquery.
        let waiting = diesel::alias!(bench_tasks as waiting);
        let open = waiting
            .select(waiting.field(t::id))
            .filter(waiting.field(t::state).eq("open"))
            .order(waiting.field(t::id))
            .limit(n)
            .for_update()
            .skip_locked();
        diesel::update(t::table.filter(t::id.eq_any(open)))
            .set(claimed_by(me))
            .returning(Task::as_returning())
            .get_results(self)
    }
}

#[cfg(feature = "sqlite")]
impl HandQueue for SqliteConnection {
    fn claim_by_hand(&mut self, me: &str, n: i64) -> QueryResult<Vec<Task>> {
        use crate::w6_task_claiming::bench_tasks as t;
        let waiting = diesel::alias!(bench_tasks as waiting);
        let open = waiting
            .select(waiting.field(t::id))
            .filter(waiting.field(t::state).eq("open"))
            .order(waiting.field(t::id))
            .limit(n);
        diesel::update(t::table.filter(t::id.eq_any(open)))
            .set(claimed_by(me))
            .returning(Task::as_returning())
            .get_results(self)
    }
}

/// `op` again while it fails with a deadlock (InnoDB picks a victim among queue
/// transactions that lock the state index in different orders), as MySQL users write it.
/// At most 100 tries, so that a plan that deadlocks every time cannot hang the run.
fn retry_deadlocks<T>(mut op: impl FnMut() -> QueryResult<T>) -> QueryResult<T> {
    use diesel::result::{DatabaseErrorKind, Error};
    let mut tries = 1;
    loop {
        match op() {
            Err(Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _))
                if tries < 100 =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

#[cfg(feature = "mysql")]
impl HandQueue for MysqlConnection {
    fn claim_by_hand(&mut self, me: &str, n: i64) -> QueryResult<Vec<Task>> {
        use crate::w6_task_claiming::bench_tasks as t;
        retry_deadlocks(|| {
            self.transaction(|conn| {
                let rows: Vec<Task> = t::table
                    .filter(t::state.eq("open"))
                    .select(Task::as_select())
                    .order(t::id)
                    .limit(n)
                    .for_update()
                    .skip_locked()
                    .load(conn)?;
                if !rows.is_empty() {
                    let ids: Vec<i64> = rows.iter().map(|t| t.id).collect();
                    diesel::update(t::table.filter(t::id.eq_any(ids)))
                        .set(claimed_by(me))
                        .execute(conn)?;
                }
                Ok(rows)
            })
        })
    }
}

/// What one worker did.
#[derive(Default)]
struct Work {
    /// Each row it claimed, by id.
    claimed: Vec<i64>,
    claims: Latencies,
}

/// Keeps the text of every statement a connection sends, for the plans.
fn recorder(statements: Arc<Mutex<Vec<String>>>) -> impl Instrumentation {
    move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            statements
                .lock()
                .expect("not poisoned")
                .push(query.to_string());
        }
    }
}

/// `sql -- binds: [..]` as diesel prints a statement, with its bound values written in
/// place (`$n` or `?`): a statement to `EXPLAIN`. Handles the values this workload binds
/// (numbers, strings, `Some`/`None`).
fn inline_binds(debug: &str) -> Option<String> {
    let (sql, binds) = debug.split_once(" -- binds: [")?;
    let binds = binds.strip_suffix(']')?;
    let mut values = Vec::new();
    let (mut depth, mut quoted, mut start) = (0, false, 0);
    for (i, c) in binds.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                values.push(binds[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !binds.trim().is_empty() {
        values.push(binds[start..].trim());
    }
    let literal = |value: &str| -> String {
        let value = value
            .strip_prefix("Some(")
            .and_then(|v| v.strip_suffix(')'))
            .unwrap_or(value);
        match value {
            "None" => "NULL".to_string(),
            v if v.starts_with('"') => format!("'{}'", v.trim_matches('"').replace('\'', "''")),
            v => v.to_string(),
        }
    };
    let mut out = sql.to_string();
    if out.contains("$1") {
        for (i, value) in values.iter().enumerate().rev() {
            out = out.replace(&format!("${}", i + 1), &literal(value));
        }
    } else {
        for value in &values {
            out = out.replacen('?', &literal(value), 1);
        }
    }
    Some(out)
}

per_backend! {
    /// `DROP`, `CREATE`, and `q` open tasks, with the index a queue in key order needs.
    fn fresh_queue(conn: &mut Conn, q: usize) -> Result<(), Box<dyn std::error::Error>> {
        let stamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        // SQLite's own key column (the rowid): each of its indexes ends with it, as
        // InnoDB's end with the primary key, so an index on `state` is one on `(state, id)`.
        let key = if BACKEND == "sqlite" { "INTEGER" } else { "BIGINT" };
        recreate(
            conn,
            "bench_tasks",
            &format!(
                "id {key} PRIMARY KEY NOT NULL, state VARCHAR(16) NOT NULL, owner VARCHAR(64), \
                 claimed_at {stamp}, version BIGINT NOT NULL, payload VARCHAR(64) NOT NULL"
            ),
        )?;
        // 1..=q from a cross join of digits: the same SQL on all three backends.
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL \
                      SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let places = q.max(1).to_string().len();
        let number: Vec<String> = (0..places).map(|p| format!("d{p}.d * {}", 10_i64.pow(p as u32))).collect();
        let from: Vec<String> = (0..places).map(|p| format!("{digits} d{p}")).collect();
        conn.batch_execute(&format!(
            "INSERT INTO bench_tasks (id, state, owner, claimed_at, version, payload) \
             SELECT n, 'open', NULL, NULL, 0, 'payload' FROM \
             (SELECT {} + 1 AS n FROM {}) numbers WHERE n <= {q}",
            number.join(" + "),
            from.join(", ")
        ))?;
        // The queue's index, walked in key order: on PostgreSQL the key must be in it; the
        // others add it to every index by themselves.
        let queue = if BACKEND == "postgres" { "(state, id)" } else { "(state)" };
        conn.batch_execute(&format!("CREATE INDEX bench_tasks_queue ON bench_tasks {queue}"))?;
        // No ANALYZE on PostgreSQL and SQLite: statistics taken while every row is open
        // say the index finds nothing faster than a scan, which is false as soon as done
        // rows pile up. InnoDB needs its statistics, or it may end a batch by the state
        // index instead of the key, locking every running row on the way.
        if BACKEND == "sqlite" {
            // The fill (and the drop of the previous point's table) are in the WAL: fold
            // them into the database now, or the first writes of the run would pay for it.
            conn.batch_execute("PRAGMA wal_checkpoint(TRUNCATE)")?;
        }
        if BACKEND == "mysql" {
            // Read as the result set it is: left unread, it would desynchronise the
            // connection's protocol for the next statement.
            #[derive(QueryableByName)]
            struct Analyzed {
                #[diesel(sql_type = diesel::sql_types::Text, column_name = "Msg_text")]
                _message: String,
            }
            diesel::sql_query("ANALYZE TABLE bench_tasks").load::<Analyzed>(conn)?;
        }
        Ok(())
    }

    /// One worker's loop until `deadline` or an empty queue.
    fn work(conn: &mut Conn, strategy: usize, me: &str, n: usize, deadline: Instant) -> Result<Work, Box<dyn std::error::Error + Send + Sync>> {
        let mut work = Work::default();
        let request = ClaimRequest { from: TaskState::Open, to: TaskState::Running, owner: me, limit: n, reclaim_after: None, order: ClaimOrder::ByKey };
        while Instant::now() < deadline {
            let began = Instant::now();
            let batch = if strategy == 0 {
                conn.claim_by_hand(me, n as i64)?
            } else {
                Task::claim(conn, bench_tasks::owner, bench_tasks::claimed_at, &request)?
            };
            work.claims.push(began.elapsed());
            if batch.is_empty() {
                break;
            }
            let ids: Vec<i64> = batch.iter().map(|t| t.id).collect();
            if strategy == 0 {
                use crate::w6_task_claiming::bench_tasks as t;
                let ended = retry_deadlocks(|| {
                    diesel::update(
                        t::table.filter(t::id.eq_any(&ids)).filter(t::owner.eq(me)).filter(t::state.eq("running")),
                    )
                    .set((t::state.eq("done"), t::version.eq(t::version + 1)))
                    .execute(conn)
                })?;
                if ended != ids.len() {
                    return Err(format!("{me}: {ended} of {} claims ended", ids.len()).into());
                }
            } else {
                let ended = Task::finish_claims(conn, &ids, bench_tasks::owner, me, TaskState::Running, TaskState::Done, Some(me))?;
                if !ended.all_finished() {
                    return Err(format!("{me}: claims lost: {:?}", ended.lost).into());
                }
            }
            work.claimed.extend(ids);
        }
        Ok(work)
    }

    /// Exactness, read back: (claimed twice, claimed but not done, done but not claimed
    /// or by another worker, done rows whose version is not 2).
    fn check(conn: &mut Conn, works: &[(String, Work)]) -> Result<[i64; 4], Box<dyn std::error::Error>> {
        let mut by: HashMap<i64, &str> = HashMap::new();
        let mut twice = 0;
        for (me, work) in works {
            for id in &work.claimed {
                if by.insert(*id, me).is_some() {
                    twice += 1;
                }
            }
        }
        let done: Vec<(i64, Option<String>, i64)> = bench_tasks::table
            .filter(bench_tasks::state.ne("open"))
            .select((bench_tasks::id, bench_tasks::owner, bench_tasks::version))
            .load(conn)?;
        let running = bench_tasks::table.filter(bench_tasks::state.eq("running")).count().get_result::<i64>(conn)?;
        let wrong_owner = done.iter().filter(|(id, owner, _)| by.get(id).copied() != owner.as_deref()).count() as i64
            + (by.len() as i64 - done.len() as i64).abs();
        let wrong_version = done.iter().filter(|(_, _, v)| *v != 2).count() as i64;
        Ok([twice, running, wrong_owner, wrong_version])
    }

    /// The plans of both strategies' claim statements on a fresh queue of `q`, claiming
    /// `n` at once (the planner's choice depends on the limit).
    fn plans(pool: &Pool, q: usize, n: usize) -> Result<String, Box<dyn std::error::Error>> {
        let mut conn = pool.get()?;
        fresh_queue(&mut conn, q)?;
        let statements = Arc::new(Mutex::new(Vec::new()));
        conn.set_instrumentation(recorder(Arc::clone(&statements)));
        let mut out = String::new();
        for (s, strategy) in STRATEGIES.iter().enumerate() {
            statements.lock().expect("not poisoned").clear();
            if s == 0 {
                (*conn).claim_by_hand("plan", n as i64)?;
            } else {
                let request = ClaimRequest { from: TaskState::Open, to: TaskState::Running, owner: "plan", limit: n, reclaim_after: None, order: ClaimOrder::ByKey };
                Task::claim(&mut *conn, bench_tasks::owner, bench_tasks::claimed_at, &request)?;
            }
            let sent: Vec<String> = statements.lock().expect("not poisoned").clone();
            for statement in sent.iter().filter(|s| s.starts_with("SELECT") || s.starts_with("UPDATE") || s.starts_with("WITH")) {
                let Some(sql) = inline_binds(statement) else { continue };
                out.push_str(&format!("-- {strategy}, Q={q} N={n}\n{sql}\n"));
                for line in explain(&mut conn, &sql)? {
                    out.push_str(&format!("    {line}\n"));
                }
            }
        }
        Ok(out)
    }

    /// The plan of `sql`, line by line.
    fn explain(conn: &mut Conn, sql: &str) -> QueryResult<Vec<String>> {
        use diesel::sql_types::{Nullable, Text};
        #[derive(QueryableByName)]
        struct PgLine {
            #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
            line: String,
        }
        #[derive(QueryableByName)]
        struct SqliteLine {
            #[diesel(sql_type = Text)]
            detail: String,
        }
        #[derive(QueryableByName)]
        struct MysqlLine {
            #[diesel(sql_type = Nullable<Text>)]
            table: Option<String>,
            #[diesel(sql_type = Nullable<Text>, column_name = "type")]
            access: Option<String>,
            #[diesel(sql_type = Nullable<Text>)]
            key: Option<String>,
            #[diesel(sql_type = Nullable<Text>, column_name = "Extra")]
            extra: Option<String>,
        }
        Ok(match BACKEND {
            "postgres" => diesel::sql_query(format!("EXPLAIN {sql}")).load::<PgLine>(conn)?.into_iter().map(|l| l.line).collect(),
            "sqlite" => diesel::sql_query(format!("EXPLAIN QUERY PLAN {sql}")).load::<SqliteLine>(conn)?.into_iter().map(|l| l.detail).collect(),
            _ => diesel::sql_query(format!("EXPLAIN {sql}"))
                .load::<MysqlLine>(conn)?
                .into_iter()
                .map(|l| format!(
                    "table {} access {} key {} {}",
                    l.table.unwrap_or_default(),
                    l.access.unwrap_or_default(),
                    l.key.unwrap_or_else(|| "-".into()),
                    l.extra.unwrap_or_default()
                ))
                .collect(),
        })
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W6",
            "task claiming: 8 workers claim N tasks of a queue of Q, finish them, and claim again",
            "rows finished per second ÷ the hand-written queue statements' (same Q and N); above 1 is faster",
        );
        let pool = pool(&settings.url, WORKERS as u32)?;
        let sizes = &settings.queue_sizes;
        let bar = report.progress("W6", (settings.claim_batches.len() * sizes.len() * ROUND_ORDER.len()) as u64);
        for &n in &settings.claim_batches {
            // Rows per second at the smallest queue, per strategy.
            let mut first_rate: [Option<f64>; 2] = [None, None];
            for &q in sizes {
                // Each strategy's runs at this point: rows, time, claim latencies, and
                // the exactness counts read back after each run.
                let mut runs: [(usize, Duration, Latencies, [i64; 4]); 2] = Default::default();
                for &s in &ROUND_ORDER {
                    let strategy = STRATEGIES[s];
                    bar.set_message(format!("N={n} Q={q} {strategy}"));
                    fresh_queue(&mut *pool.get()?, q)?;
                    let start = Barrier::new(WORKERS + 1);
                    let deadline = Mutex::new(None);
                    let works: Vec<(String, Work)> = std::thread::scope(|scope| {
                        let workers: Vec<_> = (0..WORKERS)
                            .map(|w| {
                                let (start, deadline, pool) = (&start, &deadline, &pool);
                                scope.spawn(move || -> Result<(String, Work), String> {
                                    let mut conn = pool.get().map_err(|e| e.to_string())?;
                                    if BACKEND == "mysql" {
                                        // What MySQL queues run at: REPEATABLE READ's gap
                                        // locks on the state index deadlock the workers.
                                        conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                                            .map_err(|e| e.to_string())?;
                                    }
                                    let me = format!("worker-{w}");
                                    start.wait();
                                    let until = deadline.lock().expect("not poisoned").expect("set before the start");
                                    work(&mut conn, s, &me, n, until)
                                        .map(|work| (me, work))
                                        .map_err(|e| format!("{strategy}, N={n} Q={q}: {e}"))
                                })
                            })
                            .collect();
                        *deadline.lock().expect("not poisoned") = Some(Instant::now() + settings.point);
                        start.wait();
                        workers.into_iter().map(|w| w.join().expect("a worker panicked")).collect::<Result<Vec<_>, String>>()
                    })?;
                    let began = deadline.lock().expect("not poisoned").expect("set") - settings.point;
                    let elapsed = began.elapsed().min(settings.point + Duration::from_secs(60));
                    let checked = check(&mut *pool.get()?, &works)?;
                    let run = &mut runs[s];
                    run.0 += works.iter().map(|(_, w)| w.claimed.len()).sum::<usize>();
                    run.1 += elapsed;
                    for (_, work) in works {
                        run.2.extend(work.claims);
                    }
                    for (total, count) in run.3.iter_mut().zip(checked) {
                        *total += count;
                    }
                    bar.inc(1);
                }
                let rates = runs.each_ref().map(|(rows, elapsed, ..)| *rows as f64 / elapsed.as_secs_f64());
                for (s, (rows, elapsed, claims, [twice, running, wrong_owner, wrong_version])) in runs.into_iter().enumerate() {
                    let mut record = Record::new("W6", format!("N={n} Q={q}"), STRATEGIES[s])
                        .ops(rows as u64, elapsed)
                        .latencies(&claims)
                        .ratio(rates[s] / rates[0])
                        .with("workers", WORKERS)
                        .with("claimed_twice", twice)
                        .with("claimed_not_done", running)
                        .with("wrong_owner", wrong_owner)
                        .with("rows_with_wrong_version", wrong_version);
                    match first_rate[s] {
                        Some(first) => record = record.with("rate_vs_smallest_queue", (rates[s] / first * 100.0).round() / 100.0),
                        None => first_rate[s] = Some(rates[s]),
                    }
                    bar.suspend(|| report.record(record))?;
                }
            }
        }
        bar.finish_and_clear();
        let largest = *sizes.iter().max().unwrap_or(&0);
        for &n in &settings.claim_batches {
            report.note("W6", &plans(&pool, largest, n)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::inline_binds;

    #[test]
    fn binds_are_written_in_place() {
        let pg = r#"UPDATE "t" SET "a" = $1, "o" = $2 WHERE "s" = $3 LIMIT $10 -- binds: ["run", Some("w'1"), None, 1, 2, 3, 4, 5, 6, 10]"#;
        assert_eq!(
            inline_binds(pg).as_deref(),
            Some(r#"UPDATE "t" SET "a" = 'run', "o" = 'w''1' WHERE "s" = NULL LIMIT 10"#)
        );
        let mysql = "SELECT `id` FROM `t` WHERE `s` = ? LIMIT ? -- binds: [\"open\", 10]";
        assert_eq!(
            inline_binds(mysql).as_deref(),
            Some("SELECT `id` FROM `t` WHERE `s` = 'open' LIMIT 10")
        );
        assert_eq!(inline_binds("SELECT 1"), None);
    }
}
