//! One call of the library's: the span its steps run in, and the report of how it ended.

use std::fmt::Debug;
use std::future::Future;

use crate::connect::backend::OccBackend;
use crate::error::Error;

/// A call of the library's being made: operation `db.operation` on table
/// `db.collection.name`, about the row (or lock) `key`. Made with [`Call::new`], run
/// with [`Call::run`]; a call dropped before it ended (its future dropped: a timeout, a
/// client that went away) reports the outcome `cancelled`.
#[must_use = "a call reports nothing until it runs"]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))] // Names and key: events only.
pub(crate) struct Call<'k> {
    operation: &'static str,
    table: &'static str,
    key: Option<&'k (dyn Debug + Sync)>,
    /// Whether the end has been reported.
    ended: bool,
    #[cfg(feature = "metrics")]
    system: &'static str,
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl<'k> Call<'k> {
    /// Operation `operation` on `table` of backend `B`, about the row (or lock) `key`
    /// where there is one.
    #[cfg_attr(
        not(any(feature = "tracing", feature = "metrics")),
        allow(clippy::extra_unused_type_parameters)
    )]
    #[inline]
    pub(crate) fn new<B: OccBackend>(
        operation: &'static str,
        table: &'static str,
        key: Option<&'k (dyn Debug + Sync)>,
    ) -> Call<'k> {
        Call {
            operation,
            table,
            key,
            ended: false,
            #[cfg(feature = "metrics")]
            system: B::DB_SYSTEM,
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
            #[cfg(feature = "tracing")]
            span: {
                let span = tracing::debug_span!(
                    target: "diesel_occ",
                    "diesel_occ",
                    otel.name = tracing::field::Empty,
                    otel.kind = "client",
                    otel.status_code = tracing::field::Empty,
                    db.system = B::DB_SYSTEM,
                    db.operation = operation,
                    db.collection.name = table,
                    occ.key = tracing::field::Empty,
                    occ.outcome = tracing::field::Empty,
                    error.r#type = tracing::field::Empty,
                );
                if !span.is_disabled() {
                    span.record(
                        "otel.name",
                        tracing::field::display(format_args!("{operation} {table}")),
                    );
                    if let Some(key) = key {
                        span.record("occ.key", tracing::field::debug(key));
                    }
                }
                span
            },
        }
    }

    /// Runs `body` in the call's span and reports its outcome.
    pub(crate) async fn run<T>(
        self,
        body: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.run_as(body, |e| Some(e)).await
    }

    /// [`run`](Self::run), then `report` what it answered, inside the call's span (the
    /// events of a grant, a claim).
    #[cfg_attr(not(feature = "locks"), allow(dead_code))] // Locks and claims only.
    pub(crate) async fn run_reporting<T>(
        self,
        body: impl Future<Output = Result<T, Error>>,
        report: impl FnOnce(&Result<T, Error>),
    ) -> Result<T, Error> {
        #[cfg(feature = "tracing")]
        let span = self.span.clone();
        self.run_as(
            async {
                let answer = body.await;
                #[cfg(feature = "tracing")]
                let _in_call = span.enter();
                report(&answer);
                answer
            },
            |e| Some(e),
        )
        .await
    }

    /// [`run`](Self::run) for a body whose error may be the caller's own (a
    /// read-modify-write's change): `occ` finds the library's error in it, if it is one;
    /// the caller's own is reported as `error`.
    pub(crate) async fn run_as<T, E>(
        mut self,
        body: impl Future<Output = Result<T, E>>,
        occ: impl Fn(&E) -> Option<&Error>,
    ) -> Result<T, E> {
        #[cfg(feature = "tracing")]
        let result = tracing::Instrument::instrument(body, self.span.clone()).await;
        #[cfg(not(feature = "tracing"))]
        let result = body.await;
        match &result {
            Ok(_) => self.end("ok", None),
            Err(e) => match occ(e) {
                Some(error) => self.end(error.kind(), Some(error)),
                None => self.end("error", None),
            },
        }
        result
    }

    /// Reports the end of the call: `outcome`, and the library's `error` when it failed
    /// with one.
    #[cfg_attr(
        not(all(feature = "tracing", feature = "metrics")),
        allow(unused_variables)
    )]
    fn end(&mut self, outcome: &'static str, error: Option<&Error>) {
        self.ended = true;
        #[cfg(feature = "tracing")]
        {
            self.span.record("occ.outcome", outcome);
            if outcome != "ok" {
                self.span.record("otel.status_code", "ERROR");
                self.span.record("error.type", outcome);
            }
            if let Some(error) = error.filter(|e| !reported_on_its_own(self.operation, e)) {
                let _in_call = self.span.enter();
                let key = self.key.map(tracing::field::debug);
                // The call's own fields too: an operator's subscriber (`INFO`) does not
                // show the call's span.
                if error.is_trouble() {
                    tracing::event!(
                        name: "diesel_occ.call_failed",
                        target: "diesel_occ",
                        tracing::Level::WARN,
                        db.operation = self.operation,
                        db.collection.name = self.table,
                        occ.key = key,
                        occ.outcome = outcome,
                        error = %error,
                        "{} on {} failed", self.operation, self.table
                    );
                } else {
                    tracing::event!(
                        name: "diesel_occ.call_failed",
                        target: "diesel_occ",
                        tracing::Level::DEBUG,
                        db.operation = self.operation,
                        db.collection.name = self.table,
                        occ.key = key,
                        occ.outcome = outcome,
                        error = %error,
                        "{} on {} ended without its write", self.operation, self.table
                    );
                }
            }
        }
        #[cfg(feature = "metrics")]
        {
            let (system, operation, table) = (self.system, self.operation, self.table);
            metrics::counter!(
                "diesel_occ_calls_total",
                "db.system" => system,
                "db.operation" => operation,
                "db.collection.name" => table,
                "occ.outcome" => outcome
            )
            .increment(1);
            metrics::histogram!(
                "diesel_occ_call_duration_seconds",
                "db.system" => system,
                "db.operation" => operation,
                "db.collection.name" => table
            )
            .record(self.started.elapsed());
        }
    }
}

/// A call dropped before it answered: its caller gave up on it (a timeout, a client that
/// went away).
impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.end("cancelled", None);
        }
    }
}

/// Whether `error`, the answer of `operation`, has an event of its own, so that the
/// call's end adds none: a conflict (with both tokens), a retry loop that gave up, a
/// lock held by another or lost (a lock step's; a lost claim has no other report).
#[cfg(feature = "tracing")]
fn reported_on_its_own(operation: &str, error: &Error) -> bool {
    match error {
        Error::Conflict(_) | Error::RetriesExhausted { .. } | Error::LockHeld { .. } => true,
        Error::LockLost { .. } => operation.starts_with("lock."),
        _ => false,
    }
}
