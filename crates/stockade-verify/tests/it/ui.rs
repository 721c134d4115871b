//! Compile-fail tests: the typestate's guarantees (G1, G4, G7) are checked by the compiler.
//!
//! The `.stderr` snapshots depend on the pinned toolchain (rust-toolchain.toml); bless them
//! with `TRYBUILD=overwrite cargo test -p stockade-verify --test it ui`.

#[test]
fn g4_ui_compile_fail_and_pass() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
