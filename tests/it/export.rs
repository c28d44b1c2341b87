//! The export reader against real storage: a moto S3 server and local
//! directories. No mock of the SDK. Exports that cannot be read are one
//! table of cases ([`an_export_that_cannot_be_read_is_refused_at_open_saying_why`]).
//! Streaming a large file keeps memory flat
//! ([`a_200k_item_file_streams_in_bounded_memory`], in a process of its own).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rekey::aws::export::{ExportError, ExportLocation, ExportReader, Manifest, format_rfc3339_ms};
use rekey::core::value::{Item, Value};
use rekey_testkit::export::write_export;

use crate::support::export::*;
use crate::support::{client, rerun_alone};

const T0: i64 = 1_767_225_600_123; // 2026-01-01T00:00:00.123Z

fn s3(bucket: &str, prefix: &str) -> ExportLocation {
    ExportLocation::parse(&format!("s3://{bucket}/{prefix}")).unwrap()
}

/// Reads every file of the export and checks items, order and line numbers.
async fn check_reads_back(
    reader: &ExportReader,
    manifest: &Manifest,
    all: &[rekey::core::value::Item],
    files: usize,
) {
    assert_eq!(manifest.files.len(), files);
    for (f, file) in manifest.files.iter().enumerate() {
        let (lines, summary) = read_all(reader, file, 0).await;
        let summary = summary.unwrap_or_else(|e| panic!("{}: {e}", reader.locate(file)));
        let expected = expected_in_file(all, f, files);
        assert_eq!(summary.lines, expected.len() as u64);
        assert_eq!(summary.malformed, 0);
        assert_eq!(lines.len(), expected.len());
        for (i, (line, want)) in lines.iter().zip(&expected).enumerate() {
            assert_eq!(line.line, i as u64 + 1);
            let got = line
                .item
                .as_ref()
                .unwrap_or_else(|e| panic!("line {}: {e}", line.line));
            assert_eq!(&json(got), want, "file {f} line {}", line.line);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_export_reads_back_exactly_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let all = items(101);
    let written = write_export(
        dir.path(),
        "01767225600123-a1b2c3d4",
        TABLE_ARN,
        all.clone().into_iter(),
        3,
        T0,
    )
    .unwrap();
    assert_eq!(written.item_count, 101);
    assert_eq!(written.export_time, "2026-01-01T00:00:00.123Z");
    let client = bucket("roundtrip").await;
    upload_dir(&client, "roundtrip", "exports/daily", dir.path()).await;

    let (reader, manifest) =
        ExportReader::open(s3("roundtrip", "exports/daily/"), Some(client.clone()))
            .await
            .unwrap();
    assert_eq!(manifest, written);
    assert_eq!(manifest.selection_note(), None);
    assert_eq!(
        reader.export_dir(),
        "s3://roundtrip/exports/daily/AWSDynamoDB/01767225600123-a1b2c3d4"
    );
    assert!(
        reader
            .locate(&manifest.files[0])
            .starts_with("s3://roundtrip/exports/daily/AWSDynamoDB/01767225600123-a1b2c3d4/data/")
    );
    check_reads_back(&reader, &manifest, &all, 3).await;

    // The AWSDynamoDB folder, or the export's own folder, name it too.
    for prefix in [
        "exports/daily/AWSDynamoDB",
        "exports/daily/AWSDynamoDB/01767225600123-a1b2c3d4",
    ] {
        let (reader, manifest) = ExportReader::open(s3("roundtrip", prefix), Some(client.clone()))
            .await
            .unwrap();
        assert_eq!(manifest, written, "{prefix}");
        check_reads_back(&reader, &manifest, &all, 3).await;
    }

    // At the bucket's root.
    upload_dir(&client, "roundtrip", "", dir.path()).await;
    let (reader, manifest) = ExportReader::open(
        ExportLocation::parse("s3://roundtrip").unwrap(),
        Some(client),
    )
    .await
    .unwrap();
    assert_eq!(manifest, written);
    check_reads_back(&reader, &manifest, &all, 3).await;
}

#[tokio::test]
async fn local_export_reads_back_exactly_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let all = items(50);
    // More files than items in some: empty gzip files are fine.
    let written = write_export(
        dir.path(),
        "01-local",
        TABLE_ARN,
        all.clone().into_iter(),
        4,
        T0,
    )
    .unwrap();
    let (reader, manifest) =
        ExportReader::open(ExportLocation::Local(dir.path().to_path_buf()), None)
            .await
            .unwrap();
    assert_eq!(manifest, written);
    check_reads_back(&reader, &manifest, &all, 4).await;

    let (reader, manifest) = ExportReader::open(
        ExportLocation::Local(dir.path().join("AWSDynamoDB/01-local")),
        None,
    )
    .await
    .unwrap();
    assert_eq!(manifest, written);
    check_reads_back(&reader, &manifest, &all, 4).await;

    let few = tempfile::tempdir().unwrap();
    let written =
        write_export(few.path(), "01-few", TABLE_ARN, items(2).into_iter(), 4, T0).unwrap();
    assert_eq!(
        written
            .files
            .iter()
            .map(|f| f.item_count)
            .collect::<Vec<_>>(),
        [1, 1, 0, 0]
    );
    let (reader, manifest) =
        ExportReader::open(ExportLocation::Local(few.path().to_path_buf()), None)
            .await
            .unwrap();
    check_reads_back(&reader, &manifest, &items(2), 4).await;
}

#[tokio::test]
async fn a_zero_byte_file_is_an_empty_partition() {
    // DynamoDB writes an empty file for an empty partition.
    let dir = tempfile::tempdir().unwrap();
    let m = write_export(dir.path(), "01-z", TABLE_ARN, items(1).into_iter(), 2, T0).unwrap();
    let empty = &m.files[1];
    std::fs::write(dir.path().join(&empty.key), b"").unwrap();
    let md5 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(md5_of(b""))
    };
    edit_files_manifest(dir.path(), "01-z", |v| {
        if v["dataFileS3Key"] == empty.key.as_str() {
            v["md5Checksum"] = md5.clone().into();
        }
    });
    let (reader, manifest) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let (lines, summary) = read_all(&reader, &manifest.files[1], 0).await;
    assert!(lines.is_empty());
    assert_eq!(summary.unwrap().lines, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newest_finished_full_export_is_chosen_unless_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let old = write_export(
        dir.path(),
        "01000-old",
        TABLE_ARN,
        items(3).into_iter(),
        1,
        T0,
    )
    .unwrap();
    let new = write_export(
        dir.path(),
        "00999-new",
        TABLE_ARN,
        items(5).into_iter(),
        2,
        T0 + 3_600_000,
    )
    .unwrap();
    // Newer still, but incremental; and one that has not finished.
    write_export(
        dir.path(),
        "02000-incr",
        TABLE_ARN,
        items(1).into_iter(),
        1,
        T0 + 7_200_000,
    )
    .unwrap();
    edit_summary(dir.path(), "02000-incr", |v| {
        v["exportType"] = "INCREMENTAL_EXPORT".into()
    });
    std::fs::create_dir_all(dir.path().join("AWSDynamoDB/03000-running")).unwrap();
    std::fs::write(dir.path().join("AWSDynamoDB/03000-running/_started"), b"").unwrap();

    let client = bucket("several").await;
    upload_dir(&client, "several", "p", dir.path()).await;
    let locations = [
        (ExportLocation::Local(dir.path().into()), None),
        (s3("several", "p"), Some(client.clone())),
    ];
    for (loc, client) in locations {
        let (reader, m) = ExportReader::open(loc.clone(), client.clone())
            .await
            .unwrap();
        assert_eq!(m.export_id, "00999-new", "{loc}");
        assert_eq!(m.item_count, new.item_count);
        let note = m.selection_note().unwrap();
        assert!(
            note.contains("using the newest export, 00999-new (2026-01-01T01:00:00.123Z)"),
            "{note}"
        );
        assert!(
            note.contains("01000-old (2026-01-01T00:00:00.123Z)"),
            "{note}"
        );
        assert!(
            note.contains("02000-incr (2026-01-01T02:00:00.123Z, incremental)"),
            "{note}"
        );
        assert!(
            note.contains("03000-running (unfinished or failed)"),
            "{note}"
        );
        check_reads_back(&reader, &m, &items(5), 2).await;

        let arn = format!("{TABLE_ARN}/export/01000-old");
        for id in ["01000-old", arn.as_str()] {
            let (reader, m) = ExportReader::open_export(loc.clone(), client.clone(), Some(id))
                .await
                .unwrap();
            assert_eq!(m, old);
            check_reads_back(&reader, &m, &items(3), 1).await;
        }
        let err = ExportReader::open_export(loc.clone(), client.clone(), Some("02000-incr"))
            .await
            .unwrap_err();
        assert!(matches!(err, ExportError::Incremental { .. }), "{err}");
        let err = ExportReader::open_export(loc.clone(), client.clone(), Some("03000-running"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ExportError::NotFound { .. })
                && err
                    .to_string()
                    .contains("03000-running/manifest-summary.json"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_skips_exactly_the_first_lines() {
    let dir = tempfile::tempdir().unwrap();
    let all = items(40);
    write_export(
        dir.path(),
        "01-resume",
        TABLE_ARN,
        all.clone().into_iter(),
        1,
        T0,
    )
    .unwrap();
    let client = bucket("resume").await;
    upload_dir(&client, "resume", "x", dir.path()).await;
    let (reader, m) = ExportReader::open(s3("resume", "x"), Some(client))
        .await
        .unwrap();
    let expected = expected_in_file(&all, 0, 1);
    for skip in [0u64, 1, 17, 39, 40] {
        let (lines, summary) = read_all(&reader, &m.files[0], skip).await;
        assert_eq!(summary.unwrap().lines, 40);
        let numbers: Vec<u64> = lines.iter().map(|l| l.line).collect();
        assert_eq!(numbers, (skip + 1..=40).collect::<Vec<_>>(), "skip {skip}");
        for l in &lines {
            assert_eq!(
                json(l.item.as_ref().unwrap()),
                expected[l.line as usize - 1]
            );
        }
    }
    let (lines, summary) = read_all(&reader, &m.files[0], 41).await;
    assert!(lines.is_empty());
    assert!(
        matches!(
            summary,
            Err(ExportError::SkipPastEnd {
                skip: 41,
                lines: 40,
                ..
            })
        ),
        "{summary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_line_is_reported_and_the_rest_still_comes() {
    let dir = tempfile::tempdir().unwrap();
    let all = items(21);
    let m = write_export(
        dir.path(),
        "01-bad",
        TABLE_ARN,
        all.clone().into_iter(),
        1,
        T0,
    )
    .unwrap();
    rewrite_data_file(dir.path(), "01-bad", &m.files[0].key, |n, line| {
        if n == 11 {
            "{\"Item\":{\"pk\":{\"S\":\"x\"},\"n\":{\"N\":\"twelve\"}}}".into()
        } else {
            line
        }
    });
    let client = bucket("malformed").await;
    upload_dir(&client, "malformed", "", dir.path()).await;
    let (reader, m) = ExportReader::open(
        ExportLocation::parse("s3://malformed/").unwrap(),
        Some(client),
    )
    .await
    .unwrap();
    let (lines, summary) = read_all(&reader, &m.files[0], 0).await;
    let summary = summary.unwrap();
    assert_eq!((summary.lines, summary.malformed), (21, 1));
    assert_eq!(lines.len(), 21);
    for l in &lines {
        if l.line == 11 {
            let err = l.item.as_ref().unwrap_err();
            assert!(
                err.contains("`twelve`") && err.contains("line 1 column"),
                "{err}"
            );
        } else {
            assert_eq!(
                json(l.item.as_ref().unwrap()),
                json(&all[l.line as usize - 1])
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_item_count_is_a_count_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_export(
        dir.path(),
        "01-count",
        TABLE_ARN,
        items(10).into_iter(),
        2,
        T0,
    )
    .unwrap();
    let key = m.files[1].key.clone();
    edit_files_manifest(dir.path(), "01-count", |v| {
        if v["dataFileS3Key"] == key.as_str() {
            v["itemCount"] = 6.into();
        }
    });
    // The summary's total agrees with the files' manifest: only the data is short.
    edit_summary(dir.path(), "01-count", |v| v["itemCount"] = 11.into());
    let client = bucket("count").await;
    upload_dir(&client, "count", "e", dir.path()).await;
    let (reader, m) = ExportReader::open(s3("count", "e"), Some(client))
        .await
        .unwrap();
    assert_eq!(m.item_count, 11);
    let (lines, summary) = read_all(&reader, &m.files[0], 0).await;
    assert_eq!((lines.len(), summary.unwrap().lines), (5, 5));
    let (lines, summary) = read_all(&reader, &m.files[1], 0).await;
    assert_eq!(lines.len(), 5);
    let err = summary.unwrap_err();
    assert!(
        matches!(&err, ExportError::CountMismatch { expected: 6, got: 5, file } if file.ends_with(&key)),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("the manifest says 6 items, the file has 5 lines"),
        "{err}"
    );

    // The summary disagreeing with the list of files is refused at open.
    edit_summary(dir.path(), "01-count", |v| v["itemCount"] = 10.into());
    let err = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExportError::Manifest { .. })
            && err.to_string().contains("itemCount is 10 but"),
        "{err}"
    );
}

#[tokio::test]
async fn a_wrong_checksum_is_refused_unless_checks_are_off() {
    let dir = tempfile::tempdir().unwrap();
    let all = items(5);
    let m = write_export(
        dir.path(),
        "01-md5",
        TABLE_ARN,
        all.clone().into_iter(),
        1,
        T0,
    )
    .unwrap();
    edit_files_manifest(dir.path(), "01-md5", |v| {
        v["md5Checksum"] = "AAAAAAAAAAAAAAAAAAAAAA==".into()
    });
    let (mut reader, m2) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let (lines, summary) = read_all(&reader, &m2.files[0], 0).await;
    assert_eq!(lines.len(), 5);
    let err = summary.unwrap_err();
    assert!(
        matches!(&err, ExportError::Checksum { got, .. } if Some(got) == m.files[0].md5.as_ref()),
        "{err}"
    );
    reader.verify_checksums(false);
    assert_eq!(read_all(&reader, &m2.files[0], 0).await.1.unwrap().lines, 5);

    // A hex MD5 is accepted as well.
    let hex: String = md5_of(&std::fs::read(dir.path().join(&m.files[0].key)).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    edit_files_manifest(dir.path(), "01-md5", |v| {
        v["md5Checksum"] = hex.clone().into()
    });
    let (reader, m2) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    assert_eq!(read_all(&reader, &m2.files[0], 0).await.1.unwrap().lines, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_pieces_are_not_found_with_their_names() {
    let client = bucket("missing").await;
    let err = ExportReader::open(s3("missing", "nothing/here"), Some(client.clone()))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ExportError::NotFound { .. }), "{msg}");
    assert!(
        msg.contains("s3://missing/nothing/here")
            && msg
                .contains("s3://missing/nothing/here/AWSDynamoDB/<exportId>/manifest-summary.json"),
        "{msg}"
    );

    let err = ExportReader::open_export(s3("missing", "p"), Some(client.clone()), Some("0123-abc"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("s3://missing/p/AWSDynamoDB/0123-abc/manifest-summary.json"),
        "{err}"
    );

    let err = ExportReader::open(s3("no-such-bucket", "p"), Some(client.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExportError::NotFound { .. }) && err.to_string().contains("no-such-bucket"),
        "{err}"
    );
    assert!(
        err.to_string().ends_with(&format!(
            " — S3 at {} (from the client's configuration)",
            client.endpoint.url
        )),
        "S3's endpoint is named: {err}"
    );

    let err = ExportReader::open(s3("missing", "p"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, ExportError::NoS3Client { .. }), "{err}");

    // A data file missing. (A missing folder, or list of data files, is in
    // an_export_that_cannot_be_read_is_refused_at_open_saying_why.)
    let dir = tempfile::tempdir().unwrap();
    let m = write_export(
        dir.path(),
        "01-gone",
        TABLE_ARN,
        items(4).into_iter(),
        2,
        T0,
    )
    .unwrap();
    std::fs::remove_file(dir.path().join(&m.files[1].key)).unwrap();
    upload_dir(&client, "missing", "q", dir.path()).await;
    let (reader, m) = ExportReader::open(s3("missing", "q"), Some(client.clone()))
        .await
        .unwrap();
    let (_, summary) = read_all(&reader, &m.files[1], 0).await;
    let err = summary.unwrap_err();
    assert!(
        matches!(err, ExportError::NotFound { .. })
            && err
                .to_string()
                .contains(&format!("s3://missing/q/{}", m.files[1].key)),
        "{err}"
    );
    let (reader, m) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let (_, summary) = read_all(&reader, &m.files[1], 0).await;
    assert!(summary.unwrap_err().to_string().contains(&m.files[1].key));
}

#[tokio::test]
async fn a_dropped_receiver_stops_the_read() {
    let dir = tempfile::tempdir().unwrap();
    write_export(
        dir.path(),
        "01-drop",
        TABLE_ARN,
        items(100).into_iter(),
        1,
        T0,
    )
    .unwrap();
    let (reader, m) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let (tx, mut rx) = rekey::aws::export::lines_channel(4);
    let first_two = async move {
        let a = rx.recv().await.unwrap();
        let b = rx.recv().await.unwrap();
        (a.line, b.line)
    };
    let (result, seen) = tokio::join!(reader.read_file(&m.files[0], 0, tx), first_two);
    assert_eq!(seen, (1, 2));
    assert!(
        matches!(result, Err(ExportError::Closed { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn moto_is_killed_on_drop() {
    let started = std::time::Instant::now();
    let moto = rekey::local::LocalServer::start(&Default::default())
        .await
        .expect("moto_server must start");
    eprintln!("own moto_server ready in {:?}", started.elapsed());
    let client = client::s3(moto.endpoint()).await;
    client.create_bucket().bucket("bkt").send().await.unwrap();
    let buckets = client.list_buckets().send().await.unwrap();
    assert_eq!(buckets.buckets().len(), 1);
    let (pid, port) = (moto.pid(), moto.port());
    drop(moto);
    // Reaped: the pid is gone (no zombie), the port refuses connections.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn export_times_format_like_dynamodbs() {
    assert_eq!(format_rfc3339_ms(T0), "2026-01-01T00:00:00.123Z");
}

/// An export that open must refuse: how it is spoiled, and what open says.
struct Refused {
    /// Names the case when it fails: the test it was, and which part.
    name: &'static str,
    /// Writes the export into the folder given and spoils it; returns the
    /// folder to open.
    spoil: fn(&Path) -> PathBuf,
    /// The kind of error.
    is: fn(&ExportError) -> bool,
    says: Says,
    /// Opened from S3 as well (the folder uploaded as it is).
    also_s3: bool,
}

enum Says {
    Exactly(&'static str),
    /// Each of these is in the message; `{dir}` is the folder opened.
    Containing(&'static [&'static str]),
}

fn export_of(dir: &Path, id: &str, n: usize, files: usize) -> Manifest {
    write_export(dir, id, TABLE_ARN, items(n).into_iter(), files, T0).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_cannot_be_read_is_refused_at_open_saying_why() {
    let cases = [
        Refused {
            name: "ion_and_incremental_exports_are_refused_clearly: ION",
            spoil: |dir| {
                export_of(dir, "01-ion", 2, 1);
                edit_summary(dir, "01-ion", |v| v["outputFormat"] = "ION".into());
                dir.into()
            },
            is: |e| matches!(e, ExportError::Ion { .. }),
            says: Says::Exactly(
                "export 01-ion is in ION format; ION exports are not supported: export again with --export-format DYNAMODB_JSON",
            ),
            also_s3: true,
        },
        Refused {
            name: "ion_and_incremental_exports_are_refused_clearly: incremental",
            spoil: |dir| {
                export_of(dir, "01-ion", 2, 1);
                edit_summary(dir, "01-ion", |v| {
                    v["outputFormat"] = "DYNAMODB_JSON".into();
                    v["exportType"] = "INCREMENTAL_EXPORT".into();
                });
                dir.into()
            },
            is: |e| matches!(e, ExportError::Incremental { .. }),
            says: Says::Containing(&["--export-type FULL_EXPORT"]),
            also_s3: false,
        },
        Refused {
            name: "a_broken_manifest_names_file_and_line: a bad line",
            spoil: |dir| {
                export_of(dir, "01-m", 4, 2);
                let path = dir.join("AWSDynamoDB/01-m/manifest-files.json");
                let mut text = std::fs::read_to_string(&path).unwrap();
                text.push_str("{\"itemCount\":\"many\"}\n");
                std::fs::write(&path, text).unwrap();
                dir.into()
            },
            is: |e| matches!(e, ExportError::Manifest { line: Some(3), .. }),
            says: Says::Containing(&["manifest-files.json line 3:"]),
            also_s3: false,
        },
        Refused {
            name: "a_broken_manifest_names_file_and_line: a bad exportTime",
            spoil: |dir| {
                export_of(dir, "01-m", 4, 2);
                edit_summary(dir, "01-m", |v| v["exportTime"] = "yesterday".into());
                dir.into()
            },
            is: |_| true,
            says: Says::Containing(&["manifest-summary.json: exportTime `yesterday`"]),
            also_s3: false,
        },
        Refused {
            name: "missing_pieces_are_not_found_with_their_names: an empty folder",
            spoil: |dir| dir.into(),
            is: |e| matches!(e, ExportError::NotFound { .. }),
            says: Says::Containing(&["{dir}"]),
            also_s3: false,
        },
        Refused {
            name: "missing_pieces_are_not_found_with_their_names: no such folder",
            spoil: |dir| dir.join("nope"),
            is: |_| true,
            says: Says::Containing(&["nope"]),
            also_s3: false,
        },
        Refused {
            name: "missing_pieces_are_not_found_with_their_names: no list of data files",
            spoil: |dir| {
                export_of(dir, "01-gone", 4, 2);
                std::fs::remove_file(dir.join("AWSDynamoDB/01-gone/manifest-files.json")).unwrap();
                dir.into()
            },
            is: |e| matches!(e, ExportError::NotFound { .. }),
            says: Says::Containing(&["AWSDynamoDB/01-gone/manifest-files.json"]),
            also_s3: false,
        },
    ];
    let mut failed = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let folder = (case.spoil)(dir.path());
        let mut opened = vec![(
            ExportLocation::Local(folder.clone()),
            None,
            folder.display().to_string(),
        )];
        if case.also_s3 {
            let bucket_name = format!("refused-{i}");
            let client = bucket(&bucket_name).await;
            upload_dir(&client, &bucket_name, "", &folder).await;
            opened.push((
                s3(&bucket_name, ""),
                Some(client),
                format!("s3://{bucket_name}"),
            ));
        }
        for (loc, client, shown) in opened {
            let why = match ExportReader::open(loc.clone(), client).await {
                Ok(_) => "opened".to_string(),
                Err(err) => {
                    let msg = err.to_string();
                    let mut why = Vec::new();
                    if !(case.is)(&err) {
                        why.push(format!("not the expected kind: {err:?}"));
                    }
                    match &case.says {
                        Says::Exactly(text) if msg != *text => {
                            why.push(format!("says {msg:?}, not {text:?}"))
                        }
                        Says::Containing(parts) => why.extend(
                            parts
                                .iter()
                                .map(|p| p.replace("{dir}", &shown))
                                .filter(|p| !msg.contains(p.as_str()))
                                .map(|p| format!("{msg:?} lacks {p:?}")),
                        ),
                        _ => {}
                    }
                    why.join("; ")
                }
            };
            if !why.is_empty() {
                failed.push(format!("case `{}` at {loc}: {why}", case.name));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// Streaming a large data file keeps memory flat: measured on the process's
// peak RSS, so the test runs again in a process of its own (rerun_alone).

const BIG_ITEMS: u64 = 200_000;
/// Holding the file's items would take well over 100 MB (200k items with a
/// 200-byte string each); streaming needs a few buffers.
const MAX_GROWTH_KB: u64 = 48 * 1024;

fn big_item(i: u64) -> Item {
    let mut m = Item::new();
    m.insert("pk".into(), Value::S(format!("customer#{i:08}")));
    m.insert("sk".into(), Value::N(format!("{}", i * 7919)));
    m.insert("payload".into(), Value::S(format!("{i:0>200}")));
    m
}

fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the peak RSS to the current RSS; false if the kernel cannot.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Streams the file, counting lines without keeping them; returns
/// (lines, peak RSS growth in KiB).
async fn stream_count(reader: &ExportReader, manifest: &Manifest) -> (u64, u64) {
    let before = status_kb("VmRSS:");
    let reset = reset_peak();
    let base = if reset { before } else { status_kb("VmHWM:") };
    let (tx, mut rx) = rekey::aws::export::lines_channel(256);
    let count = async {
        let (mut n, mut last) = (0u64, 0u64);
        while let Some(line) = rx.recv().await {
            assert!(line.item.is_ok(), "line {}", line.line);
            assert_eq!(line.line, last + 1);
            last = line.line;
            n += 1;
        }
        n
    };
    let (summary, n) = tokio::join!(reader.read_file(&manifest.files[0], 0, tx), count);
    let summary = summary.unwrap();
    assert_eq!((summary.lines, summary.malformed), (BIG_ITEMS, 0));
    (n, status_kb("VmHWM:").saturating_sub(base))
}

#[test]
fn a_200k_item_file_streams_in_bounded_memory() {
    if rerun_alone("export::a_200k_item_file_streams_in_bounded_memory") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(streams_in_bounded_memory());
}

async fn streams_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let written = write_export(
        dir.path(),
        "01-big",
        TABLE_ARN,
        (0..BIG_ITEMS).map(big_item),
        1,
        1_767_225_600_000,
    )
    .unwrap();
    let gz_bytes = std::fs::metadata(dir.path().join(&written.files[0].key))
        .unwrap()
        .len();
    eprintln!(
        "wrote {BIG_ITEMS} items ({gz_bytes} bytes gzip) in {:?}",
        t.elapsed()
    );

    let (reader, manifest) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let t = Instant::now();
    let (n, growth) = stream_count(&reader, &manifest).await;
    eprintln!(
        "local: {n} lines in {:?}, peak RSS +{growth} KiB",
        t.elapsed()
    );
    assert_eq!(n, BIG_ITEMS);
    assert!(
        growth < MAX_GROWTH_KB,
        "local read grew peak RSS by {growth} KiB"
    );

    let client = bucket("big").await;
    upload_dir(&client, "big", "exports", dir.path()).await;
    let (reader, manifest) = ExportReader::open(
        ExportLocation::parse("s3://big/exports").unwrap(),
        Some(client),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let (n, growth) = stream_count(&reader, &manifest).await;
    eprintln!("s3: {n} lines in {:?}, peak RSS +{growth} KiB", t.elapsed());
    assert_eq!(n, BIG_ITEMS);
    assert!(
        growth < MAX_GROWTH_KB,
        "S3 read grew peak RSS by {growth} KiB"
    );
}
