//! Tools: a name, a description, JSON Schema parameters, the trust of the output, and a call
//! that cannot happen without a permit.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use stockade_policy::allow::{Permit, Registry, SchemaError, ToolSpec};

/// Whether a tool's output may steer the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trust {
    /// Written by trusted code (the host's own data): enters the history as it is.
    Trusted,
    /// Possibly written by an outsider (a letter, a web page, a sandboxed program's output):
    /// marked before the model reads it, and reading it sets the session's read-untrusted flag.
    Untrusted,
}

/// What the model is told about a tool, and how its output is treated.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    name: String,
    description: String,
    parameters: Value,
    trust: Trust,
}

impl ToolDef {
    /// A tool definition; `parameters` is a JSON Schema of type `object` (the same schema goes
    /// to the model and to the policy's registry).
    #[must_use]
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value, trust: Trust) -> Self {
        Self { name: name.into(), description: description.into(), parameters, trust }
    }
    /// The name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The description.
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The parameters' JSON Schema.
    #[must_use]
    pub fn parameters(&self) -> &Value {
        &self.parameters
    }
    /// The output's trust.
    #[must_use]
    pub fn trust(&self) -> Trust {
        self.trust
    }

    /// The policy's view of this tool.
    pub fn spec(&self) -> Result<ToolSpec, SchemaError> {
        let spec = ToolSpec::from_json_schema(self.name.clone(), &self.parameters)?;
        Ok(if self.trust == Trust::Untrusted { spec.untrusted_output() } else { spec })
    }

    /// The chat-completions definition offered to the model.
    #[must_use]
    pub fn chat_tool(&self) -> stockade_protocol::chat::Tool {
        stockade_protocol::chat::Tool::function(self.name.clone(), self.description.clone(), self.parameters.clone())
    }
}

/// What a tool returned.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ToolOutput {
    /// Text.
    Text(String),
    /// A JSON value (marked field by field when the tool is untrusted).
    Json(Value),
    /// The tool failed. `reason` is written by trusted code; `output` is what the tool itself
    /// printed (marked when the tool is untrusted).
    Failed {
        /// Why, in the tool's trusted words.
        reason: String,
        /// The tool's own bytes, if any (bounded by the tool).
        output: Option<String>,
    },
    /// The tool did not answer within its time and was stopped; `reason` is written by
    /// trusted code (the model reads it as a failure, the trace as a timeout).
    TimedOut {
        /// Why, in the tool's trusted words.
        reason: String,
    },
}

impl ToolOutput {
    /// A failure with no output of the tool's own.
    #[must_use]
    pub fn failed(reason: impl Into<String>) -> Self {
        Self::Failed { reason: reason.into(), output: None }
    }
}

/// A tool the agent can call.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug {
    /// Its definition.
    fn def(&self) -> &ToolDef;

    /// Runs the call `permit` names. The arguments are the permit's own
    /// (`permit.call().args_json()`): a tool cannot be handed arguments other than the ones
    /// that were authorised, and the permit is used up.
    async fn call(&self, permit: Permit) -> ToolOutput;
}

/// The body of an [`FnTool`].
type ToolFn = dyn Fn(&Map<String, Value>) -> ToolOutput + Send + Sync;

/// A tool made from a closure over the call's arguments: for tests, examples and simple
/// host functions.
pub struct FnTool {
    def: ToolDef,
    f: Box<ToolFn>,
}

impl FnTool {
    /// A tool that answers with `f(arguments)`.
    pub fn new(def: ToolDef, f: impl Fn(&Map<String, Value>) -> ToolOutput + Send + Sync + 'static) -> Self {
        Self { def, f: Box::new(f) }
    }
}

impl fmt::Debug for FnTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool").field("def", &self.def).finish_non_exhaustive()
    }
}

#[async_trait]
impl Tool for FnTool {
    fn def(&self) -> &ToolDef {
        &self.def
    }
    async fn call(&self, permit: Permit) -> ToolOutput {
        match permit.call().args_json() {
            Value::Object(args) => (self.f)(&args),
            _ => ToolOutput::failed("the arguments were not an object"),
        }
    }
}

/// The tools of one agent, by name.
#[derive(Debug, Clone, Default)]
pub struct ToolBox {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl ToolBox {
    /// No tools.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`, replacing one of the same name.
    pub fn insert(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.def().name().to_owned(), tool);
    }

    /// The tool named `name`, exactly (no case folding, no normalisation).
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Every tool, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// The policy registry of these tools.
    pub fn registry(&self) -> Result<Registry, SchemaError> {
        self.tools.values().try_fold(Registry::new(), |r, t| Ok(r.with(t.def().spec()?)))
    }

    /// Runs the call `permit` names, on the tool that call names: a permit cannot be spent
    /// on another tool.
    pub async fn dispatch(&self, permit: Permit) -> ToolOutput {
        match self.tools.get(permit.call().tool()) {
            Some(tool) => tool.call(permit).await,
            None => ToolOutput::failed("no such tool"),
        }
    }
}

/// A tool as a function grant (`stockade_runtime::FunctionGrant`): sandboxed code may call it
/// through the run's broker, with the tool's parameters as the grant's schema, only when the
/// grant's policy allows the call. Text that is one JSON document becomes that value; other
/// text is a JSON string; a failure is the grant's error (its reason; the tool's own output
/// is not passed on).
pub fn tool_grant(tool: Arc<dyn Tool>) -> Result<stockade_runtime::FunctionGrant, stockade_runtime::GrantError> {
    let name = tool.def().name().to_owned();
    let schema = tool.def().parameters().clone();
    let (description, untrusted) = (tool.def().description().to_owned(), tool.def().trust() == Trust::Untrusted);
    let grant = stockade_runtime::FunctionGrant::new(&name, schema, move |permit: Permit| {
        let tool = tool.clone();
        async move {
            match tool.call(permit).await {
                ToolOutput::Json(v) => Ok(v),
                ToolOutput::Text(t) => Ok(serde_json::from_str::<Value>(t.trim()).unwrap_or(Value::String(t))),
                ToolOutput::Failed { reason, .. } | ToolOutput::TimedOut { reason } => Err(reason),
            }
        }
    })?
    .describe(&description);
    Ok(if untrusted { grant.untrusted_output() } else { grant })
}
