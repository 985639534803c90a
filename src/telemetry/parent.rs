//! The caller's span, carried to the thread or task a call continues on.

/// The span current where a call began, entered again on the thread or task that does
/// the call's work (a lock's acquisition runs as a task of its own, an async SQLite call
/// and `with_connection` on a blocking thread), so that the library's spans there are
/// children of the caller's and a request's trace stays whole.
pub(crate) struct Parent {
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl Parent {
    /// The span current here.
    #[inline]
    pub(crate) fn current() -> Parent {
        Parent {
            #[cfg(feature = "tracing")]
            span: tracing::Span::current(),
        }
    }

    /// Runs `work` in the span (on a blocking thread).
    #[inline]
    pub(crate) fn run<R>(&self, work: impl FnOnce() -> R) -> R {
        #[cfg(feature = "tracing")]
        let _in_parent = self.span.enter();
        work()
    }

    /// `work`, polled in the span (as a task of its own).
    #[cfg(all(feature = "async", feature = "locks"))] // The async lock's tasks.
    #[inline]
    pub(crate) fn wrap<F: std::future::Future>(
        self,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        #[cfg(feature = "tracing")]
        return tracing::Instrument::instrument(work, self.span);
        #[cfg(not(feature = "tracing"))]
        work
    }
}
