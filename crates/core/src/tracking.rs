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
    pub tags: Vec<KeyValue>,
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

/// The part of MLflow's search filter served here: clauses joined by `AND`, each
///
/// - on a param or a tag: `params.lr = '0.1'`, with `=`, `!=`, `LIKE` or `ILIKE` (`%` any
///   characters, `_` one; `ILIKE` ignoring case); a run without the key matches none of them;
/// - on the run's status or name (`attributes.status`, `attributes.run_name`): the same four, or
///   `IN ('a', 'b')` / `NOT IN (...)`;
/// - on the run's id (`attributes.run_id`): `=`, `!=`, `IN`, `NOT IN`; on `attributes.user_id`
///   as on the status;
/// - on its start or end time (`attributes.start_time`, `created`, `end_time`, milliseconds):
///   `=`, `!=`, `<`, `<=`, `>`, `>=` and a whole number;
/// - on a metric's latest value (highest step, then latest time): `metrics.loss < 0.5`, with
///   `=`, `!=`, `<`, `<=`, `>`, `>=` and a number.
///
/// Anything else (`OR`, datasets, `IN` on params) is refused naming this subset, never silently
/// ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    pub clauses: Vec<FilterClause>,
}

/// One clause of a [`RunFilter`].
#[derive(Debug, Clone, PartialEq)]
pub enum FilterClause {
    Param {
        key: String,
        op: TextOp,
        value: String,
    },
    Tag {
        key: String,
        op: TextOp,
        value: String,
    },
    Attribute {
        field: RunField,
        op: TextOp,
        value: String,
    },
    AttributeIn {
        field: RunField,
        values: Vec<String>,
        negated: bool,
    },
    /// The run's start or end time (milliseconds) compared with a number, as a metric is.
    Time {
        end: bool,
        op: &'static str,
        value: i64,
    },
    Metric(MetricClause),
}

/// A comparison of text, as MLflow's search has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextOp {
    Eq,
    Ne,
    /// `%` any characters, `_` one, case counts.
    Like,
    /// `LIKE`, ignoring case.
    ILike,
}

impl TextOp {
    /// The operator in SQL (Postgres's `LIKE` and `ILIKE` have MLflow's wildcards).
    pub fn sql(self) -> &'static str {
        match self {
            TextOp::Eq => "=",
            TextOp::Ne => "<>",
            TextOp::Like => "LIKE",
            TextOp::ILike => "ILIKE",
        }
    }
}

/// A field of a run that a filter compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunField {
    Status,
    Name,
    /// The run's id, as the wire has it (32 hex digits).
    Id,
    /// MLflow's `user_id`: the user the client said it ran as.
    User,
}

/// `metrics.<key> <op> <value>`: the run's latest point of the metric compared with a number.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricClause {
    pub key: String,
    /// One of `=`, `!=`, `<`, `<=`, `>`, `>=`.
    pub op: &'static str,
    pub value: f64,
}

const SYMBOL_OPERATORS: [&str; 6] = ["<=", ">=", "!=", "=", "<", ">"];
/// Operators that are words, checked in this order (`NOT IN` before `IN`), any case, with space
/// before them.
const WORD_OPERATORS: [&str; 4] = ["NOT IN", "ILIKE", "LIKE", "IN"];

/// The comparison in a clause: where its operator starts and ends (outside quotes) and which it
/// is (upper case).
fn operator_of(clause: &str) -> Option<(usize, usize, &'static str)> {
    let mut quote: Option<char> = None;
    for (i, c) in clause.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, '\'' | '"' | '`') => quote = Some(c),
            None => {
                if let Some(op) = SYMBOL_OPERATORS.iter().find(|op| clause[i..].starts_with(**op)) {
                    return Some((i, i + op.len(), op));
                }
                if c.is_whitespace() {
                    let rest = clause[i..].trim_start();
                    let at = clause.len() - rest.len();
                    for op in WORD_OPERATORS {
                        let Some(word) = rest.get(..op.len()) else { continue };
                        let after = rest[op.len()..].chars().next();
                        let normalized = word.split_whitespace().collect::<Vec<_>>().join(" ");
                        if normalized.eq_ignore_ascii_case(op) && after.is_none_or(|a| a.is_whitespace() || a == '(') {
                            return Some((at, at + op.len(), op));
                        }
                    }
                }
            }
        }
    }
    None
}

/// How runs are ordered: by up to [`MAX_ORDER_KEYS`] keys, each a field of the run or a metric's
/// latest value, a param or a tag (MLflow's `order_by`); newest first by default and after
/// the keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOrder {
    pub keys: Vec<OrderKey>,
}

/// The most `order_by` keys one search takes.
pub const MAX_ORDER_KEYS: usize = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderKey {
    pub by: OrderBy,
    pub ascending: bool,
}

/// What runs are ordered by; runs without the metric, param or tag come last either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderBy {
    StartTime,
    EndTime,
    RunName,
    Status,
    Metric(String),
    Param(String),
    Tag(String),
}

impl RunOrder {
    /// MLflow's `order_by` list: keys `attributes.start_time`, `end_time`, `run_name`,
    /// `status`, `metrics.<key>`, `params.<key>` or `tags.<key>`, each then `ASC` (MLflow's
    /// default) or `DESC`.
    pub fn parse(order_by: &[String]) -> Result<RunOrder, Error> {
        let supported = "order by `attributes.start_time`, `attributes.end_time`, `attributes.run_name`, \
                         `attributes.status`, `metrics.<key>`, `params.<key>` or `tags.<key>`, then ASC or DESC";
        if order_by.len() > MAX_ORDER_KEYS {
            return Err(Error::invalid("order_by", format!("at most {MAX_ORDER_KEYS} keys")));
        }
        let mut keys = Vec::with_capacity(order_by.len());
        for clause in order_by {
            let clause = clause.trim();
            let (field, ascending) = match clause.rsplit_once(' ') {
                Some((field, dir)) if dir.eq_ignore_ascii_case("asc") => (field.trim(), true),
                Some((field, dir)) if dir.eq_ignore_ascii_case("desc") => (field.trim(), false),
                _ => (clause, true),
            };
            let (entity, key) = field.split_once('.').unwrap_or(("attributes", field));
            let key = unquote_key(key);
            let by = match (entity.to_ascii_lowercase().as_str(), key.as_str()) {
                ("attributes" | "attribute" | "attr" | "run", "start_time") => OrderBy::StartTime,
                ("attributes" | "attribute" | "attr" | "run", "end_time") => OrderBy::EndTime,
                ("attributes" | "attribute" | "attr" | "run", "run_name") => OrderBy::RunName,
                ("attributes" | "attribute" | "attr" | "run", "status") => OrderBy::Status,
                ("metrics" | "metric", key) if !key.is_empty() => OrderBy::Metric(key.to_string()),
                ("params" | "param" | "parameter" | "parameters", key) if !key.is_empty() => {
                    OrderBy::Param(key.to_string())
                }
                ("tags" | "tag", key) if !key.is_empty() => OrderBy::Tag(key.to_string()),
                _ => return Err(Error::invalid("order_by", format!("'{clause}' is not supported here: {supported}"))),
            };
            keys.push(OrderKey { by, ascending });
        }
        Ok(RunOrder { keys })
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
                        "'{clause}' is not supported here: use clauses `params.<key>` or `tags.<key>` with =, !=, LIKE, \
                         ILIKE and a quoted value; `attributes.status` or `attributes.run_name` with those or \
                         IN / NOT IN ('a', 'b'); `attributes.run_id` with =, !=, IN, NOT IN; or \
                         `metrics.<key> <op> <number>` (=, !=, <, <=, >, >=), joined by AND"
                    ),
                )
            };
            let (at, end, op) = operator_of(&clause).ok_or_else(unsupported)?;
            let (left, right) = (clause[..at].trim(), clause[end..].trim());
            let (entity, key) = left.split_once('.').unwrap_or(("attributes", left));
            let key = unquote_key(key);
            let entity = entity.to_ascii_lowercase();
            if matches!(entity.as_str(), "metrics" | "metric") {
                let value = right
                    .parse::<f64>()
                    .ok()
                    .filter(|_| !matches!(op, "LIKE" | "ILIKE" | "IN" | "NOT IN"))
                    .ok_or_else(|| {
                        Error::invalid("filter", format!("'{clause}': a metric is compared with a number"))
                    })?;
                filter.clauses.push(FilterClause::Metric(MetricClause { key, op, value }));
                continue;
            }
            let time = match (entity.as_str(), key.as_str()) {
                ("attributes" | "attribute" | "attr" | "run", "start_time" | "created") => Some(false),
                ("attributes" | "attribute" | "attr" | "run", "end_time") => Some(true),
                _ => None,
            };
            if let Some(end) = time {
                let value =
                    right.parse::<i64>().ok().filter(|_| SYMBOL_OPERATORS.contains(&op)).ok_or_else(|| {
                        Error::invalid("filter", format!("'{clause}': a time is compared with a number"))
                    })?;
                filter.clauses.push(FilterClause::Time { end, op, value });
                continue;
            }
            let field = match (entity.as_str(), key.as_str()) {
                ("attributes" | "attribute" | "attr" | "run", "status") => Some(RunField::Status),
                ("attributes" | "attribute" | "attr" | "run", "user_id") => Some(RunField::User),
                ("attributes" | "attribute" | "attr" | "run", "run_name") => Some(RunField::Name),
                ("attributes" | "attribute" | "attr" | "run", "run_id") => Some(RunField::Id),
                ("attributes" | "attribute" | "attr" | "run", _) => return Err(unsupported()),
                _ => None,
            };
            if matches!(op, "IN" | "NOT IN") {
                let field = field.ok_or_else(unsupported)?;
                let values = unquote_list(right).ok_or_else(unsupported)?;
                let values = match field {
                    RunField::Id => values.into_iter().map(|v| v.to_ascii_lowercase()).collect(),
                    _ => values,
                };
                filter.clauses.push(FilterClause::AttributeIn { field, values, negated: op == "NOT IN" });
                continue;
            }
            let op = match op {
                "=" => TextOp::Eq,
                "!=" => TextOp::Ne,
                "LIKE" => TextOp::Like,
                "ILIKE" => TextOp::ILike,
                _ => return Err(unsupported()),
            };
            let value = unquote(right).ok_or_else(unsupported)?;
            let clause = match (entity.as_str(), field) {
                (_, Some(RunField::Id)) if matches!(op, TextOp::Like | TextOp::ILike) => return Err(unsupported()),
                (_, Some(RunField::Id)) => {
                    FilterClause::Attribute { field: RunField::Id, op, value: value.to_ascii_lowercase() }
                }
                (_, Some(field)) => FilterClause::Attribute { field, op, value },
                ("params" | "param" | "parameter" | "parameters", None) => FilterClause::Param { key, op, value },
                ("tags" | "tag", None) => FilterClause::Tag { key, op, value },
                _ => return Err(unsupported()),
            };
            filter.clauses.push(clause);
        }
        Ok(filter)
    }
}

/// MLflow's experiment search filter, the part served: clauses joined by `AND`, each on the
/// experiment's name (`name LIKE 'mnist%'`) or a tag (`tags.team = 'vision'`), with `=`, `!=`,
/// `LIKE` or `ILIKE` and a quoted value. Anything else is refused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExperimentFilter {
    /// `None` as the key: the name; else a tag's key.
    pub clauses: Vec<(Option<String>, TextOp, String)>,
}

impl ExperimentFilter {
    pub fn parse(text: &str) -> Result<ExperimentFilter, Error> {
        let mut filter = ExperimentFilter::default();
        let text = text.trim();
        if text.is_empty() {
            return Ok(filter);
        }
        for clause in split_and(text) {
            let unsupported = || {
                Error::invalid(
                    "filter",
                    format!(
                        "'{clause}' is not supported here: use clauses `name` or `tags.<key>` with =, !=, LIKE or \
                         ILIKE and a quoted value, joined by AND"
                    ),
                )
            };
            let (at, end, op) = operator_of(&clause).ok_or_else(unsupported)?;
            let (left, right) = (clause[..at].trim(), clause[end..].trim());
            let op = match op {
                "=" => TextOp::Eq,
                "!=" => TextOp::Ne,
                "LIKE" => TextOp::Like,
                "ILIKE" => TextOp::ILike,
                _ => return Err(unsupported()),
            };
            let value = unquote(right).ok_or_else(unsupported)?;
            let (entity, key) = left.split_once('.').unwrap_or(("attributes", left));
            let key = unquote_key(key);
            let target = match (entity.to_ascii_lowercase().as_str(), key.as_str()) {
                ("attributes" | "attribute" | "attr", "name") => None,
                ("tags" | "tag", key) if !key.is_empty() => Some(key.to_string()),
                _ => return Err(unsupported()),
            };
            filter.clauses.push((target, op, value));
        }
        Ok(filter)
    }
}

/// How experiments are ordered (MLflow's `order_by` of `experiments/search`): keys `name`,
/// `experiment_id`, `creation_time`, `last_update_time`, each `ASC` (default) or `DESC`; then
/// by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExperimentOrder {
    /// The column (`name`, `experiment_id`, `created_at`, `updated_at`) and whether ascending.
    pub keys: Vec<(&'static str, bool)>,
}

impl ExperimentOrder {
    pub fn parse(order_by: &[String]) -> Result<ExperimentOrder, Error> {
        if order_by.len() > MAX_ORDER_KEYS {
            return Err(Error::invalid("order_by", format!("at most {MAX_ORDER_KEYS} keys")));
        }
        let mut keys = Vec::with_capacity(order_by.len());
        for clause in order_by {
            let clause = clause.trim();
            let (field, ascending) = match clause.rsplit_once(' ') {
                Some((field, dir)) if dir.eq_ignore_ascii_case("asc") => (field.trim(), true),
                Some((field, dir)) if dir.eq_ignore_ascii_case("desc") => (field.trim(), false),
                _ => (clause, true),
            };
            let field = field.strip_prefix("attributes.").or_else(|| field.strip_prefix("attribute.")).unwrap_or(field);
            let column = match field {
                "name" => "name",
                "experiment_id" => "experiment_id",
                "creation_time" => "created_at",
                "last_update_time" => "updated_at",
                _ => {
                    return Err(Error::invalid(
                        "order_by",
                        format!(
                            "'{clause}' is not supported here: order by `name`, `experiment_id`, `creation_time` or \
                             `last_update_time`, then ASC or DESC"
                        ),
                    ));
                }
            };
            keys.push((column, ascending));
        }
        Ok(ExperimentOrder { keys })
    }
}

/// `('a', "b")`: quoted values in parentheses, separated by commas (outside quotes).
fn unquote_list(text: &str) -> Option<Vec<String>> {
    let inner = text.strip_prefix('(')?.strip_suffix(')')?;
    let mut values = Vec::new();
    let (mut current, mut quote) = (String::new(), None::<char>);
    for c in inner.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            None if matches!(c, '\'' | '"') => quote = Some(c),
            None if c == ',' => {
                values.push(unquote(current.trim())?);
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    values.push(unquote(current.trim())?);
    Some(values)
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
    fn experiment_searches_filter_by_name_and_tags_and_order_by_their_fields() {
        let filter = ExperimentFilter::parse("name LIKE 'mnist%' and tags.team != 'nlp'").unwrap();
        assert_eq!(
            filter.clauses,
            [(None, TextOp::Like, "mnist%".into()), (Some("team".into()), TextOp::Ne, "nlp".into())]
        );
        assert!(ExperimentFilter::parse("creation_time > 5").is_err());
        assert!(ExperimentFilter::parse("name IN ('a')").is_err());
        let order = ExperimentOrder::parse(&["name DESC".into(), "creation_time".into()]).unwrap();
        assert_eq!(order.keys, [("name", false), ("created_at", true)]);
        assert!(ExperimentOrder::parse(&["tags.x".into()]).is_err());
    }

    #[test]
    fn order_by_takes_keys_each_with_a_direction() {
        let key = |by, ascending| OrderKey { by, ascending };
        assert_eq!(RunOrder::parse(&[]).unwrap(), RunOrder::default());
        let order = RunOrder::parse(&[
            "metrics.loss".into(),
            "attributes.start_time DESC".into(),
            "params.`learning rate` desc".into(),
            "tags.team ASC".into(),
            "run_name desc".into(),
            "status".into(),
        ])
        .unwrap();
        assert_eq!(
            order.keys,
            [
                key(OrderBy::Metric("loss".into()), true),
                key(OrderBy::StartTime, false),
                key(OrderBy::Param("learning rate".into()), false),
                key(OrderBy::Tag("team".into()), true),
                key(OrderBy::RunName, false),
                key(OrderBy::Status, true),
            ]
        );
        assert!(RunOrder::parse(&["attributes.user_id".into()]).is_err());
        assert!(RunOrder::parse(&["params. ASC".into()]).is_err());
        assert!(RunOrder::parse(&vec!["start_time".to_string(); MAX_ORDER_KEYS + 1]).is_err());
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
        let param = |key: &str, op, value: &str| FilterClause::Param { key: key.into(), op, value: value.into() };
        let filter = RunFilter::parse(
            "params.lr = '0.1' and tags.`team name` = \"vision and more\" AND attributes.status = 'FINISHED'",
        )
        .unwrap();
        assert_eq!(
            filter.clauses,
            [
                param("lr", TextOp::Eq, "0.1"),
                FilterClause::Tag { key: "team name".into(), op: TextOp::Eq, value: "vision and more".into() },
                FilterClause::Attribute { field: RunField::Status, op: TextOp::Eq, value: "FINISHED".into() },
            ]
        );
        assert_eq!(RunFilter::parse("  ").unwrap(), RunFilter::default());
        let metrics =
            RunFilter::parse("metrics.loss < 0.5 and metrics.`val acc` >= 1e-3 AND params.lr = 'a<b'").unwrap();
        assert_eq!(
            metrics.clauses,
            [
                FilterClause::Metric(MetricClause { key: "loss".into(), op: "<", value: 0.5 }),
                FilterClause::Metric(MetricClause { key: "val acc".into(), op: ">=", value: 1e-3 }),
                param("lr", TextOp::Eq, "a<b"),
            ],
            "an operator inside quotes is the value's"
        );
        let words = RunFilter::parse(
            "params.lr != '0.1' and params.opt like 'ad%' AND tags.t ILIKE '%X%' and attributes.run_name LIKE 'a in b' \
             and attributes.run_id IN ('AB', \"cd\") and attributes.status not in ('FAILED','KILLED')",
        )
        .unwrap();
        assert_eq!(
            words.clauses,
            [
                param("lr", TextOp::Ne, "0.1"),
                param("opt", TextOp::Like, "ad%"),
                FilterClause::Tag { key: "t".into(), op: TextOp::ILike, value: "%X%".into() },
                FilterClause::Attribute { field: RunField::Name, op: TextOp::Like, value: "a in b".into() },
                FilterClause::AttributeIn {
                    field: RunField::Id,
                    values: vec!["ab".into(), "cd".into()],
                    negated: false
                },
                FilterClause::AttributeIn {
                    field: RunField::Status,
                    values: vec!["FAILED".into(), "KILLED".into()],
                    negated: true
                },
            ]
        );
        assert!(RunFilter::parse("metrics.loss < 'low'").is_err(), "a metric against text");
        assert!(RunFilter::parse("metrics.loss LIKE '1%'").is_err());
        assert!(RunFilter::parse("params.lr IN ('0.1')").is_err(), "IN on params");
        assert!(RunFilter::parse("attributes.run_id LIKE 'a%'").is_err());
        assert_eq!(
            RunFilter::parse("attributes.start_time >= 1700000000000 and attributes.user_id = 'mia'").unwrap().clauses,
            [
                FilterClause::Time { end: false, op: ">=", value: 1_700_000_000_000 },
                FilterClause::Attribute { field: RunField::User, op: TextOp::Eq, value: "mia".into() },
            ]
        );
        assert!(RunFilter::parse("attributes.end_time LIKE '1%'").is_err());
        assert!(RunFilter::parse("attributes.artifact_uri = 'x'").is_err());
        assert!(RunFilter::parse("params.lr = '0.1' OR params.lr = '0.2'").is_err());
        assert!(RunFilter::parse("params.lr = 0.1").is_err(), "MLflow quotes param values");
        assert!(RunFilter::parse("attributes.status IN 'FAILED'").is_err(), "IN takes a list");
    }
}
