//! The searcher as a state machine: its state is the fold of its stored events, and what it has
//! decided (the runs it asked for) is a function of that state alone. A server that restarts,
//! or a leader that takes over, replays the events and finds the same decisions; the driver
//! makes each decided run exist exactly once (a job per run, found by its idempotency key).
//!
//! Successive halving pauses and resumes: a trial's run stops at its rung's length with a
//! checkpoint and reports the metric there; when it ranks in the best `1/divisor` of that rung
//! (among the trials that reached it so far, as asynchronous successive halving promotes), a
//! run of the same trial resumes from that checkpoint to the next rung.

use std::collections::{BTreeMap, BTreeSet};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::spec::{Dimension, Goal, Method, SearcherSpec, Space, interpolate};

/// A trial's parameter values, by template parameter name.
pub type Params = BTreeMap<String, serde_json::Value>;

/// A fact the driver stored, in the order it stored it. Events are the searcher's only input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// A trial's run to `rung` ended with the metric at that rung's length.
    Reported {
        trial: u32,
        rung: u32,
        value: f64,
    },
    /// A trial's run ended without a value: the job failed or was cancelled by someone.
    TrialFailed {
        trial: u32,
        rung: u32,
        reason: String,
    },
    /// A trial's run ended and the engine never reported the searched metric: the whole search
    /// cannot rank anything, so it fails with this reason.
    MetricMissing {
        trial: u32,
        rung: u32,
        reason: String,
    },
    /// An outside searcher asked for a trial with these parameters (`custom` searchers).
    Asked {
        trial: u32,
        #[schema(value_type = Object)]
        params: Params,
    },
    /// The outside searcher asks for no more trials (`custom` searchers): the search completes
    /// once the runs under way end.
    AskingDone,
    /// No new runs until `Resumed`; the runs under way finish their rung.
    Paused,
    Resumed,
    /// The GPU-hours spent reached the experiment's budget: no new runs.
    BudgetReached,
    /// Every run under way is stopped and nothing new starts.
    Cancelled,
    /// A trial's run was stopped to make room (it ran on spare room, or lost a reclaim) and
    /// went back to the queue, to resume from its checkpoint: not a failure, and no decision
    /// changes. Stored by the control loop in the transaction that requeues the job.
    Preempted {
        trial: u32,
        rung: u32,
    },
}

/// A run the searcher decided on: train `trial` with `params` up to `length` steps, resuming
/// from its checkpoint when `rung` is above 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Run {
    pub trial: u32,
    pub rung: u32,
    /// The step the run stops at (its rung's length).
    pub length: u64,
    #[schema(value_type = Object)]
    pub params: Params,
}

/// Where the search stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// Runs are under way or will be decided.
    Searching,
    /// Paused by a user (or out of budget) with runs still under way.
    Paused,
    /// Nothing is under way and nothing more will run.
    Completed,
    /// The search cannot go on.
    Failed {
        reason: String,
    },
    Cancelled,
}

/// The best result: the trial with the best value at the highest rung any trial reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Best {
    pub trial: u32,
    pub rung: u32,
    pub value: f64,
}

/// What one trial has done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrialState {
    pub trial: u32,
    #[schema(value_type = Object)]
    pub params: Params,
    /// The rung of its latest run.
    pub rung: u32,
    /// Whether a run of it is under way (decided and not yet ended).
    pub running: bool,
    /// The metric at each rung it reached, lowest rung first.
    pub values: Vec<f64>,
    pub failed: Option<String>,
    /// How often its runs were preempted (each resumed from its checkpoint).
    #[serde(default)]
    pub preemptions: u32,
}

/// The searcher's whole state. Build it with [`Search::new`], feed it every stored event in
/// order with [`Search::apply`]; read [`Search::runs`] for what to run.
#[derive(Debug, Clone)]
pub struct Search {
    spec: SearcherSpec,
    space: Space,
    lengths: Vec<u64>,
    total_trials: u64,
    trials: Vec<TrialState>,
    /// Each rung's results, kept sorted best first (ties: the lower trial first).
    rungs: Vec<Vec<(f64, u32)>>,
    /// Trials promoted out of each rung.
    promoted: Vec<BTreeSet<u32>>,
    runs: Vec<Run>,
    under_way: BTreeSet<u32>,
    paused: bool,
    no_budget: bool,
    asking_done: bool,
    ended: Option<Outcome>,
}

impl Search {
    /// The search before any event: it has decided its first runs already.
    pub fn new(spec: SearcherSpec, space: Space) -> Search {
        let lengths = spec.rung_lengths();
        let total_trials = spec.trials(&space);
        let rungs = lengths.len();
        let mut search = Search {
            spec,
            space,
            lengths,
            total_trials,
            trials: Vec::new(),
            rungs: vec![Vec::new(); rungs],
            promoted: vec![BTreeSet::new(); rungs],
            runs: Vec::new(),
            under_way: BTreeSet::new(),
            paused: false,
            no_budget: false,
            asking_done: false,
            ended: None,
        };
        search.decide();
        search
    }

    /// Takes one stored event into the state and decides what follows from it. An event that
    /// does not fit the state (a report for a run never decided, a second report of one run) is
    /// refused with the reason and changes nothing: the driver never stores such an event.
    pub fn apply(&mut self, event: &Event) -> Result<(), String> {
        if self.ended.is_some() {
            return Ok(());
        }
        match event {
            Event::Reported { trial, rung, value } => {
                self.run_ended(*trial, *rung)?;
                if !value.is_finite() {
                    self.trials[*trial as usize].failed = Some(format!("the metric was {value}"));
                } else {
                    let goal = self.spec.goal;
                    let results = &mut self.rungs[*rung as usize];
                    let at = results.partition_point(|&(v, t)| goal.better(v, *value) || (v == *value && t < *trial));
                    results.insert(at, (*value, *trial));
                    self.trials[*trial as usize].values.push(*value);
                }
            }
            Event::TrialFailed { trial, rung, reason } => {
                self.run_ended(*trial, *rung)?;
                self.trials[*trial as usize].failed = Some(reason.clone());
            }
            Event::MetricMissing { trial, rung, reason } => {
                self.run_ended(*trial, *rung)?;
                self.trials[*trial as usize].failed = Some(reason.clone());
                self.ended = Some(Outcome::Failed { reason: reason.clone() });
                return Ok(());
            }
            Event::Asked { trial, params } => {
                if self.spec.method != Method::Custom {
                    return Err("only a custom searcher is asked for trials".into());
                }
                if *trial as usize != self.trials.len() {
                    return Err(format!("the next trial is {}, not {trial}", self.trials.len()));
                }
                if self.trials.len() as u64 >= self.total_trials {
                    return Err(format!("the experiment has its {} trials already", self.total_trials));
                }
                self.trial_start(params.clone());
            }
            Event::AskingDone => self.asking_done = true,
            Event::Paused => self.paused = true,
            Event::Resumed => self.paused = false,
            Event::BudgetReached => self.no_budget = true,
            Event::Cancelled => {
                self.ended = Some(Outcome::Cancelled);
                return Ok(());
            }
            Event::Preempted { trial, rung } => {
                // Counted for people; a run that is not under way (its end stored first by a
                // racing writer) changes nothing either.
                if let Some(t) = self.trials.get_mut(*trial as usize).filter(|t| t.rung == *rung && t.running) {
                    t.preemptions += 1;
                }
                return Ok(());
            }
        }
        self.decide();
        Ok(())
    }

    fn run_ended(&mut self, trial: u32, rung: u32) -> Result<(), String> {
        let known = self.trials.get(trial as usize).is_some_and(|t| t.rung == rung);
        if !known || !self.under_way.remove(&trial) {
            return Err(format!("trial {trial} has no run under way to rung {rung}"));
        }
        self.trials[trial as usize].running = false;
        Ok(())
    }

    /// Fills the free places with promotions first (highest rung first), then new trials.
    fn decide(&mut self) {
        if self.ended.is_some() {
            return;
        }
        while !self.paused && !self.no_budget && (self.under_way.len() as u32) < self.spec.max_concurrent_trials {
            if let Some((trial, rung)) = self.promotable() {
                self.promoted[rung as usize].insert(trial);
                self.launch(trial, rung + 1);
            } else if self.spec.method != Method::Custom && (self.trials.len() as u64) < self.total_trials {
                let params = self.params_of(self.trials.len() as u32);
                self.trial_start(params);
            } else {
                break;
            }
        }
        let nothing_more =
            (self.trials.len() as u64) >= self.total_trials || (self.spec.method == Method::Custom && self.asking_done);
        if self.under_way.is_empty() && (nothing_more || self.no_budget) && self.promotable().is_none() {
            self.ended = Some(if self.trials.iter().all(|t| t.failed.is_some()) && !self.trials.is_empty() {
                Outcome::Failed { reason: "every trial failed".into() }
            } else {
                Outcome::Completed
            });
        }
    }

    fn trial_start(&mut self, params: Params) {
        let trial = self.trials.len() as u32;
        self.trials.push(TrialState {
            trial,
            params,
            rung: 0,
            running: false,
            values: Vec::new(),
            failed: None,
            preemptions: 0,
        });
        self.launch(trial, 0);
    }

    fn launch(&mut self, trial: u32, rung: u32) {
        let state = &mut self.trials[trial as usize];
        state.rung = rung;
        state.running = true;
        self.under_way.insert(trial);
        self.runs.push(Run { trial, rung, length: self.lengths[rung as usize], params: state.params.clone() });
    }

    /// A trial in the best `1/divisor` of a rung (below the last) not yet promoted out of it.
    fn promotable(&self) -> Option<(u32, u32)> {
        let divisor = self.spec.divisor.max(2) as usize;
        (0..self.lengths.len().saturating_sub(1)).rev().find_map(|rung| {
            let results = &self.rungs[rung];
            results[..results.len() / divisor]
                .iter()
                .find(|(_, trial)| !self.promoted[rung].contains(trial))
                .map(|&(_, trial)| (trial, rung as u32))
        })
    }

    /// Trial `trial`'s parameters: a grid point, or a draw from the space by a generator whose
    /// stream is the trial's number, so a trial's values depend on the seed and its number only.
    fn params_of(&self, trial: u32) -> Params {
        if self.spec.method == Method::Grid {
            let mut index = trial as u64;
            let mut params = Params::new();
            for (name, dimension) in &self.space {
                let points = dimension.grid_points().unwrap_or_default();
                let n = points.len().max(1) as u64;
                params.insert(name.clone(), points.get((index % n) as usize).cloned().unwrap_or_default());
                index /= n;
            }
            return params;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.spec.seed);
        rng.set_stream(trial as u64);
        self.space
            .iter()
            .map(|(name, dimension)| {
                let value = match dimension {
                    Dimension::Int { min, max, .. } => serde_json::Value::from(rng.random_range(*min..=*max)),
                    Dimension::Float { min, max, log, .. } => {
                        serde_json::Value::from(interpolate(*min, *max, *log, rng.random_range(0.0..=1.0)))
                    }
                    Dimension::Categorical { values } => values[rng.random_range(0..values.len())].clone(),
                };
                (name.clone(), value)
            })
            .collect()
    }

    /// Every run decided so far, in the order decided.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    pub fn trials(&self) -> &[TrialState] {
        &self.trials
    }

    /// Whether an outside searcher may still ask for a trial.
    pub fn takes_asks(&self) -> bool {
        self.spec.method == Method::Custom
            && self.ended.is_none()
            && !self.asking_done
            && (self.trials.len() as u64) < self.total_trials
    }

    /// The trials with a run under way.
    pub fn under_way(&self) -> impl Iterator<Item = u32> + '_ {
        self.under_way.iter().copied()
    }

    pub fn outcome(&self) -> Outcome {
        match &self.ended {
            Some(outcome) => outcome.clone(),
            None if self.paused || self.no_budget => Outcome::Paused,
            None => Outcome::Searching,
        }
    }

    pub fn best(&self) -> Option<Best> {
        self.rungs
            .iter()
            .enumerate()
            .rev()
            .find_map(|(rung, results)| results.first().map(|&(value, trial)| Best { trial, rung: rung as u32, value }))
    }

    pub fn goal(&self) -> Goal {
        self.spec.goal
    }

    pub fn rung_lengths(&self) -> &[u64] {
        &self.lengths
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(method: Method, trials: Option<u32>, concurrent: u32) -> SearcherSpec {
        SearcherSpec {
            method,
            metric: "loss".into(),
            goal: Goal::Minimize,
            max_length: 64,
            max_trials: trials,
            max_concurrent_trials: concurrent,
            divisor: 2,
            max_rungs: 3,
            seed: 7,
        }
    }

    fn space() -> Space {
        serde_json::from_value(serde_json::json!({
            "lr": {"type": "float", "min": 0.0001, "max": 0.1, "log": true},
            "batch_size": {"type": "categorical", "values": [16, 32, 64]},
        }))
        .unwrap()
    }

    /// Plays a search to its end, answering each run with `loss(trial, rung)` in the order the
    /// runs were decided; returns the events it stored.
    fn play(search: &mut Search, loss: impl Fn(u32, u32) -> f64) -> Vec<Event> {
        let mut events = Vec::new();
        let mut answered = 0;
        while answered < search.runs().len() {
            let Run { trial, rung, .. } = search.runs()[answered].clone();
            let event = Event::Reported { trial, rung, value: loss(trial, rung) };
            search.apply(&event).unwrap();
            events.push(event);
            answered += 1;
        }
        events
    }

    #[test]
    fn asha_promotes_the_best_half_and_resumes_them_to_the_top() {
        let mut search = Search::new(spec(Method::Asha, Some(8), 2), space());
        assert_eq!(search.runs().len(), 2, "two trials start at once");
        // Lower trial numbers are better; a rung's length is more training, so a lower loss.
        play(&mut search, |trial, rung| trial as f64 - rung as f64);
        assert_eq!(search.outcome(), Outcome::Completed);
        let rung_of = |r: u32| search.runs().iter().filter(|run| run.rung == r).count();
        assert_eq!(rung_of(0), 8);
        assert_eq!(rung_of(1), 4, "the best half of 8 reach rung 1");
        assert_eq!(rung_of(2), 2, "the best half of those reach the top");
        // A promoted run resumes the same trial with the same parameters, to a longer length.
        let first = &search.runs().iter().find(|r| r.trial == 0 && r.rung == 0).unwrap();
        let top = search.runs().iter().find(|r| r.trial == 0 && r.rung == 2).unwrap();
        assert_eq!((first.length, top.length), (16, 64));
        assert_eq!(first.params, top.params);
        assert_eq!(search.best(), Some(Best { trial: 0, rung: 2, value: -2.0 }));
    }

    #[test]
    fn a_promotion_comes_before_a_new_trial() {
        let mut search = Search::new(spec(Method::Asha, Some(8), 1), space());
        search.apply(&Event::Reported { trial: 0, rung: 0, value: 5.0 }).unwrap();
        search.apply(&Event::Reported { trial: 1, rung: 0, value: 1.0 }).unwrap();
        // Two results at rung 0: the best half (trial 1) goes on before trial 2 starts.
        assert_eq!(search.runs().last().map(|r| (r.trial, r.rung)), Some((1, 1)));
    }

    #[test]
    fn the_metric_never_reported_fails_the_search_with_its_reason() {
        let mut search = Search::new(spec(Method::Asha, Some(8), 2), space());
        let reason = "the engine never reported the metric `los` (it reported loss, lr)".to_string();
        search.apply(&Event::MetricMissing { trial: 0, rung: 0, reason: reason.clone() }).unwrap();
        assert_eq!(search.outcome(), Outcome::Failed { reason });
        let runs = search.runs().len();
        search.apply(&Event::Reported { trial: 1, rung: 0, value: 1.0 }).unwrap();
        assert_eq!(search.runs().len(), runs, "nothing new after the end");
    }

    #[test]
    fn paused_and_out_of_budget_searches_start_nothing() {
        let mut search = Search::new(spec(Method::Random, Some(5), 1), space());
        search.apply(&Event::Paused).unwrap();
        search.apply(&Event::Reported { trial: 0, rung: 0, value: 1.0 }).unwrap();
        assert_eq!((search.runs().len(), search.outcome()), (1, Outcome::Paused));
        search.apply(&Event::Resumed).unwrap();
        assert_eq!(search.runs().len(), 2);
        search.apply(&Event::BudgetReached).unwrap();
        search.apply(&Event::Reported { trial: 1, rung: 0, value: 0.5 }).unwrap();
        assert_eq!(search.outcome(), Outcome::Completed, "the budget ends the search once nothing runs");
        assert_eq!(search.best().map(|b| b.trial), Some(1));
    }

    #[test]
    fn a_report_for_no_run_is_refused() {
        let mut search = Search::new(spec(Method::Asha, Some(8), 2), space());
        assert!(search.apply(&Event::Reported { trial: 5, rung: 0, value: 1.0 }).is_err());
        search.apply(&Event::Reported { trial: 0, rung: 0, value: 1.0 }).unwrap();
        assert!(search.apply(&Event::Reported { trial: 0, rung: 0, value: 1.0 }).is_err(), "reported twice");
    }

    #[test]
    fn every_failed_trial_fails_the_search() {
        let mut search = Search::new(spec(Method::Random, Some(2), 2), space());
        for trial in 0..2 {
            search.apply(&Event::TrialFailed { trial, rung: 0, reason: "exit 1".into() }).unwrap();
        }
        assert_eq!(search.outcome(), Outcome::Failed { reason: "every trial failed".into() });
    }

    #[test]
    fn a_grid_runs_each_point_once() {
        let space: Space = serde_json::from_value(serde_json::json!({
            "a": {"type": "categorical", "values": [1, 2]}, "b": {"type": "int", "min": 0, "max": 2},
        }))
        .unwrap();
        let mut search = Search::new(spec(Method::Grid, None, 3), space);
        play(&mut search, |trial, _| trial as f64);
        let points: BTreeSet<String> =
            search.runs().iter().map(|r| serde_json::to_string(&r.params).unwrap()).collect();
        assert_eq!((search.runs().len(), points.len()), (6, 6));
    }

    #[test]
    fn a_custom_search_runs_what_it_is_asked() {
        let mut search = Search::new(spec(Method::Custom, Some(2), 2), Space::new());
        assert!(search.runs().is_empty());
        let params: Params = [("lr".to_string(), serde_json::json!(0.01))].into();
        search.apply(&Event::Asked { trial: 0, params: params.clone() }).unwrap();
        assert_eq!(search.runs()[0].params, params);
        assert!(search.apply(&Event::Asked { trial: 5, params }).is_err(), "trials are numbered in order");
        search.apply(&Event::AskingDone).unwrap();
        assert_eq!(search.outcome(), Outcome::Searching, "its run is under way");
        search.apply(&Event::Reported { trial: 0, rung: 0, value: 0.5 }).unwrap();
        assert_eq!(search.outcome(), Outcome::Completed);
    }

    #[test]
    fn a_preempted_run_is_counted_and_changes_no_decision() {
        let mut quiet = Search::new(spec(Method::Asha, Some(8), 2), space());
        let quiet_events = play(&mut quiet, |trial, rung| f64::from(trial) - f64::from(rung));
        // The same results, with every run preempted once before it reports (and a stray
        // preemption of a run not under way, which a racing writer may store).
        let mut preempted = Search::new(spec(Method::Asha, Some(8), 2), space());
        preempted.apply(&Event::Preempted { trial: 7, rung: 2 }).unwrap();
        for event in &quiet_events {
            if let Event::Reported { trial, rung, .. } = event {
                preempted.apply(&Event::Preempted { trial: *trial, rung: *rung }).unwrap();
                assert!(preempted.trials()[*trial as usize].failed.is_none(), "preempted is never failed");
            }
            preempted.apply(event).unwrap();
        }
        assert_eq!(preempted.runs(), quiet.runs());
        assert_eq!(preempted.outcome(), Outcome::Completed);
        let runs_of = |trial: u32| quiet.runs().iter().filter(|r| r.trial == trial).count() as u32;
        for t in preempted.trials() {
            assert_eq!(t.preemptions, runs_of(t.trial), "trial {}", t.trial);
        }
    }

    proptest! {
        /// The same seed and the same results give the same decisions, replayed from the stored
        /// events as after a crash; every decided trial keeps its parameters across rungs.
        #[test]
        fn replaying_the_events_decides_the_same(seed in 0u64..1000, losses in proptest::collection::vec(0.0f64..10.0, 64)) {
            let mut first = Search::new(SearcherSpec { seed, ..spec(Method::Asha, Some(12), 3) }, space());
            let events = play(&mut first, |trial, rung| losses[(trial as usize * 3 + rung as usize) % 64] - rung as f64);
            let mut replayed = Search::new(SearcherSpec { seed, ..spec(Method::Asha, Some(12), 3) }, space());
            for event in &events {
                replayed.apply(event).unwrap();
            }
            prop_assert_eq!(first.runs(), replayed.runs());
            prop_assert_eq!(first.outcome(), Outcome::Completed);
            for run in first.runs() {
                prop_assert_eq!(&run.params, &first.trials()[run.trial as usize].params);
            }
            // At most max_concurrent_trials under way at any point: checked by construction in
            // `decide`, and here by the number of runs the search started with.
            prop_assert!(first.runs().iter().filter(|r| r.rung == 0).count() == 12);
        }

        #[test]
        fn draws_stay_inside_the_space(seed in 0u64..10_000, trial in 0u32..10_000) {
            let search = Search::new(SearcherSpec { seed, ..spec(Method::Random, Some(1), 1) }, space());
            let params = search.params_of(trial);
            let lr = params["lr"].as_f64().unwrap();
            prop_assert!((0.0001..=0.1).contains(&lr));
            prop_assert!([16, 32, 64].contains(&params["batch_size"].as_i64().unwrap()));
        }
    }
}
