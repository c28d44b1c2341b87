//! Fixture files with their expected output, for unit tests whose cases read
//! better as data than as code (`tests/fixtures/README.md`). A test walks a
//! folder, computes each case's output and compares it with the expected
//! file beside it; with `REKEY_BLESS=1` it writes the expected file instead.
//! Test-only: nothing here is in the shipped binary.

use std::path::{Path, PathBuf};

/// `tests/fixtures/<dir>`.
pub(crate) fn dir(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
}

/// The files of `dir` whose name ends with `suffix`, sorted.
pub(crate) fn cases(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

/// `case` with `suffix` in place of `from`: `a.toml` → `a.expected.json`.
pub(crate) fn sibling(case: &Path, from: &str, suffix: &str) -> PathBuf {
    let name = case.file_name().unwrap().to_string_lossy();
    let stem = name.strip_suffix(from).unwrap_or(&name);
    case.with_file_name(format!("{stem}{suffix}"))
}

/// Expected files in `dir` (ending with `expected`) whose case (ending with
/// `case`) is gone: a renamed or deleted case leaves one, checked by nothing.
pub(crate) fn strays(dir: &Path, case: &str, expected: &str) -> Vec<String> {
    cases(dir, expected)
        .into_iter()
        .filter(|e| !sibling(e, expected, case).exists())
        .map(|e| format!("{}: no case `…{case}` beside it", e.display()))
        .collect()
}

fn blessing() -> bool {
    std::env::var_os("REKEY_BLESS").is_some_and(|v| v == "1")
}

/// `got` against the expected file: `None` when they are equal, else what
/// differs. With `REKEY_BLESS=1`, writes `got` as the expected file.
pub(crate) fn compare(expected: &Path, got: &str) -> Option<String> {
    if blessing() {
        std::fs::write(expected, got).unwrap_or_else(|e| panic!("{}: {e}", expected.display()));
        return None;
    }
    let Ok(want) = std::fs::read_to_string(expected) else {
        return Some(format!(
            "{}: missing (REKEY_BLESS=1 writes it)",
            expected.display()
        ));
    };
    if want == got {
        return None;
    }
    let (n, w, g) = want
        .lines()
        .chain(std::iter::repeat("<end>"))
        .zip(got.lines().chain(std::iter::repeat("<end>")))
        .enumerate()
        .find(|(_, (w, g))| w != g)
        .map(|(n, (w, g))| (n + 1, w, g))
        .unwrap_or((0, "", ""));
    Some(format!(
        "{}:{n}: expected\n    {w}\n  got\n    {g}\n  (the whole output:)\n{got}",
        expected.display()
    ))
}

/// Fails with every case that failed, and when fewer than `at_least` cases
/// ran (a folder emptied by mistake checks nothing).
pub(crate) fn finish(what: &str, checked: usize, at_least: usize, failures: &[String]) {
    assert!(
        checked >= at_least,
        "{what}: {checked} cases checked, at least {at_least} expected"
    );
    assert!(
        failures.is_empty(),
        "{what}: {} problems in {checked} cases (REKEY_BLESS=1 rewrites the expected files; read the diff):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
