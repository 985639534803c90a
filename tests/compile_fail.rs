//! Misuse of `#[derive(Guarded)]` is a compile error that points at the mistake and says
//! how to fix it. Each case in `tests/ui/<category>/` has its expected `.stderr`.

#[test]
fn derive_misuse_is_reported_at_the_mistake() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*/*.rs");
}
