//! `stockade._native`: the pyo3 layer of the Python package `stockade`, over
//! `stockade-bindings`. It holds no logic of its own: it moves options and values across as
//! JSON text and bytes, releases the GIL while a run or session call goes on, and raises a
//! refusal as `NativeRefusal(kind, message, report)`, which the package's Python layer
//! (`python/stockade/__init__.py`) raises as its typed exception (`stockade.Timeout`, ...).
//!
//! # Position in the stack
//! Depends on: `stockade-bindings` (and pyo3, whose one owner this crate is). Used by: the
//! `stockade` wheel. Nothing in the workspace depends on it.
//!
//! # Threat model
//! That of `stockade-bindings`: the host program is trusted, a guest's output is not.
//!
//! # Guarantees
//! Those of `stockade-bindings`; this layer adds that the GIL is released while a run or
//! session call goes on, and that a host function and a check (Python callables) run with
//! the GIL held on a thread the runtime lends (a host function) or on the caller's thread (a
//! check), never on an async worker (tested by the package's pytest suite:
//! `bindings/stockade-python/tests`, through `cargo xtask bindings`).
//!
//! # Non-guarantees
//! A host function is the host's code.
//!
//! # Failure behaviour
//! Every refusal is a `NativeRefusal(kind, message, report)`; the package raises it as its
//! typed exception.
//!
//! # Unsafe
//! None of ours: `#![deny(unsafe_code)]`; pyo3's macros expand to the FFI glue.
//!
//! # Ambient authority
//! That of `stockade-bindings`.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Options cross as JSON text; no Python object is held past the call that passed it, but a
//! host function's callable, for its run.

#![deny(unsafe_code)]

use std::sync::Arc;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use stockade_bindings::{self as core, Refused};

pyo3::create_exception!(_native, NativeRefusal, PyException, "A refusal: (kind, message, report JSON or None).");

fn raise(r: Refused) -> PyErr {
    NativeRefusal::new_err((r.kind, r.message, r.report))
}

fn json_arg(what: &str, text: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| raise(Refused::invalid(format!("{what}: {e}"))))
}

/// Names the process tier's helper binary (the package passes the one it carries).
#[pyfunction]
fn set_helper(path: String) {
    core::set_helper(path);
}

/// Every refusal kind, for the package's exception classes.
#[pyfunction]
fn refusal_kinds() -> Vec<&'static str> {
    core::REFUSAL_KINDS.to_vec()
}

/// A host function grant from `(callable, schema JSON, description)`: the callable takes
/// the arguments as JSON text and answers with JSON text (the package wraps the user's).
fn host_function(name: &str, spec: &Bound<'_, PyAny>) -> PyResult<core::FunctionGrant> {
    let (callable, schema, description): (Py<PyAny>, String, Option<String>) = spec.extract()?;
    let schema = json_arg(&format!("grant {name}'s schema"), &schema)?;
    let callable = Arc::new(callable);
    let call: core::HostFn = Arc::new(move |args: serde_json::Value| {
        let callable = Arc::clone(&callable);
        Box::pin(async move {
            let called = tokio::task::spawn_blocking(move || {
                Python::attach(|py| -> Result<serde_json::Value, String> {
                    let out = callable.call1(py, (args.to_string(),)).map_err(|e| e.to_string())?;
                    let text: String = out.extract(py).map_err(|e: PyErr| e.to_string())?;
                    serde_json::from_str(&text).map_err(|e| format!("the host function's answer: {e}"))
                })
            })
            .await;
            called.map_err(|e| format!("the host function did not finish: {e}"))?
        })
    });
    core::host_function(name, schema, description.as_deref(), call).map_err(raise)
}

/// Runs as the options (JSON) say, with the GIL released, and verifies the report. Returns
/// `(kind, value, report)`: `kind` is `text` (value: str), `json` (value: JSON text) or
/// `bytes` (value: bytes). `check(kind, value)` answers `None` to accept or a reason to
/// reject; `functions` maps grant names to `(callable, schema JSON, description)`.
#[pyfunction]
#[pyo3(signature = (options, stdin=None, functions=None, check=None))]
fn run(
    py: Python<'_>,
    options: &str,
    stdin: Option<Vec<u8>>,
    functions: Option<&Bound<'_, PyDict>>,
    check: Option<Py<PyAny>>,
) -> PyResult<(&'static str, Py<PyAny>, String)> {
    let opts: core::RunOptions = serde_json::from_str(options).map_err(|e| raise(Refused::invalid(e.to_string())))?;
    let mut grants = Vec::new();
    if let Some(fs) = functions {
        for (name, spec) in fs.iter() {
            let name: String = name.extract()?;
            grants.push(host_function(&name, &spec)?);
        }
    }
    let executed = py.detach(|| core::runtime().block_on(core::run(opts, stdin, grants))).map_err(raise)?;
    let ran = executed
        .verify(|value| {
            let Some(check) = &check else { return Ok(()) };
            let (kind, arg) = value_of(py, value);
            match check.call1(py, (kind, arg)) {
                Ok(r) if r.is_none(py) => Ok(()),
                Ok(r) => Err(r.bind(py).str().map_or_else(|_| "rejected".into(), |s| s.to_string())),
                Err(e) => Err(e.to_string()),
            }
        })
        .map_err(raise)?;
    let (kind, value) = value_of(py, &ran.value);
    Ok((kind, value, ran.report))
}

fn value_of(py: Python<'_>, v: &core::Value) -> (&'static str, Py<PyAny>) {
    match v {
        core::Value::Text(s) => {
            ("text", s.clone().into_pyobject(py).map_or_else(|_| py.None(), |o| o.into_any().unbind()))
        }
        core::Value::Json(j) => {
            ("json", j.to_string().into_pyobject(py).map_or_else(|_| py.None(), |o| o.into_any().unbind()))
        }
        core::Value::Bytes(b) => ("bytes", PyBytes::new(py, b).into_any().unbind()),
    }
}

/// A policy over the host's tools, with one gate deciding each call.
#[pyclass(frozen, module = "stockade._native")]
struct Policy(core::BoundPolicy);

#[pymethods]
impl Policy {
    /// The policy TOML over the tools (JSON text: name to the JSON Schema of its arguments).
    #[staticmethod]
    fn from_toml(toml: &str, tools: &str) -> PyResult<Self> {
        let tools = json_arg("tools", tools)?;
        core::BoundPolicy::from_toml(toml, &tools).map(Self).map_err(raise)
    }

    /// The decision on one call (args: JSON text), as JSON text.
    fn authorize(&self, tool: &str, args: &str, source: &str) -> PyResult<String> {
        let args = json_arg("args", args)?;
        self.0.authorize(tool, &args, source).map(|d| d.to_string()).map_err(raise)
    }

    fn set_read_untrusted(&self) {
        self.0.set_read_untrusted();
    }

    fn has_read_untrusted(&self) -> bool {
        self.0.has_read_untrusted()
    }

    fn untrusted_output(&self, tool: &str) -> bool {
        self.0.untrusted_output(tool)
    }
}

/// Marks untrusted text (or JSON text, with `is_json`); the block's parts as JSON text.
#[pyfunction]
#[pyo3(signature = (text, source, call_id, is_json=false, datamark=false))]
fn mark(text: &str, source: &str, call_id: &str, is_json: bool, datamark: bool) -> PyResult<String> {
    core::mark(text, source, call_id, is_json, datamark).map(|v| v.to_string()).map_err(raise)
}

/// The system-prompt sentence for marked blocks.
#[pyfunction]
#[pyo3(signature = (datamark=false))]
fn system_prompt(datamark: bool) -> String {
    core::system_prompt(datamark)
}

/// A live session (the package's `stockade.Session` holds one).
#[pyclass(frozen, module = "stockade._native")]
struct Session(Arc<core::BoundSession>);

#[pymethods]
impl Session {
    /// Makes a session (options: JSON text), with the GIL released.
    #[staticmethod]
    fn create(py: Python<'_>, options: &str) -> PyResult<Self> {
        let opts: core::SessionOptions =
            serde_json::from_str(options).map_err(|e| raise(Refused::invalid(e.to_string())))?;
        let s = py.detach(|| core::runtime().block_on(core::BoundSession::create(opts))).map_err(raise)?;
        Ok(Self(Arc::new(s)))
    }

    #[getter]
    fn id(&self) -> String {
        self.0.id().to_owned()
    }

    /// Runs argv in it: `(summary JSON, stdout bytes, stderr bytes)`.
    #[pyo3(signature = (argv, stdin=None, timeout=None, cwd=None))]
    fn exec<'py>(
        &self,
        py: Python<'py>,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
        timeout: Option<f64>,
        cwd: Option<String>,
    ) -> PyResult<(String, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let s = Arc::clone(&self.0);
        let (summary, out, err) = py
            .detach(|| core::runtime().block_on(s.exec(&argv, stdin.unwrap_or_default(), timeout, cwd.as_deref())))
            .map_err(raise)?;
        Ok((summary.to_string(), PyBytes::new(py, &out), PyBytes::new(py, &err)))
    }

    fn write(&self, py: Python<'_>, path: &str, data: Vec<u8>) -> PyResult<()> {
        let s = Arc::clone(&self.0);
        py.detach(|| core::runtime().block_on(s.write(path, &data))).map_err(raise)
    }

    fn read<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let s = Arc::clone(&self.0);
        let data = py.detach(|| core::runtime().block_on(s.read(path))).map_err(raise)?;
        Ok(PyBytes::new(py, &data))
    }

    fn pause(&self, py: Python<'_>) -> PyResult<()> {
        let s = Arc::clone(&self.0);
        py.detach(|| core::runtime().block_on(s.pause())).map_err(raise)
    }

    fn resume(&self, py: Python<'_>) -> PyResult<()> {
        let s = Arc::clone(&self.0);
        py.detach(|| core::runtime().block_on(s.resume())).map_err(raise)
    }

    fn kill(&self, py: Python<'_>) -> PyResult<()> {
        let s = Arc::clone(&self.0);
        py.detach(|| core::runtime().block_on(s.kill())).map_err(raise)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NativeRefusal", m.py().get_type::<NativeRefusal>())?;
    m.add("MAX_RUN_THREADS", core::MAX_RUN_THREADS)?;
    m.add_function(wrap_pyfunction!(set_helper, m)?)?;
    m.add_function(wrap_pyfunction!(refusal_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(mark, m)?)?;
    m.add_function(wrap_pyfunction!(system_prompt, m)?)?;
    m.add_class::<Policy>()?;
    m.add_class::<Session>()?;
    Ok(())
}
