//! The one backoff: how long to wait before the next try after failures in a row.
//!
//! `initial × factor^(failures-1)`, the growth capped at `max` (a first wait above `max` stays
//! as it is), then shortened by up to `jitter` (a fraction, drawn from the caller's generator)
//! so that many failing keys do not retry in lockstep. Without jitter the waits are exact (no
//! floating point on the way for a whole factor): the replication tests and the seeded
//! election simulation compare exact times.
//!
//! Its users, each with its own numbers:
//! - the driver's per-key retries ([`Backoff::default`]: 1 s doubling to 5 min, a quarter of
//!   jitter);
//! - replication: a follower's next fetch of the leader's schedule (100 ms doubling to 5 s), a
//!   late parent's next try (500 ms doubling, given up after a few tries);
//! - the Kubernetes pod watch reopened after a failure (`watch_retry` doubling to the refresh
//!   interval, reset when a watch ends cleanly);
//! - the graph executor's NATS connection and build file writes ([`Backoff::fixed`], 1 s).

use std::time::Duration;

use rand::Rng;

/// See the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The waits grow up to this.
    pub max: Duration,
    /// Each failure in a row multiplies the wait by this.
    pub factor: f64,
    /// The largest fraction a wait is shortened by at random (0: none).
    pub jitter: f64,
}

impl Default for Backoff {
    /// The driver's: a key that fails is retried after 1 s, 2 s, 4 s, ... at most 5 minutes
    /// apart, each wait shortened by up to a quarter.
    fn default() -> Self {
        Backoff {
            // A first retry within a second keeps a transient failure short.
            initial: Duration::from_secs(1),
            // Five minutes bounds the wait for a fix that needs no new event to be seen.
            max: Duration::from_secs(300),
            factor: 2.0,
            jitter: 0.25,
        }
    }
}

impl Backoff {
    /// Waits doubling from `initial` up to `max`, without jitter.
    pub const fn doubling(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            factor: 2.0,
            jitter: 0.0,
        }
    }

    /// The same wait after every failure.
    pub const fn fixed(wait: Duration) -> Backoff {
        Backoff {
            initial: wait,
            max: wait,
            factor: 1.0,
            jitter: 0.0,
        }
    }

    /// The wait before the try that follows `failures` failures in a row (1 after the first;
    /// 0 counts as 1), before jitter: all of it for a backoff without jitter.
    pub fn nominal(&self, failures: u32) -> Duration {
        let steps = failures.saturating_sub(1);
        if steps == 0 {
            return self.initial;
        }
        let grown = if self.factor.fract() == 0.0 && (1.0..=u32::MAX as f64).contains(&self.factor)
        {
            // A whole factor: exact, saturating past the cap.
            (self.factor as u32)
                .checked_pow(steps)
                .and_then(|times| self.initial.checked_mul(times))
                .unwrap_or(Duration::MAX)
        } else {
            let exp = self.factor.powi(steps.min(64) as i32);
            Duration::try_from_secs_f64(self.initial.as_secs_f64() * exp).unwrap_or(Duration::MAX)
        };
        grown.min(self.max)
    }

    /// The wait before the try that follows `failures` failures in a row, shortened at random
    /// by up to `jitter` (`rng` is drawn from only when there is jitter).
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let nominal = self.nominal(failures);
        if self.jitter > 0.0 {
            let cut = rng.random::<f64>() * self.jitter;
            Duration::from_secs_f64(nominal.as_secs_f64() * (1.0 - cut))
        } else {
            nominal
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_drivers_waits_double_from_a_second_to_five_minutes() {
        let exact = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        let waits: Vec<u64> = (1..=11).map(|n| exact.nominal(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(exact.delay(4, &mut rng), Duration::from_secs(8));
        assert_eq!(exact.nominal(0), Duration::from_secs(1));
        assert_eq!(exact.nominal(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_shortens_by_up_to_its_fraction_the_same_for_the_same_seed() {
        let backoff = Backoff::default();
        let draw = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (1..30)
                .map(|n| backoff.delay(n, &mut rng))
                .collect::<Vec<_>>()
        };
        let waits = draw(5);
        assert_eq!(waits, draw(5), "reproducible from the seed");
        for (n, wait) in (1..30).zip(&waits) {
            let full = backoff.nominal(n);
            assert!(*wait <= full && wait.as_secs_f64() >= full.as_secs_f64() * 0.75 - 1e-9);
        }
        assert!(waits.iter().zip(1..).any(|(w, n)| *w < backoff.nominal(n)));
    }

    /// The numbers the replication machine waited by before (its own formulas), kept.
    #[test]
    fn replications_follow_and_late_parent_waits() {
        let follow = Backoff::doubling(ms(100), Duration::from_secs(5));
        for failures in 0..40u32 {
            let before = (ms(100) * (1 << (failures.clamp(1, 7) - 1))).min(Duration::from_secs(5));
            assert_eq!(follow.nominal(failures), before, "{failures}");
        }
        let late = Backoff::doubling(ms(500), ms(500).saturating_mul(256));
        for tries in 1..40u32 {
            let before = ms(500) * (1 << (tries - 1).min(8));
            assert_eq!(late.nominal(tries), before, "{tries}");
        }
    }

    /// The pod watch waited `watch_retry` after a first failure and doubled it up to the
    /// interval after each further one; a first wait over the interval stayed as it was.
    #[test]
    fn the_watchs_waits_double_up_to_the_interval() {
        for (first, interval) in [
            (ms(1000), ms(10_000)),
            (ms(20), ms(1000)),
            (ms(3000), ms(500)),
        ] {
            let backoff = Backoff::doubling(first, interval);
            let mut before = first;
            for failures in 1..40 {
                assert_eq!(backoff.nominal(failures), before, "{first:?} {failures}");
                before = (before * 2).min(interval);
            }
        }
    }

    #[test]
    fn a_fixed_wait_is_the_same_after_every_failure() {
        let fixed = Backoff::fixed(Duration::from_secs(1));
        let mut rng = SmallRng::seed_from_u64(1);
        for failures in [0, 1, 2, 64, u32::MAX] {
            assert_eq!(fixed.delay(failures, &mut rng), Duration::from_secs(1));
        }
    }

    #[test]
    fn a_fractional_factor_grows_by_floating_point() {
        let backoff = Backoff {
            factor: 1.5,
            ..Backoff::doubling(Duration::from_secs(2), Duration::from_secs(10))
        };
        let waits: Vec<f64> = (1..=6).map(|n| backoff.nominal(n).as_secs_f64()).collect();
        assert_eq!(waits, [2.0, 3.0, 4.5, 6.75, 10.0, 10.0]);
    }
}
