//! Generates `foreach_attack!` from the attack programs in `tests/attacks/src/bin`, so that an
//! attack without declared expectations does not compile.

use std::fmt::Write as _;

fn main() {
    // The run-time variable, not `env!`: checkouts that share a target directory share this
    // build script's binary, and a compile-time path could name another (or a deleted) checkout.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    let dir = std::path::Path::new(&manifest).join("../attacks/src/bin");
    println!("cargo::rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".rs")).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    assert!(!names.is_empty(), "no attack programs found in {}", dir.display());
    // Each file, too: a directory entry alone does not always notice a new attack.
    for n in &names {
        println!("cargo::rerun-if-changed={}/{n}.rs", dir.display());
    }
    let mut out = String::from(
        "/// Expands `$m!(attack)` for every attack program, as an array.\nmacro_rules! foreach_attack {\n    ($m:ident) => {\n        [\n",
    );
    for n in &names {
        let _ = writeln!(out, "            $m!({n}),");
    }
    out.push_str("        ]\n    };\n}\n");
    let path = std::path::Path::new(&std::env::var("OUT_DIR").unwrap_or_default()).join("attacks.rs");
    if let Err(e) = std::fs::write(&path, out) {
        panic!("writing {}: {e}", path.display());
    }
}
