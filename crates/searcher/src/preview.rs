//! What a search costs at most, before it starts: the rung ladder and the training steps.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::spec::{Method, SearcherSpec, Space};

/// One rung of the ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RungPlan {
    pub rung: u32,
    /// The step a run stops at.
    pub length: u64,
    /// Trials that reach this rung when results come in no particular order: the best
    /// `1/divisor` of the rung below (what synchronous successive halving promotes).
    pub trials: u64,
    /// Trials that can reach it at most: asynchronous promotion cannot be taken back, so when
    /// later trials keep beating earlier ones, up to `n - divisor + 1` of a rung's `n` go on.
    pub trials_at_most: u64,
}

/// What a search does when no trial fails: typically, and at most.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Ladder {
    pub rungs: Vec<RungPlan>,
    pub trials: u64,
    /// Training steps of every run together, typically (a resumed run trains only from its
    /// checkpoint on).
    pub steps: u64,
    /// The same when every promotion asynchronous halving can make happens.
    pub steps_at_most: u64,
}

/// The ladder of `spec` over `space`. Of the `n` trials that reach a rung, asynchronous
/// successive halving promotes the best `floor(n / divisor)` once all have reported, and more
/// when early promotions were later beaten: each result promotes at most one trial, and none
/// before `divisor` results are in, so at most `n - divisor + 1`.
pub fn ladder(spec: &SearcherSpec, space: &Space) -> Ladder {
    let trials = spec.trials(space);
    let asha = spec.method == Method::Asha;
    let divisor = if asha { spec.divisor.max(2) as u64 } else { 1 };
    let mut rungs = Vec::new();
    let (mut typical, mut most, mut before, mut steps, mut steps_at_most) = (trials, trials, 0u64, 0u64, 0u64);
    for (rung, length) in spec.rung_lengths().into_iter().enumerate() {
        if rung > 0 {
            typical /= divisor;
            most = (most + 1).saturating_sub(divisor);
        }
        steps = steps.saturating_add(typical.saturating_mul(length - before));
        steps_at_most = steps_at_most.saturating_add(most.saturating_mul(length - before));
        rungs.push(RungPlan { rung: rung as u32, length, trials: typical, trials_at_most: most });
        before = length;
    }
    Ladder { rungs, trials, steps, steps_at_most }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_of_a_halving_search() {
        let spec: SearcherSpec = serde_json::from_value(serde_json::json!({
            "metric": "loss", "max_length": 64, "max_trials": 8, "divisor": 2, "max_rungs": 3,
        }))
        .unwrap();
        let ladder = ladder(&spec, &Space::new());
        let trials: Vec<u64> = ladder.rungs.iter().map(|r| r.trials).collect();
        assert_eq!(trials, vec![8, 4, 2]);
        // 8 x 16 steps, then 4 resumed for 16 more, then 2 for 32 more.
        assert_eq!(ladder.steps, 128 + 64 + 64);
        let most: Vec<u64> = ladder.rungs.iter().map(|r| r.trials_at_most).collect();
        assert_eq!(most, vec![8, 7, 6]);
        assert_eq!(ladder.steps_at_most, 128 + 7 * 16 + 6 * 32);
    }

    /// The bound holds for the searcher itself: results that keep getting better promote the
    /// most a rung can.
    #[test]
    fn results_that_keep_improving_promote_the_most_the_ladder_allows() {
        use crate::machine::{Event, Search};
        let spec: SearcherSpec = serde_json::from_value(serde_json::json!({
            "metric": "loss", "max_length": 64, "max_trials": 8, "divisor": 2, "max_rungs": 2,
            "max_concurrent_trials": 1,
        }))
        .unwrap();
        let mut search = Search::new(spec.clone(), Space::new());
        let mut answered = 0;
        while answered < search.runs().len() {
            let run = search.runs()[answered].clone();
            // Each new trial is better than every earlier one; top-rung runs as well.
            let value = 100.0 - run.trial as f64 - 10.0 * run.rung as f64;
            search.apply(&Event::Reported { trial: run.trial, rung: run.rung, value }).unwrap();
            answered += 1;
        }
        let promoted = search.runs().iter().filter(|r| r.rung == 1).count() as u64;
        assert_eq!(promoted, ladder(&spec, &Space::new()).rungs[1].trials_at_most);
    }
}
