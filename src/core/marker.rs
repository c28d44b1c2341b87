//! The marker rule: drain barriers (`rekey drain`) travel the source's stream
//! as marker items whose partition key starts with [`MARKER_PREFIX`]. The
//! transform skips them everywhere (a marker is never copied), and the tail
//! recognises them ([`marker_id`]). The rollback's barrier travels the
//! target's stream the same way, as a marker in the target's key schema
//! ([`marker_id_in`], [`marker_item_in`]; the inverse skips it).

use crate::core::plan::{KeySchema, Plan};
use crate::core::value::{Item, ScalarType, Value};

/// Partition-key values starting with this are rekey's own markers.
pub const MARKER_PREFIX: &str = "__rekey__#barrier#";

/// The attribute that carries a barrier's start (epoch seconds, the clock of
/// the process that began it) in each of its markers.
pub(crate) const STARTED_AT: &str = "rekey_barrier_started_at";

/// One marker of a barrier. A barrier writes many, under distinct keys
/// (`…#<id>#<n>`), because a key reaches one partition and so one open
/// stream shard: markers are written until every open shard has shown one
/// (crate::phase::barrier).
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub barrier: String,
    pub n: u32,
    /// When the barrier began: every write acknowledged before is behind it.
    pub started_at: Option<f64>,
}

/// The barrier id if `item` (a source item) is a drain marker.
pub(crate) fn marker_id(plan: &Plan, item: &Item) -> Option<String> {
    marker_id_in(&plan.source_key, item)
}

/// The barrier id if `item` (an item of a table keyed by `key`) is a drain marker.
pub(crate) fn marker_id_in(key: &KeySchema, item: &Item) -> Option<String> {
    marker_in(key, item).map(|m| m.barrier)
}

/// The marker `item` is, if it is one (an item of a table keyed by `key`).
pub(crate) fn marker_in(key: &KeySchema, item: &Item) -> Option<Marker> {
    let text = match item.get(&key.partition_key.name)? {
        Value::S(s) => s.as_str(),
        Value::B(b) => std::str::from_utf8(b).ok()?,
        _ => return None,
    };
    let rest = text.strip_prefix(MARKER_PREFIX)?;
    let (barrier, n) = match rest.split_once('#') {
        Some((b, n)) => (b, n.parse().ok()?),
        None => (rest, 0),
    };
    let started_at = match item.get(STARTED_AT) {
        Some(Value::N(n)) => n.parse().ok(),
        _ => None,
    };
    Some(Marker {
        barrier: barrier.to_string(),
        n,
        started_at,
    })
}

/// The first marker item for barrier `id`: the source key and its start.
/// A numeric partition key cannot carry a marker: the error says what to do.
#[cfg(test)]
pub(crate) fn marker_item(plan: &Plan, id: &str) -> Result<Item, String> {
    let m = Marker {
        barrier: id.into(),
        n: 0,
        started_at: None,
    };
    marker_item_in(&plan.source_key, &plan.source_table, &m)
}

/// The item of marker `m` in `table`, keyed by `key`.
pub fn marker_item_in(key: &KeySchema, table: &str, m: &Marker) -> Result<Item, String> {
    let text = format!("{MARKER_PREFIX}{}#{}", m.barrier, m.n);
    let value = |ty: ScalarType| match ty {
        ScalarType::S => Value::S(text.clone()),
        ScalarType::B => Value::B(text.clone().into_bytes()),
        ScalarType::N => Value::N("0".into()),
    };
    let pk = &key.partition_key;
    if pk.ty == ScalarType::N {
        return Err(format!(
            "table `{}` has a numeric partition key ({}); the drain barrier needs a string or binary key \
             for its marker item. Stop the application's writes and wait for the tail to be idle instead",
            table, pk.name
        ));
    }
    let mut item = Item::new();
    item.insert(pk.name.clone(), value(pk.ty));
    if let Some(sk) = &key.sort_key {
        item.insert(sk.name.clone(), value(sk.ty));
    }
    if let Some(at) = m.started_at {
        item.insert(STARTED_AT.into(), Value::N(format!("{at:.3}")));
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(pk_type: &str) -> Plan {
        let text = format!(
            r#"
[source]
table = "s"
partition_key = "PK:{pk_type}"
sort_key = "SK"
[target]
table = "t"
partition_key = "PK"
[[rule]]
match = {{ SK = "{{x}}" }}
key = {{ PK = "{{x}}" }}
"#
        );
        Plan::parse(&text, std::path::Path::new("p")).unwrap()
    }

    #[test]
    fn a_marker_round_trips_and_ordinary_items_are_not_markers() {
        let p = plan("S");
        let m = marker_item(&p, "abc").unwrap();
        assert_eq!(marker_id(&p, &m).as_deref(), Some("abc"));
        let mut other = m.clone();
        other.insert("PK".into(), Value::S("ORDER#1".into()));
        assert_eq!(marker_id(&p, &other), None);
    }

    #[test]
    fn binary_keys_carry_the_marker_as_bytes_and_numeric_keys_are_refused() {
        let p = plan("B");
        let m = marker_item(&p, "x").unwrap();
        assert!(matches!(m["PK"], Value::B(_)));
        assert_eq!(marker_id(&p, &m).as_deref(), Some("x"));
        let e = marker_item(&plan("N"), "x").unwrap_err();
        assert!(e.contains("numeric partition key"), "{e}");
    }

    #[test]
    fn a_barriers_markers_share_its_id_and_carry_its_start() {
        let p = plan("S");
        let m = Marker {
            barrier: "20261205T140000.000Z-0000abcd".into(),
            n: 17,
            started_at: Some(1_700_000_000.25),
        };
        let item = marker_item_in(&p.source_key, "s", &m).unwrap();
        assert_eq!(marker_in(&p.source_key, &item), Some(m.clone()));
        assert_eq!(marker_id(&p, &item), Some(m.barrier));
        // The form without a number (markers written before there were many).
        let mut old = Item::new();
        old.insert("PK".into(), Value::S(format!("{MARKER_PREFIX}abc")));
        let got = marker_in(&p.source_key, &old).unwrap();
        assert_eq!(
            (got.barrier.as_str(), got.n, got.started_at),
            ("abc", 0, None)
        );
    }
}
