//! What a verify reports: the mismatches file, examples, the plain text.

use std::path::Path;

use anyhow::Context as _;

use crate::core::value::Item;
use crate::state::StateStore;

use super::{Example, Kind, MM, Mismatch, VerifyReport};

// ---- output -------------------------------------------------------------------

/// The key a mismatch is known by, and whether it is a target key: the
/// source key, or the target key of an orphan.
pub(super) fn mismatch_key(m: &Mismatch) -> Option<(&Item, bool)> {
    match (m.kind, m.suspected, &m.source_key, &m.target_key) {
        (Kind::Orphan, _, _, Some(t)) | (_, Some(Kind::Orphan), _, Some(t)) => Some((t, true)),
        (_, _, Some(s), _) => Some((s, false)),
        _ => None,
    }
}

/// An example of a mismatch, named by its key as it is (the operator
/// surface redacts it).
pub(super) fn example(m: &Mismatch) -> Example {
    let named_by = mismatch_key(m).map(|(k, target)| (k.clone(), target));
    Example {
        kind: m.kind,
        key: named_by
            .as_ref()
            .map(|(k, _)| serde_json::to_string(k).unwrap_or_default())
            .unwrap_or_default(),
        named_by,
        attributes: m.attributes.clone(),
    }
}

pub(super) const EXAMPLES: usize = 20;

/// Stream the confirmed mismatches from the store into the mismatches file
/// (atomically replaced) and return the first few as examples.
pub(super) fn write_mismatches(store: &StateStore, path: &Path) -> anyhow::Result<Vec<Example>> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(f);
    let mut examples = Vec::new();
    for kv in store.iter_prefix::<Mismatch>(MM) {
        let (_, m) = kv?;
        serde_json::to_writer(&mut out, &m)?;
        out.write_all(b"\n")?;
        if examples.len() < EXAMPLES {
            examples.push(example(&m));
        }
    }
    out.flush()?;
    out.get_ref().sync_data()?;
    drop(out);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(examples)
}

/// The plain-text report. Keys appear as `‹…›` tokens unless `--show-keys`.
pub(crate) fn render(r: &VerifyReport) -> String {
    use std::fmt::Write as _;
    let c = &r.result.counts;
    let mut out = String::new();
    let verdict = if r.result.clean {
        "clean"
    } else {
        "DIFFERENCES FOUND"
    };
    let _ = writeln!(
        out,
        "verify {} → {}: {verdict}{}",
        r.result.source_table,
        r.result.target_table,
        match r.result.sample_percent {
            Some(p) => format!(" (sample of {p}%, forward only)"),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "  source: {} scanned = {} matched + {} mismatched ({} missing, {} different, {} unconfirmed) + {} rejected ({} collisions) + {} skipped{}",
        c.scanned,
        c.matched,
        c.mismatched(),
        c.missing,
        c.different,
        c.unconfirmed,
        c.rejected,
        c.collisions,
        c.skipped,
        if c.unsampled > 0 {
            format!(" + {} not sampled", c.unsampled)
        } else {
            String::new()
        }
    );
    if r.result.sample_percent.is_none() {
        let _ = writeln!(
            out,
            "  target: {} scanned = {} mapped back + {} orphans + {} unconfirmed",
            c.target_scanned, c.target_matched, c.orphans, c.unconfirmed_orphans
        );
    }
    if c.resolved > 0 {
        let _ = writeln!(
            out,
            "  {} transient differences resolved on re-check (the tail caught up)",
            c.resolved
        );
    }
    if let Some(s) = &r.sample {
        let _ = writeln!(
            out,
            "  estimated mismatch rate {:.4}% ({} of {} compared), at most {:.4}% with 95% confidence",
            s.mismatch_rate * 100.0,
            s.mismatched,
            s.compared,
            s.mismatch_rate_upper_95 * 100.0
        );
    }
    for e in &r.examples {
        let _ = write!(out, "  {:?} {}", e.kind, e.key);
        if !e.attributes.is_empty() {
            let _ = write!(out, " (attributes: {})", e.attributes.join(", "));
        }
        out.push('\n');
    }
    if !r.result.clean {
        let _ = writeln!(
            out,
            "  every difference, with its keys: {}",
            r.mismatches_file
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    if let Some(rep) = &r.repair {
        let _ = writeln!(
            out,
            "  repair: {} rewritten, {} orphans deleted, {} skipped (source gone); {} still differ",
            rep.rewritten, rep.deleted, rep.skipped, rep.still_different
        );
        for e in &rep.examples {
            let _ = writeln!(out, "    still {:?} {}", e.kind, e.key);
        }
    }
    let _ = writeln!(
        out,
        "  {:.0} RCU source, {:.0} RCU target in {:.1} s{}",
        r.consumed_rcu_source,
        r.consumed_rcu_target,
        r.elapsed_seconds,
        if r.resumed {
            format!(" (resumed; this run scanned {})", r.this_run_scanned)
        } else {
            String::new()
        }
    );
    out
}
