//! Builds `stockade-call`, the grants client that runs inside sandboxes, as a static
//! executable (`cc -static`), so that it runs in any image. A host without a C compiler or
//! a static C library builds the runtime without the client: the broker still works, and
//! guests speak its wire protocol themselves (the report says the client is absent).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "client/stockade-call.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("stockade-call");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-static", "-Os", "-s", "-Wall", "-Wextra", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        println!("cargo:warning=could not build {src} with `{cc} -static`: the grants client is left out");
        let _ = std::fs::write(&out, b"");
    }
}
