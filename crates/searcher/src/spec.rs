//! What a user writes: the search space over a template's parameters and the searcher's settings
//! (`yard experiment create -f search.yaml` reads this shape), and the rules it must keep.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every broken rule of a spec, as (field, message), collected before answering.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Problems(pub Vec<(String, String)>);

impl Problems {
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push((field.into(), message.into()));
    }
}

/// The most trials one experiment may have: a searcher's event log stays small enough to
/// replay on every decision (see `docs/experiments.md`).
pub const MAX_TRIALS: u32 = 100_000;
/// The most rungs of successive halving.
pub const MAX_RUNGS: u32 = 10;
/// The most grid points one float or int dimension is cut into.
pub const MAX_GRID_POINTS: u32 = 1_000;

/// One searched parameter: the values a trial may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Dimension {
    /// Integers from `min` to `max`, both included. A grid takes `count` evenly spaced ones
    /// (every one when `count` is absent and the range holds at most 1,000).
    Int {
        min: i64,
        max: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u32>,
    },
    /// Reals from `min` to `max`; `log` samples the exponent evenly (learning rates). A grid
    /// needs `count` points.
    Float {
        min: f64,
        max: f64,
        #[serde(default)]
        log: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u32>,
    },
    /// One of the values given (numbers, strings or booleans, as the template's type wants).
    Categorical {
        #[schema(value_type = Vec<Object>)]
        values: Vec<serde_json::Value>,
    },
}

/// Minimise or maximise the searched metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    #[default]
    Minimize,
    Maximize,
}

impl Goal {
    /// Whether `a` is better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Minimize => a < b,
            Goal::Maximize => a > b,
        }
    }
}

/// How trials are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Every combination of the dimensions' grid points, each trained to `max_length`.
    Grid,
    /// `max_trials` trials drawn from the space, each trained to `max_length`.
    Random,
    /// Asynchronous successive halving (Li et al., MLSys 2020), pausing and resuming: a trial
    /// stops at each rung with a checkpoint, and the best `1/divisor` of a rung are resumed
    /// from their checkpoints to the next one.
    #[default]
    Asha,
    /// An outside searcher (Optuna, a team's own) asks for trials and tells their results
    /// (`POST /api/v1/experiments/{id}/ask`, `.../tell`); each trial runs to `max_length`.
    Custom,
}

/// The searcher's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearcherSpec {
    #[serde(default)]
    pub method: Method,
    /// The metric the engine reports (e.g. `loss`), compared at each rung's last step.
    pub metric: String,
    #[serde(default)]
    pub goal: Goal,
    /// The training length of a whole trial, in the template's steps (`max_steps`).
    pub max_length: u64,
    /// Trials in all (random, asha, custom); a grid's count is its points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<u32>,
    /// Trials running at once. Default 2.
    #[serde(default = "two")]
    pub max_concurrent_trials: u32,
    /// Successive halving: the fraction kept at each rung is 1/divisor. Default 4.
    #[serde(default = "four")]
    pub divisor: u32,
    /// Successive halving: rungs, the last one at `max_length`. Default 3.
    #[serde(default = "three")]
    pub max_rungs: u32,
    /// Fixes random draws (and so every decision): the same seed and results give the same
    /// trials.
    #[serde(default)]
    pub seed: u64,
}

fn two() -> u32 {
    2
}
fn three() -> u32 {
    3
}
fn four() -> u32 {
    4
}

/// The searched space: a dimension per template parameter name.
pub type Space = BTreeMap<String, Dimension>;

impl SearcherSpec {
    /// Every broken rule of the settings and the space, named by field (`searcher.divisor`,
    /// `space.lr.min`), added to `problems`.
    pub fn check(&self, space: &Space, problems: &mut Problems) {
        if self.metric.trim().is_empty() || self.metric.len() > 250 {
            problems
                .add("searcher.metric", "name the metric the template's engine reports (e.g. loss), at most 250 bytes");
        }
        if self.max_length == 0 || self.max_length > 100_000_000 {
            problems.add("searcher.max_length", "a trial's length in steps: 1 to 100000000");
        }
        if self.max_concurrent_trials == 0 || self.max_concurrent_trials > 1_000 {
            problems.add("searcher.max_concurrent_trials", "1 to 1000");
        }
        match (self.method, self.max_trials) {
            (Method::Grid, Some(_)) => {
                problems.add("searcher.max_trials", "a grid's trials are its points; leave max_trials out")
            }
            (Method::Random | Method::Asha | Method::Custom, None) => {
                problems.add("searcher.max_trials", "say how many trials to run")
            }
            (_, Some(n)) if n == 0 || n > MAX_TRIALS => {
                problems.add("searcher.max_trials", format!("1 to {MAX_TRIALS}"))
            }
            _ => {}
        }
        if self.method == Method::Asha {
            if self.divisor < 2 || self.divisor > 100 {
                problems.add("searcher.divisor", "2 to 100: the best 1/divisor of a rung go on");
            }
            if self.max_rungs == 0 || self.max_rungs > MAX_RUNGS {
                problems.add("searcher.max_rungs", format!("1 to {MAX_RUNGS}"));
            } else if self.divisor >= 2
                && self.max_length > 0
                && (self.divisor as u64).checked_pow(self.max_rungs - 1).is_none_or(|d| d > self.max_length)
            {
                problems.add(
                    "searcher.max_rungs",
                    format!(
                        "with divisor {} the first of {} rungs would be shorter than one step of max_length {}",
                        self.divisor, self.max_rungs, self.max_length
                    ),
                );
            }
        }
        if space.is_empty() && self.method != Method::Custom {
            problems.add("space", "search at least one parameter");
        }
        for (name, dimension) in space {
            dimension.check(&format!("space.{name}"), self.method == Method::Grid, problems);
        }
        if self.method == Method::Grid
            && space.values().all(|d| d.grid_points().is_some())
            && grid_size(space).is_none_or(|n| n > MAX_TRIALS as u64)
        {
            problems.add("space", format!("the grid has more than {MAX_TRIALS} points"));
        }
    }

    /// How many trials the search makes at most.
    pub fn trials(&self, space: &Space) -> u64 {
        match self.method {
            Method::Grid => grid_size(space).unwrap_or(0),
            _ => self.max_trials.unwrap_or(0) as u64,
        }
    }

    /// The rungs' training lengths, shortest first; the last is `max_length`. One rung for
    /// every method but successive halving.
    pub fn rung_lengths(&self) -> Vec<u64> {
        let rungs = if self.method == Method::Asha { self.max_rungs.max(1) } else { 1 };
        (0..rungs)
            .map(|rung| {
                let shrink = (self.divisor.max(2) as u64).saturating_pow(rungs - 1 - rung);
                (self.max_length / shrink).max(1)
            })
            .collect()
    }
}

impl Dimension {
    fn check(&self, field: &str, grid: bool, problems: &mut Problems) {
        match self {
            Dimension::Int { min, max, count } => {
                if min > max {
                    problems.add(format!("{field}.min"), format!("{min} is above max {max}"));
                }
                if let Some(count) = count {
                    if *count == 0 || *count > MAX_GRID_POINTS {
                        problems.add(format!("{field}.count"), format!("1 to {MAX_GRID_POINTS}"));
                    }
                } else if grid && min <= max && max.abs_diff(*min) >= MAX_GRID_POINTS as u64 {
                    problems
                        .add(format!("{field}.count"), "a grid over more than 1000 integers needs a count of points");
                }
            }
            Dimension::Float { min, max, log, count } => {
                if !min.is_finite() || !max.is_finite() {
                    problems.add(format!("{field}.min"), "bounds must be finite numbers");
                } else if min > max {
                    problems.add(format!("{field}.min"), format!("{min} is above max {max}"));
                } else if *log && *min <= 0.0 {
                    problems.add(format!("{field}.min"), "a log scale needs bounds above 0");
                }
                match count {
                    Some(0) => problems.add(format!("{field}.count"), format!("1 to {MAX_GRID_POINTS}")),
                    Some(n) if *n > MAX_GRID_POINTS => {
                        problems.add(format!("{field}.count"), format!("1 to {MAX_GRID_POINTS}"))
                    }
                    None if grid => {
                        problems.add(format!("{field}.count"), "a grid needs the number of points of a float")
                    }
                    _ => {}
                }
            }
            Dimension::Categorical { values } => {
                if values.is_empty() || values.len() > MAX_GRID_POINTS as usize {
                    problems.add(format!("{field}.values"), format!("1 to {MAX_GRID_POINTS} values"));
                }
                if values.iter().any(|v| v.is_object() || v.is_array() || v.is_null()) {
                    problems.add(format!("{field}.values"), "numbers, strings or booleans only");
                }
            }
        }
    }

    /// The dimension's grid points, in order; `None` when it has no finite grid.
    pub fn grid_points(&self) -> Option<Vec<serde_json::Value>> {
        match self {
            Dimension::Int { min, max, count } => {
                let span = max.checked_sub(*min)?;
                match count {
                    None if span < MAX_GRID_POINTS as i64 => Some((*min..=*max).map(serde_json::Value::from).collect()),
                    None => None,
                    Some(n) => {
                        let mut points: Vec<i64> = (0..*n)
                            .map(|i| {
                                if *n == 1 {
                                    *min
                                } else {
                                    min + ((span as f64) * i as f64 / (*n - 1) as f64).round() as i64
                                }
                            })
                            .collect();
                        points.dedup();
                        Some(points.into_iter().map(serde_json::Value::from).collect())
                    }
                }
            }
            Dimension::Float { min, max, log, count } => {
                let n = (*count)?;
                Some(
                    (0..n)
                        .map(|i| {
                            let t = if n == 1 { 0.0 } else { i as f64 / (n - 1) as f64 };
                            serde_json::Value::from(interpolate(*min, *max, *log, t))
                        })
                        .collect(),
                )
            }
            Dimension::Categorical { values } => Some(values.clone()),
        }
    }
}

/// The point at fraction `t` (0 to 1) of `[min, max]`, on a log scale when asked.
pub(crate) fn interpolate(min: f64, max: f64, log: bool, t: f64) -> f64 {
    if log { (min.ln() + (max.ln() - min.ln()) * t).exp().clamp(min, max) } else { min + (max - min) * t }
}

/// The number of points of the space's grid; `None` when a dimension has none or it overflows.
pub fn grid_size(space: &Space) -> Option<u64> {
    space.values().try_fold(1u64, |n, d| n.checked_mul(d.grid_points()?.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asha() -> SearcherSpec {
        serde_json::from_value(serde_json::json!({"metric": "loss", "max_length": 64, "max_trials": 8, "divisor": 2}))
            .unwrap()
    }

    fn problems_of(spec: &SearcherSpec, space: &Space) -> Vec<String> {
        let mut problems = Problems::default();
        spec.check(space, &mut problems);
        problems.0.into_iter().map(|(field, _)| field).collect()
    }

    #[test]
    fn rungs_halve_up_to_the_whole_length() {
        assert_eq!(asha().rung_lengths(), vec![16, 32, 64]);
        let random = SearcherSpec { method: Method::Random, ..asha() };
        assert_eq!(random.rung_lengths(), vec![64]);
    }

    #[test]
    fn every_bad_field_is_named_at_once() {
        let spec = SearcherSpec { divisor: 1, max_length: 0, max_trials: Some(0), metric: " ".into(), ..asha() };
        let space: Space = serde_json::from_value(serde_json::json!({
            "lr": {"type": "float", "min": 0.0, "max": 1.0, "log": true},
            "layers": {"type": "int", "min": 5, "max": 1},
            "opt": {"type": "categorical", "values": []},
        }))
        .unwrap();
        let fields = problems_of(&spec, &space);
        for field in [
            "searcher.metric",
            "searcher.max_length",
            "searcher.max_trials",
            "searcher.divisor",
            "space.lr.min",
            "space.layers.min",
            "space.opt.values",
        ] {
            assert!(fields.contains(&field.to_string()), "{field} missing from {fields:?}");
        }
    }

    #[test]
    fn too_many_rungs_for_the_length_are_refused() {
        let spec = SearcherSpec { max_length: 10, max_rungs: 5, ..asha() };
        assert_eq!(problems_of(&spec, &Space::new()).first().map(String::as_str), Some("searcher.max_rungs"));
    }

    #[test]
    fn a_grid_crosses_every_dimension() {
        let space: Space = serde_json::from_value(serde_json::json!({
            "lr": {"type": "float", "min": 0.001, "max": 0.1, "log": true, "count": 3},
            "batch": {"type": "categorical", "values": [16, 32]},
            "layers": {"type": "int", "min": 1, "max": 4},
        }))
        .unwrap();
        assert_eq!(grid_size(&space), Some(24));
        let lr = space["lr"].grid_points().unwrap();
        let lr: Vec<f64> = lr.iter().map(|v| v.as_f64().unwrap()).collect();
        assert!((lr[1] - 0.01).abs() < 1e-12, "the log grid's middle is the geometric mean: {lr:?}");
        let grid = SearcherSpec { method: Method::Grid, max_trials: None, ..asha() };
        assert!(problems_of(&grid, &space).is_empty());
    }
}
