//! What a load test against AWS will cost, before it runs: the request
//! units its requests consume at on-demand prices.
//!
//! An estimate, said as one: items the generator writes are under 1 KB (one
//! write unit, and one more per GSI of the new design that holds them), a
//! read is an eventually consistent Query page under 4 KB (half a read unit)
//! on each partition key it reads. Prices are us-east-1's on-demand ones;
//! other regions differ by a few tens of per cent.

use serde::Serialize;

/// US dollars per million write request units, on-demand, us-east-1.
pub(crate) const WRITE_PRICE_PER_MILLION: f64 = 0.625;
/// US dollars per million read request units, on-demand, us-east-1.
pub(crate) const READ_PRICE_PER_MILLION: f64 = 0.125;

/// One design's traffic, as the run will make it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Traffic {
    /// Requests per second, for `seconds`.
    pub rate: f64,
    pub seconds: f64,
    /// Share of requests that read.
    pub reads: f64,
    /// Partition keys one read queries (the new design's fan-out).
    pub keys_per_read: usize,
    /// Tables written per write: the base table and its GSIs.
    pub tables_per_write: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Estimate {
    pub write_units: f64,
    pub read_units: f64,
    pub dollars: f64,
}

/// The estimate for every design's traffic together.
pub(crate) fn estimate(designs: &[Traffic]) -> Estimate {
    let mut e = Estimate::default();
    for t in designs {
        let requests = t.rate * t.seconds;
        e.write_units += requests * (1.0 - t.reads) * t.tables_per_write as f64;
        e.read_units += requests * t.reads * t.keys_per_read as f64 * 0.5;
    }
    e.dollars =
        (e.write_units * WRITE_PRICE_PER_MILLION + e.read_units * READ_PRICE_PER_MILLION) / 1e6;
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_at_1000_per_second_costs_cents() {
        let old = Traffic {
            rate: 1000.0,
            seconds: 60.0,
            reads: 0.2,
            keys_per_read: 1,
            tables_per_write: 1,
        };
        let new = Traffic {
            keys_per_read: 16,
            tables_per_write: 2,
            ..old
        };
        let e = estimate(&[old, new]);
        assert_eq!(e.write_units, 48_000.0 + 96_000.0);
        assert_eq!(e.read_units, 6_000.0 + 96_000.0);
        let want = (144_000.0 * 0.625 + 102_000.0 * 0.125) / 1e6;
        assert!((e.dollars - want).abs() < 1e-12, "{e:?}");
        assert_eq!(estimate(&[]), Estimate::default());
    }
}
