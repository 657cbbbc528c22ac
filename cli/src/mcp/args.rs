//! [`Parameters`]: a tool's arguments, parsed so that arguments its schema refuses (a
//! missing field, an unknown one, a wrong type) come back as a tool error with code
//! `invalid_argument`, which the model reads and corrects, rather than as a protocol error,
//! which most hosts show only as an opaque failure.

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use super::error::{invalid, ToolError};

/// The arguments of a tool call, or why they are not valid. Its JSON schema is the
/// arguments' own (the tool macros find it by this type's name).
pub(super) struct Parameters<P>(pub Result<P, ToolError>);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        P::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        let parsed = serde_json::from_value(serde_json::Value::Object(arguments)).map_err(|e| {
            invalid(format!(
                "invalid arguments: {e}; see the tool's input schema for the fields it takes"
            ))
        });
        Ok(Parameters(parsed))
    }
}
