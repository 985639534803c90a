//! One batch test body, two executors: the blocking [`GuardedBatch`] on a connection of
//! the test's r2d2 pool, and [`AsyncGuardedBatch`] on a diesel-async connection to the
//! same database, driven from the calling thread. Test bodies take a [`Batcher`] (or a
//! function making one per thread) and run unchanged on both.

use std::sync::{Arc, Mutex};

use diesel::connection::Connection;
use diesel::prelude::*;
use diesel_occ::asynchronous::{AsyncGuardedBatch, AsyncGuardedWrite, AsyncRun};
use diesel_occ::{
    BatchMode, BatchReport, DeleteRow, Error, GuardedBatch, GuardedWrite, UpdateBatch, UpdateRow,
};

/// The changes of the caller's own write before a batch.
type QuantityIs = diesel::dsl::Eq<orders::quantity, i32>;

use super::models::Order;
use super::paths::{recorder, Async, Blocking};
use super::schema::orders;

/// A batch row's changes: only `Some` fields are written, and `gift_message: Some(None)`
/// writes `NULL`.
#[derive(Debug, Clone, Default, AsChangeset)]
#[diesel(table_name = orders)]
pub struct BatchPatch {
    pub note: Option<String>,
    pub quantity: Option<i32>,
    pub gift_message: Option<Option<String>>,
}

impl BatchPatch {
    pub fn note(note: impl Into<String>) -> Self {
        BatchPatch {
            note: Some(note.into()),
            ..Default::default()
        }
    }

    pub fn quantity(quantity: i32) -> Self {
        BatchPatch {
            quantity: Some(quantity),
            ..Default::default()
        }
    }
}

/// The batches of the shared test bodies, on the `orders` table's [`Order`].
pub trait Batcher {
    /// Which executor, for messages.
    const PATH: &'static str;
    fn update_batch(
        &mut self,
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error>;
    fn delete_batch(
        &mut self,
        rows: Vec<(i64, i64)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error>;
    /// In a transaction of the caller's: a guarded update of row `id` from `expected`
    /// setting its quantity, then the batch; committed when both returned `Ok`.
    fn update_batch_in_transaction(
        &mut self,
        first: (i64, i64, i32),
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error>;
    /// From now on, the SQL of every statement this executor's connection sends.
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>>;
}

impl<C> Batcher for Blocking<C>
where
    C: Connection + diesel_occ::WriteTransaction,
    Order: UpdateBatch<C, BatchPatch> + DeleteRow<C> + UpdateRow<C, QuantityIs>,
{
    const PATH: &'static str = "blocking";
    fn update_batch(
        &mut self,
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error> {
        <Order as GuardedBatch>::guarded_update_batch(&mut self.0, rows, mode)
    }
    fn delete_batch(
        &mut self,
        rows: Vec<(i64, i64)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error> {
        <Order as GuardedBatch>::guarded_delete_batch(&mut self.0, rows, mode)
    }
    fn update_batch_in_transaction(
        &mut self,
        (id, expected, quantity): (i64, i64, i32),
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error> {
        self.0.transaction::<_, Error, _>(|conn| {
            <Order as GuardedWrite>::guarded_update_by_key(
                conn,
                &id,
                &expected,
                orders::quantity.eq(quantity),
            )?;
            <Order as GuardedBatch>::guarded_update_batch(conn, rows, mode)
        })
    }
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        self.0.set_instrumentation(recorder(&statements));
        statements
    }
}

impl<A> Batcher for Async<A>
where
    A: diesel_async::AsyncConnection + Send,
    diesel_occ::op::BatchUpdate<Order, BatchPatch>: AsyncRun<A>,
    diesel_occ::op::BatchDelete<Order>: AsyncRun<A>,
    diesel_occ::op::Update<Order, QuantityIs>: AsyncRun<A>,
{
    const PATH: &'static str = "async";
    fn update_batch(
        &mut self,
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error> {
        self.runtime
            .block_on(<Order as AsyncGuardedBatch>::guarded_update_batch(
                &mut self.conn,
                rows,
                mode,
            ))
    }
    fn delete_batch(
        &mut self,
        rows: Vec<(i64, i64)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error> {
        self.runtime
            .block_on(<Order as AsyncGuardedBatch>::guarded_delete_batch(
                &mut self.conn,
                rows,
                mode,
            ))
    }
    fn update_batch_in_transaction(
        &mut self,
        (id, expected, quantity): (i64, i64, i32),
        rows: Vec<(i64, i64, BatchPatch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<i64>, Error> {
        self.runtime
            .block_on(self.conn.transaction::<_, Error, _>(async move |conn| {
                <Order as AsyncGuardedWrite>::guarded_update_by_key(
                    conn,
                    &id,
                    &expected,
                    orders::quantity.eq(quantity),
                )
                .await?;
                <Order as AsyncGuardedBatch>::guarded_update_batch(conn, rows, mode).await
            }))
    }
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        self.conn.set_instrumentation(recorder(&statements));
        statements
    }
}
