//! `rekey loadtest`'s pure parts: the skewed workload a plan's keys are
//! drawn from, what a run's answers add up to, and what a run will cost.
//!
//! * [`scenario`] — the tenant population (70/20/9/1) and the named
//!   scenarios, as data; a seeded sequence (SplitMix64), so a seed names a
//!   run and both designs replay the same requests;
//! * [`workload`] — a plan's rule → source items in its shapes and reads of
//!   its logical keys (the new design's through `transform` and the read
//!   path's key fan-out);
//! * [`report`] — answers → requests, throttles by reason, hottest keys,
//!   latency percentiles, a verdict;
//! * [`cost`] — the estimate printed before a run against AWS.
//!
//! The calls are `aws`'s, the run loop and its clock `phase::loadtest`'s,
//! the printing `ops`'.

pub(crate) mod cost;
pub(crate) mod report;
pub(crate) mod scenario;
pub(crate) mod workload;
