//! The randomized whole-lifecycle campaign (issue 25): `scripts/soak
//! [TRIALS] [--seed S]` runs [`campaign`]. Not in CI: a trial takes 170–350 s
//! on 2 cores, more than CI's budget has left (BENCHMARKS.md, "Soak", has the
//! figures).
//!
//! A trial draws everything from its seed: a source and a target on the
//! local server, behind a proxy that models partitions (scaled down, so
//! rekey's own traffic meets their limits), HTTP 500s and connection resets,
//! and a streams front with 16 to 64 shards that delay records, answer empty
//! pages in runs, roll over and split. Then run → cutover → rollback →
//! cutover → finish, every rekey process killed with -9 at random points and
//! started again, and the application writing whichever side is live.
//!
//! The checker shares no code with rekey's verify, nor with its transform: it
//! keeps its own record of every write the application had acknowledged,
//! renders the target's shape itself (FNV-1a, as docs/hashes.md gives it),
//! and after each switch compares both tables with that record: nothing
//! lost, nothing stale, no delete resurrected, target == plan(source) and
//! source == inverse(target).

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use rekey::core::value::Value;
use rekey_testkit::partitions::{Mode, PartitionOptions};
use rekey_testkit::proxy::{Faults, Proxy, ProxyOptions};
use rekey_testkit::streams::{StreamsFront, StreamsOptions};

use crate::support::plan::orders_by_status;
use crate::support::workload::{Rng, STATUSES, order};
use crate::support::*;

/// `scripts/soak`: SOAK_TRIALS trials (default 200) from SOAK_SEED (default:
/// the clock), SOAK_PARALLEL at once (default 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long campaign: scripts/soak"]
async fn campaign() {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let trials = var("SOAK_TRIALS").unwrap_or(200);
    let parallel = var("SOAK_PARALLEL").unwrap_or(3) as usize;
    let first = var("SOAK_SEED").unwrap_or_else(|| Rng::from_time().next() % 1_000_000);
    let seeds: Vec<u64> = (0..trials).map(|i| first + i).collect();
    let started = Instant::now();
    let failed = run_trials(&seeds, parallel).await;
    eprintln!(
        "soak: {} trials from seed {first}, {} failed, in {:.0} s",
        seeds.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "failing seeds (rerun one with scripts/soak 1 --seed S): {failed:?}"
    );
}

/// Runs the trials of `seeds`, `parallel` at a time; the seeds that failed.
async fn run_trials(seeds: &[u64], parallel: usize) -> Vec<u64> {
    use futures::FutureExt;
    use futures::stream::{self, StreamExt};
    let results: Vec<(u64, Result<String, String>)> = stream::iter(seeds.iter().copied())
        .map(|seed| async move {
            let started = Instant::now();
            let r = std::panic::AssertUnwindSafe(trial(seed))
                .catch_unwind()
                .await
                .unwrap_or_else(|e| {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(format!("panicked: {why}"))
                });
            let secs = started.elapsed().as_secs_f64();
            match &r {
                Ok(what) => eprintln!("soak seed {seed}: ok in {secs:.0} s ({what})"),
                Err(why) => eprintln!("soak seed {seed}: FAILED after {secs:.0} s: {why}"),
            }
            (seed, r)
        })
        .buffer_unordered(parallel.max(1))
        .collect()
        .await;
    results
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .map(|(s, _)| s)
        .collect()
}

/// `rekey run` as a child process, killed with -9 when dropped (a trial
/// that ends early leaves nothing running).
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a trial draws from its seed.
#[derive(Debug)]
struct Knobs {
    shards: u32,
    delay_max_ms: u64,
    empty_run_ratio: f64,
    rollover_secs: u64,
    table_write: f64,
    errors_500: f64,
    resets: f64,
    seed_items: u64,
}

impl Knobs {
    fn draw(rng: &mut Rng) -> Knobs {
        Knobs {
            shards: 16 + rng.below(49) as u32,
            delay_max_ms: rng.below(2000),
            empty_run_ratio: rng.below(40) as f64 / 100.0,
            rollover_secs: 20 + rng.below(40),
            table_write: 200.0 + rng.below(600) as f64,
            errors_500: rng.below(3) as f64 / 100.0,
            resets: rng.below(2) as f64 / 100.0,
            seed_items: 100 + rng.below(200),
        }
    }
}

/// One trial's world: the servers, the tables, the application's record.
struct World {
    // Dropped first: nothing may reach the proxy once the servers behind it are gone.
    _proxy: Proxy,
    front: StreamsFront,
    env: TestEnv,
    source: String,
    target: String,
    plan: String,
    state: String,
    extra: Vec<(&'static str, String)>,
    /// Order id → (status, v) as the application last had it acknowledged;
    /// None: deleted.
    model: Mutex<BTreeMap<u64, Option<(String, u64)>>>,
    /// Every write gets a `v` no other write has.
    next_v: std::sync::atomic::AtomicU64,
    /// `run`'s log, outside the trial's directory: a failed trial leaves it
    /// behind (its path is in the failure), a passed one removes it.
    log: std::path::PathBuf,
    seed: u64,
    started: Instant,
}

/// Ids the application writes: some beyond the seed, so some are new.
const IDS: u64 = 400;

/// The application's writers at once. Each owns the ids equal to its number
/// modulo this, so the application's record of an order follows the order
/// its writes were acknowledged in.
const WRITERS: u64 = 4;

/// How long `run` may take to be ready for cutover before the trial calls it
/// hung. A bound for a hang, not a speed test: two trials at once on two
/// cores, with a build beside them, took over 120 s (their tails 16 s behind,
/// `run`'s verify waiting on them), as no trial alone did.
const READY_WITHIN: Duration = Duration::from_secs(300);

async fn trial(seed: u64) -> Result<String, String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let knobs = Knobs::draw(&mut rng);
    let w = World::start(&knobs, seed).await?;
    let result = lifecycle(&w, &knobs, &mut rng).await;
    match &result {
        Ok(_) => {
            let _ = std::fs::remove_file(&w.log);
        }
        Err(_) => eprintln!("soak seed {seed}: run's whole log: {}", w.log.display()),
    }
    result
}

/// run → cutover → rollback → cutover → finish, checked after each switch.
async fn lifecycle(w: &World, knobs: &Knobs, rng: &mut Rng) -> Result<String, String> {
    let mut run = w.spawn_run();

    // 1. run: capture, backfill, catch-up, verify, while the application
    //    writes the source and run is killed at random points.
    let ops = 150 + rng.below(250) as usize;
    let (_, r) = tokio::join!(
        w.source_app(ops, rng.next()),
        w.kill_run_during(&mut run, rng, 2)
    );
    r?;
    w.step("the source application done");
    w.until_ready(&mut run).await?;
    w.step("ready for cutover");
    w.switch("cutover", rng).await?;
    w.step("cut over");
    w.check("after the cutover").await?;

    // 2. The application moves to the target; run's reverse tail carries it
    //    back and is killed; the forward tail's split and rollovers go on.
    w.front.split(rng.below(u64::from(knobs.shards)) as usize);
    let ops = 100 + rng.below(200) as usize;
    let (_, r) = tokio::join!(
        w.target_app(ops, rng.next()),
        w.kill_run_during(&mut run, rng, 1)
    );
    r?;
    w.step("the target application done");
    if let Err(e) = w.verify(&["--reverse", "--show-keys"]) {
        // Which side is wrong, by the application's own record.
        let by_record = w.check("by the application's record").await.err();
        return Err(format!(
            "{e}; {}",
            by_record.unwrap_or("both tables match the application's record".into())
        ));
    }
    w.step("verified backwards");
    w.check("before the rollback").await?;
    w.switch("rollback", rng).await?;
    w.step("rolled back");
    w.check("after the rollback").await?;

    // 3. Back on the source, then cut over again.
    let ops = 100 + rng.below(200) as usize;
    let (_, r) = tokio::join!(
        w.source_app(ops, rng.next()),
        w.kill_run_during(&mut run, rng, 1)
    );
    r?;
    w.step("the source application done");
    w.verify(&[])?;
    w.step("verified");
    w.switch("cutover", rng).await?;
    w.step("cut over again");
    w.check("after the second cutover").await?;

    // 4. finish ends both tails.
    let out = w.rekey(&["finish", &w.plan, "--state-dir", &w.state]);
    if !out.status.success() {
        return Err(format!("finish: {}{}", stdout(&out), stderr(&out)));
    }
    w.step("finish drained");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = run.0.try_wait().expect("run's status") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "run still running 120 s after finish: {}",
                w.run_log()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if !status.success() {
        return Err(format!("run after finish: {status}: {}", w.run_log()));
    }
    w.step("finished");
    w.check("at the end").await?;
    for table in [&w.source, &w.target] {
        let left = w
            .env
            .scan_all(table)
            .await
            .into_iter()
            .filter(is_marker)
            .count();
        if left > 0 {
            return Err(format!("{left} markers left in `{table}` after finish"));
        }
    }
    let s = w.front.stats();
    Ok(format!(
        "{} shards listed, {} rollovers, {} splits, {} empty pages; {knobs:?}",
        s.per_shard.len(),
        s.rollovers,
        s.splits,
        s.empty_pages_forced + s.empty_pages_pending
    ))
}

impl World {
    async fn start(k: &Knobs, seed: u64) -> Result<World, String> {
        let env = TestEnv::start_local().await;
        let proxy = Proxy::start(ProxyOptions {
            faults: Faults {
                error_500_ratio: k.errors_500,
                reset_ratio: k.resets,
                latency: Duration::ZERO,
                seed,
            },
            shadow: env.shadow(),
            // Partitions scaled down tenfold, so that rekey's copy, not only
            // a production-sized load, meets their limits.
            partitions: Some(PartitionOptions {
                mode: Mode::Provisioned {
                    write: k.table_write,
                    read: 3.0 * k.table_write,
                },
                partition_write: 100.0,
                partition_read: 300.0,
                burst_seconds: 2.0,
                split_after: Duration::from_secs(3),
                ..PartitionOptions::default()
            }),
            ..ProxyOptions::pass_through(env.server())
        })
        .await
        .map_err(|e| format!("the proxy: {e:#}"))?;
        let front = StreamsFront::start(StreamsOptions {
            upstream: env.endpoint(),
            partitions: k.shards,
            delay_max: Duration::from_millis(k.delay_max_ms),
            empty_run_ratio: k.empty_run_ratio,
            empty_run_max: 6,
            rollover_every: Some(Duration::from_secs(k.rollover_secs)),
            describe_delay: Duration::from_millis(500),
            seed,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("the stream front: {e:#}"))?;
        let source = env.table_name("src");
        let target = env.table_name("dst");
        env.create_streamed_table(&source, &pk_only()).await;
        env.create_streamed_table(&target, &pk_sk()).await;
        let seeded: Vec<_> = (0..k.seed_items)
            .map(|i| order(i, STATUSES[(i % 3) as usize], i))
            .collect();
        env.put(&source, &seeded).await;
        let model = (0..k.seed_items)
            .map(|i| (i, Some((STATUSES[(i % 3) as usize].to_string(), i))))
            .collect();
        let (plan_path, _) = orders_by_status(&source, &target).write(&env);
        let state = env.dir.path().join("state");
        let log = std::env::temp_dir().join(format!("rekey-soak-{seed}-run.log"));
        let _ = std::fs::remove_file(&log);
        let extra = vec![
            ("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint()),
            ("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", front.endpoint()),
            // The SDK's default attempts, as an operator runs rekey (the rest
            // of the suite runs with 1, so that rekey's own retries show).
            ("AWS_MAX_ATTEMPTS", "3".to_string()),
        ];
        Ok(World {
            _proxy: proxy,
            front,
            env,
            source,
            target,
            plan: plan_path.to_str().unwrap().to_string(),
            state: state.to_str().unwrap().to_string(),
            extra,
            model: Mutex::new(model),
            next_v: std::sync::atomic::AtomicU64::new(1_000_000),
            log,
            seed,
            started: Instant::now(),
        })
    }

    /// Where the trial is, and when: a slow trial shows which step took the time.
    fn step(&self, what: &str) {
        let secs = self.started.elapsed().as_secs_f64();
        eprintln!("soak seed {}: {secs:6.1} s {what}", self.seed);
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let extra: Vec<(&str, &str)> = self.extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.env.command(args, &extra)
    }

    fn rekey(&self, args: &[&str]) -> std::process::Output {
        self.command(args).output().expect("run rekey")
    }

    /// `rekey run`, its stderr appended to [`World::log`] (a pipe nobody
    /// read would fill and stop it).
    fn spawn_run(&self) -> Run {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("run's log");
        let child = self
            .command(&[
                "run",
                &self.plan,
                "--state-dir",
                &self.state,
                "--skip-analyze",
                "--json",
            ])
            .env(
                "RUST_LOG",
                std::env::var("SOAK_RUST_LOG").unwrap_or("rekey=info".into()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rekey run");
        Run(child)
    }

    /// The end of what `run` printed on stderr.
    fn run_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Kills `run` with -9 `kills` times at random points, starting it again
    /// each time.
    async fn kill_run_during(
        &self,
        run: &mut Run,
        rng: &mut Rng,
        kills: u32,
    ) -> Result<(), String> {
        for _ in 0..kills {
            tokio::time::sleep(Duration::from_millis(300 + rng.below(2500))).await;
            if let Ok(Some(status)) = run.0.try_wait() {
                return Err(format!(
                    "run exited before it was killed: {status}: {}",
                    self.run_log()
                ));
            }
            *run = self.spawn_run(); // the old one is killed as it is dropped
        }
        Ok(())
    }

    /// Waits until `rekey status` says ready for cutover (run alive).
    async fn until_ready(&self, run: &mut Run) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = run.0.try_wait() {
                return Err(format!("run exited with {status}: {}", self.run_log()));
            }
            let out = self.rekey(&["status", &self.plan, "--state-dir", &self.state, "--json"]);
            let phase = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .map(|s| s["phase"].clone())
                .unwrap_or_default();
            if phase == "ready_for_cutover" {
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                let status = String::from_utf8_lossy(&out.stdout).to_string();
                return Err(format!(
                    "not ready for cutover after {} s: {status}; run: {}",
                    READY_WITHIN.as_secs(),
                    self.run_log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `cutover` or `rollback`, killed with -9 once at a random point half the
    /// time, then run to its end: exit 0.
    async fn switch(&self, cmd: &str, rng: &mut Rng) -> Result<(), String> {
        let args = [
            cmd,
            &self.plan,
            "--state-dir",
            &self.state,
            "--wait",
            "120",
            "--drain-timeout",
            "120",
            // The lag gate bounds how long the final drain takes; soundness
            // is the barrier's. On up to 64 shards that each delay records
            // and answer empty pages in runs, the least-fresh shard is
            // seconds behind most of the time, as an operator of such a
            // stream would see: they raise the gate, as here.
            "--max-lag",
            "30",
        ];
        if rng.below(2) == 0 {
            let mut child = self
                .command(&args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn rekey");
            tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
            let _ = child.kill();
            let _ = child.wait();
        }
        let out = output(self.command(&args)).await;
        match out.status.code() {
            Some(0) => Ok(()),
            code => Err(format!(
                "{cmd} exited {code:?}: {}{}; the tails: {}; run's log ends: {}",
                stdout(&out),
                stderr(&out),
                self.tails(),
                self.run_log()
            )),
        }
    }

    /// The shards each tail's status shows furthest behind, for a failure.
    fn tails(&self) -> String {
        let mut out = Vec::new();
        for name in ["tail", "reverse"] {
            let path = std::path::Path::new(&self.state)
                .join(name)
                .join("status.json");
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            let s: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
            let mut shards: Vec<&serde_json::Value> = s["shards"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            shards.sort_by(|a, b| {
                let lag = |x: &serde_json::Value| x["lag_seconds"].as_f64().unwrap_or(f64::MAX);
                lag(b).total_cmp(&lag(a))
            });
            shards.truncate(4);
            out.push(format!(
                "{name}: applied_through {}, lag {}, {} shards, behind: {}",
                s["applied_through"],
                s["lag_seconds"],
                s["shards"].as_array().map_or(0, Vec::len),
                serde_json::to_string(&shards).unwrap_or_default()
            ));
        }
        out.join("; ")
    }

    fn verify(&self, extra: &[&str]) -> Result<(), String> {
        let mut args = vec!["verify", &self.plan, "--state-dir", &self.state, "--json"];
        args.extend(extra);
        let mut cmd = self.command(&args);
        // SOAK_RUST_LOG: verify's own events go to run's log too, so that a
        // slow re-check shows what it waited on.
        let log = std::env::var("SOAK_RUST_LOG").ok();
        if let Some(filter) = &log {
            cmd.env("RUST_LOG", filter);
        }
        let out = cmd.output().expect("run rekey");
        if log.is_some() {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log) {
                let _ = f.write_all(&out.stderr);
            }
        }
        match out.status.success() {
            true => Ok(()),
            false => Err(format!(
                "verify {extra:?}: {}{}; the tails: {}; run: {}",
                stdout(&out),
                stderr(&out),
                self.tails(),
                self.run_log()
            )),
        }
    }

    fn v(&self) -> u64 {
        self.next_v
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn record(&self, id: u64, state: Option<(String, u64)>) {
        self.model.lock().unwrap().insert(id, state);
    }

    fn current(&self, id: u64) -> Option<(String, u64)> {
        self.model.lock().unwrap().get(&id).cloned().flatten()
    }

    /// The application on the source: `ops` acknowledged writes from
    /// [`WRITERS`] writers at once, each write recorded once DynamoDB
    /// acknowledged it.
    async fn source_app(&self, ops: usize, seed: u64) {
        let writers = (0..WRITERS).map(|w| {
            self.source_writer(
                ops / WRITERS as usize,
                seed ^ (w + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                w,
            )
        });
        futures::future::join_all(writers).await;
    }

    /// One writer of [`World::source_app`]: the orders whose id is `worker`
    /// modulo [`WRITERS`], so that each order's writes keep their order.
    async fn source_writer(&self, ops: usize, seed: u64, worker: u64) {
        let mut rng = Rng(seed);
        let c = &self.env.clients.dynamodb;
        for n in 0..ops {
            let id = rng.below(IDS / WRITERS) * WRITERS + worker;
            let key = AttributeValue::S(format!("O#{id}"));
            let status = STATUSES[rng.below(3) as usize];
            let v = self.v();
            match rng.below(10) {
                0..=3 => {
                    c.update_item()
                        .table_name(&self.source)
                        .key("PK", key)
                        .update_expression("SET #s = :s, v = :v")
                        .expression_attribute_names("#s", "status")
                        .expression_attribute_values(":s", AttributeValue::S(status.into()))
                        .expression_attribute_values(":v", AttributeValue::N(v.to_string()))
                        .send()
                        .await
                        .map(drop)
                        .unwrap_or_else(|e| acked("source", &e));
                    self.record(id, Some((status.into(), v)));
                }
                4..=5 => {
                    let r = c
                        .update_item()
                        .table_name(&self.source)
                        .key("PK", key)
                        .update_expression("SET v = :v")
                        .condition_expression("attribute_exists(PK)")
                        .expression_attribute_values(":v", AttributeValue::N(v.to_string()))
                        .send()
                        .await;
                    match r {
                        Ok(_) => {
                            let (s, _) = self.current(id).expect("the update found the order");
                            self.record(id, Some((s, v)));
                        }
                        Err(e)
                            if e.as_service_error()
                                .is_some_and(|s| s.is_conditional_check_failed_exception()) => {}
                        Err(e) => acked("source", &e),
                    }
                }
                6..=7 => {
                    c.delete_item()
                        .table_name(&self.source)
                        .key("PK", key)
                        .send()
                        .await
                        .map(drop)
                        .unwrap_or_else(|e| acked("source", &e));
                    self.record(id, None);
                }
                _ => {
                    let it = order(id, status, v);
                    c.put_item()
                        .table_name(&self.source)
                        .set_item(Some(rekey::aws::to_sdk_item(&it)))
                        .send()
                        .await
                        .map(drop)
                        .unwrap_or_else(|e| acked("source", &e));
                    self.record(id, Some((status.into(), v)));
                }
            }
            if n % 25 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// The application on the target, in the new key shape: a status change
    /// deletes the order's old key and puts the new one. [`WRITERS`] writers
    /// at once, as on the source.
    async fn target_app(&self, ops: usize, seed: u64) {
        let writers = (0..WRITERS).map(|w| {
            self.target_writer(
                ops / WRITERS as usize,
                seed ^ (w + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                w,
            )
        });
        futures::future::join_all(writers).await;
    }

    async fn target_writer(&self, ops: usize, seed: u64, worker: u64) {
        let mut rng = Rng(seed);
        let c = &self.env.clients.dynamodb;
        let key = |id: u64, status: &str| -> std::collections::HashMap<String, AttributeValue> {
            let (pk, sk) = target_key(id, status);
            [
                ("PK".to_string(), AttributeValue::S(pk)),
                ("SK".to_string(), AttributeValue::S(sk)),
            ]
            .into()
        };
        for n in 0..ops {
            let id = rng.below(IDS / WRITERS) * WRITERS + worker;
            let old = self.current(id);
            if rng.below(5) == 0 {
                if let Some((s, _)) = &old {
                    c.delete_item()
                        .table_name(&self.target)
                        .set_key(Some(key(id, s)))
                        .send()
                        .await
                        .map(drop)
                        .unwrap_or_else(|e| acked("target", &e));
                    self.record(id, None);
                }
                continue;
            }
            let status = STATUSES[rng.below(3) as usize];
            let v = self.v();
            if let Some((s, _)) = &old
                && s != status
            {
                c.delete_item()
                    .table_name(&self.target)
                    .set_key(Some(key(id, s)))
                    .send()
                    .await
                    .map(drop)
                    .unwrap_or_else(|e| acked("target", &e));
                self.record(id, None);
            }
            let mut item = key(id, status);
            item.insert("status".into(), AttributeValue::S(status.into()));
            item.insert("v".into(), AttributeValue::N(v.to_string()));
            c.put_item()
                .table_name(&self.target)
                .set_item(Some(item))
                .send()
                .await
                .map(drop)
                .unwrap_or_else(|e| acked("target", &e));
            self.record(id, Some((status.into(), v)));
            if n % 25 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Both tables against the application's record.
    async fn check(&self, stage: &str) -> Result<(), String> {
        let model = self.model.lock().unwrap().clone();
        let mut wrong = Vec::new();
        // The source: `O#id` → (status, v).
        let mut source: BTreeMap<u64, (String, u64)> = BTreeMap::new();
        for item in self.env.scan_all(&self.source).await {
            let pk = text(&item, "PK");
            if pk.starts_with(rekey::core::marker::MARKER_PREFIX) {
                continue;
            }
            let Some(id) = pk.strip_prefix("O#").and_then(|i| i.parse().ok()) else {
                wrong.push(format!("source: an item that is no order: {item:?}"));
                continue;
            };
            source.insert(id, (text(&item, "status"), number(&item, "v")));
        }
        // The target: (PK, SK) → (status, v).
        let mut target: BTreeMap<(String, String), (String, u64)> = BTreeMap::new();
        for item in self.env.scan_all(&self.target).await {
            let pk = text(&item, "PK");
            if pk.starts_with(rekey::core::marker::MARKER_PREFIX) {
                continue;
            }
            let mut names: Vec<&String> = item.keys().collect();
            names.sort();
            if names != ["PK", "SK", "status", "v"] {
                wrong.push(format!("target: attributes {names:?} in {item:?}"));
            }
            target.insert(
                (pk, text(&item, "SK")),
                (text(&item, "status"), number(&item, "v")),
            );
        }
        for (id, state) in &model {
            match (state, source.get(id)) {
                (None, Some(got)) => {
                    wrong.push(format!("source: {id} deleted, resurrected as {got:?}"))
                }
                (Some(want), None) => wrong.push(format!("source: {id} lost (want {want:?})")),
                (Some(want), Some(got)) if want != got => {
                    wrong.push(format!("source: {id} is {got:?}, want {want:?}"))
                }
                _ => {}
            }
        }
        for id in source.keys().filter(|id| !model.contains_key(id)) {
            wrong.push(format!("source: {id} was never written"));
        }
        let expected: BTreeMap<(String, String), (String, u64)> = model
            .iter()
            .filter_map(|(id, s)| s.clone().map(|(st, v)| (target_key(*id, &st), (st, v))))
            .collect();
        for (k, want) in &expected {
            match target.get(k) {
                None => wrong.push(format!("target: {k:?} lost (want {want:?})")),
                Some(got) if got != want => {
                    wrong.push(format!("target: {k:?} is {got:?}, want {want:?}"))
                }
                _ => {}
            }
        }
        for (k, got) in target.iter().filter(|(k, _)| !expected.contains_key(*k)) {
            wrong.push(format!("target: {k:?} = {got:?} should not exist"));
        }
        match wrong.is_empty() {
            true => Ok(()),
            false => {
                let n = wrong.len();
                wrong.truncate(12);
                Err(format!("{stage}: {n} wrong: {}", wrong.join("; ")))
            }
        }
    }
}

/// An application write DynamoDB did not acknowledge: the trial cannot go on.
fn acked(side: &str, e: &(dyn std::error::Error + 'static)) {
    panic!("{side} application: {}", rekey::aws::error_chain(e))
}

/// The target key of order `id` with `status`, as the plan's rule
/// (`ST#{@status}#{shard(id, 4)}`, `O#{id}`) gives it, computed here from
/// docs/hashes.md's FNV-1a.
fn target_key(id: u64, status: &str) -> (String, String) {
    let text = id.to_string();
    let mut h: u32 = 2_166_136_261;
    for b in text.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(16_777_619);
    }
    (format!("ST#{status}#{}", h % 4), format!("O#{id}"))
}

fn text(item: &rekey::core::value::Item, name: &str) -> String {
    match item.get(name) {
        Some(Value::S(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn number(item: &rekey::core::value::Item, name: &str) -> u64 {
    match item.get(name) {
        Some(Value::N(n)) => n.parse().unwrap_or(u64::MAX),
        _ => u64::MAX,
    }
}
