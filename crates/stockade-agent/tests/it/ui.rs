//! Compile-fail cases for G1: a tool runs only with a permit, and a permit cannot be retargeted.

#[test]
fn g1_ui_compile_fail_and_pass() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
