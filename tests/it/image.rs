// Seconds: the image is built from the test binary already built (no release build), its one
// layer written and unpacked by umoci (3.5 s idle, 6-9 s at load 9 on 2 cores), then a 40-item
// backfill runs inside it (about 1 s); the whole test took 8-11 s at that load.
//! The container image `scripts/image` builds (issue 28, item 1), run as a
//! container runtime would run it: the image is built from the `rekey` these
//! tests already built, unpacked with umoci into a runtime bundle, and its
//! process (the bundle's `config.json`: arguments, user, environment, working
//! directory) is started in a chroot of the unpacked root file system under
//! the image's user, with nothing of this machine's environment. Podman is not
//! needed: a chroot shares the loopback with the test, so the process inside
//! reaches the local server as any container on the host network would.
//!
//! It checks what the image promises: no shell and nothing but rekey, its
//! libraries and the CA certificates; an unprivileged user whose home is the
//! working directory; `rekey --version`; and a backfill into the local server
//! whose target is exactly transform(source), its state directory made in
//! the home directory by default. umoci comes from `scripts/install-deps`
//! (CI runs it first); a missing tool or a non-root run fails, it does not
//! skip.

use std::ffi::CString;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

use crate::support::plan::tenant_days;
use crate::support::workload::even_order;
use crate::support::*;

/// What the runtime bundle says to run: an OCI runtime spec's `process`.
struct Process {
    rootfs: PathBuf,
    args: Vec<String>,
    uid: u32,
    gid: u32,
    env: Vec<(String, String)>,
    cwd: String,
}

/// `scripts/image` on the test binary into `dir/oci`, unpacked into `dir/bundle`.
fn build_and_unpack(dir: &Path) -> Process {
    // SAFETY: a plain syscall.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the image test unpacks and chroots: run it as root (CI does)"
    );
    let layout = dir.join("oci");
    let out = Command::new("bash")
        .arg(repo_path("scripts/image"))
        .args(["--binary", env!("CARGO_BIN_EXE_rekey"), "--tag", "test"])
        .arg("--out")
        .arg(&layout)
        .output()
        .expect("run scripts/image");
    assert!(out.status.success(), "scripts/image: {}", stderr(&out));
    let bundle = dir.join("bundle");
    let out = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:test", layout.display()))
        .arg(&bundle)
        .output()
        .expect("umoci (scripts/install-deps installs it)");
    assert!(out.status.success(), "umoci unpack: {}", stderr(&out));
    let spec: Json =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let p = &spec["process"];
    let strings = |v: &Json| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("not a list: {v}"))
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    Process {
        rootfs: bundle.join("rootfs"),
        args: strings(&p["args"]),
        uid: p["user"]["uid"].as_u64().unwrap() as u32,
        gid: p["user"]["gid"].as_u64().unwrap() as u32,
        env: strings(&p["env"])
            .into_iter()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect(),
        cwd: p["cwd"].as_str().unwrap().to_string(),
    }
}

impl Process {
    fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A path inside the image, on this machine.
    fn path(&self, inside: &str) -> PathBuf {
        self.rootfs.join(inside.trim_start_matches('/'))
    }

    /// The image's process with `args` appended, its environment plus
    /// `extra`, started as a runtime would: chroot into the root file system,
    /// the working directory, then the image's user (no supplementary groups).
    fn run(&self, args: &[&str], extra: &[(String, String)]) -> Output {
        let root = CString::new(self.rootfs.as_os_str().as_encoded_bytes()).unwrap();
        let cwd = CString::new(self.cwd.as_str()).unwrap();
        let (uid, gid) = (self.uid, self.gid);
        let mut cmd = Command::new(&self.args[0]);
        cmd.args(&self.args[1..])
            .args(args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .envs(extra.iter().cloned());
        // SAFETY: only async-signal-safe calls between fork and exec, on
        // strings made before the fork. exec then finds `rekey` on the
        // image's PATH, inside the new root.
        unsafe {
            cmd.pre_exec(move || {
                let check = |rc: libc::c_int| {
                    if rc == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                };
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(cwd.as_ptr()))?;
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(gid))?;
                check(libc::setuid(uid))
            });
        }
        cmd.output().expect("start the image's process")
    }
}

/// The environment `TestEnv` gives rekey (endpoint, credentials, region,
/// attempts), to hand to the process inside the image.
fn operator_env(env: &TestEnv) -> Vec<(String, String)> {
    env.command(&[], &[])
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
        .collect()
}

/// Every regular file in the image, by its path inside.
fn files(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(root, &e.path(), out);
            } else {
                let inside = e.path().strip_prefix(root).unwrap().display().to_string();
                out.push(format!("/{inside}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_rekey_as_its_user_and_backfills_against_the_local_server() {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    let items: Vec<_> = (0..40).map(even_order).collect();
    env.put(&source, &items).await;
    let plan = tenant_days(&source, &target, "T#{t}");

    let started = std::time::Instant::now();
    let image = build_and_unpack(env.dir.path());
    eprintln!("image built and unpacked in {:?}", started.elapsed());

    // What is in it: rekey, the loader and libraries, certificates, users. No shell.
    assert_eq!(image.args, ["rekey"]);
    assert_ne!(image.uid, 0, "the image's user is not root");
    let passwd = std::fs::read_to_string(image.path("/etc/passwd")).unwrap();
    assert!(
        passwd.contains(&format!("rekey:x:{}:{}:", image.uid, image.gid)),
        "{passwd}"
    );
    let certs = image.env("SSL_CERT_FILE").expect("SSL_CERT_FILE");
    let pem = std::fs::read_to_string(image.path(certs)).unwrap();
    assert!(pem.matches("BEGIN CERTIFICATE").count() > 50, "a CA bundle");
    let all = files(&image.rootfs);
    assert!(all.contains(&"/usr/local/bin/rekey".to_string()), "{all:?}");
    assert!(all.iter().any(|f| f.contains("/libc.so")), "{all:?}");
    assert!(all.iter().any(|f| f.contains("/ld-linux")), "{all:?}");
    assert!(!all.iter().any(|f| f.ends_with("/sh")), "no shell: {all:?}");
    assert!(all.len() < 15, "rekey and what it needs only: {all:?}");
    let home = std::fs::metadata(image.path(&image.cwd)).unwrap();
    assert_eq!(
        (home.uid(), home.gid()),
        (image.uid, image.gid),
        "the working directory is the user's"
    );

    let out = image.run(&["--version"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        format!("rekey {}", env!("CARGO_PKG_VERSION"))
    );

    // A backfill, the plan beside it in the working directory, the state
    // directory where rekey puts it by default (.rekey/plan).
    std::fs::write(image.path(&format!("{}/plan.toml", image.cwd)), plan.text()).unwrap();
    let out = image.run(&["backfill", "plan.toml", "--json"], &operator_env(&env));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let r = report(&out);
    assert_eq!(r["totals"]["scanned"], 40, "{r}");
    assert_eq!(r["totals"]["written"], 40, "{r}");
    let state = std::fs::metadata(image.path(&format!("{}/.rekey/plan", image.cwd))).unwrap();
    assert_eq!(state.uid(), image.uid, "the state directory is the user's");
    assert_eq!(
        target_vs_transform(&env, &plan.parse(), &source, &target).await,
        (0, 0, 0),
        "the target is transform(source)"
    );
    eprintln!("whole test {:?}", started.elapsed());
}
