//! Expected run times, and what each assumes: the median of recent runs of the same kind of job
//! when there are enough of them, else what the job or its template declares, else the
//! platform's default. Estimates are only as good as these guesses, so every estimate says which
//! one it used ("assuming 12 min, the median of the last 9 runs of pytorch-ddp by the same
//! user").
//!
//! "The same kind": the same template (or, for a job without one, the same job name) in the
//! same tenant, with the same shape (replicas x GPUs per replica): a 1-GPU smoke test and an
//! 8-GPU run of one template are not one class. The same user's runs come first, as Slurm
//! users' own history is the best predictor of their next job (Tsafrir et al., "Backfilling
//! using system-generated predictions rather than user runtime estimates", 2007: the average of
//! a user's last two jobs beat user estimates); a median rather than their mean, because one
//! run that hung until its time limit should not move the guess much.

use std::fmt;

/// Runs of a class needed before their median is trusted over a declared run time.
pub const MIN_RUNS: usize = 3;

/// Recent runs of a class taken into the median at most (the newest).
pub const RECENT_RUNS: usize = 20;

/// A guess of a job's run time, with where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeGuess {
    pub seconds: i64,
    pub basis: RuntimeBasis,
}

/// Where a [`RuntimeGuess`] comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeBasis {
    /// The median of the user's own last `runs` runs of `class`.
    UserHistory { runs: usize, class: String },
    /// The median of the tenant's last `runs` runs of `class` (the user has too few).
    TenantHistory { runs: usize, class: String },
    /// The job's time limit: it cannot run longer.
    TimeLimit,
    /// The run time the job's template declares.
    TemplateDefault { template: String },
    /// Nothing is known: the platform's default.
    PlatformDefault,
}

/// What is known of a job for guessing its run time.
#[derive(Debug, Clone, Default)]
pub struct RuntimeFacts<'a> {
    /// How the class is named in the guess's text: "pytorch-ddp on 1 x 1 GPU".
    pub class: &'a str,
    /// Run times in seconds of the user's recent successful runs of the class, newest first.
    pub user_runs: &'a [i64],
    /// The same for the whole tenant (the user's included), newest first.
    pub tenant_runs: &'a [i64],
    pub time_limit: Option<i64>,
    /// The template's name and its declared run time, for a job of a template that declares one.
    pub template_default: Option<(&'a str, i64)>,
}

/// The best guess of a job's run time from what is known of it. History comes first when it
/// has [`MIN_RUNS`] runs (the user's, else the tenant's), never beyond the job's time limit;
/// then the time limit, the template's declared run time, the platform's default.
pub fn guess_runtime(facts: &RuntimeFacts<'_>, platform_default: i64) -> RuntimeGuess {
    let capped = |median: i64| facts.time_limit.map_or(median, |limit| median.min(limit));
    if let Some(median) = median_of_recent(facts.user_runs) {
        let runs = facts.user_runs.len().min(RECENT_RUNS);
        return RuntimeGuess {
            seconds: capped(median),
            basis: RuntimeBasis::UserHistory { runs, class: facts.class.to_string() },
        };
    }
    if let Some(median) = median_of_recent(facts.tenant_runs) {
        let runs = facts.tenant_runs.len().min(RECENT_RUNS);
        return RuntimeGuess {
            seconds: capped(median),
            basis: RuntimeBasis::TenantHistory { runs, class: facts.class.to_string() },
        };
    }
    if let Some(limit) = facts.time_limit {
        return RuntimeGuess { seconds: limit, basis: RuntimeBasis::TimeLimit };
    }
    if let Some((template, seconds)) = facts.template_default {
        return RuntimeGuess { seconds, basis: RuntimeBasis::TemplateDefault { template: template.to_string() } };
    }
    RuntimeGuess { seconds: platform_default, basis: RuntimeBasis::PlatformDefault }
}

/// The median of the newest [`RECENT_RUNS`] of `runs` (newest first), when there are at least
/// [`MIN_RUNS`]; of an even count, the lower middle one (a run time that happened).
pub fn median_of_recent(runs: &[i64]) -> Option<i64> {
    if runs.len() < MIN_RUNS {
        return None;
    }
    let mut recent: Vec<i64> = runs.iter().take(RECENT_RUNS).copied().collect();
    recent.sort_unstable();
    Some(recent[(recent.len() - 1) / 2])
}

/// "12 min", "1h 30 min", "45 s": a run time as people say it.
pub fn human_duration(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        s if s < 90 => format!("{s} s"),
        s if s < 3600 => format!("{} min", (s + 30) / 60),
        s => {
            let minutes = (s + 30) / 60;
            match minutes % 60 {
                0 => format!("{}h", minutes / 60),
                m => format!("{}h {m} min", minutes / 60),
            }
        }
    }
}

/// "assuming 12 min, the median of the last 9 runs of pytorch-ddp on 1 x 1 GPU by the same user"
impl fmt::Display for RuntimeGuess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "assuming {}, ", human_duration(self.seconds))?;
        match &self.basis {
            RuntimeBasis::UserHistory { runs, class } => {
                write!(f, "the median of the last {runs} runs of {class} by the same user")
            }
            RuntimeBasis::TenantHistory { runs, class } => {
                write!(f, "the median of the tenant's last {runs} runs of {class}")
            }
            RuntimeBasis::TimeLimit => write!(f, "the job's time limit"),
            RuntimeBasis::TemplateDefault { template } => write!(f, "the default of the template {template}"),
            RuntimeBasis::PlatformDefault => write!(f, "the platform's default (no history, no declared run time)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3600;

    fn facts<'a>(user: &'a [i64], tenant: &'a [i64]) -> RuntimeFacts<'a> {
        RuntimeFacts { class: "pytorch-ddp on 1 x 1 GPU", user_runs: user, tenant_runs: tenant, ..Default::default() }
    }

    #[test]
    fn the_users_own_history_comes_first_then_the_tenants() {
        let user = [700, 720, 740];
        let tenant = [100, 100, 100, 100, 700, 720, 740];
        let guess = guess_runtime(&facts(&user, &tenant), HOUR);
        assert_eq!(guess.seconds, 720);
        assert_eq!(
            guess.to_string(),
            "assuming 12 min, the median of the last 3 runs of pytorch-ddp on 1 x 1 GPU by the same user"
        );
        // Two runs of the user's are too few: the tenant's seven decide.
        let guess = guess_runtime(&facts(&user[..2], &tenant), HOUR);
        assert_eq!(guess.seconds, 100);
        assert!(guess.to_string().contains("the tenant's last 7 runs"), "{guess}");
    }

    #[test]
    fn a_median_ignores_one_run_that_hung() {
        assert_eq!(median_of_recent(&[600, 610, 86_400, 590, 605]), Some(605));
        // Even counts take the lower middle run.
        assert_eq!(median_of_recent(&[10, 20, 30, 40]), Some(20));
        assert_eq!(median_of_recent(&[10, 20]), None);
        // Only the newest runs count: a class that got faster is guessed fast.
        let mut runs = vec![60; RECENT_RUNS];
        runs.extend([HOUR; 30]);
        assert_eq!(median_of_recent(&runs), Some(60));
    }

    #[test]
    fn history_never_goes_beyond_the_time_limit() {
        let runs = [HOUR, HOUR, HOUR];
        let guess = guess_runtime(&RuntimeFacts { time_limit: Some(600), ..facts(&runs, &runs) }, HOUR);
        assert_eq!(guess.seconds, 600);
        assert!(matches!(guess.basis, RuntimeBasis::UserHistory { runs: 3, .. }));
    }

    #[test]
    fn without_history_the_declared_run_time_then_the_default() {
        let limit =
            RuntimeFacts { time_limit: Some(1800), template_default: Some(("pytorch-ddp", 900)), ..facts(&[], &[]) };
        assert_eq!(guess_runtime(&limit, HOUR).to_string(), "assuming 30 min, the job's time limit");
        let template = RuntimeFacts { template_default: Some(("pytorch-ddp", HOUR)), ..facts(&[], &[]) };
        assert_eq!(guess_runtime(&template, HOUR).to_string(), "assuming 1h, the default of the template pytorch-ddp");
        let nothing = guess_runtime(&facts(&[], &[]), HOUR);
        assert_eq!(nothing, RuntimeGuess { seconds: HOUR, basis: RuntimeBasis::PlatformDefault });
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(45), "45 s");
        assert_eq!(human_duration(12 * 60 + 10), "12 min");
        assert_eq!(human_duration(HOUR), "1h");
        assert_eq!(human_duration(HOUR + 30 * 60), "1h 30 min");
        assert_eq!(human_duration(-5), "0 s");
    }
}
