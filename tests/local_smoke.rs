//! Smoke tests of `local`: real moto servers. They fail (never skip) when
//! moto is missing: run scripts/install-deps first.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use rekey::local::{LocalError, LocalOptions, LocalServer};

async fn client(local: &LocalServer) -> Client {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(local.endpoint())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .load()
        .await;
    Client::new(&config)
}

async fn create_table(client: &Client, name: &str) {
    client
        .create_table()
        .table_name(name)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
}

async fn table_names(client: &Client) -> Vec<String> {
    client
        .list_tables()
        .send()
        .await
        .unwrap()
        .table_names
        .unwrap_or_default()
}

/// True while `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
        .is_ok()
}

/// Polls until the process is gone and its port refuses connections.
fn wait_gone(pid: u32, port: u16, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let (is_alive, is_accepting) = (alive(pid), accepts(port));
        if !is_alive && !is_accepting {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "after {limit:?}: pid {pid} alive={is_alive}, port {port} accepting={is_accepting}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_side_by_side_and_drop_kills() {
    let opts = LocalOptions::default();
    let started = Instant::now();
    let (a, b) = tokio::join!(LocalServer::start(&opts), LocalServer::start(&opts));
    let (a, b) = (a.unwrap(), b.unwrap());
    eprintln!(
        "two instances ready in {:?}: {} (pid {}), {} (pid {})",
        started.elapsed(),
        a.endpoint(),
        a.pid(),
        b.endpoint(),
        b.pid()
    );
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_eq!(a.endpoint(), format!("http://127.0.0.1:{}", a.port()));

    let (ca, cb) = (client(&a).await, client(&b).await);
    tokio::join!(create_table(&ca, "table-a"), create_table(&cb, "table-b"));
    assert_eq!(table_names(&ca).await, ["table-a"]);
    assert_eq!(table_names(&cb).await, ["table-b"]);

    let (pid, port) = (a.pid(), a.port());
    assert!(alive(pid));
    drop(a);
    let took = wait_gone(pid, port, Duration::from_secs(5)).unwrap();
    eprintln!("dropped instance gone after {took:?}");

    // The other one is unaffected.
    assert_eq!(table_names(&cb).await, ["table-b"]);
    let (pid, port) = (b.pid(), b.port());
    drop(b);
    wait_gone(pid, port, Duration::from_secs(5)).unwrap();
}

#[tokio::test]
async fn a_given_port_is_used() {
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = LocalOptions {
        port: Some(port),
        ..LocalOptions::default()
    };
    let started = Instant::now();
    let local = LocalServer::start(&opts).await.unwrap();
    eprintln!("one instance ready in {:?}", started.elapsed());
    assert_eq!(local.port(), port);
    assert_eq!(
        table_names(&client(&local).await).await,
        Vec::<String>::new()
    );

    // A second instance on the same port is refused up front (its readiness
    // probe would be answered by the first one).
    let err = LocalServer::start(&opts).await.unwrap_err();
    assert!(
        matches!(err, LocalError::PortInUse { port: p, .. } if p == port),
        "{err:?}"
    );
}

/// A fake install: `moto_server` with a `#!/bin/sh` line and `python3`
/// beside it holding `python`, so the launcher runs that instead of moto.
fn fake_install(name: &str, python: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rekey-fake-moto-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in [("moto_server", "#!/bin/sh\n"), ("python3", python)] {
        let p = dir.join(file);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

#[tokio::test]
async fn missing_install_is_not_installed() {
    let path = std::env::temp_dir().join(format!("no-moto-here-{}", std::process::id()));
    let opts = LocalOptions {
        server: Some(path.clone()),
        port: None,
    };
    let err = LocalServer::start(&opts).await.unwrap_err();
    let LocalError::NotInstalled { searched } = &err else {
        panic!("expected NotInstalled, got {err:?}");
    };
    assert_eq!(searched, &[path.display().to_string()]);
    let message = err.to_string();
    assert!(message.contains("scripts/install-deps"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");

    assert!(matches!(
        LocalServer::find_server(Some(Path::new("/nonexistent"))),
        Err(LocalError::NotInstalled { .. })
    ));
}

#[tokio::test]
async fn a_server_that_exits_is_reported_with_its_output() {
    let dir = fake_install(
        "exits",
        "#!/bin/sh\necho 'no module named moto' >&2\nexit 3\n",
    );
    let opts = LocalOptions {
        server: Some(dir.join("moto_server")),
        port: None,
    };
    let err = LocalServer::start(&opts).await.unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    let LocalError::Exited { status, output } = &err else {
        panic!("expected Exited, got {err:?}");
    };
    assert_eq!(status, "exit status: 3");
    assert!(output.contains("no module named moto"), "{err}");
}

#[test]
fn the_install_is_found() {
    let server: PathBuf = LocalServer::find_server(None).unwrap();
    assert!(server.ends_with("moto_server"), "{}", server.display());
}

const HELPER_ENV: &str = "LOCALLAUNCH_TEST_HELPER";

/// Not a test on its own: when `HELPER_ENV` is set, this is the body of the
/// subprocess that `the_server_dies_with_its_owner` starts and then ends.
#[test]
fn owner_process_helper() {
    let Ok(mode) = std::env::var(HELPER_ENV) else {
        return;
    };
    static KEEP: std::sync::OnceLock<LocalServer> = std::sync::OnceLock::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let local = runtime
        .block_on(LocalServer::start(&LocalOptions::default()))
        .unwrap();
    println!("SERVER pid={} port={}", local.pid(), local.port());
    // Statics are never dropped: `exit` leaves without killing it.
    let _ = KEEP.set(local);
    match mode.as_str() {
        "exit" => std::process::exit(0),
        _ => std::thread::sleep(Duration::from_secs(120)),
    }
}

/// Starts `owner_process_helper` in a subprocess; returns it and its server's
/// pid and port.
fn start_owner(mode: &str) -> (std::process::Child, u32, u16) {
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "owner_process_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, mode)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(owner.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        // libtest prints "test owner_process_helper ... " before it.
        if let Some((_, rest)) = line.split_once("SERVER pid=") {
            let (pid, port) = rest.split_once(" port=").unwrap();
            return (owner, pid.parse().unwrap(), port.parse().unwrap());
        }
    }
    let status = owner.wait().unwrap();
    panic!("the helper process ended ({status}) without starting the local server");
}

#[test]
fn the_server_dies_with_its_owner() {
    // SIGKILLed owner: no destructor runs at all.
    let (mut owner, pid, port) = start_owner("sleep");
    assert!(alive(pid));
    owner.kill().unwrap();
    owner.wait().unwrap();
    let result = wait_gone(pid, port, Duration::from_secs(5));
    if result.is_err() {
        // Don't leave it behind if the test fails.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let took = result.unwrap();
    eprintln!("server of SIGKILLed owner gone after {took:?}");

    // Owner exits without dropping (the instance is in a static).
    let (mut owner, pid, port) = start_owner("exit");
    assert!(owner.wait().unwrap().success());
    let result = wait_gone(pid, port, Duration::from_secs(5));
    if result.is_err() {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    result.unwrap();
}
