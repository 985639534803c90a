//! A row only a lock's holder writes, with the newest fence it accepted (for fenced
//! writes); each test creates it with [`CREATE`].

use diesel::prelude::*;
use diesel_occ::Guarded;

diesel::table! {
    protected (id) {
        id -> BigInt,
        value -> BigInt,
        last_fence -> BigInt,
        version -> BigInt,
    }
}

/// The row, with the fence column the holder's writes record.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = protected)]
pub struct Protected {
    pub id: i64,
    pub value: i64,
    pub last_fence: i64,
    #[occ(version)]
    pub version: i64,
}

/// The table, with row 1 at value 0 and fence 0.
pub const CREATE: &str = "CREATE TABLE protected (id BIGINT PRIMARY KEY, value BIGINT NOT NULL, \
     last_fence BIGINT NOT NULL, version BIGINT NOT NULL); \
     INSERT INTO protected (id, value, last_fence, version) VALUES (1, 0, 0, 0)";
