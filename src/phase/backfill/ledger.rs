//! A backfill's books: counters, the rejects file and resume points,
//! committed together, one page at a time.

use std::collections::BTreeSet;

use crate::core::plan::Plan;
use crate::core::value::{Item, encode_key};
use crate::state::StateStore;
use crate::state::claims::Claims;
use crate::state::rejects::RejectsFile;

use super::{Counters, Keys};

/// A page read, transformed and written: what its checkpoint commits.
pub(super) struct PageDone {
    /// The checkpoint's key (a segment's or an export file's).
    pub(super) key: String,
    /// The resume point after this page.
    pub(super) state: serde_json::Value,
    pub(super) counts: Counters,
    pub(super) rejects: Vec<(Item, String)>,
    /// The stream's last page, or a stop: an open import part is written now.
    pub(super) last: bool,
}

/// Shared state of a run: counters, rejects file, checkpoint commits.
pub(super) struct Ledger {
    pub(super) keys: Keys,
    pub(super) store: StateStore,
    /// None when the plan proves a target key has one source key
    /// ([`crate::core::inverse::key_injective`]): nothing to claim.
    pub(super) claims: Option<Claims>,
    pub(super) totals: Counters,
    pub(super) this_run: Counters,
    pub(super) rejects: RejectsFile,
}

impl Ledger {
    /// Commit one page: its rejects, counters and resume point, atomically.
    pub(super) fn commit(
        &mut self,
        key: &str,
        state: &serde_json::Value,
        page: &Counters,
        rejects: &[(Item, String)],
    ) -> anyhow::Result<()> {
        self.commit_with(key, state, page, rejects, &[])
    }

    /// [`Ledger::commit`], with `extra` entries in the same batch (an
    /// import's next part number).
    pub(super) fn commit_with(
        &mut self,
        key: &str,
        state: &serde_json::Value,
        page: &Counters,
        rejects: &[(Item, String)],
        extra: &[(&str, serde_json::Value)],
    ) -> anyhow::Result<()> {
        for (item, reason) in rejects {
            self.rejects.write(item, reason)?;
        }
        let len = self.rejects.flush_len()?;
        self.totals.add(page);
        self.this_run.add(page);
        let (counters, rejects_len) = (self.keys.counters(), self.keys.rejects_len());
        let mut entries = vec![
            (key, state.clone()),
            (counters.as_str(), serde_json::to_value(self.totals)?),
            (rejects_len.as_str(), serde_json::to_value(len)?),
        ];
        entries.extend(extra.iter().cloned());
        self.store.put_batch(&entries)?;
        self.store.flush()?;
        // The resume point itself holds key values: only its name and the counts.
        tracing::info!(
            checkpoint = key,
            scanned = page.scanned,
            written = page.written,
            rejected = page.rejected,
            skipped = page.skipped,
            total_scanned = self.totals.scanned,
            "checkpoint committed"
        );
        Ok(())
    }
}

/// Where a Scan segment resumes after a page: done, after a key, or — a stop
/// came in the middle of a page — from a page's start again, skipping the
/// items already counted (named by [`super::page::digest`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resume {
    Done,
    After(Item),
    Partial {
        /// The page's start (None: the segment's beginning).
        from: Option<Item>,
        done: Vec<String>,
    },
}

/// A page read from `from` up to `next`, over a checkpoint that carried
/// `carried` (the re-read met `met` of them, skipped), whose processing
/// settled `partial` (None: all of it).
pub(crate) struct PageEnd {
    pub(crate) from: Option<Item>,
    pub(crate) next: Option<Item>,
    pub(crate) carried: BTreeSet<String>,
    pub(crate) met: BTreeSet<String>,
    pub(crate) partial: Option<Vec<String>>,
}

impl PageEnd {
    /// The checkpoint after the page. Stopped mid-page: the same start, and
    /// every item counted so far. Whole: after the page, still carrying the
    /// counted items it did not meet — a re-read under live writes can end
    /// its page earlier, and they may be in the next one.
    pub(crate) fn resume(self) -> Resume {
        let PageEnd {
            from,
            next,
            mut carried,
            met,
            partial,
        } = self;
        if let Some(done) = partial {
            carried.extend(done);
            return Resume::Partial {
                from,
                done: carried.into_iter().collect(),
            };
        }
        let Some(next) = next else {
            return Resume::Done;
        };
        carried.retain(|d| !met.contains(d));
        if carried.is_empty() {
            Resume::After(next)
        } else {
            Resume::Partial {
                from: Some(next),
                done: carried.into_iter().collect(),
            }
        }
    }
}

/// Of a page's items, those not counted before a stop (`carried`), and the
/// digests of those that were (skipped now: counted once).
pub(crate) fn skip_counted(
    plan: &Plan,
    items: Vec<Item>,
    carried: &BTreeSet<String>,
) -> (Vec<Item>, BTreeSet<String>) {
    if carried.is_empty() {
        return (items, BTreeSet::new());
    }
    let names = plan.source_key.names();
    let mut met = BTreeSet::new();
    let keep = items
        .into_iter()
        .filter(|it| match digest(it, &names) {
            Some(d) if carried.contains(&d) => {
                met.insert(d);
                false
            }
            _ => true,
        })
        .collect();
    (keep, met)
}

/// The name a partial checkpoint gives an item: the MD5 of its encoded
/// source key, hex (a fixed 32 bytes whatever the key, and, after a re-read
/// under live writes, the same item by key whatever its attributes became).
pub(super) fn digest(key: &Item, names: &[&str]) -> Option<String> {
    use md5::{Digest, Md5};
    let k = encode_key(key, names)?;
    Some(format!(
        "{:032x}",
        u128::from_be_bytes(Md5::digest(&k).into())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;

    fn key(pk: &str) -> Item {
        let mut k = Item::new();
        k.insert("PK".into(), Value::S(pk.into()));
        k
    }

    fn set(ds: &[&str]) -> BTreeSet<String> {
        ds.iter().map(|d| d.to_string()).collect()
    }

    fn end(carried: &[&str], met: &[&str], partial: Option<&[&str]>) -> PageEnd {
        PageEnd {
            from: Some(key("a")),
            next: Some(key("z")),
            carried: set(carried),
            met: set(met),
            partial: partial.map(|p| p.iter().map(|d| d.to_string()).collect()),
        }
    }

    #[test]
    fn a_whole_page_resumes_after_it() {
        assert_eq!(end(&[], &[], None).resume(), Resume::After(key("z")));
        let last = PageEnd {
            next: None,
            ..end(&["x"], &[], None)
        };
        assert_eq!(last.resume(), Resume::Done, "a finished segment forgets");
    }

    #[test]
    fn a_stop_resumes_from_the_pages_start_with_everything_counted() {
        assert_eq!(
            end(&["c"], &["c"], Some(&["d", "b"])).resume(),
            Resume::Partial {
                from: Some(key("a")),
                done: vec!["b".into(), "c".into(), "d".into()],
            }
        );
    }

    #[test]
    fn counted_items_not_met_again_are_carried_to_the_next_page() {
        assert_eq!(
            end(&["b", "c"], &["b", "c"], None).resume(),
            Resume::After(key("z"))
        );
        assert_eq!(
            end(&["b", "c"], &["b"], None).resume(),
            Resume::Partial {
                from: Some(key("z")),
                done: vec!["c".into()],
            }
        );
    }
}
