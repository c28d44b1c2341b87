//! Why a rule cannot be read backwards, and what to change in the plan.
//! Two files find reasons — `compile` what a rule loses for every item (a
//! capture, a removed or overwritten attribute), `analysis` what makes
//! items ambiguous (adjacent parts, overlapping rules) — and `analysis`
//! reads `compile`'s; the reasons live here so that `compile` need not
//! import `analysis` back.

use std::fmt;

/// How `drop` or `remove` took an attribute away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Drop,
    Remove,
}

/// Why a rule is not reversible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Irreversible {
    /// Source and target are one table: nothing to replicate back.
    InPlace,
    /// A source key attribute no shape matches and no target template carries whole.
    LostSourceKey { attr: String },
    /// A capture no target template (unpadded) or kept attribute carries.
    LostCapture {
        capture: String,
        /// The attribute and shape that bind it.
        attr: String,
        shape: String,
        /// Where it appears padded only: (attribute, part).
        padded: Option<(String, String)>,
    },
    /// `drop` or `remove` takes the attribute away from the target.
    Removed { attr: String, by: Removal },
    /// The rule reads the attribute but writes over it.
    Overwritten { attr: String, by: &'static str },
    /// Two variable-width parts of a template with no literal between them.
    Adjacent {
        attr: String,
        left: String,
        right: String,
    },
    /// Another rule's target items can have the same key.
    Overlap { other: String },
}

impl Irreversible {
    /// Whether every item of the rule is lost (else only some are ambiguous).
    pub(crate) fn every_item(&self) -> bool {
        !matches!(
            self,
            Irreversible::Adjacent { .. } | Irreversible::Overlap { .. }
        )
    }

    /// What to change in the plan to make the rule reversible.
    pub fn fix(&self) -> String {
        match self {
            Irreversible::InPlace => {
                "none for a rollback: in place, `rekey undo` removes what the plan set".into()
            }
            Irreversible::LostSourceKey { attr } => format!(
                "match `{attr}` with a shape whose captures the target key keeps, or carry it whole with `{{@{attr}}}` in a target key or a `set` attribute"
            ),
            Irreversible::LostCapture { capture, .. } => format!(
                "put `{{{capture}}}` (unpadded) into a target key template, or keep it on the item: set = {{ {capture} = \"{{{capture}}}\" }}"
            ),
            Irreversible::Removed {
                attr,
                by: Removal::Drop,
            } => format!("keep it: take `{attr}` out of `[options] drop`"),
            Irreversible::Removed {
                attr,
                by: Removal::Remove,
            } => format!("keep it: take `{attr}` out of the rule's `remove`"),
            Irreversible::Overwritten { attr, .. } => {
                format!("write the computed value under another name than `{attr}`")
            }
            Irreversible::Adjacent { left, right, .. } => {
                format!("put literal text between them, e.g. `{left}#{right}`")
            }
            Irreversible::Overlap { other } => format!(
                "give this rule's target key literal text rule `{other}`'s cannot hold (a prefix such as `ORDER#`), so a key says which rule wrote it"
            ),
        }
    }
}

impl fmt::Display for Irreversible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Irreversible::InPlace => f.write_str(
                "in place: source and target are one table, so there is nothing to replicate back",
            ),
            Irreversible::LostSourceKey { attr } => write!(
                f,
                "source key attribute `{attr}` has no shape in this rule and no target key or kept attribute carries it"
            ),
            Irreversible::LostCapture {
                capture,
                attr,
                shape,
                padded,
            } => {
                write!(
                    f,
                    "capture `{capture}` (from {attr} = \"{shape}\") is in no target key and no kept attribute"
                )?;
                if let Some((a, part)) = padded {
                    write!(
                        f,
                        "; `{a}` has it only padded (`{part}`), and padding cannot be undone (`7` and `07` render alike)"
                    )?;
                }
                Ok(())
            }
            Irreversible::Removed { attr, by } => {
                let by = match by {
                    Removal::Drop => "`[options] drop`",
                    Removal::Remove => "the rule's `remove`",
                };
                write!(
                    f,
                    "`{attr}` is removed by {by}, so the target does not hold it"
                )
            }
            Irreversible::Overwritten { attr, by } => write!(
                f,
                "the rule reads `{attr}`, but {by} writes over it, so its source value is not on the target"
            ),
            Irreversible::Adjacent { attr, left, right } => write!(
                f,
                "`{attr}`'s template puts `{left}` and `{right}` side by side: no literal text says where one ends"
            ),
            Irreversible::Overlap { other } => write!(
                f,
                "its target keys can take the same values as rule `{other}`'s, so some target items could come from either"
            ),
        }
    }
}
