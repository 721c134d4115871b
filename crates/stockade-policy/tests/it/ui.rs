//! Compile-fail tests for G5 and G9; bless with `TRYBUILD=overwrite`.

#[test]
fn g9_ui_compile_fail_and_pass() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
