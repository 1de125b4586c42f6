//! Experiment tracking as MLflow's clients speak it (issue 42): experiments, runs and what is
//! logged to them, with MLflow's rules. No I/O; the store keeps these, the server's MLflow edge
//! (`server/src/http/mlflow.rs`) puts them on MLflow's wire format.
//!
//! MLflow's semantics: params are written once (a different value for a logged key is refused),
//! metrics append, tags overwrite. One log-batch request carries at most [`MAX_BATCH_METRICS`]
//! metrics, [`MAX_BATCH_PARAMS`] params and [`MAX_BATCH_TAGS`] tags.

use crate::Error;

/// MLflow's limits on one log-batch request.
pub const MAX_BATCH_METRICS: usize = 1000;
pub const MAX_BATCH_PARAMS: usize = 100;
pub const MAX_BATCH_TAGS: usize = 100;
/// MLflow's limits on keys and values (`mlflow/utils/validation.py`).
pub const MAX_KEY_CHARS: usize = 250;
pub const MAX_PARAM_VALUE_CHARS: usize = 6000;
pub const MAX_TAG_VALUE_CHARS: usize = 8000;
/// The most runs one search returns.
pub const MAX_SEARCH_RESULTS: i64 = 50_000;

/// A run's status, as MLflow names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Scheduled,
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Scheduled => "SCHEDULED",
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }

    pub fn parse(text: &str) -> Option<RunStatus> {
        [RunStatus::Running, RunStatus::Scheduled, RunStatus::Finished, RunStatus::Failed, RunStatus::Killed]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// An experiment of a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    pub experiment_id: i64,
    pub name: String,
    pub lifecycle_stage: String,
    /// Milliseconds since the epoch.
    pub creation_time: i64,
    pub last_update_time: i64,
}

/// A run's own fields.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub run_id: uuid::Uuid,
    pub experiment_id: i64,
    pub run_name: String,
    pub user_id: String,
    pub status: String,
    pub start_time: i64,
    pub end_time: Option<i64>,
    pub lifecycle_stage: String,
}

/// A key and its value: a param or a tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

/// One metric point.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub key: String,
    pub value: f64,
    /// Milliseconds since the epoch, as the client sent it.
    pub timestamp: i64,
    pub step: i64,
}

/// A run with what was logged to it: its params and tags, and the latest point of each metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub info: RunInfo,
    pub metrics: Vec<Metric>,
    pub params: Vec<KeyValue>,
    pub tags: Vec<KeyValue>,
}

/// What one log call writes to a run (log-metric, log-parameter and set-tag are batches of one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogBatch {
    pub metrics: Vec<Metric>,
    pub params: Vec<KeyValue>,
    pub tags: Vec<KeyValue>,
}

impl LogBatch {
    /// MLflow's per-request limits and its key and value rules, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let over = |field: &str, count: usize, max: usize| {
            Error::invalid(field, format!("a batch may carry at most {max} {field}; this one has {count}"))
        };
        if self.metrics.len() > MAX_BATCH_METRICS {
            return Err(over("metrics", self.metrics.len(), MAX_BATCH_METRICS));
        }
        if self.params.len() > MAX_BATCH_PARAMS {
            return Err(over("params", self.params.len(), MAX_BATCH_PARAMS));
        }
        if self.tags.len() > MAX_BATCH_TAGS {
            return Err(over("tags", self.tags.len(), MAX_BATCH_TAGS));
        }
        for metric in &self.metrics {
            key_check("metrics.key", &metric.key)?;
        }
        for (field, items, max) in
            [("params", &self.params, MAX_PARAM_VALUE_CHARS), ("tags", &self.tags, MAX_TAG_VALUE_CHARS)]
        {
            for item in items {
                key_check(&format!("{field}.key"), &item.key)?;
                if item.value.chars().count() > max {
                    return Err(Error::invalid(
                        format!("{field}.value"),
                        format!("the value of '{}' is over {max} characters", item.key),
                    ));
                }
            }
        }
        let mut keys: Vec<&str> = self.params.iter().map(|p| p.key.as_str()).collect();
        keys.sort_unstable();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1])
            && self
                .params
                .iter()
                .filter(|p| p.key == pair[0])
                .map(|p| &p.value)
                .collect::<Vec<_>>()
                .windows(2)
                .any(|v| v[0] != v[1])
        {
            return Err(Error::invalid("params", format!("param '{}' is given twice with different values", pair[0])));
        }
        Ok(())
    }
}

/// MLflow's rule for metric, param and tag keys: 1 to 250 letters, digits, `_`, `-`, `.`, ` `,
/// `/`; no `..` path segment and not absolute.
pub fn key_check(field: &str, key: &str) -> Result<(), Error> {
    let allowed = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | '/' | ':');
    if key.is_empty() || key.chars().count() > MAX_KEY_CHARS || !key.chars().all(allowed) {
        return Err(Error::invalid(
            field,
            format!(
                "'{key}': keys are 1 to {MAX_KEY_CHARS} letters, digits, underscores, dashes, periods, spaces, colons or slashes"
            ),
        ));
    }
    if key.starts_with('/') || key.split('/').any(|segment| segment == "..") {
        return Err(Error::invalid(field, format!("'{key}': a key may not be an absolute or parent path")));
    }
    Ok(())
}

/// The part of MLflow's search filter served here: clauses joined by `AND`, each an equality on
/// a param (`params.lr = '0.1'`), a tag (`tags.team = 'vision'`), the status
/// (`attributes.status = 'FINISHED'`) or the run's name (`attributes.run_name = 'x'`), or a
/// comparison of a metric's latest value with a number (`metrics.loss < 0.5`, with `=`, `!=`,
/// `<`, `<=`, `>`, `>=`). Anything else is refused naming this subset, never silently ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    pub params: Vec<KeyValue>,
    pub tags: Vec<KeyValue>,
    pub status: Option<String>,
    pub run_name: Option<String>,
    pub metrics: Vec<MetricClause>,
}

/// `metrics.<key> <op> <value>`: the run's latest point of the metric compared with a number.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricClause {
    pub key: String,
    /// One of `=`, `!=`, `<`, `<=`, `>`, `>=`.
    pub op: &'static str,
    pub value: f64,
}

const OPERATORS: [&str; 6] = ["<=", ">=", "!=", "=", "<", ">"];

/// The comparison in a clause: where its operator starts (outside quotes) and which it is.
fn operator_of(clause: &str) -> Option<(usize, &'static str)> {
    let mut quote: Option<char> = None;
    for (i, c) in clause.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, '\'' | '"' | '`') => quote = Some(c),
            None => {
                if let Some(op) = OPERATORS.iter().find(|op| clause[i..].starts_with(**op)) {
                    return Some((i, op));
                }
            }
        }
    }
    None
}

/// How runs are ordered: by one of their fields or a metric's latest value (MLflow's
/// `order_by`, one key), newest first by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOrder {
    /// `start_time`, `end_time`, `run_name` or `metric`.
    pub by: &'static str,
    /// The metric's key when `by` is `metric`.
    pub metric: Option<String>,
    pub ascending: bool,
}

impl Default for RunOrder {
    fn default() -> Self {
        RunOrder { by: "start_time", metric: None, ascending: false }
    }
}

impl RunOrder {
    /// MLflow's `order_by` list: at most one key here, `attributes.start_time`, `end_time`,
    /// `run_name` or `metrics.<key>`, then `ASC` (MLflow's default) or `DESC`.
    pub fn parse(order_by: &[String]) -> Result<RunOrder, Error> {
        let supported = "order by one key: `attributes.start_time`, `attributes.end_time`, `attributes.run_name` or \
                         `metrics.<key>`, then ASC or DESC";
        let clause = match order_by {
            [] => return Ok(RunOrder::default()),
            [one] => one.trim(),
            _ => return Err(Error::invalid("order_by", supported)),
        };
        let (field, ascending) = match clause.rsplit_once(' ') {
            Some((field, dir)) if dir.eq_ignore_ascii_case("asc") => (field.trim(), true),
            Some((field, dir)) if dir.eq_ignore_ascii_case("desc") => (field.trim(), false),
            _ => (clause, true),
        };
        let (entity, key) = field.split_once('.').unwrap_or(("attributes", field));
        let key = unquote_key(key);
        let order = |by| Ok(RunOrder { by, metric: None, ascending });
        match (entity.to_ascii_lowercase().as_str(), key.as_str()) {
            ("attributes" | "attribute" | "attr" | "run", "start_time") => order("start_time"),
            ("attributes" | "attribute" | "attr" | "run", "end_time") => order("end_time"),
            ("attributes" | "attribute" | "attr" | "run", "run_name") => order("run_name"),
            ("metrics" | "metric", key) if !key.is_empty() => {
                Ok(RunOrder { by: "metric", metric: Some(key.to_string()), ascending })
            }
            _ => Err(Error::invalid("order_by", format!("'{clause}' is not supported here: {supported}"))),
        }
    }
}

impl RunFilter {
    pub fn parse(text: &str) -> Result<RunFilter, Error> {
        let mut filter = RunFilter::default();
        let text = text.trim();
        if text.is_empty() {
            return Ok(filter);
        }
        for clause in split_and(text) {
            let unsupported = || {
                Error::invalid(
                    "filter",
                    format!(
                        "'{clause}' is not supported here: use clauses `params.<key> = '<value>'`, `tags.<key> = '<value>'`, \
                         `attributes.status = '<status>'`, `attributes.run_name = '<name>'` or `metrics.<key> <op> <number>` \
                         (=, !=, <, <=, >, >=) joined by AND"
                    ),
                )
            };
            let (at, op) = operator_of(&clause).ok_or_else(unsupported)?;
            let (left, right) = (clause[..at].trim(), clause[at + op.len()..].trim());
            let (entity, key) = left.split_once('.').unwrap_or(("attributes", left));
            let key = unquote_key(key);
            if matches!(entity.to_ascii_lowercase().as_str(), "metrics" | "metric") {
                let value = right
                    .parse::<f64>()
                    .map_err(|_| Error::invalid("filter", format!("'{clause}': a metric is compared with a number")))?;
                filter.metrics.push(MetricClause { key, op, value });
                continue;
            }
            if op != "=" {
                return Err(unsupported());
            }
            let value = unquote(right).ok_or_else(unsupported)?;
            match entity.to_ascii_lowercase().as_str() {
                "params" | "param" | "parameter" | "parameters" => filter.params.push(KeyValue { key, value }),
                "tags" | "tag" => filter.tags.push(KeyValue { key, value }),
                "attributes" | "attribute" | "attr" | "run" => match key.as_str() {
                    "status" => filter.status = Some(value),
                    "run_name" => filter.run_name = Some(value),
                    _ => return Err(unsupported()),
                },
                _ => return Err(unsupported()),
            }
        }
        Ok(filter)
    }
}

/// Clauses of a filter joined by `AND` (any case), outside quotes.
fn split_and(text: &str) -> Vec<String> {
    let mut clauses = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let words: Vec<&str> = text.split(' ').collect();
    for word in words {
        if quote.is_none() && word.eq_ignore_ascii_case("and") && !current.trim().is_empty() {
            clauses.push(current.trim().to_string());
            current.clear();
            continue;
        }
        for c in word.chars() {
            match quote {
                Some(q) if c == q => quote = None,
                None if matches!(c, '\'' | '"' | '`') => quote = Some(c),
                _ => {}
            }
        }
        current.push_str(word);
        current.push(' ');
    }
    if !current.trim().is_empty() {
        clauses.push(current.trim().to_string());
    }
    clauses
}

fn unquote(text: &str) -> Option<String> {
    let first = text.chars().next()?;
    // One quoted string: `'a' OR x = 'b'` is not one.
    (matches!(first, '\'' | '"') && text.len() >= 2 && text.ends_with(first))
        .then(|| &text[1..text.len() - 1])
        .filter(|inner| !inner.contains(first))
        .map(str::to_string)
}

fn unquote_key(text: &str) -> String {
    let text = text.trim();
    match text.chars().next() {
        Some(q @ ('`' | '"')) if text.len() >= 2 && text.ends_with(q) => text[1..text.len() - 1].to_string(),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_by_takes_one_key_and_a_direction() {
        let order = |text: &str| RunOrder::parse(&[text.to_string()]);
        assert_eq!(RunOrder::parse(&[]).unwrap(), RunOrder::default());
        assert_eq!(
            order("metrics.loss").unwrap(),
            RunOrder { by: "metric", metric: Some("loss".into()), ascending: true }
        );
        assert_eq!(order("attributes.start_time DESC").unwrap(), RunOrder::default());
        assert_eq!(order("run_name desc").unwrap().by, "run_name");
        assert!(order("params.lr ASC").is_err());
        assert!(RunOrder::parse(&["start_time".into(), "end_time".into()]).is_err());
    }

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.into(), value: value.into() }
    }

    #[test]
    fn a_batch_over_mlflows_limits_is_refused_naming_what_is_over() {
        let metric = Metric { key: "loss".into(), value: 1.0, timestamp: 0, step: 0 };
        let at_limit = LogBatch {
            metrics: vec![metric.clone(); MAX_BATCH_METRICS],
            params: (0..MAX_BATCH_PARAMS).map(|i| kv(&format!("p{i}"), "v")).collect(),
            tags: (0..MAX_BATCH_TAGS).map(|i| kv(&format!("t{i}"), "v")).collect(),
        };
        assert_eq!(at_limit.validate(), Ok(()));
        let mut over = at_limit.clone();
        over.metrics.push(metric);
        assert!(matches!(over.validate(), Err(Error::InvalidInput { field, .. }) if field == "metrics"));
        let mut over = at_limit.clone();
        over.params.push(kv("extra", "v"));
        assert!(matches!(over.validate(), Err(Error::InvalidInput { field, .. }) if field == "params"));
        let mut over = at_limit;
        over.tags.push(kv("extra", "v"));
        assert!(matches!(over.validate(), Err(Error::InvalidInput { field, .. }) if field == "tags"));
    }

    #[test]
    fn keys_follow_mlflows_rule() {
        assert!(key_check("key", "train/loss-1.5 x:y").is_ok());
        assert!(key_check("key", "").is_err());
        assert!(key_check("key", "a;b").is_err());
        assert!(key_check("key", "../etc").is_err());
        assert!(key_check("key", &"k".repeat(MAX_KEY_CHARS + 1)).is_err());
        let batch = LogBatch { params: vec![kv("lr", "0.1"), kv("lr", "0.2")], ..Default::default() };
        assert!(batch.validate().is_err(), "one batch giving a param two values");
    }

    #[test]
    fn the_filter_subset_parses_and_refuses_the_rest() {
        let filter = RunFilter::parse(
            "params.lr = '0.1' and tags.`team name` = \"vision and more\" AND attributes.status = 'FINISHED'",
        )
        .unwrap();
        assert_eq!(filter.params, vec![kv("lr", "0.1")]);
        assert_eq!(filter.tags, vec![kv("team name", "vision and more")]);
        assert_eq!(filter.status.as_deref(), Some("FINISHED"));
        assert_eq!(RunFilter::parse("  ").unwrap(), RunFilter::default());
        let metrics =
            RunFilter::parse("metrics.loss < 0.5 and metrics.`val acc` >= 1e-3 AND params.lr = 'a<b'").unwrap();
        assert_eq!(
            metrics.metrics,
            [
                MetricClause { key: "loss".into(), op: "<", value: 0.5 },
                MetricClause { key: "val acc".into(), op: ">=", value: 1e-3 }
            ]
        );
        assert_eq!(metrics.params, [kv("lr", "a<b")], "an operator inside quotes is the value's");
        assert!(RunFilter::parse("metrics.loss < 'low'").is_err(), "a metric against text");
        assert!(RunFilter::parse("tags.t LIKE 'x%'").is_err());
        assert!(RunFilter::parse("params.lr = '0.1' OR params.lr = '0.2'").is_err());
        assert!(RunFilter::parse("params.lr != '0.1'").is_err());
        assert!(RunFilter::parse("params.lr = 0.1").is_err(), "MLflow quotes param values");
    }
}
