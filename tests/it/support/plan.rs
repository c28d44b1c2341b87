//! One plan builder for every test. A test says what its plan has, in the
//! plan's own words, and gets the TOML an operator would write:
//!
//! ```ignore
//! PlanText::new(&source, &target)
//!     .source_sort_key("SK")
//!     .rule(Rule::new(&[("PK", "T#{t}")], &[("PK", "T#{t}#S#{shard(id, 8)}")]))
//!     .write(&env)
//! ```
//!
//! Templates are written as they read in a plan (`{t}`, not `{{t}}`). The
//! shapes several test areas share are presets below ([`orders_by_status`],
//! [`tenant_shards`], [`tenant_days`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use rekey::core::plan::Plan;

use super::TestEnv;

/// One `[[rule]]`: its `match`, `key` and optional `name` and `set`.
#[derive(Clone, Debug)]
pub struct Rule {
    name: Option<String>,
    matching: Vec<(String, String)>,
    key: Vec<(String, String)>,
    set: Vec<(String, String)>,
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Rule {
    /// `match = { … }`, `key = { … }`.
    pub fn new(matching: &[(&str, &str)], key: &[(&str, &str)]) -> Rule {
        Rule {
            name: None,
            matching: pairs(matching),
            key: pairs(key),
            set: Vec::new(),
        }
    }

    /// `name = "…"`.
    pub fn named(mut self, name: &str) -> Rule {
        self.name = Some(name.to_string());
        self
    }

    /// `set = { … }`.
    pub fn set(mut self, attrs: &[(&str, &str)]) -> Rule {
        self.set = pairs(attrs);
        self
    }
}

/// A plan's text, built up. Defaults: the source keyed by `PK`, the target
/// by `PK` and `SK`, no options, no rules.
#[derive(Clone, Debug)]
pub struct PlanText {
    source: String,
    source_key: (String, Option<String>),
    target: String,
    target_key: (String, Option<String>),
    indexes: Vec<(String, String)>,
    options: Vec<(String, String)>,
    rules: Vec<Rule>,
}

/// A TOML basic string (JSON's escapes are TOML's).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn inline_table(p: &[(String, String)]) -> String {
    let fields: Vec<String> = p
        .iter()
        .map(|(k, v)| format!("{k} = {}", quote(v)))
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

impl PlanText {
    pub fn new(source: &str, target: &str) -> PlanText {
        PlanText {
            source: source.to_string(),
            source_key: ("PK".into(), None),
            target: target.to_string(),
            target_key: ("PK".into(), Some("SK".into())),
            indexes: Vec::new(),
            options: Vec::new(),
            rules: Vec::new(),
        }
    }

    /// The source table has a sort key too.
    pub fn source_sort_key(mut self, name: &str) -> PlanText {
        self.source_key.1 = Some(name.to_string());
        self
    }

    /// `[[target.index]]` with its partition key.
    pub fn index(mut self, name: &str, partition_key: &str) -> PlanText {
        self.indexes
            .push((name.to_string(), partition_key.to_string()));
        self
    }

    /// `[options] source_key_prefix = "…"`.
    pub fn source_key_prefix(mut self, prefix: &str) -> PlanText {
        self.options
            .push(("source_key_prefix".into(), quote(prefix)));
        self
    }

    /// `[options] drop = […]`.
    pub fn drop_attrs(mut self, attrs: &[&str]) -> PlanText {
        let list: Vec<String> = attrs.iter().map(|a| quote(a)).collect();
        self.options
            .push(("drop".into(), format!("[{}]", list.join(", "))));
        self
    }

    pub fn rule(mut self, rule: Rule) -> PlanText {
        self.rules.push(rule);
        self
    }

    /// The plan without its rule named `name`.
    pub fn without_rule(mut self, name: &str) -> PlanText {
        self.rules.retain(|r| r.name.as_deref() != Some(name));
        self
    }

    /// The plan as TOML.
    pub fn text(&self) -> String {
        let mut t = String::new();
        let key = |t: &mut String, (pk, sk): &(String, Option<String>)| {
            writeln!(t, "partition_key = {}", quote(pk)).unwrap();
            if let Some(sk) = sk {
                writeln!(t, "sort_key = {}", quote(sk)).unwrap();
            }
        };
        writeln!(t, "[source]\ntable = {}", quote(&self.source)).unwrap();
        key(&mut t, &self.source_key);
        writeln!(t, "\n[target]\ntable = {}", quote(&self.target)).unwrap();
        key(&mut t, &self.target_key);
        for (name, pk) in &self.indexes {
            writeln!(
                t,
                "\n[[target.index]]\nname = {}\npartition_key = {}",
                quote(name),
                quote(pk)
            )
            .unwrap();
        }
        if !self.options.is_empty() {
            t.push_str("\n[options]\n");
            for (k, v) in &self.options {
                writeln!(t, "{k} = {v}").unwrap();
            }
        }
        for r in &self.rules {
            t.push_str("\n[[rule]]\n");
            if let Some(name) = &r.name {
                writeln!(t, "name = {}", quote(name)).unwrap();
            }
            writeln!(t, "match = {}", inline_table(&r.matching)).unwrap();
            writeln!(t, "key = {}", inline_table(&r.key)).unwrap();
            if !r.set.is_empty() {
                writeln!(t, "set = {}", inline_table(&r.set)).unwrap();
            }
        }
        t
    }

    /// The plan as rekey reads it.
    pub fn parse(&self) -> Plan {
        let text = self.text();
        Plan::parse(&text, std::path::Path::new("plan.toml"))
            .unwrap_or_else(|e| panic!("the test's plan does not parse: {e}\n{text}"))
    }

    /// Writes `plan.toml` into the test's directory: its path, and the plan.
    pub fn write(&self, env: &TestEnv) -> (PathBuf, Plan) {
        (env.file("plan.toml", &self.text()), self.parse())
    }
}

/// The live-write tests' plan: orders keyed by `O#{id}` alone, their target
/// key depending on their status, so an update of the status moves the item.
pub fn orders_by_status(source: &str, target: &str) -> PlanText {
    PlanText::new(source, target).rule(Rule::new(
        &[("PK", "O#{id}")],
        &[("PK", "ST#{@status}#{shard(id, 4)}"), ("SK", "O#{id}")],
    ))
}

/// Orders of a tenant (`T#{t}`, `O#{id}`) spread over eight shards.
pub fn tenant_shards(source: &str, target: &str) -> PlanText {
    PlanText::new(source, target)
        .source_sort_key("SK")
        .rule(Rule::new(
            &[("PK", "T#{t}"), ("SK", "O#{id}")],
            &[("PK", "T#{t}#S#{shard(id, 8)}"), ("SK", "O#{id}")],
        ))
}

/// A tenant-day's orders spread over eight shards, with `gsi1pk` as the
/// order's `GSI1PK`, and a rule mapping every `C#{x}` item to one target key
/// (collisions).
pub fn tenant_days(source: &str, target: &str, gsi1pk: &str) -> PlanText {
    PlanText::new(source, target)
        .source_sort_key("SK")
        .rule(
            Rule::new(
                &[("PK", "T#{t}#D#{d}"), ("SK", "O#{id}")],
                &[("PK", "T#{t}#D#{d}#S#{shard(id, 8)}"), ("SK", "O#{id}")],
            )
            .named("order")
            .set(&[("GSI1PK", gsi1pk)]),
        )
        .rule(
            Rule::new(
                &[("PK", "C#{x}"), ("SK", "{y}")],
                &[("PK", "C"), ("SK", "SAME#{x}")],
            )
            .named("collide"),
        )
}
