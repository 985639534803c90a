//! Misuse of `#[derive(Guarded)]`, and the likeliest mistakes with the async API (the
//! blocking prelude on an async connection, a pool's guard passed for its connection), is
//! a compile error that points at the mistake and says how to fix it. Each case in
//! `tests/ui/<category>/` has its expected `.stderr`. (What diesel accepts, the derive
//! accepts too: that is `tests/writes/diesel_attributes.rs`. A case that must compile
//! here would make trybuild check every case in a build of its own, not all in one.)
//!
//! The expected messages list the version types of every backend (MySQL adds the
//! unsigned ones), some cases use chrono, and with the async API a method's trait is
//! named in full, so they run with every feature on, as CI runs them.

#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "chrono",
    feature = "async",
    feature = "bb8"
))]
#[test]
fn derive_misuse_is_reported_at_the_mistake() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*/*.rs");
}
