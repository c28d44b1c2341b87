//! rekey re-keys live DynamoDB tables online: it copies every item into a new
//! key design while the application keeps writing.
//!
//! # Module map
//!
//! The pure core — no I/O, no clock, tested as plain functions:
//! * [`value`] — the item model: every DynamoDB type, numbers as decimal text,
//!   DynamoDB JSON, item size by DynamoDB's rules.
//! * [`hash`], [`bucket`] — the documented functions plans use: `shard()`
//!   hashes applications can reproduce, and time buckets.
//! * [`template`] — key shapes (`TENANT#{tenant}`) and templates
//!   (`…#SHARD#{shard(id,16):02}`): parse, match, render.
//! * [`plan`] — plan files: raw TOML → validated [`plan::Plan`], errors at
//!   `file:line:col`.
//! * [`transform`] — one source item → the target item, a reject, or a skip.
//!
//! Around it:
//! * [`aws`] — owns the AWS SDK clients, resolves each one's endpoint
//!   ([`aws::endpoint`]), and turns SDK errors into errors that name the
//!   table, the service's endpoint and where it came from, or the IAM action.
//! * [`scan`] — parallel segmented Scan, page by page, under a [`rate`] budget.
//! * [`write`] — BatchWriteItem with UnprocessedItems retried.
//! * [`tail`] — DynamoDB Streams into the target, per-item order across shard
//!   lineage, buffered until the backfill is complete; publishes its lag.
//! * [`watch`] — a short-lived second stream reader for verify's re-checks:
//!   which source items were written, and which target keys they map to.
//! * [`barrier`] — the drain barrier: a marker written to the source that
//!   proves the tail has applied everything before it.
//! * [`status`] — the JSON snapshots each driver publishes in the state
//!   directory, so other processes read a migration without its locks;
//!   `rekey status`.
//! * [`state`] — owns sled: the per-plan state directory, checkpoints,
//!   the plan fingerprint.
//! * [`claims`] — the backfill's on-disk claim index (target key → source
//!   key) that catches collisions before anything is written, in flat memory.
//! * [`spill`] — external sort-aggregate: exact counts over more keys than fit
//!   in memory.
//! * [`analyze`] — the dry run: collisions, rejects, old vs new key load.
//! * [`backfill`] — the copy: Scan → transform → conditional puts, checkpointed;
//!   [`control`] pauses it and changes its rates while it runs.
//! * [`lifecycle`] — `rekey run`: analyze gate, tail, backfill, catch-up,
//!   verify, ready for cutover, in one resumable command.
//! * [`cutover`] — gates, the postpone flag, the drain barrier, the durable
//!   cutover record; `rekey finish`.
//! * [`verify`] — both ways, checkpointed: every source item's transform is
//!   in the target exactly, every target item maps back to a source item;
//!   differences re-checked against the tail's progress before they count.
//! * [`inplace`] — in-place mode (target = source): the conditional
//!   UpdateItem of just the computed attributes, pinned to the inputs they were
//!   computed from (pure decision, I/O apply with re-read on conflict), undo,
//!   and `check_item` for verify.
//! * [`check`] — plan validation and sample items before/after.
//! * [`itemfile`], [`rejects`] — DynamoDB JSON files in and out.
//! * [`progress`] — owns terminal progress output.
//! * [`export`] — reads DynamoDB S3 exports (manifest, gzip DynamoDB JSON),
//!   streaming, from S3 or a local copy.
//! * [`local`] — starts the local AWS (moto: DynamoDB, Streams, S3) for tests
//!   and the demo, as a child process that dies with rekey.
//! * [`demo`] — `rekey demo`: a skewed table re-keyed under live writes,
//!   analyze to finish, with a built-in application and a before/after.
//! * [`iam`] — `rekey iam-policy`: the least-privilege IAM policy a plan's
//!   commands need, from the list of AWS actions the code calls.
//! * [`redact`] — key values out of terminal and `--json` output (stable
//!   hashed tokens, the plan's shapes and shard numbers kept readable) unless
//!   `--show-keys`.
//! * [`cli`], [`commands`] — arguments, dispatch, exit codes.

pub mod aws;
pub mod core;
pub mod local;
pub mod ops;
pub mod phase;
pub mod state;
