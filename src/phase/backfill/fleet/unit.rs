//! One unit (a Scan segment, or an export's data file: `export`) under a
//! lease: read from its last committed
//! checkpoint, page by page; each page transformed, its target keys claimed
//! in the control table (unless the plan is proven collision-free: then
//! there is nothing to claim), written under the fence, and committed with its
//! counters in one write conditioned on the lease.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::control::Cond;
use crate::aws::export::{DataFile, ExportReader};
use crate::aws::rate::Control;
use crate::aws::scan::Page;
use crate::core::plan::Plan;
use crate::core::value::Item;
use crate::phase::backfill::ledger::{PageEnd, Resume, skip_counted};
use crate::phase::backfill::page::{MAX_SETTLED, Settled, transform_page};
use crate::phase::backfill::writer::Writer;
use crate::phase::fleet::{LeaseLost, Shared, UnitScan, scan_unit};
use crate::state::claims::{Claim, Owners};
use crate::state::fleet::{Checkpoint, Counters, FleetError, Lease, Unit};
use crate::state::rejects::RejectsFile;

/// What every unit of a worker shares.
pub(super) struct UnitDrive {
    pub(super) clients: Clients,
    pub(super) plan: Arc<Plan>,
    pub(super) shared: Arc<Shared>,
    pub(super) writer: Arc<Writer>,
    pub(super) control: Arc<Control>,
    /// This worker's own rejects file; each line tagged (unit, lease, page).
    pub(super) rejects: Mutex<RejectsFile>,
    /// What this worker committed.
    pub(super) this: Mutex<Counters>,
    /// What a unit reads.
    pub(super) reads: Reads,
    /// Claims in flight at once.
    pub(super) claims_at_once: usize,
    /// Whether target keys are claimed at all ([`super::why_claim`]).
    pub(super) claims: bool,
}

/// What the units of a worker read.
pub(super) enum Reads {
    /// Unit n is segment n of a Scan in `segments`.
    Scan {
        segments: u32,
        page_limit: Option<i32>,
    },
    /// Unit n is a data file of the export, read `lines` lines a page.
    Export {
        files: Arc<ExportFiles>,
        lines: usize,
    },
}

/// The export a worker's units read, opened once (`export::join`).
pub(crate) struct ExportFiles {
    pub(super) reader: ExportReader,
    /// Each unit's data file.
    pub(super) files: HashMap<u32, DataFile>,
}

/// A page as read, on its way to its commit: its items, the records that
/// could not be read (each rejected; `bad` holds a rejects line for those
/// that have one), and where the unit resumes after it.
pub(super) struct PageRead {
    pub(super) items: Vec<Item>,
    pub(super) unreadable: u64,
    pub(super) bad: Vec<(Item, String)>,
    /// The checkpoint after the page, given what settled (None: all of it;
    /// else, on a stop, the digests of the items counted); None: commit
    /// nothing, the page is read again.
    pub(super) checkpoint: EndOfPage,
    /// How many settled items a partial checkpoint may name.
    pub(super) room: usize,
}

/// How a page's checkpoint follows from what settled (see [`PageRead`]).
pub(super) type EndOfPage = Box<dyn FnOnce(Option<Vec<String>>) -> Option<Checkpoint> + Send>;

impl UnitDrive {
    /// [`Drive::run`] for a Scan segment's unit: its pages from its checkpoint.
    pub(super) async fn run_segment(
        self: Arc<Self>,
        segments: u32,
        page_limit: Option<i32>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> anyhow::Result<bool> {
        let carried = match &unit.checkpoint {
            Checkpoint::Partial { done, .. } => done.iter().cloned().collect(),
            _ => BTreeSet::new(),
        };
        let carried = Arc::new(std::sync::Mutex::new(carried));
        let scan = UnitScan {
            table: self.plan.source_table.clone(),
            segments,
            segment: unit.n,
            page_limit,
            control: self.control.clone(),
            stop: stop.clone(),
        };
        let me = self.clone();
        scan_unit(&self.clients, scan, &unit, move |page, page_no| {
            let (me, stop, carried) = (me.clone(), stop.clone(), carried.clone());
            async move { me.page(l, page, page_no, &stop, &carried).await }
        })
        .await
    }

    pub(super) fn fence(&self, l: Lease) -> anyhow::Result<()> {
        if self.shared.may_write(l.unit, l) {
            Ok(())
        } else {
            Err(LeaseLost {
                unit: l.unit,
                lease: l.lease,
            }
            .into())
        }
    }

    /// One page of the Scan: see [`UnitDrive::commit_read`]. The items a
    /// stop checkpointed mid-page (`carried`) are skipped, counted once.
    async fn page(
        &self,
        l: Lease,
        mut page: Page,
        page_no: u64,
        stop: &CancellationToken,
        carried: &Arc<std::sync::Mutex<BTreeSet<String>>>,
    ) -> anyhow::Result<()> {
        let before = carried.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (items, met) = skip_counted(&self.plan, std::mem::take(&mut page.items), &before);
        let (from, next, shared) = (page.from, page.next, carried.clone());
        let read = PageRead {
            room: MAX_SETTLED.saturating_sub(before.len()),
            items,
            unreadable: page.unreadable,
            bad: Vec::new(),
            checkpoint: Box::new(move |partial| {
                if partial.as_ref().is_some_and(Vec::is_empty) {
                    return None;
                }
                let end = PageEnd {
                    from,
                    next,
                    carried: before,
                    met,
                    partial,
                };
                let resume = end.resume();
                let mut c = shared.lock().unwrap_or_else(|e| e.into_inner());
                *c = match &resume {
                    Resume::Partial { done, .. } => done.iter().cloned().collect(),
                    _ => BTreeSet::new(),
                };
                Some(match resume {
                    Resume::Done => Checkpoint::Done,
                    Resume::After(k) => Checkpoint::After(k),
                    Resume::Partial { from, done } => Checkpoint::Partial { from, done },
                })
            }),
        };
        self.commit_read(l, read, page_no, stop).await
    }

    /// Commits the unit's checkpoint and counters as of `pages` commits,
    /// under the lease: [`LeaseLost`] if it is gone (checked here first, and
    /// by the write's condition).
    pub(super) async fn commit_fenced(
        &self,
        l: Lease,
        checkpoint: &Checkpoint,
        counts: &Counters,
        pages: u64,
    ) -> anyhow::Result<()> {
        self.fence(l)?;
        let cond = self
            .shared
            .fleet
            .commit(l, checkpoint, counts, pages)
            .await?;
        if cond == Cond::Refused {
            return Err(LeaseLost {
                unit: l.unit,
                lease: l.lease,
            }
            .into());
        }
        Ok(())
    }

    /// One page: process, tag and write its rejects, commit under the lease.
    pub(super) async fn commit_read(
        &self,
        l: Lease,
        read: PageRead,
        page_no: u64,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        self.fence(l)?;
        let shared = self.shared.clone();
        let fence = move || shared.may_write(l.unit, l);
        let settled = self.process(read.items, &fence, stop, read.room).await?;
        let (mut counts, mut rejects) = (settled.counts, settled.rejects);
        if settled.partial.is_none() {
            // Unreadable records and bad lines have no key to name: counted
            // when their page is whole (a stopped page is read again).
            counts.scanned += read.unreadable;
            counts.rejected += read.unreadable;
            rejects.extend(read.bad);
        }
        let Some(checkpoint) = (read.checkpoint)(settled.partial) else {
            return Ok(());
        };
        // Lines first, durably; a page whose commit never lands is read again
        // and its lines written again, under a later lease (readers keep the
        // committing lease's lines: `state::fleet::committed_lease`).
        {
            let mut file = self.rejects.lock().await;
            let tag = serde_json::json!({"unit": l.unit, "lease": l.lease, "page": page_no});
            for (item, reason) in &rejects {
                file.write_tagged(item, reason, &tag)?;
            }
            file.flush_len()?;
        }
        self.commit_fenced(l, &checkpoint, &counts, page_no + 1)
            .await?;
        self.this.lock().await.add(&counts);
        tracing::info!(
            unit = l.unit,
            lease = l.lease,
            page = page_no,
            scanned = counts.scanned,
            written = counts.written,
            rejected = counts.rejected,
            skipped = counts.skipped,
            "checkpoint committed"
        );
        Ok(())
    }

    /// Transform, claim in the control table, write (fenced): the page's
    /// counters and rejects.
    async fn process(
        &self,
        items: Vec<Item>,
        fence: &(dyn Fn() -> bool + Sync),
        stop: &CancellationToken,
        room: usize,
    ) -> anyhow::Result<Settled> {
        let mut page = transform_page(&self.plan, items);
        if self.claims {
            let keys = page.claim_keys(&self.plan);
            let owners = self.claim(&keys).await?;
            page.keep_owned(&keys, owners);
        }
        let answers = self.writer.write_fenced(&page.puts, fence, stop).await?;
        Ok(page.written(&self.plan, answers, room))
    }

    /// Claims each target key in the control table, before the write as
    /// the local claim index does: who holds each (None: this item).
    async fn claim(&self, keys: &[Claim]) -> Result<Owners, FleetError> {
        self.shared.fleet.claim_all(keys, self.claims_at_once).await
    }
}
