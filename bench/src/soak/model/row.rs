//! The model of a data row: a versioned row that can be missing, with an integer value
//! and a JSON object of integers, written by guarded writes, `modify` and JSON merges.

use std::collections::BTreeMap;

use stateright::semantics::SequentialSpec;

use super::{Op, Ret, Row, UNKNOWN_SEED};

/// The model's state: the row, if it exists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct VersionedRow(pub Option<Row>);

impl VersionedRow {
    /// The row after a write that moved it on (the version by one).
    fn moved(row: &Row, edit: impl FnOnce(&mut Row)) -> Row {
        let mut next = row.clone();
        if next.version != UNKNOWN_SEED {
            next.version += 1;
        }
        edit(&mut next);
        next
    }
}

impl SequentialSpec for VersionedRow {
    type Op = Op;
    type Ret = Ret;

    /// The answer of an operation applied to this state (used for operations whose
    /// answer never came: applied or not, the checker tries both).
    fn invoke(&mut self, op: &Op) -> Ret {
        let (ret, next) = step(&self.0, op, None);
        self.0 = next;
        ret
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        if *ret == Ret::NothingWritten {
            return true;
        }
        let (expected, next) = step(&self.0, op, Some(ret));
        if expected == *ret {
            self.0 = next;
            true
        } else {
            false
        }
    }
}

/// The answer of `op` on `state`, and the state after it. `answered` is what the library
/// said (`None` for a call that never answered): it supplies what the model cannot know,
/// the version an insert was seeded with.
fn step(state: &Option<Row>, op: &Op, answered: Option<&Ret>) -> (Ret, Option<Row>) {
    let pinned = state.as_ref().map(|row| pin(row, op, answered));
    let same = pinned.clone();
    match (op, &pinned) {
        (Op::Load, _) => (Ret::Loaded { row: same.clone() }, same),
        (Op::Insert { .. }, Some(_)) => (Ret::AlreadyExists, same),
        (Op::Insert { value }, None) => {
            let seed = match answered {
                Some(Ret::Written { version: Some(v) }) => *v,
                _ => UNKNOWN_SEED,
            };
            let row = Row {
                version: seed,
                value: *value,
                doc: BTreeMap::new(),
            };
            (
                Ret::Written {
                    version: Some(seed),
                },
                Some(row),
            )
        }
        (Op::Upsert { value, .. }, None) => {
            let seed = match answered {
                Some(Ret::Upserted {
                    inserted: true,
                    version,
                }) => *version,
                _ => UNKNOWN_SEED,
            };
            let row = Row {
                version: seed,
                value: *value,
                doc: BTreeMap::new(),
            };
            let ret = Ret::Upserted {
                inserted: true,
                version: seed,
            };
            (ret, Some(row))
        }
        (_, None) => (Ret::NotFound, None),
        (
            Op::Upsert {
                expected: Some(expected),
                value,
            },
            Some(row),
        ) if row.version == *expected => {
            let next = VersionedRow::moved(row, |r| {
                r.value = *value;
                r.doc.clear();
            });
            let ret = Ret::Upserted {
                inserted: false,
                version: next.version,
            };
            (ret, Some(next))
        }
        // The copy's version is not the row's (a new copy's never is).
        (Op::Upsert { .. }, Some(row)) => (
            Ret::Conflict {
                current: row.clone(),
            },
            same,
        ),
        (
            Op::Update {
                expected, value, ..
            },
            Some(row),
        ) => {
            if row.version != *expected {
                return (
                    Ret::Conflict {
                        current: row.clone(),
                    },
                    same,
                );
            }
            let next = VersionedRow::moved(row, |r| r.value = *value);
            (
                Ret::Written {
                    version: Some(next.version),
                },
                Some(next),
            )
        }
        (Op::Delete { expected }, Some(row)) => {
            if row.version != *expected {
                return (
                    Ret::Conflict {
                        current: row.clone(),
                    },
                    same,
                );
            }
            (Ret::Written { version: None }, None)
        }
        (Op::Add { add }, Some(row)) => {
            let next = VersionedRow::moved(row, |r| r.value += add);
            let ret = Ret::Added {
                version: next.version,
                value: next.value,
            };
            (ret, Some(next))
        }
        // A read-merge-write whose patch leaves the document as it is writes nothing:
        // the row keeps its token.
        (
            Op::Merge {
                field,
                number,
                in_place: false,
            },
            Some(row),
        ) if row.doc.get(field) == Some(number) => (
            Ret::Written {
                version: Some(row.version),
            },
            same,
        ),
        (Op::Merge { field, number, .. }, Some(row)) => {
            let next = VersionedRow::moved(row, |r| {
                r.doc.insert(field.clone(), *number);
            });
            (
                Ret::Written {
                    version: Some(next.version),
                },
                Some(next),
            )
        }
        (_, Some(_)) => unreachable!("{op:?} is not an operation on a data row"),
    }
}

/// `row` with an unknown seed replaced by the version `answered` shows it had (the
/// answer is then judged as usual); unchanged otherwise, or when no answer came (an
/// unanswered write on such a row is taken as one that did not match).
fn pin(row: &Row, op: &Op, answered: Option<&Ret>) -> Row {
    if row.version != UNKNOWN_SEED {
        return row.clone();
    }
    let version = match (op, answered) {
        (_, Some(Ret::Loaded { row: Some(seen) })) => Some(seen.version),
        (_, Some(Ret::Conflict { current })) => Some(current.version),
        (Op::Update { expected, .. } | Op::Delete { expected }, Some(Ret::Written { .. })) => {
            Some(*expected)
        }
        (Op::Add { .. }, Some(Ret::Added { version, .. })) => Some(version - 1),
        (
            Op::Upsert {
                expected: Some(expected),
                ..
            },
            Some(Ret::Upserted {
                inserted: false, ..
            }),
        ) => Some(*expected),
        (Op::Merge { .. }, Some(Ret::Written { version: Some(v) })) => Some(v - 1),
        _ => None,
    };
    Row {
        version: version.unwrap_or(UNKNOWN_SEED),
        ..row.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

    fn row(version: i64, value: i64) -> Row {
        Row {
            version,
            value,
            doc: BTreeMap::new(),
        }
    }

    #[test]
    fn a_lost_update_is_not_linearizable() {
        // Two writers read version 0 and both are told their write landed at version 1.
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(0, 0))));
        t.on_invoke(
            1u64,
            Op::Update {
                expected: 0,
                value: 1,
                save: false,
            },
        )
        .unwrap();
        t.on_invoke(
            2u64,
            Op::Update {
                expected: 0,
                value: 2,
                save: false,
            },
        )
        .unwrap();
        t.on_return(1, Ret::Written { version: Some(1) }).unwrap();
        t.on_return(2, Ret::Written { version: Some(1) }).unwrap();
        assert!(!t.is_consistent());
    }

    #[test]
    fn an_upsert_inserts_only_a_missing_row_and_saves_only_over_its_version() {
        let upsert = |expected| Op::Upsert { expected, value: 7 };
        // Two new copies both told they inserted the row: one of them overwrote the other.
        let mut t = LinearizabilityTester::new(VersionedRow(None));
        t.on_invoke(1u64, upsert(None)).unwrap();
        t.on_invoke(2u64, upsert(None)).unwrap();
        let inserted = |version| Ret::Upserted {
            inserted: true,
            version,
        };
        t.on_return(1, inserted(100)).unwrap();
        t.on_return(2, inserted(200)).unwrap();
        assert!(!t.is_consistent());
        // One inserted, the other found it: a conflict naming it.
        let mut t = LinearizabilityTester::new(VersionedRow(None));
        t.on_invoke(1u64, upsert(None)).unwrap();
        t.on_return(1, inserted(100)).unwrap();
        t.on_invoke(2u64, upsert(None)).unwrap();
        t.on_return(
            2,
            Ret::Conflict {
                current: row(100, 7),
            },
        )
        .unwrap();
        assert!(t.is_consistent());
        // A save over a version the row no longer holds.
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(5, 0))));
        t.on_invoke(1u64, upsert(Some(4))).unwrap();
        let updated = Ret::Upserted {
            inserted: false,
            version: 5,
        };
        t.on_return(1, updated).unwrap();
        assert!(!t.is_consistent());
    }

    #[test]
    fn a_conflict_must_name_a_row_that_existed() {
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(0, 0))));
        t.on_invoke(
            1u64,
            Op::Update {
                expected: 0,
                value: 1,
                save: false,
            },
        )
        .unwrap();
        t.on_return(1, Ret::Written { version: Some(1) }).unwrap();
        t.on_invoke(
            2u64,
            Op::Update {
                expected: 0,
                value: 2,
                save: false,
            },
        )
        .unwrap();
        t.on_return(2, Ret::Conflict { current: row(1, 7) })
            .unwrap();
        assert!(!t.is_consistent(), "the current row had value 1, never 7");
    }

    #[test]
    fn an_unanswered_write_may_have_landed_or_not() {
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(0, 0))));
        t.on_invoke(1u64, Op::Add { add: 5 }).unwrap();
        t.on_invoke(2u64, Op::Load).unwrap();
        t.on_return(
            2,
            Ret::Loaded {
                row: Some(row(1, 5)),
            },
        )
        .unwrap();
        assert!(t.is_consistent());
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(0, 0))));
        t.on_invoke(1u64, Op::Add { add: 5 }).unwrap();
        t.on_invoke(2u64, Op::Load).unwrap();
        t.on_return(
            2,
            Ret::Loaded {
                row: Some(row(0, 0)),
            },
        )
        .unwrap();
        assert!(t.is_consistent());
    }

    #[test]
    fn a_read_older_than_an_acknowledged_write_is_not_linearizable() {
        let mut t = LinearizabilityTester::new(VersionedRow(Some(row(0, 0))));
        t.on_invoke(1u64, Op::Add { add: 5 }).unwrap();
        t.on_return(
            1,
            Ret::Added {
                version: 1,
                value: 5,
            },
        )
        .unwrap();
        t.on_invoke(2u64, Op::Load).unwrap();
        t.on_return(
            2,
            Ret::Loaded {
                row: Some(row(0, 0)),
            },
        )
        .unwrap();
        assert!(!t.is_consistent());
    }
}
