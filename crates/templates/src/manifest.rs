//! The manifest (`template.yaml`): its types, parsing, and every rule it must satisfy.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainyard_core::job::{MAX_REPLICAS, check_env_name};
use trainyard_core::resources::{Cpu, MAX_GPUS_PER_REPLICA, Memory};
use utoipa::ToSchema;

use crate::LoadError;
use crate::params::coerce;

/// A task template's manifest. See `docs/templates.md` for the format with a full example.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Lowercase letters, digits and '-'.
    pub name: String,
    /// Semantic version; a published (name, version) never changes.
    #[schema(value_type = String, example = "1.0.0")]
    pub version: semver::Version,
    pub description: String,
    /// Typed parameters, in the order people should see them.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub parameters: IndexMap<String, ParamSpec>,
    /// Per-replica resources, each fixed or taken from a parameter.
    #[serde(default)]
    pub resources: ResourcesSpec,
    /// How many replicas, fixed or from a parameter. Default 1.
    #[serde(default = "one_replica")]
    pub replicas: Quantity,
    /// Container image (used by the Kubernetes executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The program and its arguments. Each text element renders to exactly one argv element;
    /// `{expand: <list parameter>}` inserts that list's items as elements.
    pub command: Vec<ArgSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgSpec>,
    /// Environment variables; values may use template expressions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Files of the template the job receives (paths, or folders ending in '/'), under
    /// `template/` in each replica's working directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// What the job writes, by name (for example a checkpoint directory).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    #[schema(value_type = Object)]
    pub outputs: IndexMap<String, OutputSpec>,
    /// A typical run time (`45m`, `2h`), used for start-time estimates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_runtime: Option<String>,
}

fn one_replica() -> Quantity {
    Quantity::Fixed(Value::from(1))
}

/// One typed parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(rename = "type")]
    pub kind: ParamKind,
    /// Must be given at submit (and then has no default).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub default: Option<Value>,
    /// Lower bound: of the value (int, float), seconds (duration) or items (list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// A regular expression a string or path must match (whole value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The allowed values of an enum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<String>>,
    /// One line for people: what it does, which values make sense.
    #[serde(default)]
    pub help: String,
    /// Volume parameters only: when the named volume does not exist yet, the run creates it
    /// with this size (`20Gi`; charged to the tenant's storage quota, shared by the tenant's
    /// later jobs) instead of refusing the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_size: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParamKind {
    String,
    Int,
    Float,
    Bool,
    Enum,
    /// `30s`, `45m`, `2h 30m`.
    Duration,
    Path,
    /// A list of strings (for example a command line).
    List,
    /// A dataset reference, `name@version`.
    Dataset,
    /// A shared volume, by name.
    Volume,
    /// Another job's checkpoint, `JOB[:STEP]` (an id, short id or name; the newest step when
    /// none): the server resolves it to the checkpoint's file as the job sees it.
    Checkpoint,
}

impl ParamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ParamKind::String => "string",
            ParamKind::Int => "int",
            ParamKind::Float => "float",
            ParamKind::Bool => "bool",
            ParamKind::Enum => "enum",
            ParamKind::Duration => "duration",
            ParamKind::Path => "path",
            ParamKind::List => "list",
            ParamKind::Dataset => "dataset",
            ParamKind::Volume => "volume",
            ParamKind::Checkpoint => "checkpoint",
        }
    }
}

/// Per-replica resources of a template.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<Quantity>,
}

/// A value fixed in the manifest, or `{param: <name>}` to take it from a parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Quantity {
    FromParam {
        param: String,
    },
    #[schema(value_type = Object)]
    Fixed(Value),
}

/// One element of `command` or `args`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ArgSpec {
    /// Inserts the items of a list parameter, one argv element each.
    Expand { expand: String },
    /// Text that may use `{{ parameter }}` expressions; always one argv element.
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Relative to the replica's working directory.
    pub path: String,
    #[serde(default)]
    pub description: String,
}

impl Manifest {
    /// True when the manifest's `files` include this bundle path.
    pub fn delivers(&self, path: &str) -> bool {
        self.files.iter().any(|entry| entry == path || (entry.ends_with('/') && path.starts_with(entry.as_str())))
    }

    /// The expected run time in seconds, when the manifest gives one.
    pub fn expected_runtime_seconds(&self) -> Option<u64> {
        self.expected_runtime.as_deref().and_then(|t| humantime::parse_duration(t).ok()).map(|d| d.as_secs())
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> LoadError {
    LoadError::manifest(field, message)
}

/// Parses the YAML text, naming the path of the first bad field.
pub(crate) fn parse(text: &str) -> Result<Manifest, LoadError> {
    let deserializer = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let field = if path == "." { "-".to_string() } else { path };
        LoadError::manifest(field, inner.to_string())
    })
}

/// A minijinja environment that can only compute: no loader (so no `include` or `import`), no
/// access to the process environment or files, strict about undefined names, and a fuel limit
/// so that no template can loop for long.
pub(crate) fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(100_000));
    env
}

/// Every rule of a manifest, each violation naming its field.
pub(crate) fn check(m: &Manifest, files: &BTreeMap<String, Vec<u8>>) -> Result<(), LoadError> {
    if let Err(message) = trainyard_core::names::TemplateName::parse(&m.name) {
        return Err(err("name", message));
    }
    if m.description.trim().is_empty() {
        return Err(err("description", "must say in a sentence what the template does"));
    }
    let param_name_ok = regex::Regex::new(r"^[a-z_][a-z0-9_]{0,63}$").expect("valid regex");
    for (name, spec) in &m.parameters {
        let field = |attr: &str| format!("parameters.{name}.{attr}");
        if !param_name_ok.is_match(name) {
            return Err(err(format!("parameters.{name}"), "parameter names are lowercase letters, digits and '_'"));
        }
        check_param(name, spec, &field)?;
    }

    let r = &m.resources;
    check_quantity(m, "resources.cpu", r.cpu.as_ref(), &[ParamKind::Float, ParamKind::Int, ParamKind::String], |v| {
        serde_json::from_value::<Cpu>(v.clone()).map(drop).map_err(|e| e.to_string())
    })?;
    check_quantity(m, "resources.memory", r.memory.as_ref(), &[ParamKind::String, ParamKind::Int], |v| {
        serde_json::from_value::<Memory>(v.clone()).map(drop).map_err(|e| e.to_string())
    })?;
    check_quantity(m, "resources.gpus", r.gpus.as_ref(), &[ParamKind::Int], |v| match v.as_u64() {
        Some(n) if n <= u64::from(MAX_GPUS_PER_REPLICA) => Ok(()),
        _ => Err(format!("must be a whole number from 0 to {MAX_GPUS_PER_REPLICA}")),
    })?;
    check_quantity(m, "resources.gpu_type", r.gpu_type.as_ref(), &[ParamKind::String, ParamKind::Enum], |v| {
        v.as_str().map(drop).ok_or_else(|| "must be a GPU type such as nvidia-h100-80gb".to_string())
    })?;
    check_quantity(m, "replicas", Some(&m.replicas), &[ParamKind::Int], |v| match v.as_u64() {
        Some(n) if (1..=u64::from(MAX_REPLICAS)).contains(&n) => Ok(()),
        _ => Err(format!("must be a whole number from 1 to {MAX_REPLICAS}")),
    })?;

    if m.command.is_empty() {
        return Err(err("command", "must name the program to run"));
    }
    let env = environment();
    for (list, items) in [("command", &m.command), ("args", &m.args)] {
        for (i, item) in items.iter().enumerate() {
            let field = format!("{list}[{i}]");
            match item {
                ArgSpec::Text(text) => check_expression(m, &env, &field, text)?,
                ArgSpec::Expand { expand } => match m.parameters.get(expand) {
                    Some(spec) if spec.kind == ParamKind::List => {}
                    Some(spec) => {
                        return Err(err(
                            field,
                            format!(
                                "expands {expand}, a {} parameter; only list parameters expand",
                                spec.kind.as_str()
                            ),
                        ));
                    }
                    None => {
                        return Err(err(field, format!("expands {expand}, which is not a parameter")));
                    }
                },
            }
        }
    }
    for (key, value) in &m.env {
        check_env_name(key).map_err(|message| err(format!("env.{key}"), message))?;
        check_expression(m, &env, &format!("env.{key}"), value)?;
    }
    for (i, entry) in m.files.iter().enumerate() {
        let found =
            files.keys().any(|path| path == entry || (entry.ends_with('/') && path.starts_with(entry.as_str())));
        if !found {
            return Err(err(format!("files[{i}]"), format!("{entry} is not in the template folder")));
        }
    }
    for (name, output) in &m.outputs {
        if output.path.is_empty() || output.path.starts_with('/') || output.path.split('/').any(|p| p == "..") {
            return Err(err(format!("outputs.{name}.path"), "must be a relative path inside the working directory"));
        }
    }
    if let Some(runtime) = &m.expected_runtime {
        humantime::parse_duration(runtime)
            .map_err(|e| err("expected_runtime", format!("{runtime:?} is not a duration such as 45m or 2h: {e}")))?;
    }
    if m.image.as_deref().is_some_and(|i| i.trim().is_empty()) {
        return Err(err("image", "must name an image when present"));
    }
    Ok(())
}

fn check_param(name: &str, spec: &ParamSpec, field: &dyn Fn(&str) -> String) -> Result<(), LoadError> {
    let bounded = matches!(spec.kind, ParamKind::Int | ParamKind::Float | ParamKind::Duration | ParamKind::List);
    if (spec.min.is_some() || spec.max.is_some()) && !bounded {
        return Err(err(field("min"), format!("a {} parameter has no bounds", spec.kind.as_str())));
    }
    if let (Some(min), Some(max)) = (spec.min, spec.max)
        && min > max
    {
        return Err(err(field("min"), format!("min ({min}) is above max ({max})")));
    }
    if let Some(pattern) = &spec.pattern {
        if !matches!(spec.kind, ParamKind::String | ParamKind::Path) {
            return Err(err(field("pattern"), "only string and path parameters have a pattern"));
        }
        regex::Regex::new(pattern).map_err(|e| err(field("pattern"), format!("not a regular expression: {e}")))?;
    }
    match (&spec.choices, spec.kind) {
        (None, ParamKind::Enum) => {
            return Err(err(field("choices"), "an enum parameter lists its choices"));
        }
        (Some(choices), ParamKind::Enum) if choices.is_empty() => {
            return Err(err(field("choices"), "an enum parameter lists at least one choice"));
        }
        (Some(_), kind) if kind != ParamKind::Enum => {
            return Err(err(field("choices"), "only enum parameters have choices"));
        }
        _ => {}
    }
    if let Some(size) = &spec.create_size {
        if spec.kind != ParamKind::Volume {
            return Err(err(field("create_size"), "only volume parameters create what they name"));
        }
        trainyard_core::resources::Memory::parse(size)
            .map_err(|message| err(field("create_size"), format!("{size:?} is not a size such as 20Gi: {message}")))?;
    }
    match (&spec.default, spec.required) {
        (Some(_), true) => {
            return Err(err(field("default"), "a required parameter has no default"));
        }
        (Some(default), false) => {
            coerce(spec, default).map_err(|message| err(field("default"), message))?;
        }
        _ => {}
    }
    let _ = name;
    Ok(())
}

fn check_quantity(
    m: &Manifest,
    field: &str,
    quantity: Option<&Quantity>,
    kinds: &[ParamKind],
    fixed_ok: impl Fn(&Value) -> Result<(), String>,
) -> Result<(), LoadError> {
    match quantity {
        None => Ok(()),
        Some(Quantity::Fixed(value)) => fixed_ok(value).map_err(|message| LoadError::manifest(field, message)),
        Some(Quantity::FromParam { param }) => match m.parameters.get(param) {
            None => Err(LoadError::manifest(field, format!("takes parameter {param}, which is not declared"))),
            Some(spec) if !kinds.contains(&spec.kind) => {
                let allowed: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
                Err(LoadError::manifest(
                    field,
                    format!(
                        "takes parameter {param} of type {}; it must be {}",
                        spec.kind.as_str(),
                        allowed.join(" or ")
                    ),
                ))
            }
            Some(_) => Ok(()),
        },
    }
}

/// The text compiles and names only declared parameters.
fn check_expression(
    m: &Manifest,
    env: &minijinja::Environment<'static>,
    field: &str,
    text: &str,
) -> Result<(), LoadError> {
    let template = env.template_from_str(text).map_err(|e| {
        LoadError::manifest(field, format!("not a valid template expression: {}", e.detail().unwrap_or("syntax error")))
    })?;
    let mut unknown: Vec<String> =
        template.undeclared_variables(false).into_iter().filter(|name| !m.parameters.contains_key(name)).collect();
    unknown.sort();
    if let Some(name) = unknown.first() {
        return Err(LoadError::manifest(field, format!("uses {name}, which is not a parameter")));
    }
    Ok(())
}
