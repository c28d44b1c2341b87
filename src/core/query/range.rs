//! The sort-key range one partition key is read over, and the DynamoDB key
//! condition that fetches it.
//!
//! The reader's condition (`--sk-begins-with`, `--sk-between`) is a range;
//! a cursor narrows it to what comes after the position a page ended at.
//! DynamoDB allows a single condition on the sort key, so the range cannot
//! always be sent as it is (`begins_with` and `> x` together, or a strict
//! bound in a `BETWEEN`): [`SkRange::key_condition`] sends the tightest
//! condition DynamoDB takes, and the items it returns are checked with
//! [`SkRange::contains`] — one past the far end means the key is done.
//!
//! Sort keys are strings (`S`), compared as DynamoDB does: by UTF-8 bytes,
//! which is Rust's `str` order.

/// The reader's condition on the sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkCondition {
    Any,
    BeginsWith(String),
    /// Both ends included, as DynamoDB's `BETWEEN`.
    Between(String, String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Ascending,
    Descending,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::Ascending => "asc",
            Order::Descending => "desc",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    pub value: String,
    pub inclusive: bool,
}

/// A set of sort keys: between the bounds and starting with the prefix.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SkRange {
    pub lower: Option<Bound>,
    pub upper: Option<Bound>,
    pub prefix: Option<String>,
}

/// One DynamoDB condition on the sort key (`None`: the whole partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyCondition {
    None,
    BeginsWith(String),
    Between(String, String),
    Gt(String),
    Ge(String),
    Lt(String),
    Le(String),
}

impl SkRange {
    pub fn of(c: &SkCondition) -> SkRange {
        match c {
            SkCondition::Any => SkRange::default(),
            SkCondition::BeginsWith(p) => SkRange {
                prefix: Some(p.clone()),
                ..SkRange::default()
            },
            SkCondition::Between(a, b) => SkRange {
                lower: Some(Bound {
                    value: a.clone(),
                    inclusive: true,
                }),
                upper: Some(Bound {
                    value: b.clone(),
                    inclusive: true,
                }),
                prefix: None,
            },
        }
    }

    /// Only what comes after `from` in `order`: strictly after its value, or
    /// from it on (`inclusive`, for a key the merge puts after the one the
    /// value was read from). A position is always inside the range it narrows.
    pub fn after(mut self, from: Bound, order: Order) -> SkRange {
        let b = Some(from);
        match order {
            Order::Ascending => self.lower = b,
            Order::Descending => self.upper = b,
        }
        self
    }

    pub fn contains(&self, sk: &str) -> bool {
        let above = |b: &Bound| sk > b.value.as_str() || (b.inclusive && sk == b.value);
        let below = |b: &Bound| sk < b.value.as_str() || (b.inclusive && sk == b.value);
        self.lower.as_ref().is_none_or(above)
            && self.upper.as_ref().is_none_or(below)
            && self
                .prefix
                .as_ref()
                .is_none_or(|p| sk.starts_with(p.as_str()))
    }

    /// `sk`, read in `order`, is past the far end: nothing after it is in range.
    pub(crate) fn is_past_end(&self, sk: &str, order: Order) -> bool {
        let outside_prefix = |beyond: bool| {
            self.prefix
                .as_ref()
                .is_some_and(|p| !sk.starts_with(p.as_str()) && beyond)
        };
        match order {
            Order::Ascending => {
                let past = self
                    .upper
                    .as_ref()
                    .is_some_and(|b| sk > b.value.as_str() || (!b.inclusive && sk == b.value));
                past || outside_prefix(self.prefix.as_ref().is_some_and(|p| sk > p.as_str()))
            }
            Order::Descending => {
                let past = self
                    .lower
                    .as_ref()
                    .is_some_and(|b| sk < b.value.as_str() || (!b.inclusive && sk == b.value));
                past || outside_prefix(self.prefix.as_ref().is_some_and(|p| sk < p.as_str()))
            }
        }
    }

    /// The tightest single condition DynamoDB accepts that holds every key of the range.
    pub(crate) fn key_condition(&self) -> KeyCondition {
        let v = |b: &Bound| b.value.clone();
        match (&self.lower, &self.upper, &self.prefix) {
            (Some(l), Some(u), _) => KeyCondition::Between(v(l), v(u)),
            (Some(l), None, _) if l.inclusive => KeyCondition::Ge(v(l)),
            (Some(l), None, _) => KeyCondition::Gt(v(l)),
            (None, Some(u), _) if u.inclusive => KeyCondition::Le(v(u)),
            (None, Some(u), _) => KeyCondition::Lt(v(u)),
            (None, None, Some(p)) => KeyCondition::BeginsWith(p.clone()),
            (None, None, None) => KeyCondition::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(value: &str, inclusive: bool) -> Bound {
        Bound {
            value: value.into(),
            inclusive,
        }
    }

    #[test]
    fn a_prefix_narrowed_by_a_position_is_read_from_the_position_and_stops_at_the_prefix_end() {
        let r = SkRange::of(&SkCondition::BeginsWith("ORDER#".into()))
            .after(bound("ORDER#5", false), Order::Ascending);
        assert_eq!(r.key_condition(), KeyCondition::Gt("ORDER#5".into()));
        assert!(!r.contains("ORDER#5"));
        assert!(r.contains("ORDER#6"));
        assert!(!r.is_past_end("ORDER#5", Order::Ascending));
        assert!(r.is_past_end("PROFILE", Order::Ascending));
        let d = SkRange::of(&SkCondition::BeginsWith("B".into()))
            .after(bound("B9", true), Order::Descending);
        assert_eq!(d.key_condition(), KeyCondition::Le("B9".into()));
        assert!(d.contains("B9"));
        assert!(d.is_past_end("A", Order::Descending));
        assert!(!d.is_past_end("B", Order::Descending));
    }

    #[test]
    fn between_keeps_both_ends_and_a_strict_end_is_checked_here() {
        let r = SkRange::of(&SkCondition::Between("a".into(), "m".into()));
        assert_eq!(
            r.key_condition(),
            KeyCondition::Between("a".into(), "m".into())
        );
        assert!(r.contains("a") && r.contains("m") && !r.contains("n"));
        let r = r.after(bound("c", false), Order::Ascending);
        assert_eq!(
            r.key_condition(),
            KeyCondition::Between("c".into(), "m".into())
        );
        assert!(!r.contains("c"));
        assert!(!r.is_past_end("c", Order::Ascending));
        assert!(r.is_past_end("m0", Order::Ascending));
        assert_eq!(
            SkRange::of(&SkCondition::Any).key_condition(),
            KeyCondition::None
        );
    }
}
