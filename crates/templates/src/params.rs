//! Checking parameter values against their declared types and bounds.
//!
//! Values arrive as JSON from the API, or as strings from `yard run --set`; both forms are
//! accepted for numbers and booleans, so the CLI and a script get the same rules and the same
//! messages. The result is each value in one canonical JSON form.

use std::collections::BTreeMap;

use serde_json::Value;
use trainyard_core::Error;

use crate::Template;
use crate::manifest::{ParamKind, ParamSpec};

/// Parameters as given at submit: name to JSON value.
pub type Params = serde_json::Map<String, Value>;

/// The longest string value accepted (a parameter is a setting, not a payload).
const MAX_VALUE_BYTES: usize = 64 * 1024;
/// The most items of a list parameter.
const MAX_LIST_ITEMS: usize = 1024;

impl Template {
    /// Checks every given parameter and fills in defaults. Errors are 422s naming
    /// `params.<name>` and the rule, every broken one at once. Optional parameters without a
    /// value are `null`.
    pub fn check_params(&self, given: &Params) -> Result<BTreeMap<String, Value>, Error> {
        let declared = &self.manifest.parameters;
        let mut problems = trainyard_core::error::Problems::default();
        let mut unknown: Vec<&String> = given.keys().filter(|name| !declared.contains_key(*name)).collect();
        unknown.sort();
        let known: Vec<&str> = declared.keys().map(String::as_str).collect();
        for name in unknown {
            problems.add(
                format!("params.{name}"),
                format!("{} has no parameter {name}; it has: {}", self.manifest.name, known.join(", ")),
            );
        }
        let mut values = BTreeMap::new();
        for (name, spec) in declared {
            let value = match (given.get(name), &spec.default) {
                (Some(value), _) => match coerce(spec, value) {
                    Ok(value) => value,
                    Err(rule) => {
                        problems.add(format!("params.{name}"), rule);
                        continue;
                    }
                },
                (None, Some(default)) => coerce(spec, default).map_err(Error::internal)?,
                (None, None) if spec.required => {
                    problems.add(format!("params.{name}"), "is required");
                    continue;
                }
                (None, None) => Value::Null,
            };
            values.insert(name.clone(), value);
        }
        problems.into_result()?;
        Ok(values)
    }
}

/// One value against its spec: the canonical value, or the rule it breaks.
pub(crate) fn coerce(spec: &ParamSpec, value: &Value) -> Result<Value, String> {
    match spec.kind {
        ParamKind::Int => {
            let n = match value {
                Value::Number(n) => n.as_i64().ok_or_else(|| format!("must be a whole number, got {n}"))?,
                Value::String(s) => {
                    s.trim().parse::<i64>().map_err(|_| format!("must be a whole number, got {s:?}"))?
                }
                other => return Err(format!("must be a whole number, got {}", kind_of(other))),
            };
            check_bounds(spec, n as f64, "")?;
            Ok(Value::from(n))
        }
        ParamKind::Float => {
            let x = match value {
                Value::Number(n) => n.as_f64().ok_or_else(|| format!("must be a number, got {n}"))?,
                Value::String(s) => s.trim().parse::<f64>().map_err(|_| format!("must be a number, got {s:?}"))?,
                other => return Err(format!("must be a number, got {}", kind_of(other))),
            };
            if !x.is_finite() {
                return Err("must be a finite number".into());
            }
            check_bounds(spec, x, "")?;
            Ok(serde_json::Number::from_f64(x).map(Value::Number).expect("finite"))
        }
        ParamKind::Bool => match value {
            Value::Bool(b) => Ok(Value::Bool(*b)),
            Value::String(s) if s == "true" || s == "false" => Ok(Value::Bool(s == "true")),
            other => Err(format!("must be true or false, got {}", shown(other))),
        },
        ParamKind::Enum => {
            let s = text(value)?;
            let choices = spec.choices.as_deref().unwrap_or_default();
            if choices.iter().any(|c| c == s) {
                Ok(Value::from(s))
            } else {
                Err(format!("must be one of {}, got {s:?}", choices.join(", ")))
            }
        }
        ParamKind::Duration => {
            let s = text(value)?;
            let duration = humantime::parse_duration(s)
                .map_err(|_| format!("must be a duration such as 30s, 45m or 2h, got {s:?}"))?;
            check_bounds(spec, duration.as_secs_f64(), " seconds")?;
            Ok(Value::from(s))
        }
        ParamKind::String | ParamKind::Path => {
            let s = text(value)?;
            if spec.kind == ParamKind::Path && (s.is_empty() || s.split('/').any(|part| part == "..")) {
                return Err(format!("must be a path without '..' parts, got {s:?}"));
            }
            if let Some(pattern) = &spec.pattern {
                let whole = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| e.to_string())?;
                if !whole.is_match(s) {
                    return Err(format!("must match the pattern {pattern}, got {:?}", abbreviate(s)));
                }
            }
            Ok(Value::from(s))
        }
        ParamKind::Dataset => {
            let s = text(value)?;
            // `name@version`, or `store:name@version` for a version kept on the object store.
            let parsed = trainyard_core::names::DatasetRef::parse_store(s)
                .unwrap_or_else(|| trainyard_core::names::DatasetRef::parse(s));
            parsed.map(|_| Value::from(s))
        }
        ParamKind::Volume => {
            let s = text(value)?;
            // An optional volume parameter may be left empty: no volume.
            if s.is_empty() && !spec.required {
                return Ok(Value::from(s));
            }
            trainyard_core::names::VolumeName::parse(s).map(|_| Value::from(s))
        }
        ParamKind::Checkpoint => {
            let s = text(value)?;
            // An optional checkpoint parameter may be left empty: start from fresh weights.
            if s.is_empty() && !spec.required {
                return Ok(Value::from(s));
            }
            CheckpointRef::parse(s).map(|_| Value::from(s))
        }
        ParamKind::List => {
            let Value::Array(items) = value else {
                return Err(format!("must be a list of strings, got {}", kind_of(value)));
            };
            if items.len() > MAX_LIST_ITEMS {
                return Err(format!("may have at most {MAX_LIST_ITEMS} items"));
            }
            check_bounds(spec, items.len() as f64, " items")?;
            let items = items
                .iter()
                .enumerate()
                .map(|(i, item)| text(item).map(Value::from).map_err(|e| format!("item {i} {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Array(items))
        }
    }
}

/// A checkpoint parameter's value: `JOB[:STEP]`, the job an id, a short id or a name (job
/// names hold no `:`), the step a whole number (none: the newest checkpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRef {
    pub job: String,
    pub step: Option<u64>,
}

impl CheckpointRef {
    pub fn parse(text: &str) -> Result<CheckpointRef, String> {
        let (job, step) = match text.split_once(':') {
            Some((job, step)) => {
                let step = step.parse::<u64>().map_err(|_| {
                    format!("must be JOB or JOB:STEP, the step a whole number, got {:?}", abbreviate(text))
                })?;
                (job, Some(step))
            }
            None => (text, None),
        };
        if job.is_empty() || !job.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return Err(format!(
                "must be JOB or JOB:STEP, JOB a job's id, short id or name, got {:?}",
                abbreviate(text)
            ));
        }
        Ok(CheckpointRef { job: job.to_string(), step })
    }
}

fn text(value: &Value) -> Result<&str, String> {
    match value {
        Value::String(s) if s.len() > MAX_VALUE_BYTES => {
            Err(format!("must be at most {MAX_VALUE_BYTES} bytes, got {}", s.len()))
        }
        Value::String(s) if s.contains('\0') => Err("must not contain a NUL byte".into()),
        Value::String(s) => Ok(s),
        other => Err(format!("must be a string, got {}", kind_of(other))),
    }
}

fn check_bounds(spec: &ParamSpec, x: f64, unit: &str) -> Result<(), String> {
    if let Some(min) = spec.min
        && x < min
    {
        return Err(format!("must be at least {min}{unit}, got {x}{unit}"));
    }
    if let Some(max) = spec.max
        && x > max
    {
        return Err(format!("must be at most {max}{unit}, got {x}{unit}"));
    }
    Ok(())
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{:?}", abbreviate(s)),
        other => kind_of(other).to_string(),
    }
}

fn abbreviate(s: &str) -> String {
    if s.chars().count() > 40 { format!("{}...", s.chars().take(40).collect::<String>()) } else { s.to_string() }
}
