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
    /// Trials that reach this rung at most.
    pub trials: u64,
}

/// The most a search does: no trial fails and every promotion happens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Ladder {
    pub rungs: Vec<RungPlan>,
    pub trials: u64,
    /// Training steps of every run together (a resumed run trains only from its checkpoint on).
    pub steps_at_most: u64,
}

/// The ladder of `spec` over `space`. Asynchronous successive halving promotes at most
/// `floor(n / divisor)` of the `n` trials that reach a rung, however the results arrive.
pub fn ladder(spec: &SearcherSpec, space: &Space) -> Ladder {
    let trials = spec.trials(space);
    let divisor = if spec.method == Method::Asha { spec.divisor.max(2) as u64 } else { 1 };
    let mut rungs = Vec::new();
    let (mut reaching, mut before, mut steps) = (trials, 0u64, 0u64);
    for (rung, length) in spec.rung_lengths().into_iter().enumerate() {
        if rung > 0 {
            reaching /= divisor;
        }
        steps = steps.saturating_add(reaching.saturating_mul(length - before));
        rungs.push(RungPlan { rung: rung as u32, length, trials: reaching });
        before = length;
    }
    Ladder { rungs, trials, steps_at_most: steps }
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
        assert_eq!(ladder.steps_at_most, 128 + 64 + 64);
    }
}
