//! The tools a policy may name, with the type of every argument.

use std::collections::BTreeMap;

use serde_json::Value;

/// Deepest nesting of object and array argument types: 16.
pub const MAX_ARG_TYPE_DEPTH: usize = 16;

/// The type of one argument (or of a field inside one).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ArgType {
    /// A JSON string.
    String,
    /// A JSON number with no fractional part.
    Integer,
    /// Any JSON number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// An array whose items all have this type.
    Array(Box<ArgType>),
    /// An object with exactly these fields (unknown fields are refused).
    Object(BTreeMap<String, ArgSpec>),
}

/// One argument or field: its type and whether it must be present.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgSpec {
    ty: ArgType,
    required: bool,
}

impl ArgSpec {
    /// A field of type `ty`.
    #[must_use]
    pub fn new(ty: ArgType, required: bool) -> Self {
        Self { ty, required }
    }
    /// Its type.
    #[must_use]
    pub fn ty(&self) -> &ArgType {
        &self.ty
    }
    /// Whether it must be present.
    #[must_use]
    pub fn required(&self) -> bool {
        self.required
    }
}

/// A registered tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    name: String,
    args: BTreeMap<String, ArgSpec>,
    untrusted_output: bool,
    metered: bool,
}

/// A JSON Schema could not be read as a tool's argument types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool {tool:?}: unsupported parameter schema at {pointer}: {reason}")]
#[non_exhaustive]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// Where in the schema.
    pub pointer: String,
    /// What was unsupported.
    pub reason: String,
}

impl ToolSpec {
    /// A tool with no arguments.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), args: BTreeMap::new(), untrusted_output: false, metered: false }
    }

    /// Adds an argument.
    #[must_use]
    pub fn arg(mut self, name: impl Into<String>, ty: ArgType, required: bool) -> Self {
        self.args.insert(name.into(), ArgSpec::new(ty, required));
        self
    }

    /// Marks the tool as metered: its caller counts the bytes each allowed call carries and
    /// enforces a rule's `max_bytes` (the network grant's `net.connect`). Only a metered
    /// tool's rules may name `max_bytes`.
    #[must_use]
    pub fn metered(mut self) -> Self {
        self.metered = true;
        self
    }

    /// Whether the tool is metered.
    #[must_use]
    pub fn is_metered(&self) -> bool {
        self.metered
    }

    /// Marks the tool's output as untrusted: calling it sets the session's
    /// "has read untrusted data" flag (the agent loop does this; the policy reads the flag).
    #[must_use]
    pub fn untrusted_output(mut self) -> Self {
        self.untrusted_output = true;
        self
    }

    /// Reads the argument types from a tool's JSON Schema (`type: object` with
    /// `properties` and `required`), the form OpenAI-compatible tool definitions use.
    pub fn from_json_schema(name: impl Into<String>, schema: &Value) -> Result<Self, SchemaError> {
        let name = name.into();
        match schema_type(&name, schema, "", 0)? {
            ArgType::Object(fields) => Ok(Self { name, args: fields, untrusted_output: false, metered: false }),
            _ => Err(SchemaError { tool: name, pointer: "/".into(), reason: "parameters must be an object".into() }),
        }
    }

    /// The tool's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its arguments.
    #[must_use]
    pub fn args(&self) -> &BTreeMap<String, ArgSpec> {
        &self.args
    }

    /// Whether its output is untrusted.
    #[must_use]
    pub fn has_untrusted_output(&self) -> bool {
        self.untrusted_output
    }

    /// The type at a dotted path (`["to"]`, `["meta", "host"]`), if the path exists.
    pub(crate) fn type_at(&self, path: &[String]) -> Option<&ArgType> {
        let (first, rest) = path.split_first()?;
        let mut ty = self.args.get(first)?.ty();
        for seg in rest {
            match ty {
                ArgType::Object(fields) => ty = fields.get(seg)?.ty(),
                _ => return None,
            }
        }
        Some(ty)
    }
}

fn schema_type(tool: &str, schema: &Value, pointer: &str, depth: usize) -> Result<ArgType, SchemaError> {
    let err = |reason: &str| SchemaError { tool: tool.into(), pointer: format!("{pointer}/"), reason: reason.into() };
    if depth > MAX_ARG_TYPE_DEPTH {
        return Err(err("nested too deeply"));
    }
    let ty = schema.get("type").and_then(Value::as_str).ok_or_else(|| err("every schema needs a single `type`"))?;
    Ok(match ty {
        "string" => ArgType::String,
        "integer" => ArgType::Integer,
        "number" => ArgType::Number,
        "boolean" => ArgType::Boolean,
        "array" => {
            let items = schema.get("items").ok_or_else(|| err("an array needs `items`"))?;
            ArgType::Array(Box::new(schema_type(tool, items, &format!("{pointer}/items"), depth + 1)?))
        }
        "object" => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut fields = BTreeMap::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    let ty = schema_type(tool, v, &format!("{pointer}/properties/{k}"), depth + 1)?;
                    fields.insert(k.clone(), ArgSpec::new(ty, required.contains(&k.as_str())));
                }
            }
            ArgType::Object(fields)
        }
        other => return Err(err(&format!("unsupported type {other:?}"))),
    })
}

/// The registered tools a policy is checked against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registry {
    tools: BTreeMap<String, ToolSpec>,
}

impl Registry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool (replacing one of the same name).
    #[must_use]
    pub fn with(mut self, tool: ToolSpec) -> Self {
        self.tools.insert(tool.name.clone(), tool);
        self
    }

    /// The tool named `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    /// Every registered tool.
    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values()
    }
}

/// Checks `value` against `ty`; returns the dotted path of the first problem and what it is.
pub(crate) fn check_value(ty: &ArgType, value: &Value, path: &str) -> Result<(), (String, &'static str)> {
    let fail = |what| Err((path.to_owned(), what));
    match (ty, value) {
        (ArgType::String, Value::String(_))
        | (ArgType::Boolean, Value::Bool(_))
        | (ArgType::Number, Value::Number(_)) => Ok(()),
        (ArgType::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(()),
        (ArgType::Array(item), Value::Array(items)) => {
            items.iter().enumerate().try_for_each(|(i, v)| check_value(item, v, &format!("{path}[{i}]")))
        }
        (ArgType::Object(fields), Value::Object(map)) => {
            for (k, v) in map {
                match fields.get(k) {
                    Some(spec) => check_value(spec.ty(), v, &format!("{path}.{k}"))?,
                    None => return Err((format!("{path}.{k}"), "unknown field")),
                }
            }
            match fields.iter().find(|(k, spec)| spec.required() && !map.contains_key(*k)) {
                Some((k, _)) => Err((format!("{path}.{k}"), "missing required field")),
                None => Ok(()),
            }
        }
        _ => fail("wrong type"),
    }
}
