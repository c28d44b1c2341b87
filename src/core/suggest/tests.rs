use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::core::plan::{KeyAttr, Plan};
use crate::core::transform::{Outcome, transform};

fn schema(pk: ScalarType, sk: Option<ScalarType>) -> KeySchema {
    KeySchema {
        partition_key: KeyAttr {
            name: "PK".into(),
            ty: pk,
        },
        sort_key: sk.map(|ty| KeyAttr {
            name: "SK".into(),
            ty,
        }),
    }
}

fn item(pk: &str, sk: &str) -> Item {
    let mut i = Item::new();
    i.insert("PK".into(), Value::S(pk.into()));
    i.insert("SK".into(), Value::S(sk.into()));
    i
}

fn opts(write_rate: f64) -> SuggestOptions {
    SuggestOptions {
        write_rate,
        read_rate: None,
        headroom: 0.5,
        rounding: ShardRounding::PowerOfTwo,
        limits: Limits {
            write_units: 1000.0,
            read_units: 3000.0,
        },
        target_table: None,
    }
}

fn sample_of(items: &[Item]) -> Sample {
    let mut s = Sample::new(1_000_000);
    let key = schema(ScalarType::S, Some(ScalarType::S));
    for i in items {
        s.add(i, &key);
    }
    s
}

/// Tenants and days as in the demo: one tenant holds 40 % of today's orders.
fn orders() -> Vec<Item> {
    let mut v = Vec::new();
    for t in 0..20 {
        v.push(item(&format!("TENANT#t-{t:02}"), "PROFILE"));
    }
    for n in 0..2000u32 {
        let t = if n % 5 < 2 { 0 } else { n % 20 };
        let day = if n % 10 < 7 {
            "2026-07-07"
        } else {
            "2026-07-06"
        };
        v.push(item(
            &format!("TENANT#t-{t:02}#DAY#{day}"),
            &format!("ORDER#{:08x}", n.wrapping_mul(2_654_435_761)),
        ));
    }
    v
}

fn plan_of(s: &Suggestion) -> Plan {
    Plan::parse(
        s.plan.as_deref().expect("a plan"),
        Path::new("suggested.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", s.plan.as_deref().unwrap_or("")))
}

#[test]
fn the_tenant_day_table_gets_a_sharded_rule_and_the_profiles_none() {
    let items = orders();
    let key = schema(ScalarType::S, Some(ScalarType::S));
    let s = suggest("orders", &key, &sample_of(&items), &opts(20000.0));
    assert_eq!(s.verdict, Verdict::Plan);
    let order = &s.shapes[0];
    assert_eq!(order.pk, "TENANT#{tenant}#DAY#{day}");
    assert_eq!(order.sk.as_deref(), Some("ORDER#{order}"));
    assert_eq!(order.hottest_key, "TENANT#t-00#DAY#2026-07-07");
    assert_eq!(s.hot_keys.len(), HOT_KEYS);
    assert_eq!(s.hot_keys[0].key, order.hottest_key);
    assert_eq!(s.hot_keys[0].shape, order.pk);
    assert_eq!(s.hot_keys[0].write_load, order.write_load);
    assert!(
        s.hot_keys
            .windows(2)
            .all(|w| w[0].write_load >= w[1].write_load)
    );
    // The smallest power of two over load / budget.
    let Action::Shard { shards, capture } = &order.action else {
        panic!("{:?}", order.action)
    };
    assert_eq!(capture, "order");
    assert!(order.needed > f64::from(shards / 2) && order.needed <= f64::from(*shards));
    let rule = order.rule.as_ref().unwrap();
    assert_eq!(
        rule.key_pk,
        format!("TENANT#{{tenant}}#DAY#{{day}}#SHARD#{{shard(order, {shards}):02}}")
    );
    let profile = &s.shapes[1];
    assert_eq!(profile.pk, "TENANT#{tenant}");
    assert_eq!(profile.sk.as_deref(), Some("PROFILE"));
    assert_eq!(profile.action, Action::NoRule);
    let plan = plan_of(&s);
    assert!(s.plan.as_deref().unwrap().contains("no rule needed"));
    // Every order goes through the rule; every profile is copied unchanged.
    for i in &items {
        match transform(&plan, i) {
            Outcome::Put { rule, item } => {
                let sharded = matches!(i.get("SK"), Some(Value::S(sk)) if sk.starts_with("ORDER#"));
                assert_eq!(rule.is_some(), sharded);
                assert_eq!(item.get("PK") != i.get("PK"), sharded);
            }
            other => panic!("{other:?}"),
        }
    }
    // At a low rate nothing is hot.
    let s = suggest("orders", &key, &sample_of(&items), &opts(100.0));
    assert_eq!(s.verdict, Verdict::NoRuleNeeded);
    assert!(s.plan.is_none());
}

#[test]
fn reads_raise_the_count_and_a_time_in_the_sort_key_offers_a_bucket() {
    let mut items = Vec::new();
    for n in 0..1000u64 {
        let src = if n % 2 == 0 { "billing" } else { "s1" };
        items.push(item(
            &format!("SOURCE#{src}"),
            &format!("EVENT#{}#e{n}", 1_783_400_000_000 + n * 1000),
        ));
    }
    let key = schema(ScalarType::S, Some(ScalarType::S));
    let mut o = opts(1000.0);
    let s = suggest("events", &key, &sample_of(&items), &o);
    let r = &s.shapes[0];
    assert_eq!(
        (r.pk.as_str(), r.sk.as_deref()),
        ("SOURCE#{source}", Some("EVENT#{event}#{id}"))
    );
    assert_eq!(r.bucket.as_deref(), Some("HOUR#{bucket(event, hour)}"));
    // 500 WCU/s fits the 500 budget exactly: no rule, but the bucket is offered.
    assert_eq!(r.action, Action::NoRule);
    assert!(r.notes[0].contains("time bucket"), "{:?}", r.notes);
    o.read_rate = Some(12000.0);
    let s = suggest("events", &key, &sample_of(&items), &o);
    let r = &s.shapes[0];
    // 6000 RCU/s over a 1500 budget: 4 shards, by the event id, in hour buckets.
    assert_eq!(
        r.action,
        Action::Shard {
            shards: 4,
            capture: "id".into()
        }
    );
    assert_eq!(
        r.rule.as_ref().unwrap().key_pk,
        "SOURCE#{source}#HOUR#{bucket(event, hour)}#SHARD#{shard(id, 4)}"
    );
    plan_of(&s);
}

#[test]
fn unusual_data_gets_a_clear_verdict_and_no_plan() {
    let key = schema(ScalarType::S, Some(ScalarType::S));
    let s = suggest("t", &key, &Sample::new(10), &opts(1000.0));
    assert_eq!(s.verdict, Verdict::Empty);
    let n = suggest(
        "t",
        &schema(ScalarType::N, None),
        &Sample::new(10),
        &opts(1.0),
    );
    assert!(
        n.verdict.message().contains("numeric"),
        "{}",
        n.verdict.message()
    );
    let flat: Vec<Item> = (0..50)
        .map(|i| item(&format!("user{}", i % 3), &format!("{i}")))
        .collect();
    let s = suggest("t", &key, &sample_of(&flat), &opts(100000.0));
    assert_eq!(s.verdict, Verdict::NoDelimiters);
    // Every item its own number of segments.
    let ragged: Vec<Item> = (1..40)
        .map(|i| item(&vec!["x1"; i].join("#"), "a#1"))
        .collect();
    let s = suggest("t", &key, &sample_of(&ragged), &opts(1.0));
    assert!(
        matches!(s.verdict, Verdict::ShapePerItem { .. }),
        "{:?}",
        s.verdict
    );
    for v in [Verdict::Empty, Verdict::NoDelimiters, s.verdict.clone()] {
        assert!(v.message().contains("no plan written"));
    }
    // One hot key whose sort key is constant cannot be sharded.
    let one: Vec<Item> = (0..10)
        .map(|i| item(&format!("K#k{}", i % 2), "META"))
        .collect();
    let s = suggest("t", &key, &sample_of(&one), &opts(100000.0));
    assert_eq!(s.verdict, Verdict::CannotFix);
    assert!(s.plan.is_none());
    // Beside a shape that can be sharded, it is named in the plan as staying hot.
    let mut both = one.clone();
    both.extend((0..10).map(|i| item("K#k0", &format!("ITEM#i{i}"))));
    let s = suggest("t", &key, &sample_of(&both), &opts(100000.0));
    assert_eq!(s.verdict, Verdict::Plan);
    let meta = s
        .shapes
        .iter()
        .find(|r| r.sk.as_deref() == Some("META"))
        .unwrap();
    assert_eq!(meta.action, Action::CannotShard);
    assert!(
        s.plan
            .as_deref()
            .unwrap()
            .contains("its sort key is constant")
    );
    plan_of(&s);
}

#[test]
fn a_broader_rule_does_not_take_a_shape_that_needs_none() {
    // `{device_id}#{ts}` would match `{a}#{b}#{c}`'s values: the latter gets its own rule.
    let mut items = Vec::new();
    for n in 0..400u64 {
        items.push(item(
            "DATE#2026-07-07",
            &format!("device-{}#{}", n % 50, 1_783_400_000 + n),
        ));
    }
    for n in 0..40u64 {
        items.push(item(
            &format!("DATE#2026-07-0{}", 1 + n % 5),
            &format!("x-{n}#y-{n}#z-{n}"),
        ));
    }
    let key = schema(ScalarType::S, Some(ScalarType::S));
    let s = suggest("readings", &key, &sample_of(&items), &opts(2000.0));
    assert_eq!(s.verdict, Verdict::Plan);
    let plan = plan_of(&s);
    for i in &items {
        let Outcome::Put { item, .. } = transform(&plan, i) else {
            panic!()
        };
        let three = matches!(i.get("SK"), Some(Value::S(sk)) if sk.starts_with("x-"));
        assert_eq!(item.get("PK") == i.get("PK"), three, "{i:?} → {item:?}");
    }
}

/// The outside test's table: `{day}|STORE|{store}` keys, most of the items,
/// beside a device's `DEVICE:{device}` / `READING:{time}` keys. One
/// delimiter for the attribute left the devices one variable and no rule.
fn stores_and_devices() -> Vec<Item> {
    let mut v = Vec::new();
    for n in 0..600u32 {
        let (day, store) = if n < 380 {
            ("2026-07-07", 0)
        } else {
            (["2026-07-06", "2026-07-07"][n as usize % 2], 1 + n % 10)
        };
        v.push(item(
            &format!("{day}|STORE|s-{store:02}"),
            &format!("SALE|{:08x}", n.wrapping_mul(2_654_435_761)),
        ));
    }
    for n in 0..400u32 {
        let device = if n < 90 { 0 } else { 1 + n % 30 };
        v.push(item(
            &format!("DEVICE:d-{device:02}"),
            &format!(
                "READING:2026-07-07T{:02}:{:02}:{:02}Z",
                n / 60 % 24,
                n % 60,
                n % 7
            ),
        ));
    }
    v
}

#[test]
fn mixed_delimiters_single_table_each_shape_found() {
    let items = stores_and_devices();
    let key = schema(ScalarType::S, Some(ScalarType::S));
    let s = suggest("t", &key, &sample_of(&items), &opts(20000.0));
    assert_eq!(s.verdict, Verdict::Plan);
    let texts: Vec<(&str, Option<&str>)> = s
        .shapes
        .iter()
        .map(|r| (r.pk.as_str(), r.sk.as_deref()))
        .collect();
    assert_eq!(
        texts,
        [
            ("{day}|STORE|{store}", Some("SALE|{sale}")),
            ("DEVICE:{device}", Some("READING:{reading}")),
        ]
    );
    let (store, device) = (&s.shapes[0], &s.shapes[1]);
    // 38 % of 20,000 writes/s over a 500 budget: 15.2, so 16.
    assert_eq!(
        store.action,
        Action::Shard {
            shards: 16,
            capture: "sale".into()
        }
    );
    assert_eq!(
        store.rule.as_ref().unwrap().key_pk,
        "{day}|STORE|{store}|SHARD|{shard(sale, 16):02}"
    );
    // 9 %: 1,800 WCU/s, 4 shards; the reading's time offers an hour bucket in `:`s.
    assert_eq!(
        device.action,
        Action::Shard {
            shards: 4,
            capture: "reading".into()
        }
    );
    assert_eq!(
        device.bucket.as_deref(),
        Some("HOUR:{bucket(reading, hour)}")
    );
    assert_eq!(
        device.rule.as_ref().unwrap().key_pk,
        "DEVICE:{device}:HOUR:{bucket(reading, hour)}:SHARD:{shard(reading, 4)}"
    );
    let plan = plan_of(&s);
    for i in &items {
        let Outcome::Put { rule, item } = transform(&plan, i) else {
            panic!("{i:?}")
        };
        assert!(rule.is_some(), "{i:?}");
        assert_ne!(item.get("PK"), i.get("PK"), "{i:?}");
        assert_eq!(item.get("SK"), i.get("SK"));
    }
}

/// Items of one shape, `{k}` a key (one hot), `{n}` an id, `{t}` a time.
fn one_shape(pk: &str, sk: &str) -> Vec<Item> {
    (0..200u32)
        .map(|n| {
            let k = if n < 100 { 0 } else { 1 + n % 10 };
            let fill = |p: &str| {
                p.replace("{k}", &format!("t-{k:02}"))
                    .replace("{n}", &format!("ord-{n:05}"))
                    .replace(
                        "{t}",
                        &format!("2026-07-07T{:02}:{:02}:00Z", n % 24, n % 60),
                    )
            };
            item(&fill(pk), &fill(sk))
        })
        .collect()
}

#[test]
fn the_rule_the_bucket_and_the_shards_take_the_shapes_own_delimiters() {
    // (PK, SK) → the shape, and the new PK; half the writes on one key: 4 shards.
    let cases = [
        (
            "TENANT#{k}",
            "ORDER#{n}",
            "TENANT#{tenant}",
            "ORDER#{order}",
            "TENANT#{tenant}#SHARD#{shard(order, 4)}",
        ),
        (
            "TENANT|{k}",
            "ORDER|{n}",
            "TENANT|{tenant}",
            "ORDER|{order}",
            "TENANT|{tenant}|SHARD|{shard(order, 4)}",
        ),
        (
            "TENANT:{k}",
            "ORDER:{n}",
            "TENANT:{tenant}",
            "ORDER:{order}",
            "TENANT:{tenant}:SHARD:{shard(order, 4)}",
        ),
        (
            "TENANT/{k}",
            "ORDER/{n}",
            "TENANT/{tenant}",
            "ORDER/{order}",
            "TENANT/{tenant}/SHARD/{shard(order, 4)}",
        ),
        // The partition key's delimiter, not the sort key's, joins the bucket and the shard.
        (
            "SOURCE|{k}",
            "EVENT#{t}#{n}",
            "SOURCE|{source}",
            "EVENT#{event}#{ord_id}",
            "SOURCE|{source}|HOUR|{bucket(event, hour)}|SHARD|{shard(ord_id, 4)}",
        ),
        (
            "{k}",
            "ORDER:{n}",
            "{id}",
            "ORDER:{order}",
            "{id}:SHARD:{shard(order, 4)}",
        ),
        (
            "T/{k}",
            "{t}",
            "T/{t}",
            "{ts}",
            "T/{t}/HOUR/{bucket(ts, hour)}/SHARD/{shard(ts, 4)}",
        ),
    ];
    let key = schema(ScalarType::S, Some(ScalarType::S));
    for (pk, sk, want_pk, want_sk, want_key) in cases {
        let items = one_shape(pk, sk);
        let s = suggest("t", &key, &sample_of(&items), &opts(3000.0));
        assert_eq!(s.shapes.len(), 1, "{pk} / {sk}: {:#?}", s.shapes);
        let r = &s.shapes[0];
        assert_eq!((r.pk.as_str(), r.sk.as_deref()), (want_pk, Some(want_sk)));
        let rule = r.rule.as_ref().unwrap_or_else(|| panic!("{pk}: {r:#?}"));
        assert_eq!(rule.key_pk, want_key);
        let plan = plan_of(&s);
        for i in &items {
            let Outcome::Put { rule, .. } = transform(&plan, i) else {
                panic!("{i:?}")
            };
            assert!(rule.is_some(), "{i:?}");
        }
    }
}

fn arb_items() -> impl Strategy<Value = Vec<Item>> {
    let lit = prop::sample::select(vec!["TENANT", "DAY", "CASE", "TASK", "EVENT", "ORDER"]);
    let shape = prop::collection::vec(prop::option::of(lit), 1..5);
    let delim = prop::sample::select(shape::DELIMITERS.to_vec());
    // Each attribute's shapes in any of the delimiters, mixed in one table.
    let shapes = prop::collection::vec(((shape.clone(), delim.clone()), (shape, delim)), 1..4);
    (shapes, 1usize..300, any::<u64>()).prop_map(|(shapes, n, seed)| {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let value = |(segs, d): &(Vec<Option<&str>>, char), next: &mut dyn FnMut() -> u64| {
            segs.iter()
                .map(|s| match s {
                    Some(l) => l.to_string(),
                    None => format!("v{}", next() % 7),
                })
                .collect::<Vec<_>>()
                .join(&d.to_string())
        };
        (0..n)
            .map(|i| {
                let (pk, sk) = &shapes[i % shapes.len()];
                item(&value(pk, &mut next), &value(sk, &mut next))
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn a_suggested_plan_always_parses_and_every_sampled_item_goes_through_it(
        items in arb_items(), rate in 1.0f64..1e6,
    ) {
        let key = schema(ScalarType::S, Some(ScalarType::S));
        let s = suggest("t", &key, &sample_of(&items), &opts(rate));
        prop_assert_eq!(s.plan.is_some(), s.verdict == Verdict::Plan);
        if let Some(text) = &s.plan {
            let plan = Plan::parse(text, Path::new("p"));
            prop_assert!(plan.is_ok(), "{:?}\n{}", plan.err(), text);
            let plan = plan.unwrap();
            for i in &items {
                let put = matches!(transform(&plan, i), Outcome::Put { .. });
                prop_assert!(put, "{i:?}\n{text}");
            }
        }
        for r in &s.shapes {
            if let Action::Shard { shards, .. } = r.action {
                prop_assert!(shards.is_power_of_two());
                prop_assert!(r.needed <= f64::from(shards));
                prop_assert!(shards == 1 || r.needed > f64::from(shards / 2));
            }
        }
    }
}
