//! Which way a tail replicates. The forward tail follows the source's stream
//! and writes `transform(item)` to the target; the reverse tail (`rekey
//! reverse`, issue 13's rollback) follows the target's stream and writes
//! `inverse(item)` back to the source. Everything else — lineage order,
//! per-item lanes, checkpoints, barriers, lag, rejects — is the same
//! machinery, so the direction is a value the tail carries, not a second
//! copy of it: the tables and key schemas swapped, the mapping, and where
//! its state lives.

use std::path::PathBuf;

use crate::core::inverse::{InverseOutcome, Inverter};
use crate::core::plan::{KeySchema, Plan};
use crate::core::transform::{Outcome, transform};
use crate::core::value::Item;
use crate::state::StateDir;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flow {
    /// Source stream → target, by the plan's transform.
    #[default]
    Forward,
    /// Target stream → source, by the plan's inverse.
    Reverse,
}

impl Flow {
    /// The table whose stream this direction reads.
    pub fn read_table(self, plan: &Plan) -> &str {
        match self {
            Flow::Forward => &plan.source_table,
            Flow::Reverse => &plan.target_table,
        }
    }

    /// The table this direction writes.
    pub fn write_table(self, plan: &Plan) -> &str {
        match self {
            Flow::Forward => &plan.target_table,
            Flow::Reverse => &plan.source_table,
        }
    }

    pub fn read_key(self, plan: &Plan) -> &KeySchema {
        match self {
            Flow::Forward => &plan.source_key,
            Flow::Reverse => &plan.target_key,
        }
    }

    pub fn write_key(self, plan: &Plan) -> &KeySchema {
        match self {
            Flow::Forward => &plan.target_key,
            Flow::Reverse => &plan.source_key,
        }
    }

    /// "source" or "target": the role of the table read, for messages.
    pub fn read_role(self) -> &'static str {
        match self {
            Flow::Forward => "source",
            Flow::Reverse => "target",
        }
    }

    /// "tail" or "reverse tail", for messages.
    pub fn tail_name(self) -> &'static str {
        match self {
            Flow::Forward => "tail",
            Flow::Reverse => "reverse tail",
        }
    }

    /// The direction's own sled store.
    pub fn store(self, dir: &StateDir) -> PathBuf {
        match self {
            Flow::Forward => dir.tail_store(),
            Flow::Reverse => dir.reverse_store(),
        }
    }

    /// The direction's status snapshot.
    pub fn snapshot(self, dir: &StateDir) -> PathBuf {
        match self {
            Flow::Forward => dir.tail_snapshot(),
            Flow::Reverse => dir.reverse_snapshot(),
        }
    }

    /// The direction's echo ledger.
    pub fn ledger(self, dir: &StateDir) -> PathBuf {
        match self {
            Flow::Forward => dir.tail_ledger(),
            Flow::Reverse => dir.reverse_ledger(),
        }
    }

    /// The other direction.
    pub fn other(self) -> Flow {
        match self {
            Flow::Forward => Flow::Reverse,
            Flow::Reverse => Flow::Forward,
        }
    }
}

/// What one item of the table read maps to in the table written.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    Put(Item),
    Reject(String),
    /// Nothing to write (an unmatched item the plan skips, a marker).
    Skip,
}

/// A direction's mapping: the transform forwards, the inverse (rules compiled
/// once) backwards.
pub struct Mapper<'p> {
    pub plan: &'p Plan,
    pub flow: Flow,
    inverter: Inverter<'p>,
}

impl<'p> Mapper<'p> {
    pub fn new(plan: &'p Plan, flow: Flow) -> Mapper<'p> {
        Mapper {
            plan,
            flow,
            inverter: Inverter::new(plan),
        }
    }

    /// An item of the table read, mapped to the table written.
    pub fn map(&self, item: &Item) -> Mapped {
        self.map_as(self.flow, item)
    }

    /// The key, in the table read, of the item an item of the table written
    /// comes from (mapped the other way), if it maps.
    pub fn back_key(&self, written: &Item) -> Option<Item> {
        match self.map_as(self.flow.other(), written) {
            Mapped::Put(item) => Some(self.read_key_of(&item)),
            _ => None,
        }
    }

    fn map_as(&self, flow: Flow, item: &Item) -> Mapped {
        match flow {
            Flow::Forward => match transform(self.plan, item) {
                Outcome::Put { item, .. } => Mapped::Put(item),
                Outcome::Reject(r) => Mapped::Reject(r.to_string()),
                Outcome::Skip => Mapped::Skip,
            },
            Flow::Reverse => match self.inverter.invert(item) {
                InverseOutcome::Put { item, .. } => Mapped::Put(item),
                InverseOutcome::Reject(r) => Mapped::Reject(format!("inverse: {r}")),
                InverseOutcome::Skip => Mapped::Skip,
            },
        }
    }

    /// The key attributes of an item of the table written.
    pub fn write_key_of(&self, item: &Item) -> Item {
        key_of(self.flow.write_key(self.plan), item)
    }

    /// The key attributes of an item of the table read.
    pub fn read_key_of(&self, item: &Item) -> Item {
        key_of(self.flow.read_key(self.plan), item)
    }
}

fn key_of(key: &KeySchema, item: &Item) -> Item {
    key.names()
        .iter()
        .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
        .collect()
}
