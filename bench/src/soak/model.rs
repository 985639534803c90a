//! The sequential model every key's history is judged against: a versioned row that can
//! be missing, with an integer value and a JSON object of integers. Each operation of the
//! soak is one of these; the checker asks whether some order of them, consistent with
//! real time, explains every answer the library gave.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use stateright::semantics::SequentialSpec;

/// A row as the model and the answers see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Row {
    pub version: i64,
    pub value: i64,
    pub doc: BTreeMap<String, i64>,
}

/// What a worker asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Read the row by key.
    Load,
    /// Insert the row with `value` and an empty document.
    Insert { value: i64 },
    /// A guarded update of `value` from a copy read at `expected` (`guarded_update`, or
    /// `guarded_save` when `save`).
    Update {
        expected: i64,
        value: i64,
        save: bool,
    },
    /// A guarded delete from a copy read at `expected`.
    Delete { expected: i64 },
    /// Read-modify-write with retries: `value += add`.
    Add { add: i64 },
    /// A JSON merge of `{field: number}` (read-merge-write, or the one-statement merge when
    /// `in_place`).
    Merge {
        field: String,
        number: i64,
        in_place: bool,
    },
}

/// What the library answered, when it answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ret", rename_all = "snake_case")]
pub enum Ret {
    /// A load: the row, or none.
    Loaded { row: Option<Row> },
    /// A write that landed, with the token it handed back (`None` for a delete).
    Written { version: Option<i64> },
    /// An add that landed: the row's new version and value.
    Added { version: i64, value: i64 },
    /// A guarded write refused: the row the library reported as current.
    Conflict { current: Row },
    /// The row is missing.
    NotFound,
    /// An insert found the key taken.
    AlreadyExists,
    /// An answer that says nothing was written (a retryable error, retries exhausted,
    /// no connection from the pool): no effect on the row.
    NothingWritten,
}

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

/// The version of a row inserted by a call whose answer never came: the library seeds
/// each insert's version itself, so the model learns it from the first answer that shows
/// the row.
pub const UNKNOWN_SEED: i64 = i64::MIN;

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
        (_, None) => (Ret::NotFound, None),
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
