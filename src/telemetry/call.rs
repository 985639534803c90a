//! One call of the library's: the span its steps run in, and the report of how it ended.

use std::fmt::Debug;
use std::future::Future;

use crate::connect::backend::OccBackend;
use crate::error::Error;

/// A call of the library's being made: operation `db.operation` on table
/// `db.collection.name`. Made with [`Call::new`], run with [`Call::run`].
#[must_use = "a call reports nothing until it runs"]
pub(crate) struct Call {
    #[cfg(feature = "metrics")]
    labels: [(&'static str, &'static str); 3],
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl Call {
    /// Operation `operation` on `table` of backend `B`, about the row (or lock) `key`
    /// where there is one.
    #[cfg_attr(
        not(all(feature = "tracing", feature = "metrics")),
        allow(unused_variables)
    )]
    #[cfg_attr(
        not(any(feature = "tracing", feature = "metrics")),
        allow(clippy::extra_unused_type_parameters)
    )]
    #[inline]
    pub(crate) fn new<B: OccBackend>(
        operation: &'static str,
        table: &'static str,
        key: Option<&dyn Debug>,
    ) -> Call {
        Call {
            #[cfg(feature = "metrics")]
            labels: [
                ("db.system", B::DB_SYSTEM),
                ("db.operation", operation),
                ("db.collection.name", table),
            ],
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
            #[cfg(feature = "tracing")]
            span: {
                let span = tracing::debug_span!(
                    target: "diesel_occ",
                    "diesel_occ",
                    db.system = B::DB_SYSTEM,
                    db.operation = operation,
                    db.collection.name = table,
                    occ.key = tracing::field::Empty,
                    occ.outcome = tracing::field::Empty,
                );
                if let (Some(key), false) = (key, span.is_disabled()) {
                    span.record("occ.key", tracing::field::debug(key));
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
        self,
        body: impl Future<Output = Result<T, E>>,
        occ: impl Fn(&E) -> Option<&Error>,
    ) -> Result<T, E> {
        #[cfg(feature = "tracing")]
        let result = tracing::Instrument::instrument(body, self.span.clone()).await;
        #[cfg(not(feature = "tracing"))]
        let result = body.await;
        match &result {
            Ok(_) => self.ended("ok", None),
            Err(e) => match occ(e) {
                Some(error) => self.ended(error.kind(), Some(error)),
                None => self.ended("error", None),
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
    fn ended(self, outcome: &'static str, error: Option<&Error>) {
        #[cfg(feature = "tracing")]
        {
            self.span.record("occ.outcome", outcome);
            // A conflict has had its own event, with both tokens.
            if let Some(error) = error.filter(|e| !matches!(e, Error::Conflict(_))) {
                let _in_call = self.span.enter();
                if error.is_trouble() {
                    tracing::event!(name: "diesel_occ.call_failed", target: "diesel_occ", tracing::Level::WARN, occ.outcome = outcome, error = %error, "the call failed");
                } else {
                    tracing::event!(name: "diesel_occ.call_failed", target: "diesel_occ", tracing::Level::DEBUG, occ.outcome = outcome, error = %error, "the call ended without its write");
                }
            }
        }
        #[cfg(feature = "metrics")]
        {
            let [system, operation, table] = self.labels;
            metrics::counter!(
                "diesel_occ_calls_total",
                &[system, operation, table, ("occ.outcome", outcome)]
            )
            .increment(1);
            metrics::histogram!("diesel_occ_call_duration_seconds", &self.labels)
                .record(self.started.elapsed());
        }
    }
}
