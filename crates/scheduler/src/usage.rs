//! Usage over time: resources held by attempts, clipped to a window, bucketed for charts, and
//! decayed by age (Slurm's fair-share usage, where an hour one half-life ago counts half).
//!
//! Pure: times are seconds on any one clock (the caller uses Unix time). The usage report
//! (`yard usage`) uses these, and so could a fair-share order that weighs recent use.

/// One attempt's hold on a resource: `amount` units (GPUs, cores) from `start` to `end`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hold {
    pub amount: f64,
    pub start: f64,
    pub end: f64,
}

/// Seconds of `[start, end)` inside `[from, to)`; zero when they do not overlap.
pub fn overlap_seconds(start: f64, end: f64, from: f64, to: f64) -> f64 {
    (end.min(to) - start.max(from)).max(0.0)
}

/// Unit-hours of a hold inside the window `[from, to)`.
pub fn held_hours(hold: &Hold, from: f64, to: f64) -> f64 {
    hold.amount * overlap_seconds(hold.start, hold.end, from, to) / 3600.0
}

/// Unit-hours of a hold in each of `buckets` consecutive buckets of `bucket_seconds`, the first
/// starting at `from`.
pub fn bucketed_hours(hold: &Hold, from: f64, bucket_seconds: f64, buckets: usize) -> Vec<f64> {
    (0..buckets)
        .map(|i| {
            let start = from + i as f64 * bucket_seconds;
            held_hours(hold, start, start + bucket_seconds)
        })
        .collect()
}

/// Unit-hours of a hold decayed by age at `now`: each moment `t` of it weighs
/// `2^(-(now - t) / half_life)`, so usage one half-life old counts half. The integral in closed
/// form: `amount * h / ln 2 * (2^(-(now - end) / h) - 2^(-(now - start) / h))`, in hours. The part
/// of a hold after `now` is not counted.
pub fn decayed_hours(hold: &Hold, now: f64, half_life_seconds: f64) -> f64 {
    let end = hold.end.min(now);
    if end <= hold.start || half_life_seconds <= 0.0 {
        return 0.0;
    }
    let weight = |t: f64| (-(now - t) / half_life_seconds).exp2();
    hold.amount * half_life_seconds / std::f64::consts::LN_2 * (weight(end) - weight(hold.start)) / 3600.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: f64 = 3600.0;

    fn hold(amount: f64, start: f64, end: f64) -> Hold {
        Hold { amount, start, end }
    }

    #[test]
    fn a_hold_is_clipped_to_the_window() {
        let h = hold(4.0, 0.0, 10.0 * HOUR);
        assert_eq!(held_hours(&h, 0.0, 10.0 * HOUR), 40.0);
        assert_eq!(held_hours(&h, 2.0 * HOUR, 5.0 * HOUR), 12.0);
        assert_eq!(held_hours(&h, -5.0 * HOUR, 1.0 * HOUR), 4.0);
        assert_eq!(held_hours(&h, 10.0 * HOUR, 20.0 * HOUR), 0.0);
        assert_eq!(held_hours(&h, 20.0 * HOUR, 30.0 * HOUR), 0.0);
    }

    #[test]
    fn buckets_add_up_to_the_window() {
        let h = hold(2.0, 0.5 * HOUR, 3.25 * HOUR);
        let buckets = bucketed_hours(&h, 0.0, HOUR, 4);
        assert_eq!(buckets, vec![1.0, 2.0, 2.0, 0.5]);
        assert_eq!(buckets.iter().sum::<f64>(), held_hours(&h, 0.0, 4.0 * HOUR));
    }

    #[test]
    fn usage_one_half_life_old_counts_half() {
        let half_life = 7.0 * 24.0 * HOUR; // Slurm's default
        let now = 100.0 * 24.0 * HOUR;
        // A short hold, exactly one half-life before now, weighs about one half.
        let old = hold(1.0, now - half_life, now - half_life + 60.0);
        let fresh = hold(1.0, now - 60.0, now);
        let ratio = decayed_hours(&old, now, half_life) / decayed_hours(&fresh, now, half_life);
        assert!((ratio - 0.5).abs() < 1e-3, "{ratio}");
        // Two half-lives: a quarter.
        let older = hold(1.0, now - 2.0 * half_life, now - 2.0 * half_life + 60.0);
        let ratio = decayed_hours(&older, now, half_life) / decayed_hours(&fresh, now, half_life);
        assert!((ratio - 0.25).abs() < 1e-3, "{ratio}");
    }

    #[test]
    fn decay_integrates_to_the_undecayed_hours_for_a_long_half_life() {
        let h = hold(3.0, 0.0, 2.0 * HOUR);
        let decayed = decayed_hours(&h, 2.0 * HOUR, 1e12);
        assert!((decayed - 6.0).abs() < 1e-6, "{decayed}");
        // The part after now does not count yet.
        assert!((decayed_hours(&h, HOUR, 1e12) - 3.0).abs() < 1e-6);
        assert_eq!(decayed_hours(&h, -1.0, HOUR), 0.0);
    }
}
