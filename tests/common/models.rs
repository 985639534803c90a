//! Entities of the example tables, as a user of diesel-occ writes them.

use diesel::prelude::*;
use diesel_occ::Guarded;

#[cfg(feature = "chrono")]
use super::schema::documents;
use super::schema::{counters, order_lines, orders};

/// A BIGINT version and a nullable column.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = orders)]
pub struct Order {
    pub id: i64,
    pub customer: String,
    pub note: String,
    pub status: String,
    pub quantity: i32,
    pub gift_message: Option<String>,
    #[occ(version)]
    pub version: i64,
}

impl Order {
    pub fn new(id: i64, note: &str) -> Self {
        Order {
            id,
            customer: "ada".into(),
            note: note.into(),
            status: "valid".into(),
            quantity: 1,
            gift_message: None,
            version: 0,
        }
    }
}

/// A partial change: only `Some` fields are written.
#[derive(Debug, Default, AsChangeset)]
#[diesel(table_name = orders)]
pub struct OrderPatch {
    pub note: Option<String>,
    pub quantity: Option<i32>,
}

/// A composite key and an INTEGER version.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = order_lines, primary_key(order_id, line_no))]
pub struct OrderLine {
    pub order_id: i64,
    pub line_no: i32,
    pub sku: String,
    pub quantity: i32,
    #[occ(version)]
    pub version: i32,
}

/// A text key and a SMALLINT version whose field is named differently from its column.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = counters, primary_key(name))]
pub struct Counter {
    pub name: String,
    pub value: i64,
    #[occ(version)]
    #[diesel(column_name = revision)]
    pub rev: i16,
}

/// A quantity as the domain sees it; stored as INTEGER.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantity(pub i32);

impl From<Quantity> for i32 {
    fn from(q: Quantity) -> i32 {
        q.0
    }
}

impl From<i32> for Quantity {
    fn from(q: i32) -> Quantity {
        Quantity(q)
    }
}

/// A form over `orders` that may not change the customer and stores a newtype.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
pub struct OrderForm {
    pub id: i64,
    #[diesel(skip_update)]
    pub customer: String,
    pub note: String,
    #[diesel(serialize_as = i32, deserialize_as = i32)]
    pub quantity: Quantity,
    #[occ(version)]
    pub version: i64,
}

/// A row guarded by its last-modified timestamp, on the application's clock.
#[cfg(feature = "chrono")]
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = documents)]
pub struct Document {
    pub id: i64,
    pub body: String,
    pub hits: i64,
    #[occ(last_modified)]
    pub last_modified: chrono::NaiveDateTime,
}

/// The same row on a clock each test thread sets itself ([`FrozenClock`]).
#[cfg(feature = "chrono")]
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = documents)]
pub struct FrozenDocument {
    pub id: i64,
    pub body: String,
    pub hits: i64,
    #[occ(last_modified(clock = super::FrozenClock))]
    pub last_modified: chrono::NaiveDateTime,
}

/// The states of an order, stored as text in `orders.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
#[occ(storage = "text")]
pub enum OrderState {
    #[occ(from(Held))]
    Valid,
    #[occ(from(Valid))]
    Held,
    #[occ(from(Valid))]
    Shipped,
    #[occ(from(Valid, Held), rename = "canceled")]
    Cancelled,
    #[occ(from(Shipped))]
    Delivered,
}

/// An order whose status moves by transitions only.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
pub struct TrackedOrder {
    pub id: i64,
    pub note: String,
    #[occ(status)]
    pub status: OrderState,
    #[occ(version)]
    pub version: i64,
}

/// An order whose view counter is written outside the guard.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
pub struct ViewedOrder {
    pub id: i64,
    pub note: String,
    #[occ(exclude)]
    pub views: i64,
    #[occ(version)]
    pub version: i64,
}
