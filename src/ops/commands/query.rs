//! `rekey query`: one page of a logical key, as a table or JSON lines,
//! with the cursor of the next page.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::json;

use super::connect;
use crate::core::value::Item;
use crate::ops::cli::exit;
use crate::ops::config::{Common, Format, Planned};
use crate::ops::out;
use crate::ops::redact::PlanRedactor;
use crate::phase::query::{self, QueryOptions, QueryReport};

/// Widest cell of the table; longer values are cut with `…` (`--json` has them whole).
const CELL: usize = 40;

pub(super) async fn query(c: &Common, cmd: Planned<QueryOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let mut report = query::run(&clients, &plan, &options).await?;
    let redactor = PlanRedactor::new(&plan, c.output.redactor);
    let key_names = plan.target_key.names();
    for item in &mut report.items {
        for name in &key_names {
            if let Some(crate::core::value::Value::S(v)) = item.get_mut(*name) {
                *v = redactor.target_value(name, v);
            }
        }
    }
    match c.output.format {
        Format::Json => {
            for item in &report.items {
                out::line(&serde_json::to_string(item)?)?;
            }
            out::line(
                &json!({
                    "next_cursor": report.next_cursor,
                    "count": report.items.len(),
                    "keys": report.keys,
                    "queries": report.queries,
                    "consumed_rcu": report.consumed_rcu,
                    "unreadable": report.unreadable,
                })
                .to_string(),
            )?;
        }
        Format::Text => out::text(&table(&report, &key_names))?,
    }
    Ok(exit::OK)
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(CELL) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The key attributes first, then every other attribute of the page, by name.
fn table(r: &QueryReport, key_names: &[&str]) -> String {
    let others: BTreeSet<&str> = r
        .items
        .iter()
        .flat_map(|i: &Item| i.keys().map(String::as_str))
        .filter(|n| !key_names.contains(n))
        .collect();
    let columns: Vec<&str> = key_names.iter().copied().chain(others).collect();
    let rows: Vec<Vec<String>> = r
        .items
        .iter()
        .map(|i| {
            columns
                .iter()
                .map(|c| i.get(*c).map_or(String::new(), |v| cut(&v.display_text())))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(k, c)| {
            rows.iter()
                .map(|row| row[k].chars().count())
                .chain([c.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut o = String::new();
    let line = |o: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let text: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        let _ = writeln!(o, "{}", text.join("  ").trim_end());
    };
    if !r.items.is_empty() {
        line(&mut o, &mut columns.iter().copied());
        for row in &rows {
            line(&mut o, &mut row.iter().map(String::as_str));
        }
    }
    let _ = writeln!(
        o,
        "{} item(s) from {} partition key(s) of rule `{}` in `{}` ({} queries, {:.1} RCU)",
        r.items.len(),
        r.keys,
        r.rule,
        r.table,
        r.queries,
        r.consumed_rcu
    );
    if r.unreadable > 0 {
        let _ = writeln!(
            o,
            "note: {} item(s) had attribute types this rekey cannot read and are not shown",
            r.unreadable
        );
    }
    match &r.next_cursor {
        Some(cur) => {
            let _ = writeln!(o, "next page: --cursor {cur}");
        }
        None => {
            let _ = writeln!(o, "last page");
        }
    }
    o
}
