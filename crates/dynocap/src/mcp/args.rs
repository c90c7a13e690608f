//! Strict parsing of a tool call's `arguments` against the tool's parameter table: unknown
//! parameters, wrong JSON types, fractional or out-of-range numbers and bad enum values are
//! refused with `invalid_argument` naming the parameter and what it accepts. `null` counts as
//! "not given" (some clients send it for omitted optional parameters). SDK-free.

use serde_json::{Map, Value};

use dynocap_engine::Error;

use super::tools::{Kind, Param, ToolDef};

/// A call's arguments, checked against `tool`'s parameters.
pub struct Args<'a> {
    tool: &'a ToolDef,
    map: Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Refuses unknown parameters and missing required ones; types are checked per access.
    pub fn new(tool: &'a ToolDef, arguments: Option<Map<String, Value>>) -> Result<Self, Error> {
        let mut map = arguments.unwrap_or_default();
        map.retain(|_, v| !v.is_null());
        let mut unknown: Vec<&str> = map
            .keys()
            .filter(|k| tool.param(k).is_none())
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            let accepted: Vec<&str> = tool.params.iter().map(|p| p.name).collect();
            return Err(Error::invalid(format!(
                "{} does not take {}; {}",
                tool.name,
                unknown
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if accepted.is_empty() {
                    "it takes no parameters".to_owned()
                } else {
                    format!("its parameters are {}", accepted.join(", "))
                }
            )));
        }
        for param in tool.params.iter().filter(|p| p.required) {
            if !map.contains_key(param.name) {
                return Err(Error::invalid(format!(
                    "{} needs {:?} ({})",
                    tool.name, param.name, param.description
                )));
            }
        }
        Ok(Self { tool, map })
    }

    pub fn tool(&self) -> &'a ToolDef {
        self.tool
    }

    fn param(&self, name: &str) -> Result<&'a Param, Error> {
        self.tool
            .param(name)
            .ok_or_else(|| Error::internal(format!("{} has no parameter {name}", self.tool.name)))
    }

    /// A string parameter (`String` or `Enum` kind), `None` when not given. Enum values are
    /// checked here; defaults are left to the caller (the engine applies them).
    pub fn string(&self, name: &str) -> Result<Option<String>, Error> {
        let param = self.param(name)?;
        let Some(value) = self.map.get(name) else {
            return Ok(None);
        };
        let Value::String(text) = value else {
            return Err(wrong_type(name, "a string", value));
        };
        if param.required && text.is_empty() {
            return Err(Error::invalid(format!("{name} must not be empty")));
        }
        if let Kind::Enum { values, .. } = param.kind {
            if !values.contains(&text.as_str()) {
                return Err(Error::invalid(format!(
                    "{name} {text:?} is not valid; use one of {}",
                    values
                        .iter()
                        .map(|v| format!("\"{v}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(Some(text.clone()))
    }

    /// A required string parameter.
    pub fn required_string(&self, name: &str) -> Result<String, Error> {
        self.string(name)?
            .ok_or_else(|| Error::invalid(format!("{} needs {name:?}", self.tool.name)))
    }

    /// A whole number within the parameter's range: JSON integers and integral floats such
    /// as 30.0 are accepted; 30.5, strings and out-of-range values are refused.
    pub fn integer(&self, name: &str) -> Result<Option<u64>, Error> {
        let param = self.param(name)?;
        let (Kind::Integer { min, max, .. } | Kind::OptionalInteger { min, max }) = param.kind
        else {
            return Err(Error::internal(format!("{name} is not a number parameter")));
        };
        let Some(value) = self.map.get(name) else {
            return Ok(None);
        };
        let Value::Number(number) = value else {
            return Err(wrong_type(name, "a whole number", value));
        };
        let range = |shown: &str, below: bool| {
            Error::invalid(format!(
                "{name} {shown} is {} {}; use a value from {min} to {max}",
                if below {
                    "below the minimum"
                } else {
                    "above the maximum"
                },
                if below { min } else { max }
            ))
        };
        if let Some(n) = number.as_u64() {
            if n < min {
                return Err(range(&n.to_string(), true));
            }
            if n > max {
                return Err(range(&n.to_string(), false));
            }
            return Ok(Some(n));
        }
        if let Some(n) = number.as_i64() {
            // Only negative values reach here.
            return Err(range(&n.to_string(), true));
        }
        let float = number.as_f64().unwrap_or(f64::NAN);
        if !float.is_finite() || float.fract() != 0.0 {
            return Err(Error::invalid(format!(
                "{name} must be a whole number from {min} to {max}, not {number}"
            )));
        }
        // Integral and finite: compare as floats, then convert exactly (the range is small).
        #[allow(clippy::cast_precision_loss)]
        let (min_f, max_f) = (min as f64, max as f64);
        if float < min_f {
            return Err(range(&number.to_string(), true));
        }
        if float > max_f {
            return Err(range(&number.to_string(), false));
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(Some(float as u64))
    }

    /// A parameter that takes a string or a whole number (`mode`: `"755"` or `493`): either,
    /// as given, for the caller to judge; any other type, or a number that is not whole and
    /// non-negative, is refused.
    pub fn string_or_whole(&self, name: &str) -> Result<Option<StringOrWhole>, Error> {
        self.param(name)?;
        let Some(value) = self.map.get(name) else {
            return Ok(None);
        };
        let wrong = || wrong_type(name, "a string or a whole number", value);
        match value {
            Value::String(text) => Ok(Some(StringOrWhole::String(text.clone()))),
            Value::Number(number) => {
                if let Some(n) = number.as_u64() {
                    return Ok(Some(StringOrWhole::Whole(n)));
                }
                let float = number.as_f64().unwrap_or(f64::NAN);
                // Integral floats as `integer` takes them (493.0); no mode is near 2^53.
                if float.is_finite() && float.fract() == 0.0 && (0.0..9e15).contains(&float) {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    return Ok(Some(StringOrWhole::Whole(float as u64)));
                }
                Err(wrong())
            }
            _ => Err(wrong()),
        }
    }

    pub fn boolean(&self, name: &str) -> Result<Option<bool>, Error> {
        self.param(name)?;
        match self.map.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(name, "true or false", other)),
        }
    }

    /// A parameter's JSON value as given, for a parameter whose shape its caller checks
    /// (`publish`).
    pub fn value(&self, name: &str) -> Result<Option<&Value>, Error> {
        self.param(name)?;
        Ok(self.map.get(name))
    }

    /// A list of strings.
    pub fn string_list(&self, name: &str) -> Result<Option<Vec<String>>, Error> {
        self.param(name)?;
        let Some(value) = self.map.get(name) else {
            return Ok(None);
        };
        let Value::Array(items) = value else {
            return Err(wrong_type(name, "a list of strings", value));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(Error::invalid(format!(
                    "{name}[{i}] must be a string, not {}",
                    describe(other)
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An object of string values, as (key, value) pairs in the order given.
    pub fn string_map(&self, name: &str) -> Result<Vec<(String, String)>, Error> {
        self.param(name)?;
        let Some(value) = self.map.get(name) else {
            return Ok(Vec::new());
        };
        let Value::Object(object) = value else {
            return Err(wrong_type(name, "an object of strings", value));
        };
        object
            .iter()
            .map(|(key, value)| match value {
                Value::String(text) => Ok((key.clone(), text.clone())),
                other => Err(Error::invalid(format!(
                    "{name}.{key} must be a string, not {}",
                    describe(other)
                ))),
            })
            .collect()
    }
}

/// A parameter given as a string or as a whole number ([`Args::string_or_whole`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StringOrWhole {
    String(String),
    Whole(u64),
}

fn wrong_type(name: &str, expected: &str, value: &Value) -> Error {
    Error::invalid(format!(
        "{name} must be {expected}, not {}",
        describe(value)
    ))
}

/// A short, bounded description of a JSON value for error messages.
fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_owned(),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let mut text = value.to_string();
    if text.chars().count() > 40 {
        text = text.chars().take(40).collect::<String>() + "...";
    }
    format!("{kind} ({text})")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::mcp::tools::definitions;

    fn tool(name: &str) -> ToolDef {
        definitions().into_iter().find(|t| t.name == name).unwrap()
    }

    fn args(value: Value) -> Option<Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }

    #[test]
    fn numbers() {
        let run = tool("dynocap_run");
        let ok = |v: Value| {
            Args::new(&run, args(json!({"name": "a", "ttlSeconds": v})))
                .unwrap()
                .integer("ttlSeconds")
        };
        assert_eq!(ok(json!(30)).unwrap(), Some(30));
        assert_eq!(ok(json!(30.0)).unwrap(), Some(30));
        assert_eq!(ok(json!(86_400)).unwrap(), Some(86_400));
        for bad in [
            json!(29),
            json!(86_401),
            json!(30.5),
            json!(-1),
            json!(1e300),
            json!("30"),
            json!(true),
        ] {
            let err = ok(bad.clone()).unwrap_err();
            assert_eq!(
                err.code,
                dynocap_engine::ErrorCode::InvalidArgument,
                "{bad}"
            );
            assert!(err.message.contains("ttlSeconds"), "{err}");
        }
        assert!(ok(json!(29))
            .unwrap_err()
            .message
            .contains("ttlSeconds 29 is below the minimum 30"));
        assert_eq!(
            Args::new(&run, args(json!({"name": "a", "ttlSeconds": null})))
                .unwrap()
                .integer("ttlSeconds")
                .unwrap(),
            None
        );
    }

    #[test]
    fn unknown_missing_and_types() {
        let run = tool("dynocap_run");
        let err = Args::new(&run, args(json!({"name": "a", "ttl": 30})))
            .err()
            .unwrap();
        assert!(err.message.contains("\"ttl\""), "{err}");
        assert!(err.message.contains("ttlSeconds"), "{err}");
        let err = Args::new(&run, None).err().unwrap();
        assert!(err.message.contains("\"name\""), "{err}");
        let a = Args::new(&run, args(json!({"name": 5}))).unwrap();
        assert!(a.required_string("name").is_err());
        let a = Args::new(&run, args(json!({"name": "a", "network": "wifi"}))).unwrap();
        assert!(a
            .string("network")
            .unwrap_err()
            .message
            .contains("\"none\""));
        let exec = tool("dynocap_exec");
        let a = Args::new(
            &exec,
            args(json!({"name": "a", "command": "x", "env": {"A": 1}, "terminal": "yes"})),
        )
        .unwrap();
        assert!(a.string_map("env").unwrap_err().message.contains("env.A"));
        assert!(a.boolean("terminal").is_err());
        for start in ["dynocap_run", "dynocap_task_start"] {
            let start = tool(start);
            let a = Args::new(
                &start,
                args(json!({"name": "a", "allowHosts": "pypi.org", "image": ["debian"]})),
            )
            .unwrap();
            let err = a.string_list("allowHosts").unwrap_err();
            assert!(err.message.contains("allowHosts must be a list"), "{err}");
            assert!(a.string("image").unwrap_err().message.contains("image"));
            let a = Args::new(&start, args(json!({"name": "a", "allowHosts": ["x", 1]}))).unwrap();
            let err = a.string_list("allowHosts").unwrap_err();
            assert!(err.message.contains("allowHosts[1]"), "{err}");
        }
        let ls = tool("dynocap_ls");
        let err = Args::new(&ls, args(json!({"x": 1}))).err().unwrap();
        assert!(err.message.contains("takes no parameters"), "{err}");
    }
}
