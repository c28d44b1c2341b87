//! Benchmark: how fast rekey reads a DynamoDB S3 export (local copy) and
//! computes the new keys, next to plain `gzip -dc` of the same files.
//!
//! Generates N realistic order items (PK `TENANT#t#DAY#d` with a skewed tenant
//! mix, SK `ORDER#id`, ~250 bytes each) as a real export layout, then measures
//! side by side, with the same parallelism (P data files at a time, default 2):
//!
//! 1. rekey: `ExportReader::read_file` (gunzip + DynamoDB JSON parse) and
//!    `transform` with plans/tenant-day-shard.toml of every item, no writes;
//! 2. `gzip -dc FILE > /dev/null` of the same data files (the floor: the
//!    decompression alone, by a C program).
//!
//! (Also, for context: the reader alone, without `transform`.)
//! Each measurement is repeated R times (default 3) and the median is printed.
//! Files are read once before timing so every run reads from the page cache.
//!
//! Run:
//!   cargo build --release --example bench_export
//!   target/release/examples/bench_export [--items N] [--files F] [--parallel P]
//!       [--repeat R] [--dir DIR] [--write-only] [--transform-only]
//!
//! `--write-only --dir DIR` generates the export into DIR and exits (used by
//! scripts/bench/peak-rss). The generator is deterministic (SplitMix64, fixed
//! seed) and mirrored in scripts/bench/gen_items.py.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rekey::aws::export::{DataFile, ExportLocation, ExportReader};
use rekey::core::plan::Plan;
use rekey::core::transform::{Owned, transform_owned};
use rekey::core::value::{Item, Value};
use rekey_testkit::export::write_export;

/// The binary's allocator (src/main.rs), so this measures what `rekey` does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PLAN: &str = include_str!("../plans/tenant-day-shard.toml");
const EXPORT_ID: &str = "01767225600000-bench000";
const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:000000000000:table/orders";
const EXPORT_TIME_MS: i64 = 1_767_225_600_000;

// ---- the item generator (mirrored in scripts/bench/gen_items.py) ------------

/// SplitMix64: fixed and dependency-free, so Rust and Python agree.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick(&mut self, cumulative: &[u64]) -> usize {
        let total = *cumulative.last().unwrap();
        let r = self.next() % total;
        cumulative.iter().position(|&c| r < c).unwrap()
    }
}

/// 100 tenants: 70 normal (weight 1), 20 large (5), 9 enterprise (25),
/// 1 pathological (400): the last one writes about half of all orders.
const CLASSES: [(&str, u32, u64); 4] = [
    ("normal", 70, 1),
    ("large", 20, 5),
    ("enterprise", 9, 25),
    ("pathological", 1, 400),
];
const DAYS: [(&str, u64); 3] = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)];
const STATUSES: [&str; 5] = ["PLACED", "PAID", "SHIPPED", "DELIVERED", "CANCELLED"];
const CURRENCIES: [&str; 3] = ["USD", "EUR", "GBP"];
const STREETS: [&str; 8] = [
    "Main",
    "Oak",
    "Pine",
    "Maple",
    "Cedar",
    "Elm",
    "Washington",
    "Lake",
];
const CITIES: [&str; 8] = [
    "Springfield",
    "Riverside",
    "Franklin",
    "Greenville",
    "Bristol",
    "Clinton",
    "Fairview",
    "Salem",
];

struct Generator {
    rng: Rng,
    tenants: Vec<String>,
    tenant_cum: Vec<u64>,
    day_cum: Vec<u64>,
    n: u64,
    end: u64,
}

fn cumulative(weights: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut acc = 0;
    weights
        .map(|w| {
            acc += w;
            acc
        })
        .collect()
}

impl Generator {
    fn new(items: u64) -> Self {
        let mut tenants = Vec::new();
        let mut weights = Vec::new();
        for (name, count, weight) in CLASSES {
            for i in 0..count {
                tenants.push(format!("{name}-{i:02}"));
                weights.push(weight);
            }
        }
        Generator {
            rng: Rng(0x5EED_BE4C),
            tenants,
            tenant_cum: cumulative(weights.into_iter()),
            day_cum: cumulative(DAYS.iter().map(|d| d.1)),
            n: 0,
            end: items,
        }
    }
}

impl Iterator for Generator {
    type Item = Item;
    fn next(&mut self) -> Option<Item> {
        if self.n >= self.end {
            return None;
        }
        let n = self.n;
        self.n += 1;
        let r = &mut self.rng;
        let tenant = &self.tenants[r.pick(&self.tenant_cum)];
        let day = DAYS[r.pick(&self.day_cum)].0;
        let (a, b, c, d) = (r.next(), r.next(), r.next(), r.next());
        // n * odd constant is a bijection on u64: order ids are unique.
        let order_id = format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let ms = a % 86_400_000;
        let mut it = Item::new();
        let s = |v: String| Value::S(v);
        it.insert("PK".into(), s(format!("TENANT#{tenant}#DAY#{day}")));
        it.insert("SK".into(), s(format!("ORDER#{order_id}")));
        it.insert("order_id".into(), s(order_id));
        it.insert("customer_id".into(), s(format!("CUST#{:08x}", b >> 32)));
        it.insert("status".into(), s(STATUSES[(b % 5) as usize].into()));
        it.insert(
            "created_at".into(),
            s(format!(
                "{day}T{:02}:{:02}:{:02}.{:03}Z",
                ms / 3_600_000,
                ms / 60_000 % 60,
                ms / 1000 % 60,
                ms % 1000
            )),
        );
        let cents = c % 100_000;
        it.insert(
            "total".into(),
            Value::N(format!("{}.{:02}", cents / 100, cents % 100)),
        );
        it.insert(
            "currency".into(),
            s(CURRENCIES[(c >> 32) as usize % 3].into()),
        );
        it.insert("line_count".into(), Value::N((1 + d % 9).to_string()));
        it.insert(
            "ship_to".into(),
            s(format!(
                "{} {} Street, {}, {:05}",
                1 + (d >> 8) % 9999,
                STREETS[((d >> 24) % 8) as usize],
                CITIES[((d >> 32) % 8) as usize],
                (d >> 40) % 100_000
            )),
        );
        it.insert(
            "channel".into(),
            s(if d >> 63 == 0 { "web" } else { "mobile" }.into()),
        );
        Some(it)
    }
}

// ---- measurements ------------------------------------------------------------

#[derive(Default, Clone, Copy)]
struct Counts {
    items: u64,
    puts: u64,
    rejects: u64,
    bad_lines: u64,
    /// Bytes of new keys, so the work cannot be optimized away.
    key_bytes: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.items += o.items;
        self.puts += o.puts;
        self.rejects += o.rejects;
        self.bad_lines += o.bad_lines;
        self.key_bytes += o.key_bytes;
    }
}

/// Reads every file, `parallel` at a time, transforming each item if `plan`.
async fn rekey_pass(
    reader: Arc<ExportReader>,
    files: Arc<Vec<DataFile>>,
    plan: Option<Arc<Plan>>,
    parallel: usize,
) -> Counts {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..parallel {
        let (reader, files, plan, next) =
            (reader.clone(), files.clone(), plan.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut counts = Counts::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(file) = files.get(i) else { break };
                let (tx, mut rx) = rekey::aws::export::lines_channel(1024);
                let read = reader.read_file(file, 0, tx);
                let drain = async {
                    let mut c = Counts::default();
                    while let Some(line) = rx.recv().await {
                        c.items += 1;
                        match line.item {
                            Err(_) => c.bad_lines += 1,
                            Ok(item) => match &plan {
                                None => c.key_bytes += item.len() as u64,
                                // As the backfill does: the item is given away.
                                Some(plan) => match transform_owned(plan, item) {
                                    Owned::Put { item, .. } => {
                                        c.puts += 1;
                                        if let Some(Value::S(pk)) = item.get("PK") {
                                            c.key_bytes += pk.len() as u64;
                                        }
                                    }
                                    Owned::Reject(..) => c.rejects += 1,
                                    Owned::Skip => {}
                                },
                            },
                        }
                    }
                    c
                };
                let (summary, c) = tokio::join!(read, drain);
                summary.expect("reading an export file");
                counts.add(c);
            }
            counts
        }));
    }
    let mut total = Counts::default();
    for w in workers {
        total.add(w.await.unwrap());
    }
    total
}

/// `gzip -dc` of every file to /dev/null, `parallel` processes at a time.
fn gzip_pass(paths: &[PathBuf], parallel: usize) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = paths.get(i) else { break };
                    let status = Command::new("gzip")
                        .arg("-dc")
                        .arg(p)
                        .stdout(Stdio::null())
                        .status()
                        .expect("running gzip");
                    assert!(status.success(), "gzip -dc {} failed", p.display());
                }
            });
        }
    });
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn machine_info() {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .map(|l| l.trim_start_matches("MemTotal:").trim().to_string())
        .unwrap_or_default();
    println!(
        "machine: nproc={nproc}, cpu=\"{model}\", memory={mem} (shared machine: other builds may run)"
    );
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

struct Args {
    items: u64,
    files: usize,
    parallel: usize,
    repeat: usize,
    dir: Option<PathBuf>,
    write_only: bool,
    /// Only the in-memory transform, `repeat` times (for a profiler).
    transform_only: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        items: 1_000_000,
        files: 8,
        parallel: 2,
        repeat: 3,
        dir: None,
        write_only: false,
        transform_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--items" => a.items = val("--items").replace('_', "").parse().expect("--items N"),
            "--files" => a.files = val("--files").parse().expect("--files F"),
            "--parallel" => a.parallel = val("--parallel").parse().expect("--parallel P"),
            "--repeat" => a.repeat = val("--repeat").parse().expect("--repeat R"),
            "--dir" => a.dir = Some(PathBuf::from(val("--dir"))),
            "--write-only" => a.write_only = true,
            "--transform-only" => a.transform_only = true,
            "-h" | "--help" => {
                println!(
                    "bench_export [--items N (1000000)] [--files F (8)] [--parallel P (2)] \
                     [--repeat R (3)] [--dir DIR] [--write-only] [--transform-only]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(a.files >= 1 && a.parallel >= 1 && a.repeat >= 1);
    if a.write_only && a.dir.is_none() {
        eprintln!("--write-only needs --dir DIR");
        std::process::exit(2);
    }
    a
}

fn main() {
    let args = parse_args();
    if args.transform_only {
        let plan = Plan::parse(PLAN, Path::new("plans/tenant-day-shard.toml")).expect("the plan");
        let per_item = transform_alone(&plan, args.repeat);
        println!(
            "transform alone: {per_item:.2} µs/item (median of {})",
            args.repeat
        );
        return;
    }
    let _temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).expect("creating --dir");
            d.clone()
        }
        None => {
            _temp = tempfile::tempdir().expect("temp dir");
            _temp.path().to_path_buf()
        }
    };

    let t = Instant::now();
    let manifest = write_export(
        &dir,
        EXPORT_ID,
        TABLE_ARN,
        Generator::new(args.items),
        args.files,
        EXPORT_TIME_MS,
    )
    .expect("writing the export");
    let data_dir = dir.join("AWSDynamoDB").join(EXPORT_ID).join("data");
    let gz_bytes = dir_size(&data_dir);
    println!(
        "export: {} items in {} files, {:.1} MB gzip, written in {:.1} s to {}",
        manifest.item_count,
        manifest.files.len(),
        gz_bytes as f64 / 1e6,
        t.elapsed().as_secs_f64(),
        dir.display()
    );
    if args.write_only {
        return;
    }
    machine_info();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (reader, manifest) = rt
        .block_on(ExportReader::open(
            ExportLocation::parse(dir.to_str().unwrap()).unwrap(),
            None,
        ))
        .expect("opening the export");
    let plan = Arc::new(
        Plan::parse(PLAN, Path::new("plans/tenant-day-shard.toml")).expect("parsing the plan"),
    );
    let paths: Vec<PathBuf> = manifest
        .files
        .iter()
        .map(|f| PathBuf::from(reader.locate(f)))
        .collect();
    let reader = Arc::new(reader);
    let files = Arc::new(manifest.files.clone());

    // Warm the page cache (and check the uncompressed size).
    let raw_bytes: u64 = paths
        .iter()
        .map(|p| {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("gzip -dc '{}' | wc -c", p.display()))
                .output()
                .expect("gzip | wc");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum();
    println!(
        "data: {:.1} MB DynamoDB JSON ({:.0} bytes/line), {:.1} MB gzip; parallelism: {} files at a time for every measurement; median of {} runs",
        raw_bytes as f64 / 1e6,
        raw_bytes as f64 / manifest.item_count.max(1) as f64,
        gz_bytes as f64 / 1e6,
        args.parallel,
        args.repeat
    );

    let n = manifest.item_count as f64;
    let mut t_rekey = Vec::new();
    let mut t_read = Vec::new();
    let mut t_gzip = Vec::new();
    let mut last = Counts::default();
    for _ in 0..args.repeat {
        let t = Instant::now();
        gzip_pass(&paths, args.parallel);
        t_gzip.push(t.elapsed());

        let t = Instant::now();
        last = rt.block_on(rekey_pass(
            reader.clone(),
            files.clone(),
            Some(plan.clone()),
            args.parallel,
        ));
        t_rekey.push(t.elapsed());

        let t = Instant::now();
        let c = rt.block_on(rekey_pass(
            reader.clone(),
            files.clone(),
            None,
            args.parallel,
        ));
        t_read.push(t.elapsed());
        assert_eq!(c.items, manifest.item_count);
    }
    assert_eq!(last.items, manifest.item_count, "every line read");
    assert_eq!(last.bad_lines, 0);
    let (r, rd, g) = (median(t_rekey), median(t_read), median(t_gzip));
    println!(
        "checked: {} items transformed: {} puts, {} rejects",
        last.items, last.puts, last.rejects
    );
    println!(
        "(1) rekey reader + transform : {:7.2} s  {:>10.0} items/s",
        secs(r),
        n / secs(r)
    );
    println!(
        "    rekey reader only        : {:7.2} s  {:>10.0} items/s",
        secs(rd),
        n / secs(rd)
    );
    println!(
        "(2) gzip -dc > /dev/null     : {:7.2} s  {:>10.0} items/s",
        secs(g),
        n / secs(g)
    );
    println!("ratio rekey/gzip (time)      : {:7.2}", secs(r) / secs(g));
    let per_item = transform_alone(&plan, args.repeat);
    println!(
        "    transform alone          : {per_item:7.2} µs/item (in memory, 200,000 of the same items, one thread)"
    );
}

/// The transform's own cost, apart from reading: the first 200,000
/// generated items, held in memory, transformed `repeat` times (median),
/// given away as the backfill gives them (a fresh copy each time, made
/// before the clock starts).
fn transform_alone(plan: &Plan, repeat: usize) -> f64 {
    let items: Vec<Item> = Generator::new(200_000).collect();
    let n = items.len();
    let mut times = Vec::new();
    for _ in 0..repeat.max(1) {
        let copy = items.clone();
        let t = Instant::now();
        let mut key_bytes = 0usize;
        for it in copy {
            if let Owned::Put { item, .. } = transform_owned(plan, it)
                && let Some(Value::S(pk)) = item.get("PK")
            {
                key_bytes += pk.len();
            }
        }
        times.push(t.elapsed());
        assert!(key_bytes > 0, "every item transformed");
    }
    secs(median(times)) * 1e6 / n as f64
}
