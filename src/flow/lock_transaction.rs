//! A lock's write (take, renew, free) as a flow: which statements its bounded transaction
//! sends, in which order on each backend, and whether a grant is read back after its
//! `COMMIT`. The blocking driver runs the statements inside the backend's bounded
//! transaction (`LockBackend::bounded`), the async one inside its own; both send the
//! write's compare-and-set last, when every wait is over, so that the lease it computes
//! from the database's clock starts after them.

use crate::connect::backend::Duplicates;

/// Which write of a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockWrite {
    /// Take the lock if it is free or its lease ended.
    Acquire,
    /// Extend the holder's unexpired lease.
    Renew,
    /// Free the lock if the holder still holds it.
    Release,
}

/// The next statement inside the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Read the lock row `FOR UPDATE` (every wait for it happens here); then
    /// [`read_row`](LockTransaction::read_row) with whether it exists.
    ReadRow,
    /// Insert the lock row unless it exists; then
    /// [`created_row`](LockTransaction::created_row).
    CreateRow,
    /// Draw the next fence into the session (SQLite); then
    /// [`drew_fence`](LockTransaction::drew_fence).
    DrawFence,
    /// Send the write's compare-and-set; its answer is the transaction's, to commit.
    Write,
}

/// What a backend's locks need to know of it (`locks::backend::facts`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockFacts {
    /// How its `INSERT` leaves an existing row alone.
    pub(crate) duplicates: Duplicates,
    /// Whether a fence is drawn before the acquisition that uses it.
    pub(crate) draws_fence: bool,
    /// Whether a grant is read back after its `COMMIT` before it is believed.
    pub(crate) confirms_grants: bool,
}

/// Where a lock's write is: what its backend needs and what was sent.
#[derive(Debug)]
pub(crate) struct LockTransaction {
    write: LockWrite,
    duplicates: Duplicates,
    draws_fence: bool,
    confirms_grants: bool,
    created: bool,
}

impl LockTransaction {
    /// `write` on a backend with `facts`.
    pub(crate) fn new(write: LockWrite, facts: LockFacts) -> Self {
        LockTransaction {
            write,
            duplicates: facts.duplicates,
            draws_fence: facts.draws_fence,
            confirms_grants: facts.confirms_grants,
            created: false,
        }
    }

    /// The first statement after `BEGIN` (and the transaction's wait bounds). A release
    /// waits in its own statement: it only frees a lock that is the holder's. The others
    /// lock the row first, creating it on first use: MySQL's `INSERT ... ON DUPLICATE KEY
    /// UPDATE` locks an existing row itself (a `SELECT ... FOR UPDATE` of a missing row
    /// would take a gap lock that deadlocks two first users); `ON CONFLICT DO NOTHING`
    /// does not lock, so the row is read `FOR UPDATE`, and created only when missing.
    pub(crate) fn begun(&mut self) -> Effect {
        match (self.write, self.duplicates) {
            (LockWrite::Release, _) => Effect::Write,
            (_, Duplicates::OnDuplicateKey) => Effect::CreateRow,
            (_, Duplicates::OnConflict) => Effect::ReadRow,
        }
    }

    /// The row was read `FOR UPDATE`; it `exists` or not.
    pub(crate) fn read_row(&mut self, exists: bool) -> Effect {
        if exists || self.created {
            self.row_locked()
        } else {
            Effect::CreateRow
        }
    }

    /// The row was inserted, or found there.
    pub(crate) fn created_row(&mut self) -> Effect {
        self.created = true;
        match self.duplicates {
            Duplicates::OnDuplicateKey => self.row_locked(),
            // The insert locked nothing: read the row again, `FOR UPDATE`.
            Duplicates::OnConflict => Effect::ReadRow,
        }
    }

    /// The next fence was drawn.
    pub(crate) fn drew_fence(&mut self) -> Effect {
        Effect::Write
    }

    /// The write succeeded and its transaction committed: whether the grant must be read
    /// back before it is believed (`LockBackend::CONFIRMS_GRANTS`).
    pub(crate) fn confirms_grant(&self) -> bool {
        self.write == LockWrite::Acquire && self.confirms_grants
    }

    /// The row is locked for the rest of the transaction.
    fn row_locked(&self) -> Effect {
        if self.write == LockWrite::Acquire && self.draws_fence {
            Effect::DrawFence
        } else {
            Effect::Write
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Effect, LockTransaction, LockWrite};
    use crate::connect::backend::Duplicates;

    fn flow(
        write: LockWrite,
        duplicates: Duplicates,
        draws: bool,
        confirms: bool,
    ) -> LockTransaction {
        LockTransaction {
            write,
            duplicates,
            draws_fence: draws,
            confirms_grants: confirms,
            created: false,
        }
    }

    /// Runs the flow with the lock row existing or not, and lists the statements sent.
    fn sent(mut flow: LockTransaction, row_exists: bool) -> Vec<Effect> {
        let mut exists = row_exists;
        let mut effects = Vec::new();
        let mut effect = flow.begun();
        loop {
            effects.push(effect);
            effect = match effect {
                Effect::ReadRow => flow.read_row(exists),
                Effect::CreateRow => {
                    exists = true;
                    flow.created_row()
                }
                Effect::DrawFence => flow.drew_fence(),
                Effect::Write => return effects,
            };
        }
    }

    use Effect::{CreateRow, DrawFence, ReadRow, Write};

    #[test]
    fn on_conflict_backends_read_the_row_locked_and_create_it_only_when_missing() {
        let on_conflict = |write| flow(write, Duplicates::OnConflict, false, false);
        assert_eq!(
            sent(on_conflict(LockWrite::Acquire), true),
            [ReadRow, Write]
        );
        assert_eq!(
            sent(on_conflict(LockWrite::Acquire), false),
            [ReadRow, CreateRow, ReadRow, Write]
        );
        assert_eq!(sent(on_conflict(LockWrite::Renew), true), [ReadRow, Write]);
        assert_eq!(
            sent(on_conflict(LockWrite::Renew), false),
            [ReadRow, CreateRow, ReadRow, Write]
        );
    }

    #[test]
    fn on_duplicate_key_backends_lock_the_row_by_the_insert_alone() {
        for exists in [true, false] {
            let acquire = flow(LockWrite::Acquire, Duplicates::OnDuplicateKey, false, true);
            assert_eq!(sent(acquire, exists), [CreateRow, Write]);
            let renew = flow(LockWrite::Renew, Duplicates::OnDuplicateKey, false, true);
            assert_eq!(sent(renew, exists), [CreateRow, Write]);
        }
    }

    #[test]
    fn a_release_sends_only_its_write() {
        for duplicates in [Duplicates::OnConflict, Duplicates::OnDuplicateKey] {
            for exists in [true, false] {
                let release = flow(LockWrite::Release, duplicates, true, true);
                assert_eq!(sent(release, exists), [Write]);
            }
        }
    }

    #[test]
    fn only_an_acquisition_draws_a_fence_after_the_row_is_locked() {
        let acquire = flow(LockWrite::Acquire, Duplicates::OnConflict, true, false);
        assert_eq!(
            sent(acquire, false),
            [ReadRow, CreateRow, ReadRow, DrawFence, Write]
        );
        let renew = flow(LockWrite::Renew, Duplicates::OnConflict, true, false);
        assert_eq!(sent(renew, true), [ReadRow, Write]);
    }

    #[test]
    fn only_a_grant_is_read_back_and_only_where_the_backend_asks() {
        for write in [LockWrite::Acquire, LockWrite::Renew, LockWrite::Release] {
            let confirming = flow(write, Duplicates::OnDuplicateKey, false, true);
            assert_eq!(confirming.confirms_grant(), write == LockWrite::Acquire);
            let trusting = flow(write, Duplicates::OnConflict, false, false);
            assert!(!trusting.confirms_grant());
        }
    }

    #[test]
    fn each_backend_gives_its_own_data() {
        use crate::locks::backend::facts;
        #[cfg(feature = "sqlite")]
        {
            let facts = facts::<diesel::sqlite::Sqlite>();
            let sqlite = LockTransaction::new(LockWrite::Acquire, facts);
            assert_eq!(sent(sqlite, true), [ReadRow, DrawFence, Write]);
        }
        #[cfg(feature = "postgres")]
        {
            let pg = LockTransaction::new(LockWrite::Acquire, facts::<diesel::pg::Pg>());
            assert!(!pg.confirms_grant());
            assert_eq!(sent(pg, true), [ReadRow, Write]);
        }
        #[cfg(feature = "mysql")]
        {
            let facts = facts::<diesel::mysql::Mysql>();
            let mysql = LockTransaction::new(LockWrite::Acquire, facts);
            assert!(mysql.confirms_grant());
            assert_eq!(sent(mysql, true), [CreateRow, Write]);
        }
    }
}
