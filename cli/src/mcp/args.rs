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

impl<S, P: DeserializeOwned + JsonSchema> FromContextPart<ToolCallContext<'_, S>>
    for Parameters<P>
{
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let mut arguments = context.arguments.take().unwrap_or_default();
        let parsed = numbers_from_strings::<P>(&mut arguments)
            .map_err(invalid)
            .and_then(|()| {
                serde_json::from_value(serde_json::Value::Object(arguments)).map_err(|e| {
                    invalid(format!(
                        "invalid arguments: {e}; see the tool's input schema for the fields it \
                         takes"
                    ))
                })
            });
        Ok(Parameters(parsed))
    }
}

/// Turns the string arguments whose field the schema says is a number (`"30"`, as the MCP
/// Inspector and some hosts send every form field) into that number. Strings that are not
/// numbers are refused, naming the field.
fn numbers_from_strings<P: JsonSchema>(
    arguments: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<P>();
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return Ok(());
    };
    for (name, value) in arguments.iter_mut() {
        let Some(text) = value.as_str().map(str::trim) else {
            continue;
        };
        let types = properties.get(name).and_then(|p| p.get("type"));
        let has = |t: &str| match types {
            Some(serde_json::Value::String(s)) => s == t,
            Some(serde_json::Value::Array(a)) => a.iter().any(|v| v == t),
            _ => false,
        };
        let (number, kind) = if has("integer") {
            let n = text
                .parse::<i64>()
                .ok()
                .map(serde_json::Value::from)
                .or_else(|| text.parse::<u64>().ok().map(serde_json::Value::from));
            (n, "a whole number")
        } else if has("number") {
            let n = text
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .and_then(|n| serde_json::Number::from_f64(n).map(serde_json::Value::Number));
            (n, "a number")
        } else {
            continue;
        };
        match number {
            Some(number) => *value = number,
            None => return Err(format!("{name} must be {kind}, not {text:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Args {
        count: Option<u64>,
        ratio: f64,
        name: String,
    }

    fn parse(arguments: serde_json::Value) -> Result<Args, String> {
        let mut arguments = arguments.as_object().cloned().unwrap();
        numbers_from_strings::<Args>(&mut arguments)?;
        serde_json::from_value(serde_json::Value::Object(arguments)).map_err(|e| e.to_string())
    }

    #[test]
    fn numbers_sent_as_strings_are_numbers_and_other_strings_stay_strings() {
        let args =
            parse(serde_json::json!({"count": " 30", "ratio": "0.5", "name": "42"})).unwrap();
        assert_eq!(
            (args.count, args.ratio, args.name.as_str()),
            (Some(30), 0.5, "42")
        );
        let err =
            parse(serde_json::json!({"count": "thirty", "ratio": 1, "name": "x"})).unwrap_err();
        assert_eq!(err, "count must be a whole number, not \"thirty\"");
        assert!(parse(serde_json::json!({"count": "-1", "ratio": 1, "name": "x"})).is_err());
        assert!(parse(serde_json::json!({"count": null, "ratio": "NaN", "name": "x"})).is_err());
    }
}
