//! The wasm tier's pre-initializer attack (bounded, issue 39, finding 1) is a module, not a
//! program: `tests/attacks/wasm/preinit.c`, whose `wizer-initialize` export grows memory
//! until refused and then sleeps, run by the wasm column. A native program has no
//! pre-initializer (its start-up is part of its run, under the same limits), so the process
//! and docker columns do not run this; it exists so that the row is generated like every
//! other (one program per row).
fn main() {
    println!("ATTEMPT pre_initializer n/a");
}
