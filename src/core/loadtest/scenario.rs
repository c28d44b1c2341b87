//! Who the application's requests are for, and what they do: the skewed
//! tenant population and the named scenarios, as data.
//!
//! A load test that spreads its requests evenly over random keys proves
//! nothing: real traffic is skewed, and the skew is what throttles. The
//! reference articles' load-test chapter gives the population (70 % normal
//! tenants, 20 % large, 9 % enterprise, 1 % one pathological hot tenant)
//! and the scenarios to run. Each scenario here is a [`Scenario`]: which
//! tenants a request picks, which period (day) it lands on, whether it
//! writes a new item or one of a few existing ones, and its share of reads.
//! None has a code path of its own; the generator ([`super::Generator`])
//! reads the data.

/// A class of tenants: how many of the 100, and how heavily each one
/// writes and reads relative to a normal tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Class {
    pub name: &'static str,
    pub tenants: u32,
    pub weight: u32,
}

/// 100 tenants, 70 / 20 / 9 / 1, each class far heavier per tenant than the
/// one before: the one pathological tenant makes about half the traffic
/// (400 of 795 weight units), enterprise tenants a quarter.
pub(crate) const CLASSES: [Class; 4] = [
    Class {
        name: "normal",
        tenants: 70,
        weight: 1,
    },
    Class {
        name: "large",
        tenants: 20,
        weight: 5,
    },
    Class {
        name: "enterprise",
        tenants: 9,
        weight: 25,
    },
    Class {
        name: "pathological",
        tenants: 1,
        weight: 400,
    },
];

/// Which tenant a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tenants {
    /// By [`CLASSES`]' weights.
    Skewed,
    /// Always the pathological tenant (one case everyone opens).
    Hot,
    /// Every tenant alike (a poll each tenant makes, a backfill's sweep).
    Uniform,
}

/// Which period (day) a request's key is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Periods {
    /// The last three days, most of it today (1 : 2 : 7).
    Recent,
    /// Today only.
    Today,
    /// The last 30 days alike (a replay, a backfill).
    Spread,
}

/// Which item a write writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Items {
    /// A new item every write.
    New,
    /// One of this many items per key, written again and again.
    Pool(u32),
}

/// A named workload: key choice and read/write mix.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Share of requests that read (0 to 1); the rest write.
    pub reads: f64,
    pub tenants: Tenants,
    pub periods: Periods,
    pub items: Items,
}

/// The scenario without `--preset`: the skewed population, recent days,
/// new items, a fifth of requests reading.
pub(crate) const DEFAULT: Scenario = Scenario {
    name: "skewed",
    about: "the skewed population (70/20/9/1 tenants), most requests on today's keys",
    reads: 0.2,
    tenants: Tenants::Skewed,
    periods: Periods::Recent,
    items: Items::New,
};

/// The reference articles' scenarios (one per `--preset`), and the default.
pub(crate) const PRESETS: [Scenario; 9] = [
    DEFAULT,
    Scenario {
        name: "hot-case",
        about: "everyone opens the same high-profile case: the hot tenant's key, read, a few edits",
        reads: 0.95,
        tenants: Tenants::Hot,
        periods: Periods::Today,
        items: Items::Pool(50),
    },
    Scenario {
        name: "bulk-upload",
        about: "a bulk evidence upload to one case: new items, all on the hot tenant's key",
        reads: 0.0,
        tenants: Tenants::Hot,
        periods: Periods::Today,
        items: Items::New,
    },
    Scenario {
        name: "deadline-scheduler",
        about: "the daily deadline scheduler writes every tenant's due items for today",
        reads: 0.0,
        tenants: Tenants::Skewed,
        periods: Periods::Today,
        items: Items::New,
    },
    Scenario {
        name: "status-churn",
        about: "open tasks change status again and again (a status GSI's churn)",
        reads: 0.1,
        tenants: Tenants::Skewed,
        periods: Periods::Recent,
        items: Items::Pool(20),
    },
    Scenario {
        name: "dashboard",
        about: "each tenant's dashboard reads its today key every 5 s (--rate: all polls per second)",
        reads: 1.0,
        tenants: Tenants::Uniform,
        periods: Periods::Today,
        items: Items::New,
    },
    Scenario {
        name: "replay",
        about: "old events replayed into projections: new items over the last 30 days",
        reads: 0.0,
        tenants: Tenants::Skewed,
        periods: Periods::Spread,
        items: Items::New,
    },
    Scenario {
        name: "lambda-spike",
        about: "a Lambda concurrency spike writing the same few keys of the hot tenant",
        reads: 0.0,
        tenants: Tenants::Hot,
        periods: Periods::Today,
        items: Items::Pool(10),
    },
    Scenario {
        name: "gsi-backfill",
        about: "a backfill adding a GSI attribute: every tenant's items of 30 days rewritten alike",
        reads: 0.0,
        tenants: Tenants::Uniform,
        periods: Periods::Spread,
        items: Items::Pool(1_000),
    },
];

/// The preset called `name`.
pub(crate) fn preset(name: &str) -> Option<Scenario> {
    PRESETS.iter().find(|s| s.name == name).copied()
}

/// The days a period is drawn from, with their weights; the last is today.
/// Fixed dates: core has no clock, and a test's keys must not depend on one.
pub(crate) fn days(periods: Periods) -> Vec<(String, u32)> {
    let day = |n: u32| -> String {
        // 30 days ending 2026-07-07: June's 8th to 30th, then July's 1st to 7th.
        if n < 23 {
            format!("2026-06-{:02}", n + 8)
        } else {
            format!("2026-07-{:02}", n - 22)
        }
    };
    match periods {
        Periods::Recent => vec![(day(27), 1), (day(28), 2), (day(29), 7)],
        Periods::Today => vec![(day(29), 1)],
        Periods::Spread => (0..30).map(|n| (day(n), 1)).collect(),
    }
}

/// SplitMix64: a fixed, dependency-free sequence, so a seed names a run.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn by `weights` (not all zero).
    pub(crate) fn pick(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut r = self.next() % total.max(1);
        for (i, &w) in weights.iter().enumerate() {
            if r < u64::from(w) {
                return i;
            }
            r -= u64::from(w);
        }
        weights.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_found_by_its_name_and_names_are_unique() {
        let names: std::collections::BTreeSet<_> = PRESETS.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), PRESETS.len());
        for s in PRESETS {
            assert_eq!(preset(s.name), Some(s));
            assert!((0.0..=1.0).contains(&s.reads), "{}", s.name);
        }
        assert_eq!(preset("skewed"), Some(DEFAULT));
        assert_eq!(preset("nope"), None);
    }

    #[test]
    fn the_population_is_70_20_9_1() {
        let tenants: Vec<u32> = CLASSES.iter().map(|c| c.tenants).collect();
        assert_eq!(tenants, [70, 20, 9, 1]);
    }

    #[test]
    fn periods_end_today_and_spread_covers_30_distinct_days() {
        for p in [Periods::Recent, Periods::Today, Periods::Spread] {
            assert_eq!(days(p).last().unwrap().0, "2026-07-07");
        }
        let spread = days(Periods::Spread);
        let distinct: std::collections::BTreeSet<_> = spread.iter().map(|d| &d.0).collect();
        assert_eq!(distinct.len(), 30);
        assert_eq!(spread[0].0, "2026-06-08");
        assert!(distinct.iter().all(|d| d.len() == 10));
    }

    #[test]
    fn pick_follows_the_weights() {
        let mut rng = Rng(7);
        let mut counts = [0u32; 3];
        for _ in 0..100_000 {
            counts[rng.pick(&[1, 2, 7])] += 1;
        }
        for (c, w) in counts.iter().zip([1.0, 2.0, 7.0]) {
            let share = f64::from(*c) / 100_000.0;
            assert!((share - w / 10.0).abs() < 0.01, "{counts:?}");
        }
        assert!((0..1000).all(|_| (0.0..1.0).contains(&rng.unit())));
    }
}
