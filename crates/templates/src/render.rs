//! Rendering a template with checked parameters into the job spec that runs: data in, argv out.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::Value;
use trainyard_core::Error;
use trainyard_core::job::{JobSpec, JobSubmission, TemplateRef};
use trainyard_core::resources::Resources;

use crate::Template;
use crate::manifest::{ArgSpec, Quantity, environment};

impl Template {
    /// The spec a job from this template runs, for values from [`Template::check_params`].
    ///
    /// Each text element of `command` and `args` renders to exactly one argv element, whatever
    /// the values hold (quotes, `;`, `$(...)`, newlines): values are data in the expression's
    /// context, never parsed as template or shell syntax. Only `{expand: list}` elements produce
    /// several argv elements: one per item of that list. The result passes the same checks as a
    /// job submitted directly (argv and environment limits, resource bounds).
    pub fn render(&self, values: &BTreeMap<String, Value>) -> Result<JobSpec, Error> {
        let m = &self.manifest;
        let env = environment();
        let context = minijinja::Value::from(minijinja::value::Serde(values));
        let render_text = |field: &str, text: &str| -> Result<String, Error> {
            env.render_str(text, context.clone())
                .map_err(|e| Error::invalid(field, format!("the template could not render it: {e}")))
        };
        let render_args = |list: &str, items: &[ArgSpec]| -> Result<Vec<String>, Error> {
            let mut argv = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    ArgSpec::Text(text) => argv.push(render_text(&format!("{list}[{i}]"), text)?),
                    ArgSpec::Expand { expand } => {
                        let items = values.get(expand).and_then(Value::as_array).cloned().unwrap_or_default();
                        argv.extend(items.into_iter().filter_map(|v| v.as_str().map(str::to_string)));
                    }
                }
            }
            Ok(argv)
        };
        let command = render_args("command", &m.command)?;
        let args = render_args("args", &m.args)?;
        let mut job_env = BTreeMap::new();
        for (key, text) in &m.env {
            job_env.insert(key.clone(), render_text(&format!("env.{key}"), text)?);
        }

        let defaults = Resources::default();
        let r = &m.resources;
        let resources = Resources {
            cpu: resolve(r.cpu.as_ref(), values, "resources.cpu")?.unwrap_or(defaults.cpu),
            memory: resolve(r.memory.as_ref(), values, "resources.memory")?.unwrap_or(defaults.memory),
            gpus: resolve(r.gpus.as_ref(), values, "resources.gpus")?.unwrap_or(0),
            gpu_type: resolve::<Option<String>>(r.gpu_type.as_ref(), values, "resources.gpu_type")?
                .flatten()
                .filter(|t| !t.is_empty()),
        };
        let replicas = resolve(Some(&m.replicas), values, "replicas")?.unwrap_or(1);

        // The rendered job meets every rule a directly submitted one does.
        let valid = JobSubmission {
            name: Some(m.name.clone()),
            command,
            args,
            env: job_env,
            resources,
            replicas,
            priority: 0,
            max_restarts: 0,
            idempotency_key: None,
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
            after_ok: Vec::new(),
            after_any: Vec::new(),
            after_failed: Vec::new(),
            array: None,
        }
        .validate()?;
        let mut spec = valid.spec;
        spec.template =
            Some(TemplateRef { name: m.name.clone(), version: m.version.to_string(), digest: self.digest.clone() });
        Ok(spec)
    }
}

/// A fixed value or a parameter's, read as `T`. A parameter's value that does not fit is the
/// submitter's error and names the parameter.
fn resolve<T: DeserializeOwned>(
    quantity: Option<&Quantity>,
    values: &BTreeMap<String, Value>,
    field: &str,
) -> Result<Option<T>, Error> {
    let (value, field) = match quantity {
        None => return Ok(None),
        Some(Quantity::Fixed(value)) => (value.clone(), field.to_string()),
        Some(Quantity::FromParam { param }) => {
            (values.get(param).cloned().unwrap_or(Value::Null), format!("params.{param}"))
        }
    };
    if value.is_null() {
        return Ok(None);
    }
    serde_json::from_value(value).map(Some).map_err(|e| Error::invalid(field, e.to_string()))
}
