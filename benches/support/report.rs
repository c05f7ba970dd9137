//! The percentile line the process benches print (`benches/cluster.rs`, `benches/datacenters.rs`).

use std::time::Duration;

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints `name`'s p50, p99, min and max of `v` (sorted here), padded to `width`, counting the
/// samples as `what` (trials, samples).
pub(crate) fn report(name: &str, width: usize, what: &str, mut v: Vec<Duration>) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "  {name:<width$} p50 {:>8.1} ms   p99 {:>8.1} ms   (min {:.1}, max {:.1}, {} {what})",
        ms(p(0.5)),
        ms(p(0.99)),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    );
}
