//! The soak's locks: workers take a lock per key (`try_lock`, a 5 s lease), renew it,
//! write the row it protects under its fence, and release it; others meanwhile find it
//! held, read the row, or write with the fence of a lock they released. A grant with an
//! odd fence (about half of them) is kept under a lease that renews itself (`Lease` / `AsyncLease`): its holder
//! asks the lease whether it still holds and writes through it (`write_while_held`)
//! instead. Each call on both drivers, answered in the model's terms.
//!
//! The model cannot see time, so whether a grant came after the previous holder's lease
//! had ended is witnessed by the database itself: a trigger on the lock table writes each
//! grant to `soak_lock_audit` with the previous holder and whether its lease still lasted
//! ([`audit`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::asynchronous as on_async;
use diesel_occ::prelude::*;

use super::model::{Op, Ret};
use crate::backend::per_backend;

/// The lock name of every soak lock; a lock's resource is its key.
pub const NAME: &str = "occ-soak";

/// The lease of a soak lock: far longer than a worker holds one, so that a lease ends
/// only when its holder's release was lost.
pub const TTL: Duration = Duration::from_secs(5);

/// How a worker keeps a lock it was granted: renewing it by its own calls (`G`, a
/// guard), or under a lease that renews itself (`L`).
pub enum Kept<G, L> {
    Renewed(G),
    Leased(L),
}

/// What a worker holds of one lock (`K`: a [`Kept`]).
pub struct Holding<K> {
    pub kept: K,
    pub fence: i64,
    /// Kept under a lease.
    pub leased: bool,
    /// A renewal, a lease's check or a write through it said the lock was lost: release
    /// it next.
    pub lost: bool,
}

impl<K> Holding<K> {
    /// The release of this lock.
    pub fn release(&self) -> Op {
        match self.leased {
            true => Op::ReleaseLease { fence: self.fence },
            false => Op::Release { fence: self.fence },
        }
    }
}

/// Whether a grant of `fence` is kept under a lease: those with an odd fence (fences come
/// from one source for every lock, so about half the grants of each).
fn leased(fence: i64) -> bool {
    fence % 2 == 1
}

/// The locks a worker holds, and the fence of the last one it released per key.
pub struct LockState<G> {
    pub held: HashMap<i64, Holding<G>>,
    pub released: HashMap<i64, i64>,
}

impl<G> Default for LockState<G> {
    fn default() -> Self {
        LockState {
            held: HashMap::new(),
            released: HashMap::new(),
        }
    }
}

impl<G> LockState<G> {
    /// The next operation on lock `key`.
    pub fn choose(&self, rng: &mut fastrand::Rng, key: i64) -> Op {
        let value = rng.i64(0..1000);
        match self.held.get(&key) {
            Some(h) if h.lost => h.release(),
            Some(h) if h.leased => match rng.u8(0..100) {
                0..=44 => Op::WriteWhileHeld {
                    fence: h.fence,
                    value,
                },
                45..=64 => Op::Check { fence: h.fence },
                _ => h.release(),
            },
            Some(h) => match rng.u8(0..100) {
                0..=44 => Op::FencedWrite {
                    fence: h.fence,
                    value,
                },
                45..=64 => Op::Renew { fence: h.fence },
                _ => Op::Release { fence: h.fence },
            },
            None => match (rng.u8(0..100), self.released.get(&key)) {
                (55..=74, _) => Op::ReadFenced,
                (75..=99, Some(&fence)) => Op::FencedWrite { fence, value },
                _ => Op::Acquire,
            },
        }
    }
}

/// One grant as the audit trigger saw it.
#[derive(Debug, QueryableByName)]
struct Grant {
    #[diesel(sql_type = diesel::sql_types::Text)]
    lock_name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    resource: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    old_fence: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    new_fence: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    old_holder: Option<String>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    overlap: i64,
}

/// What the audit table says about every grant of the run.
#[derive(Debug, Default)]
pub struct Audit {
    pub grants: u64,
    pub locks: u64,
    /// Grants of a lock whose previous holder never released it (its lease had ended).
    pub after_lease_end: u64,
    /// Grants while the previous holder's lease still lasted: double holders.
    pub overlapping: Vec<String>,
    /// Grants whose fence did not follow the previous grant's: a fence handed out twice,
    /// or a grant missing from the chain.
    pub broken_chain: Vec<String>,
}

impl Audit {
    pub fn passed(&self) -> bool {
        self.overlapping.is_empty() && self.broken_chain.is_empty()
    }
}

/// Judges the grants the audit table holds.
fn judge(grants: Vec<Grant>) -> Audit {
    let mut audit = Audit::default();
    let mut by_lock: BTreeMap<(&str, &str), Vec<&Grant>> = BTreeMap::new();
    for grant in &grants {
        audit.grants += 1;
        if grant.overlap != 0 {
            audit.overlapping.push(format!("{grant:?}"));
        } else if grant.old_holder.is_some() {
            audit.after_lease_end += 1;
        }
        by_lock
            .entry((&grant.lock_name, &grant.resource))
            .or_default()
            .push(grant);
    }
    audit.locks = by_lock.len() as u64;
    for (_, mut chain) in by_lock {
        chain.sort_by_key(|g| g.new_fence);
        for pair in chain.windows(2) {
            if pair[1].old_fence != Some(pair[0].new_fence)
                || pair[1].new_fence <= pair[0].new_fence
            {
                audit
                    .broken_chain
                    .push(format!("{:?} after {:?}", pair[1], pair[0]));
            }
        }
    }
    audit
}

per_backend! {
    diesel::table! {
        soak_fenced (id) {
            id -> BigInt,
            version -> BigInt,
            last_fence -> BigInt,
            value -> BigInt,
        }
    }

    /// The row a lock protects: the newest fence it accepted and a value.
    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = soak_fenced)]
    pub struct SoakFenced {
        pub id: i64,
        #[occ(version)]
        pub version: i64,
        pub last_fence: i64,
        pub value: i64,
    }

    /// A lock a blocking worker holds.
    pub type Guard = Kept<diesel_occ::LockGuard<Pool>, diesel_occ::Lease<Pool>>;

    /// A lock an async worker holds.
    pub type AsyncGuard<P> = Kept<on_async::AsyncLockGuard<P>, on_async::AsyncLease<P>>;

    /// The protected rows of `keys`, the library's lock table without the soak's locks,
    /// and the audit trigger on it.
    pub fn prepare(conn: &mut Conn, keys: impl Iterator<Item = i64>) -> Result<(), Box<dyn std::error::Error>> {
        diesel_occ::migrations::run(conn)?;
        crate::backend::recreate(
            conn,
            "soak_fenced",
            "id BIGINT PRIMARY KEY, version BIGINT NOT NULL, last_fence BIGINT NOT NULL, value BIGINT NOT NULL",
        )?;
        let rows: Vec<SoakFenced> = keys.map(|id| SoakFenced { id, version: 0, last_fence: 0, value: 0 }).collect();
        for chunk in rows.chunks(500) {
            diesel::insert_into(soak_fenced::table).values(chunk).execute(conn)?;
        }
        conn.batch_execute(&format!("DELETE FROM occ_locks WHERE lock_name LIKE '{NAME}%'"))?;
        let id = match BACKEND { "postgres" => "BIGSERIAL PRIMARY KEY", "mysql" => "BIGINT AUTO_INCREMENT PRIMARY KEY", _ => "INTEGER PRIMARY KEY" };
        crate::backend::recreate(
            conn,
            "soak_lock_audit",
            &format!("id {id}, lock_name VARCHAR(191) NOT NULL, resource VARCHAR(191) NOT NULL, old_holder VARCHAR(64), \
                      new_holder VARCHAR(64), old_fence BIGINT, new_fence BIGINT NOT NULL, overlap INT NOT NULL"),
        )?;
        let columns = "lock_name, resource, old_holder, new_holder, old_fence, new_fence, overlap";
        // A row created without a holder is no grant: the grant that follows updates it.
        let mine = format!("NEW.lock_name LIKE '{NAME}%' AND NEW.holder IS NOT NULL");
        let lasted = "OLD.holder IS NOT NULL AND OLD.expires_at > NEW.acquired_at";
        let triggers = match BACKEND {
            "postgres" => format!(
                "CREATE OR REPLACE FUNCTION soak_lock_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                   IF TG_OP = 'INSERT' AND {mine} THEN \
                     INSERT INTO soak_lock_audit ({columns}) VALUES (NEW.lock_name, NEW.resource, NULL, NEW.holder, NULL, NEW.fence, 0); \
                   ELSIF TG_OP = 'UPDATE' AND {mine} AND NEW.fence <> OLD.fence THEN \
                     INSERT INTO soak_lock_audit ({columns}) VALUES (NEW.lock_name, NEW.resource, OLD.holder, NEW.holder, OLD.fence, NEW.fence, \
                       CASE WHEN {lasted} THEN 1 ELSE 0 END); \
                   END IF; RETURN NULL; END $$; \
                 DROP TRIGGER IF EXISTS soak_lock_audit ON occ_locks; \
                 CREATE TRIGGER soak_lock_audit AFTER INSERT OR UPDATE ON occ_locks FOR EACH ROW EXECUTE FUNCTION soak_lock_audit();"
            ),
            "mysql" => format!(
                "DROP TRIGGER IF EXISTS soak_lock_audit_insert;\n\
                 DROP TRIGGER IF EXISTS soak_lock_audit_update;\n\
                 CREATE TRIGGER soak_lock_audit_insert AFTER INSERT ON occ_locks FOR EACH ROW \
                   INSERT INTO soak_lock_audit ({columns}) SELECT NEW.lock_name, NEW.resource, NULL, NEW.holder, NULL, NEW.fence, 0 FROM DUAL WHERE {mine};\n\
                 CREATE TRIGGER soak_lock_audit_update AFTER UPDATE ON occ_locks FOR EACH ROW \
                   INSERT INTO soak_lock_audit ({columns}) SELECT NEW.lock_name, NEW.resource, OLD.holder, NEW.holder, OLD.fence, NEW.fence, {lasted} \
                   FROM DUAL WHERE {mine} AND NEW.fence <> OLD.fence"
            ),
            _ => format!(
                "DROP TRIGGER IF EXISTS soak_lock_audit_insert; DROP TRIGGER IF EXISTS soak_lock_audit_update; \
                 CREATE TRIGGER soak_lock_audit_insert AFTER INSERT ON occ_locks WHEN {mine} BEGIN \
                   INSERT INTO soak_lock_audit ({columns}) VALUES (NEW.lock_name, NEW.resource, NULL, NEW.holder, NULL, NEW.fence, 0); END; \
                 CREATE TRIGGER soak_lock_audit_update AFTER UPDATE ON occ_locks WHEN {mine} AND NEW.fence <> OLD.fence BEGIN \
                   INSERT INTO soak_lock_audit ({columns}) VALUES (NEW.lock_name, NEW.resource, OLD.holder, NEW.holder, OLD.fence, NEW.fence, {lasted}); END;"
            ),
        };
        // One statement per call: MariaDB keeps what follows a trigger's body in the same
        // batch as part of it, which it then cannot parse when it reloads the trigger
        // after a restart ("Query was empty").
        for statement in triggers.split(";\n").filter(|s| !s.trim().is_empty()) {
            conn.batch_execute(statement)?;
        }
        Ok(())
    }

    /// Reads the audit table and judges it.
    pub fn audit(conn: &mut Conn) -> QueryResult<Audit> {
        let integer = if BACKEND == "mysql" { "SIGNED" } else { "BIGINT" };
        let grants: Vec<Grant> = diesel::sql_query(format!(
            "SELECT lock_name, resource, old_fence, new_fence, old_holder, CAST(overlap AS {integer}) AS overlap FROM soak_lock_audit"
        ))
        .load(conn)?;
        Ok(judge(grants))
    }

    fn fenced(row: Option<SoakFenced>, key: i64) -> Result<Ret, diesel_occ::Error> {
        match row {
            Some(row) => Ok(Ret::Fenced { fence: row.last_fence, value: row.value }),
            None => Err(diesel_occ::Error::NotFound { table: "soak_fenced", key: key.to_string() }),
        }
    }

    /// One call on lock `key`, on the blocking API.
    pub fn call_blocking(locks: &diesel_occ::Locks<Pool>, pool: &Pool, state: &mut LockState<Guard>, key: i64, op: &Op) -> Result<Ret, diesel_occ::Error> {
        let connection = || pool.get().map_err(|e| diesel_occ::Error::Pool(Box::new(e)));
        Ok(match op {
            Op::Acquire => {
                let guard = locks.try_lock(NAME, &key.to_string(), TTL, Some("soak"))?;
                let fence = guard.fence();
                let kept = if leased(fence) { Kept::Leased(diesel_occ::Lease::keep_alive(guard)) } else { Kept::Renewed(guard) };
                state.held.insert(key, Holding { kept, fence, leased: leased(fence), lost: false });
                Ret::Granted { fence }
            }
            Op::Renew { .. } | Op::Check { .. } => {
                let holding = state.held.get_mut(&key).expect("a renewal of a lock held");
                let renewed = match &mut holding.kept {
                    Kept::Renewed(guard) => guard.renew(),
                    Kept::Leased(lease) => lease.check(),
                };
                holding.lost = matches!(renewed, Err(diesel_occ::Error::LockLost { .. }));
                renewed?;
                Ret::Kept
            }
            Op::Release { fence } | Op::ReleaseLease { fence } => {
                let holding = state.held.remove(&key).expect("a release of a lock held");
                state.released.insert(key, *fence);
                match holding.kept {
                    Kept::Renewed(guard) => guard.release()?,
                    Kept::Leased(lease) => lease.release()?,
                }
                Ret::Released
            }
            Op::FencedWrite { fence, value } => {
                SoakFenced::write_fenced(&mut *connection()?, &key, soak_fenced::last_fence, *fence, soak_fenced::value.eq(*value))?;
                Ret::Done
            }
            Op::WriteWhileHeld { fence, value } => {
                let holding = state.held.get_mut(&key).expect("a write through a lease held");
                let Kept::Leased(lease) = &holding.kept else { unreachable!("a write through a lease of a lock renewed by hand") };
                let written = lease.write_while_held(&mut *connection()?, |conn| {
                    SoakFenced::write_fenced(conn, &key, soak_fenced::last_fence, *fence, soak_fenced::value.eq(*value))
                });
                holding.lost = matches!(written, Err(diesel_occ::Error::LockLost { .. }));
                written?;
                Ret::Done
            }
            Op::ReadFenced => fenced(SoakFenced::load_by_key(&mut *connection()?, &key)?, key)?,
            _ => unreachable!("{op:?} is not an operation on a lock"),
        })
    }

    /// One call on lock `key`, on the async API: the locks and the fenced rows on `pool`.
    pub async fn call_async<P>(locks: &on_async::AsyncLocks<P>, pool: &P, state: &mut LockState<AsyncGuard<P>>, key: i64, op: &Op) -> Result<Ret, diesel_occ::Error>
    where
        P: on_async::AsyncConnectionSource<Connection = AsyncConn>,
    {
        use on_async::{AsyncFencedWrite, AsyncLoadByKey};
        Ok(match op {
            Op::Acquire => {
                let guard = locks.try_lock(NAME, &key.to_string(), TTL, Some("soak")).await?;
                let fence = guard.fence();
                let kept = if leased(fence) { Kept::Leased(on_async::AsyncLease::keep_alive(guard)) } else { Kept::Renewed(guard) };
                state.held.insert(key, Holding { kept, fence, leased: leased(fence), lost: false });
                Ret::Granted { fence }
            }
            Op::Renew { .. } | Op::Check { .. } => {
                let holding = state.held.get_mut(&key).expect("a renewal of a lock held");
                let renewed = match &mut holding.kept {
                    Kept::Renewed(guard) => guard.renew().await,
                    Kept::Leased(lease) => lease.check(),
                };
                holding.lost = matches!(renewed, Err(diesel_occ::Error::LockLost { .. }));
                renewed?;
                Ret::Kept
            }
            Op::Release { fence } | Op::ReleaseLease { fence } => {
                let holding = state.held.remove(&key).expect("a release of a lock held");
                state.released.insert(key, *fence);
                match holding.kept {
                    Kept::Renewed(guard) => guard.release().await?,
                    Kept::Leased(lease) => lease.release().await?,
                }
                Ret::Released
            }
            Op::FencedWrite { fence, value } => {
                let mut conn = pool.checkout().await?;
                <SoakFenced as AsyncFencedWrite>::write_fenced(&mut *conn, &key, soak_fenced::last_fence, *fence, soak_fenced::value.eq(*value)).await?;
                Ret::Done
            }
            Op::WriteWhileHeld { fence, value } => {
                let holding = state.held.get_mut(&key).expect("a write through a lease held");
                let Kept::Leased(lease) = &holding.kept else { unreachable!("a write through a lease of a lock renewed by hand") };
                let (fence, value) = (*fence, *value);
                let mut conn = pool.checkout().await?;
                let written = lease
                    .write_while_held(&mut *conn, async move |conn: &mut AsyncConn| {
                        <SoakFenced as AsyncFencedWrite>::write_fenced(conn, &key, soak_fenced::last_fence, fence, soak_fenced::value.eq(value)).await
                    })
                    .await;
                holding.lost = matches!(written, Err(diesel_occ::Error::LockLost { .. }));
                written?;
                Ret::Done
            }
            Op::ReadFenced => {
                let mut conn = pool.checkout().await?;
                fenced(<SoakFenced as AsyncLoadByKey<AsyncConn>>::load_by_key(&mut *conn, &key).await?, key)?
            }
            _ => unreachable!("{op:?} is not an operation on a lock"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(resource: &str, old: Option<i64>, new: i64, overlap: i64) -> Grant {
        Grant {
            lock_name: NAME.into(),
            resource: resource.into(),
            old_fence: old,
            new_fence: new,
            old_holder: old.map(|_| "before".into()),
            overlap,
        }
    }

    #[test]
    fn a_chain_of_grants_passes_and_each_break_fails() {
        let chain = vec![
            grant("1", None, 1, 0),
            grant("1", Some(1), 4, 0),
            grant("2", None, 2, 0),
        ];
        let audit = judge(chain);
        assert!(audit.passed(), "{audit:?}");
        assert_eq!(
            (audit.grants, audit.locks, audit.after_lease_end),
            (3, 2, 1)
        );
        // A grant while the previous lease lasted.
        assert!(!judge(vec![grant("1", None, 1, 0), grant("1", Some(1), 2, 1)]).passed());
        // The same fence handed out twice: two grants after the same one.
        let forked = vec![
            grant("1", None, 1, 0),
            grant("1", Some(1), 2, 0),
            grant("1", Some(1), 3, 0),
        ];
        assert!(!judge(forked).passed());
    }
}
