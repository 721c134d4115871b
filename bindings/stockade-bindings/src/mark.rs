//! MARK for a host's own agent loop: untrusted text (or JSON) wrapped in a block no text
//! inside can close, and the system-prompt sentence that tells the model what a block means.

use serde_json::{Value, json};
use stockade_runtime::policy::mark::{self as m, MarkMode, Provenance, Untrusted};

use crate::Refused;

/// Marks `text` (or, with `is_json`, the JSON value it holds) from `source` (call `call_id`),
/// datamarked if `datamark`. The answer: `{"text": the whole block, "header", "open",
/// "body", "close", "nonce"}`; `text` is what goes into the prompt.
pub fn mark(text: &str, source: &str, call_id: &str, is_json: bool, datamark: bool) -> Result<Value, Refused> {
    let mode = if datamark { MarkMode::Datamark } else { MarkMode::Delimit };
    let provenance = Provenance::tool(source, call_id);
    let marked = if is_json {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Refused::invalid(format!("the JSON to mark: {e}")))?;
        m::mark_json(&Untrusted::new(value, provenance), mode)
    } else {
        m::mark_with(&Untrusted::new(text.to_owned(), provenance), mode)
    }
    .map_err(|e| Refused::invalid(e.to_string()))?;
    Ok(json!({
        "text": marked.to_string(),
        "header": marked.header(),
        "open": marked.open_tag(),
        "body": marked.body(),
        "close": marked.close_tag(),
        "nonce": marked.nonce(),
    }))
}

/// The system-prompt sentence for marked blocks (`datamark`: for datamarked ones).
#[must_use]
pub fn system_prompt(datamark: bool) -> String {
    m::system_prompt(if datamark { MarkMode::Datamark } else { MarkMode::Delimit })
}
