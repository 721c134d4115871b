//! `cargo xtask tidy`: the rules of STYLE.md that a program can check.
//!
//! Each check collects every problem it finds; `run` reports them all at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The `lib.rs` headings every library crate has, in this order (STYLE §6).
const HEADINGS: &[&str] = &[
    "# Position in the stack",
    "# Threat model",
    "# Guarantees",
    "# Non-guarantees",
    "# Failure behaviour",
    "# Unsafe",
    "# Ambient authority",
    "# Feature flags",
    "# Invariants",
];

/// Workspace crates each crate may depend on (normal and build dependencies; STYLE §2).
const LAYERS: &[(&str, &[&str])] = &[
    ("stockade-protocol", &[]),
    ("stockade-policy", &[]),
    ("stockade-verify", &["stockade-protocol"]),
    // Host-directory authority the three tiers share (not a tier: no tier reaches another
    // through it).
    ("stockade-hostfs", &["stockade-protocol"]),
    // Host process and cgroup facts (safe /proc readers) the process and docker tiers and
    // the runtime share.
    ("stockade-sys", &[]),
    ("stockade-process", &["stockade-protocol", "stockade-hostfs", "stockade-sys"]),
    // verify only as a dev-dependency (dev-dependencies are not checked here).
    ("stockade-wasm", &["stockade-protocol", "stockade-hostfs"]),
    ("stockade-docker", &["stockade-protocol", "stockade-hostfs", "stockade-sys"]),
    // The network grant's proxy: decisions on connections (not a tier: it isolates nothing).
    ("stockade-egress", &["stockade-protocol", "stockade-policy"]),
    (
        "stockade-runtime",
        &[
            "stockade-protocol",
            "stockade-policy",
            "stockade-egress",
            "stockade-verify",
            "stockade-sys",
            "stockade-process",
            "stockade-wasm",
            "stockade-docker",
        ],
    ),
    ("stockade-agent", &["stockade-protocol", "stockade-policy", "stockade-runtime"]),
    // The servers: beside the agent, on the runtime's sessions.
    ("stockade-serve", &["stockade-protocol", "stockade-runtime"]),
    ("stockade-cli", &["stockade-agent", "stockade-serve", "stockade-runtime"]),
    // The bindings (under bindings/, a floor above the CLI: nothing under crates/ depends
    // on them): one core both share, and one FFI crate per host language over it.
    ("stockade-bindings", &["stockade-agent", "stockade-runtime"]),
    ("stockade-python", &["stockade-bindings"]),
    ("stockade-node", &["stockade-bindings"]),
];

/// Heavy or risky dependencies and the one crate under `crates/` allowed to use each (STYLE §2.5).
const OWNERS: &[(&str, &str)] = &[
    ("bollard", "stockade-docker"),
    ("wasmtime", "stockade-wasm"),
    ("wasmtime-wasi", "stockade-wasm"),
    ("wasmtime-wizer", "stockade-wasm"),
    ("landlock", "stockade-process"),
    ("seccompiler", "stockade-process"),
    ("libc", "stockade-process"),
    ("rustix", "stockade-process"),
    // The files API's extended attributes (a file's user metadata), on descriptors cap-std
    // opened: safe calls, the crate stays `forbid(unsafe_code)`.
    ("rustix", "stockade-hostfs"),
    ("nix", "stockade-process"),
    ("cap-std", "stockade-hostfs"),
    ("jsonschema", "stockade-runtime"),
    ("reqwest", "stockade-agent"),
    ("ureq", "stockade-agent"),
    ("hyper", "stockade-agent"),
    // The one server crate beside the one client crate: hyper's two roles, each owned once.
    ("hyper", "stockade-serve"),
    // Each host language's FFI has one crate.
    ("pyo3", "stockade-python"),
    ("napi", "stockade-node"),
    ("napi-derive", "stockade-node"),
    ("napi-build", "stockade-node"),
];

/// Crates whose root must say `#![forbid(unsafe_code)]` (STYLE §5.1).
const FORBID_UNSAFE: &[&str] = &[
    "stockade-protocol",
    "stockade-hostfs",
    "stockade-sys",
    "stockade-egress",
    "stockade-policy",
    "stockade-verify",
    "stockade-docker",
    "stockade-runtime",
    "stockade-agent",
    "stockade-serve",
    "stockade-cli",
    "stockade-bindings",
];

/// `cargo metadata --no-deps` for the workspace.
pub(crate) fn metadata(root: &Path) -> Result<Value> {
    let out = crate::cargo(&["metadata", "--format-version", "1", "--no-deps"]).current_dir(root).output()?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("parsing cargo metadata")
}

/// Runs every check and fails with the full list of problems.
pub(crate) fn run(root: &Path) -> Result<()> {
    let meta = metadata(root)?;
    let mut problems = Vec::new();
    let packages = meta["packages"].as_array().context("no packages")?;
    for pkg in packages {
        check_package(root, pkg, &mut problems)?;
    }
    check_sources(root, &mut problems)?;
    if problems.is_empty() {
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("{} tidy problem(s)", problems.len())
}

fn check_package(root: &Path, pkg: &Value, problems: &mut Vec<String>) -> Result<()> {
    let name = pkg["name"].as_str().unwrap_or_default();
    let manifest = PathBuf::from(pkg["manifest_path"].as_str().unwrap_or_default());
    let dir = manifest.parent().context("manifest has no directory")?.to_path_buf();
    let rel = dir.strip_prefix(root).unwrap_or(&dir).to_string_lossy().into_owned();
    let text = fs::read_to_string(&manifest)?;
    if !text.contains("[lints]\nworkspace = true") {
        problems.push(format!("{rel}/Cargo.toml: missing `[lints] workspace = true`"));
    }
    // The bindings' crates are held to the same rules as those under crates/.
    let under_crates = rel.starts_with("crates/") || rel.starts_with("bindings/");
    if under_crates {
        if dir.file_name().and_then(|f| f.to_str()) != Some(name) {
            problems.push(format!("{rel}: directory name differs from package name {name}"));
        }
        check_lib_header(&dir, name, problems)?;
        check_guarantee_tests(&dir, name, problems)?;
        check_single_test_binary(&dir, name, problems)?;
        check_unused_dependencies(&dir, name, pkg, problems)?;
    } else {
        let version = pkg["version"].as_str().unwrap_or_default();
        let unpublished = pkg["publish"].as_array().is_some_and(Vec::is_empty);
        if version != "0.0.0" || !unpublished {
            problems.push(format!("{rel}: unpublished crates need version 0.0.0 and publish = false"));
        }
    }
    for dep in pkg["dependencies"].as_array().into_iter().flatten() {
        let kind = dep["kind"].as_str();
        if kind == Some("dev") || !under_crates {
            continue;
        }
        let dep_name = dep["name"].as_str().unwrap_or_default();
        if dep_name.starts_with("stockade-") {
            let allowed = LAYERS.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
            match allowed {
                Some(a) if a.contains(&dep_name) => {}
                Some(_) => problems.push(format!("{name} must not depend on {dep_name} (STYLE §2 layering)")),
                None => problems.push(format!("{name} is not in the layering table in xtask/src/tidy.rs")),
            }
        }
        let owners: Vec<&str> = OWNERS.iter().filter(|(d, _)| *d == dep_name).map(|(_, o)| *o).collect();
        if !owners.is_empty() && !owners.contains(&name) {
            let owners = owners.join(" and ");
            problems.push(format!("{name} depends on {dep_name}, which only {owners} may use (STYLE §2.5)"));
        }
    }
    Ok(())
}

/// Dependencies a crate declares for what they do to another crate (features, a linked
/// library), not for code it names: (crate, dependency, why).
const USED_WITHOUT_NAMING: &[(&str, &str, &str)] = &[];

/// Every normal dependency of a crate under `crates/` is named somewhere in its `src/` (as
/// `name::`, `use name`, `name!` or in a derive path): one that is not is dead weight in
/// every build and a false edge in the layering table.
fn check_unused_dependencies(dir: &Path, name: &str, pkg: &Value, problems: &mut Vec<String>) -> Result<()> {
    let mut text = String::new();
    let mut stack = vec![dir.join("src")];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text.push_str(&fs::read_to_string(&path)?);
            }
        }
    }
    if let Ok(build) = fs::read_to_string(dir.join("build.rs")) {
        text.push_str(&build);
    }
    for dep in pkg["dependencies"].as_array().into_iter().flatten() {
        if dep["kind"].as_str().is_some() {
            continue; // dev and build dependencies
        }
        let dep_name = dep["name"].as_str().unwrap_or_default();
        let ident = dep["rename"].as_str().unwrap_or(dep_name).replace('-', "_");
        let named = [format!("{ident}::"), format!("use {ident}"), format!("{ident}!")].iter().any(|p| {
            text.match_indices(p.as_str()).any(|(i, _)| !text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        });
        if !named && !USED_WITHOUT_NAMING.iter().any(|(c, d, _)| *c == name && *d == dep_name) {
            problems.push(format!("{name} declares the dependency {dep_name} but its src/ never names it; remove it"));
        }
    }
    Ok(())
}

fn check_lib_header(dir: &Path, name: &str, problems: &mut Vec<String>) -> Result<()> {
    let lib = dir.join("src/lib.rs");
    let Ok(text) = fs::read_to_string(&lib) else {
        problems.push(format!("{name}: no src/lib.rs (STYLE §1.3)"));
        return Ok(());
    };
    let docs: Vec<&str> = text.lines().take_while(|l| l.starts_with("//!") || l.trim().is_empty()).collect();
    let mut at = 0;
    for heading in HEADINGS {
        match docs[at..].iter().position(|l| l.trim_start_matches("//!").trim() == *heading) {
            Some(i) => at += i + 1,
            None => problems.push(format!("{name}: lib.rs header lacks `{heading}` (or it is out of order)")),
        }
    }
    if FORBID_UNSAFE.contains(&name) && !text.contains("#![forbid(unsafe_code)]") {
        problems.push(format!("{name}: lib.rs must say #![forbid(unsafe_code)]"));
    }
    Ok(())
}

/// Every `G<n>.` in the lib.rs header has a test `fn g<n>_*` (or a tests/ui file mentioning
/// `G<n>`), every such test has its guarantee, and every `pinned by` path exists.
fn check_guarantee_tests(dir: &Path, name: &str, problems: &mut Vec<String>) -> Result<()> {
    let lib = fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
    let mut declared = BTreeSet::new();
    let mut pinned = Vec::new();
    let mut current: Option<String> = None;
    for line in lib.lines().map(|l| l.trim_start_matches("//!").trim()) {
        if let Some(rest) = line.strip_prefix('G')
            && let Some((n, _)) = rest.split_once('.')
            && let Ok(n) = n.parse::<u32>()
        {
            declared.insert(n);
        }
        if let Some(rest) = line.strip_prefix("(pinned by:") {
            current = Some(rest.to_owned());
        } else if let Some(group) = current.as_mut() {
            group.push(' ');
            group.push_str(line);
        }
        if let Some(group) = current.take_if(|g| g.ends_with(')')) {
            pinned.extend(group.trim_end_matches(')').split(',').map(|e| e.trim().to_owned()));
        }
    }
    let mut tested: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for file in rust_files(dir)? {
        let text = fs::read_to_string(&file)?;
        let rel = file.strip_prefix(dir).unwrap_or(&file).to_string_lossy().into_owned();
        for line in text.lines() {
            if let Some(pos) = line.find("fn g") {
                let digits: String = line[pos + 4..].chars().take_while(char::is_ascii_digit).collect();
                if let Ok(n) = digits.parse::<u32>()
                    && line[pos + 4 + digits.len()..].starts_with('_')
                {
                    tested.entry(n).or_default().push(rel.clone());
                }
            }
        }
        if rel.starts_with("tests/ui/") {
            for n in &declared {
                if text.contains(&format!("G{n}")) {
                    tested.entry(*n).or_default().push(rel.clone());
                }
            }
        }
    }
    for n in &declared {
        if !tested.contains_key(n) {
            problems.push(format!("{name}: guarantee G{n} has no test named g{n}_* and no tests/ui file naming it"));
        }
    }
    for (n, files) in &tested {
        if !declared.contains(n) {
            problems.push(format!("{name}: {} has g{n}_* tests but lib.rs declares no G{n}", files[0]));
        }
    }
    for entry in pinned.iter().filter(|e| !e.is_empty()) {
        let (path, test) = entry.split_once("::").unwrap_or((entry, ""));
        let full = dir.join(path);
        let exists = if path.contains('*') { full.parent().is_some_and(Path::is_dir) } else { full.is_file() };
        if !exists {
            problems.push(format!("{name}: `pinned by` names {path}, which does not exist"));
            continue;
        }
        if let Some(prefix) = test.strip_suffix('*')
            && !path.contains('*')
            && !fs::read_to_string(&full)?.contains(&format!("fn {prefix}"))
        {
            problems.push(format!("{name}: `pinned by` names {entry}, but {path} has no fn {prefix}*"));
        }
    }
    Ok(())
}

/// STYLE §8.2: one integration binary, `tests/it/main.rs`.
fn check_single_test_binary(dir: &Path, name: &str, problems: &mut Vec<String>) -> Result<()> {
    let tests = dir.join("tests");
    if !tests.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(&tests)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            problems.push(format!("{name}: {} is a separate test binary; use tests/it/", path.display()));
        }
    }
    Ok(())
}

/// Banned test attributes and the unsafe allow-list, over every Rust file in the repository.
fn check_sources(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let should_panic = concat!("#[", "should_panic");
    let bare_ignore = concat!("#[", "ignore]");
    let mut counts = BTreeMap::new();
    for file in rust_files(root)? {
        let rel = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().into_owned();
        if rel.starts_with("tests/ui") || rel.contains("/tests/ui/") {
            // Compile-fail cases exist to contain what the rules forbid.
            continue;
        }
        let text = fs::read_to_string(&file)?;
        if text.contains(should_panic) {
            problems.push(format!("{rel}: should_panic is banned; assert on the Err (STYLE §8.8)"));
        }
        if text.contains(bare_ignore) {
            problems.push(format!("{rel}: a bare ignore is banned; gate with an env var that says why (STYLE §8.8)"));
        }
        let n = count_unsafe(&text);
        if n > 0 {
            counts.insert(rel, n);
        }
    }
    let listed = read_allowlist(root)?;
    for (file, n) in &counts {
        match listed.get(file) {
            Some(m) if m == n => {}
            Some(m) => {
                problems.push(format!("{file}: {n} unsafe uses, allow-list says {m}; edit xtask/unsafe-allowlist.txt"))
            }
            None => problems.push(format!("{file}: {n} unsafe uses, not on xtask/unsafe-allowlist.txt (STYLE §5.5)")),
        }
    }
    for file in listed.keys().filter(|f| !counts.contains_key(*f)) {
        problems.push(format!("xtask/unsafe-allowlist.txt lists {file}, which has no unsafe; remove the line"));
    }
    Ok(())
}

/// Counts `unsafe` blocks, fns, impls and extern blocks outside comments.
fn count_unsafe(text: &str) -> usize {
    let kw = "unsafe";
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| {
            l.match_indices(kw)
                .filter(|(i, _)| {
                    let before = l[..*i].chars().next_back();
                    let after = l[i + kw.len()..].trim_start();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '"')
                        && ["{", "fn ", "impl", "extern"].iter().any(|s| after.starts_with(s))
                })
                .count()
        })
        .sum()
}

fn read_allowlist(root: &Path) -> Result<BTreeMap<String, usize>> {
    let text = fs::read_to_string(root.join("xtask/unsafe-allowlist.txt")).unwrap_or_default();
    let mut map = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (file, n) = line.rsplit_once(' ').context("allow-list lines are `path count`")?;
        map.insert(file.trim().to_owned(), n.parse().context("allow-list count")?);
    }
    Ok(map)
}

/// Every `.rs` file below `dir`, skipping build output and VCS directories.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let path = entry?.path();
            let fname = path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
            if path.is_dir() {
                if !matches!(fname, "target" | ".git" | "corpus" | "artifacts") {
                    stack.push(path);
                }
            } else if fname.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tidy() {
        if let Err(e) = super::run(&crate::root()) {
            panic!("{e:#}");
        }
    }

    #[test]
    fn unsafe_counter_sees_keywords_only() {
        let src = concat!("unsafe", " { x }\n// unsafe", " {\nlet s = \"unsafe", " {\";\n", "unsafe", " fn f() {}\n");
        assert_eq!(super::count_unsafe(src), 2);
    }
}
