//! The integration-test environment: a real DynamoDB Local per test, random
//! table names, and the `rekey` binary pointed at it through the standard
//! AWS environment variables — the way an operator runs it.
//!
//! A server that cannot start fails the test loudly; nothing is skipped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use rekey::aws::{AwsOptions, Clients};
use rekey::local::{DynamoDbLocal, LocalOptions};
use rekey::plan::KeySchema;
use rekey::value::Item;

pub struct TestEnv {
    pub ddb: DynamoDbLocal,
    pub clients: Clients,
    pub dir: tempfile::TempDir,
}

impl TestEnv {
    pub async fn start() -> TestEnv {
        let ddb = match DynamoDbLocal::start(&LocalOptions {
            install_dir: None,
            port: None,
        })
        .await
        {
            Ok(d) => d,
            Err(e) => panic!("DynamoDB Local did not start (run scripts/install-deps): {e}"),
        };
        let clients = Clients::connect(&AwsOptions {
            endpoint_url: Some(ddb.endpoint().to_string()),
            region: Some("us-east-1".into()),
            static_credentials: Some(("test".into(), "test".into())),
            ..Default::default()
        })
        .await
        .expect("SDK clients");
        TestEnv {
            ddb,
            clients,
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// A table name no other test uses.
    pub fn table_name(&self, prefix: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub async fn create_table(&self, name: &str, key: &KeySchema) {
        self.clients
            .create_table(name, key, false)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    pub async fn put(&self, table: &str, items: &[Item]) {
        rekey::write::put_all(&self.clients, table, items, 4)
            .await
            .unwrap_or_else(|e| panic!("put into {table}: {e}"));
    }

    /// Write a file into the test's temp dir.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write test file");
        p
    }

    /// `rekey ARGS` against this DynamoDB Local, configured through the
    /// environment as an operator would.
    pub fn rekey(&self, args: &[&str]) -> Output {
        rekey_with_env(args, &[("AWS_ENDPOINT_URL", self.ddb.endpoint())])
    }
}

/// `rekey ARGS` with fake credentials, a region, one attempt per request, and `env`.
pub fn rekey_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rekey"));
    cmd.args(args)
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
        .env_remove("AWS_PROFILE")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run rekey")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An item from DynamoDB JSON text.
pub fn item(json: &str) -> Item {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("bad test item {json}: {e}"))
}

pub fn s(text: &str) -> rekey::value::Value {
    rekey::value::Value::S(text.to_string())
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
