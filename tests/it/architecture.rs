//! The architecture invariants of ARCHITECTURE.md, checked against the
//! sources: which layer may import which, who may call the SDK, print to
//! stdout or redact, and that no two modules — nor two files of one layer —
//! import each other through any chain. A rule that breaks names the file,
//! the line and the import.
//!
//! The sources are read as text: comments and string literals are blanked
//! first, then every `crate::…` path (in `use` trees too) and every
//! `super::…` path is resolved to the module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers: folders under `src/` whose modules are named `layer::module`.
const LAYERS: [&str; 6] = ["core", "aws", "state", "phase", "ops", "local"];

/// One source file: its module path and its text without comments and strings.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    code: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                out.push(Source {
                    module: module_of(rel),
                    code: blank_test_modules(&blank_comments_and_strings(&text)),
                    path,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// `a/b.rs` → [a, b]; `a/mod.rs` → [a]; `lib.rs`, `main.rs` → [].
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The text with comments, string and char literals replaced by spaces
/// (newlines kept, so line numbers stay right).
fn blank_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 1;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 1;
                    }
                    j += 1;
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'r' if is_raw_string_start(b, i) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                let body = i + 2 + hashes;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let end = b[body..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| body + p + close.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, (j + 1).min(b.len()));
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..]
                        .iter()
                        .position(|&c| c == b'\'')
                        .map(|p| i + 3 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    Some(i + 3)
                } else {
                    std::str::from_utf8(&b[i + 1..])
                        .ok()
                        .and_then(|rest| rest.chars().next())
                        .filter(|c| c.len_utf8() > 1)
                        .and_then(|c| {
                            let after = i + 1 + c.len_utf8();
                            (b.get(after) == Some(&b'\'')).then_some(after + 1)
                        })
                };
                match end {
                    Some(end) => {
                        blank(&mut out, i, end);
                        i = end;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The code with `#[cfg(test)] mod … { … }` blanked: unit tests may reach
/// anywhere, and their `super::` is relative to an inline module.
fn blank_test_modules(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(p) = code[from..].find("#[cfg(test)]") {
        let start = from + p;
        let after = &code[start + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        from = start + 1;
        if !trimmed.starts_with("mod ") {
            continue;
        }
        let Some(open) = code[start..].find('{').map(|o| start + o) else {
            break;
        };
        let mut depth = 0;
        let mut end = code.len();
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        for c in &mut out[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_raw_string_start(b: &[u8], i: usize) -> bool {
    let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if prev_ident {
        return false;
    }
    let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
    b.get(i + 1 + hashes) == Some(&b'"')
}

/// An import of one module by another, where it is written.
#[derive(Debug, Clone)]
struct Import {
    line: usize,
    path: Vec<String>,
}

/// Every path the code names through `crate::` or `super::`, expanded out of
/// `use` trees, as absolute module paths.
fn imports(src: &Source) -> Vec<Import> {
    let code = src.code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &src.code[i..];
        let starts_word = i == 0 || !is_ident(code[i - 1]) && code[i - 1] != b':';
        let base: Option<(Vec<String>, usize)> = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            // `super::super::x` climbs once per `super`.
            let mut m = self_module(src);
            let mut len = 0;
            while src.code[i + len..].starts_with("super::") {
                m.pop();
                len += "super::".len();
            }
            Some((m, len))
        } else {
            None
        };
        let Some((base, len)) = base else {
            i += 1;
            continue;
        };
        let line = src.code[..i].matches('\n').count() + 1;
        let (paths, used) = parse_tree(&src.code[i + len..]);
        for p in paths {
            let mut full = base.clone();
            full.extend(p);
            out.push(Import { line, path: full });
        }
        i += len + used.max(1);
    }
    out
}

/// The module whose items a file's `super::` is relative to: a `mod.rs`
/// names its own module, so `super` is its parent.
fn self_module(src: &Source) -> Vec<String> {
    src.module.clone()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Parses `a::b::{c, d::e}` into [[a,b,c],[a,b,d,e]]; returns the bytes used.
fn parse_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let b = s.as_bytes();
    let mut i = 0;
    let mut prefix: Vec<String> = Vec::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) == Some(&b'{') {
            let mut paths = Vec::new();
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let (sub, used) = parse_tree(&s[i..]);
                for p in sub {
                    let mut full = prefix.clone();
                    full.extend(p);
                    paths.push(full);
                }
                i += used.max(1);
            }
            return (paths, i);
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if start == i {
            return (vec![prefix], i);
        }
        prefix.push(s[start..i].to_string());
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The unit an import names for the layering rules: `layer::module` inside
/// a layer folder, else the top-level module.
fn unit(path: &[String]) -> Option<String> {
    let first = path.first()?;
    if LAYERS.contains(&first.as_str()) {
        match path.get(1) {
            Some(second) if second.chars().next().is_some_and(char::is_lowercase) => {
                Some(format!("{first}::{second}"))
            }
            _ => Some(first.clone()),
        }
    } else {
        Some(first.clone())
    }
}

fn layer(unit: &str) -> &str {
    unit.split("::").next().unwrap_or(unit)
}

/// Units that are modules (a file or folder exists for them).
fn known_units(srcs: &[Source]) -> BTreeSet<String> {
    srcs.iter().filter_map(|s| unit(&s.module)).collect()
}

/// (from unit, to unit) → the first place it is written.
fn edges(srcs: &[Source]) -> BTreeMap<(String, String), String> {
    let known = known_units(srcs);
    let mut out = BTreeMap::new();
    for s in srcs {
        let Some(from) = unit(&s.module) else {
            continue; // lib.rs and main.rs wire everything
        };
        for imp in imports(s) {
            let Some(to) = unit(&imp.path) else { continue };
            if to == from || !known.contains(&to) {
                continue;
            }
            out.entry((from.clone(), to)).or_insert_with(|| {
                format!(
                    "{}:{} imports crate::{}",
                    rel(&s.path),
                    imp.line,
                    imp.path.join("::")
                )
            });
        }
    }
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(p)
        .display()
        .to_string()
}

/// Layer rule: `from` layer may import only the layers `allowed` returns.
fn check_layers(allowed: impl Fn(&str) -> Option<&'static [&'static str]>) -> Vec<String> {
    let srcs = sources();
    let mut bad = Vec::new();
    for ((from, to), at) in edges(&srcs) {
        let (lf, lt) = (layer(&from), layer(&to));
        if let Some(ok) = allowed(lf)
            && lf != lt
            && !ok.contains(&lt)
        {
            bad.push(format!("{from} → {to}: {at}"));
        }
    }
    bad
}

#[test]
fn architecture_invariant_core_imports_only_core() {
    let bad = check_layers(|l| (l == "core").then_some(&[][..]));
    assert!(
        bad.is_empty(),
        "core imports outside core:\n{}",
        bad.join("\n")
    );
}

#[test]
fn architecture_invariant_aws_imports_only_core() {
    let bad = check_layers(|l| (l == "aws").then_some(&["core"][..]));
    assert!(bad.is_empty(), "aws imports:\n{}", bad.join("\n"));
}

#[test]
fn architecture_invariant_phase_never_imports_ops() {
    let bad = check_layers(|l| (l == "phase").then_some(&["core", "aws", "state", "local"][..]));
    assert!(bad.is_empty(), "phase imports:\n{}", bad.join("\n"));
}

#[test]
fn architecture_invariant_state_never_imports_phase() {
    let bad = check_layers(|l| (l == "state").then_some(&["core", "aws"][..]));
    assert!(bad.is_empty(), "state imports:\n{}", bad.join("\n"));
}

/// clippy's `wildcard_imports` (denied in lib.rs) lets `use super::*`
/// through, and `phase::tail` had four of them: so it is checked here.
/// Outside test modules, every import names what it takes.
#[test]
fn architecture_invariant_no_glob_import_outside_test_modules() {
    let mut bad = Vec::new();
    // A test module in a file of its own (`#[cfg(test)] mod tests;`) may glob.
    for s in sources()
        .into_iter()
        .filter(|s| !s.module.iter().any(|m| m == "tests"))
    {
        for (n, line) in s.code.lines().enumerate() {
            if line.contains("::*") {
                bad.push(format!("{}:{}: {}", rel(&s.path), n + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "glob imports:\n{}", bad.join("\n"));
}

/// Lines of code outside `layer` that match `pattern` (a plain substring).
fn uses_outside(layer_dirs: &[&str], patterns: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for s in sources() {
        let inside = s
            .module
            .first()
            .is_some_and(|m| layer_dirs.contains(&m.as_str()));
        if inside {
            continue;
        }
        for (n, line) in s.code.lines().enumerate() {
            if let Some(p) = patterns.iter().find(|p| contains_word(line, p)) {
                bad.push(format!("{}:{}: {p}", rel(&s.path), n + 1));
            }
        }
    }
    bad
}

/// `pattern` in `line`, not as the tail of a longer name (`eprintln!` is
/// not `println!`).
fn contains_word(line: &str, pattern: &str) -> bool {
    line.match_indices(pattern).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        !pattern.starts_with(|c: char| c.is_alphanumeric())
            || !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn architecture_invariant_only_aws_calls_the_sdk() {
    let bad = uses_outside(
        &["aws"],
        &["aws_sdk_", "aws_smithy_", "aws_config", ".send()"],
    );
    assert!(bad.is_empty(), "SDK use outside aws/:\n{}", bad.join("\n"));
}

#[test]
fn architecture_invariant_only_ops_prints_to_stdout_or_redacts() {
    let bad = uses_outside(&["ops"], &["println!", "print!(", "stdout()", "Redactor"]);
    assert!(
        bad.is_empty(),
        "stdout or redaction outside ops/:\n{}",
        bad.join("\n")
    );
}

/// `-v`/`RUST_LOG`: the other layers emit tracing events, and only `ops`
/// decides where they go (`ops::log` installs the one subscriber, on stderr).
/// `main.rs` calls it rather than naming the subscriber itself.
#[test]
fn architecture_invariant_only_ops_installs_the_log_subscriber() {
    let bad = uses_outside(&["ops"], &["tracing_subscriber"]);
    assert!(
        bad.is_empty(),
        "log subscriber outside ops/:\n{}",
        bad.join("\n")
    );
}

/// A cycle in the unit graph, as `a → b → … → a` with where each edge is written.
fn find_cycle(edges: &BTreeMap<(String, String), String>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    // Depth-first search with an explicit path; colours: 1 on path, 2 done.
    let mut colour: BTreeMap<&str, u8> = BTreeMap::new();
    for &start in next.keys() {
        if colour.contains_key(start) {
            continue;
        }
        let mut path: Vec<(&str, usize)> = vec![(start, 0)];
        colour.insert(start, 1);
        while let Some(&mut (node, ref mut k)) = path.last_mut() {
            let outs = next.get(node).map(Vec::as_slice).unwrap_or_default();
            if *k < outs.len() {
                let to = outs[*k];
                *k += 1;
                match colour.get(to) {
                    Some(1) => {
                        let from = path.iter().position(|(n, _)| *n == to).unwrap();
                        let mut cycle: Vec<&str> = path[from..].iter().map(|(n, _)| *n).collect();
                        cycle.push(to);
                        return Some(
                            cycle
                                .windows(2)
                                .map(|w| {
                                    let at = &edges[&(w[0].to_string(), w[1].to_string())];
                                    format!("{} → {} ({at})", w[0], w[1])
                                })
                                .collect(),
                        );
                    }
                    Some(_) => {}
                    None => {
                        colour.insert(to, 1);
                        path.push((to, 0));
                    }
                }
            } else {
                colour.insert(node, 2);
                path.pop();
            }
        }
    }
    None
}

#[test]
fn architecture_invariant_no_import_cycle() {
    let srcs = sources();
    if let Some(cycle) = find_cycle(&edges(&srcs)) {
        panic!("import cycle:\n{}", cycle.join("\n"));
    }
}

/// (from file, to file) → the first place it is written, for the imports
/// between two files of one layer. An import names the file of the longest
/// prefix of its path that is a module: `super::analysis::Irreversible` is
/// `analysis.rs`, `super::*` the parent's `mod.rs` (a re-export counts as
/// the file that re-exports).
fn file_edges(srcs: &[Source]) -> BTreeMap<(String, String), String> {
    let files: BTreeMap<&[String], String> = srcs
        .iter()
        .map(|s| (s.module.as_slice(), rel(&s.path)))
        .collect();
    let mut out = BTreeMap::new();
    for s in srcs {
        let Some(layer) = s.module.first() else {
            continue; // lib.rs and main.rs wire everything
        };
        for imp in imports(s) {
            let Some(to) = (1..=imp.path.len())
                .rev()
                .map(|n| &imp.path[..n])
                .find(|m| files.contains_key(m))
            else {
                continue;
            };
            if to == s.module.as_slice() || to.first() != Some(layer) {
                continue;
            }
            let from = rel(&s.path);
            out.entry((from.clone(), files[to].clone()))
                .or_insert_with(|| {
                    format!("{from}:{} imports crate::{}", imp.line, imp.path.join("::"))
                });
        }
    }
    out
}

/// Within a layer, no two files import each other through any chain: a
/// piece both need goes into one of them or a third file, so each file can
/// be read (and changed) knowing only the files below it.
#[test]
fn architecture_invariant_no_file_cycle_within_a_layer() {
    let srcs = sources();
    if let Some(cycle) = find_cycle(&file_edges(&srcs)) {
        panic!("file import cycle:\n{}", cycle.join("\n"));
    }
}

#[test]
fn the_import_reader_sees_use_trees_super_and_skips_strings_and_comments() {
    let src = Source {
        path: PathBuf::from("src/phase/tail.rs"),
        module: vec!["phase".into(), "tail".into()],
        code: blank_comments_and_strings(
            "use crate::{core::plan::{Plan, Rule}, aws};\n\
             // use crate::ops::cli;\n\
             let s = \"crate::ops::x\"; let r = r#\"crate::ops::y\"#;\n\
             fn f<'a>(c: char) -> bool { c == '\"' && super::watch::go() }\n\
             x::crate::not_this;\n",
        ),
    };
    let got: Vec<String> = imports(&src).iter().map(|i| i.path.join("::")).collect();
    assert_eq!(
        got,
        [
            "core::plan::Plan",
            "core::plan::Rule",
            "aws",
            "phase::watch::go"
        ]
    );
    let mut e = BTreeMap::new();
    e.insert(("a".to_string(), "b".to_string()), "x".to_string());
    e.insert(("b".to_string(), "c".to_string()), "y".to_string());
    assert_eq!(find_cycle(&e), None);
    e.insert(("c".to_string(), "a".to_string()), "z".to_string());
    assert_eq!(
        find_cycle(&e).unwrap(),
        ["a → b (x)", "b → c (y)", "c → a (z)"]
    );
}

#[test]
fn the_file_graph_names_the_file_of_the_longest_module_prefix() {
    let src = |path: &str, module: &[&str], code: &str| Source {
        path: Path::new(env!("CARGO_MANIFEST_DIR")).join(path),
        module: module.iter().map(|m| m.to_string()).collect(),
        code: code.into(),
    };
    let srcs = [
        src("src/core/a/mod.rs", &["core", "a"], "use crate::aws::X;\n"),
        src(
            "src/core/a/b.rs",
            &["core", "a", "b"],
            "use super::c::{Y, Z};\nuse super::*;\n",
        ),
        src("src/core/a/c.rs", &["core", "a", "c"], "use super::b::W;\n"),
    ];
    let e = file_edges(&srcs);
    let got: Vec<(&str, &str)> = e.keys().map(|(f, t)| (f.as_str(), t.as_str())).collect();
    assert_eq!(
        got,
        [
            ("src/core/a/b.rs", "src/core/a/c.rs"),
            ("src/core/a/b.rs", "src/core/a/mod.rs"),
            ("src/core/a/c.rs", "src/core/a/b.rs"),
        ],
        "one edge per pair, none to another layer"
    );
    assert_eq!(find_cycle(&e).map(|c| c.len()), Some(2));
}

/// The shipped binary carries no test machinery: the proxy, the stand-in and
/// the export writer are in the dev-only crate `crates/testkit`, and neither
/// it nor an HTTP server is a dependency of `rekey` itself.
#[test]
fn architecture_invariant_the_shipped_binary_carries_no_test_machinery() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("Cargo.toml");
    let deps: toml::Table =
        toml::from_str::<toml::Table>(&manifest).expect("valid TOML")["dependencies"]
            .as_table()
            .cloned()
            .expect("[dependencies]");
    for banned in ["hyper", "hyper-util", "http-body-util", "rekey-testkit"] {
        assert!(
            !deps.contains_key(banned),
            "`{banned}` is a dependency of the shipped binary"
        );
    }
    let dev: toml::Table = toml::from_str::<toml::Table>(&manifest).unwrap()["dev-dependencies"]
        .as_table()
        .cloned()
        .unwrap();
    assert!(dev.contains_key("rekey-testkit"), "tests use the testkit");
}

/// The modules that may be `pub`, each with the user outside the library
/// that names it: `main` (src/main.rs), the integration tests and the
/// `bench_export` example, or the testkit (crates/testkit). Everything else
/// is `pub(crate)` or private, so `dead_code` sees what nothing calls.
const PUBLIC_MODULES: &[(&str, &str)] = &[
    ("aws", "tests: SDK clients, to_sdk_item, error_chain"),
    (
        "aws::control",
        "tests: plant and read the fleet's control table",
    ),
    (
        "aws::export",
        "testkit writes the exports it reads; tests, the example read them",
    ),
    ("aws::item", "tests: delete_item as the application"),
    ("aws::rate", "tests: a rate Control"),
    ("aws::streams", "tests: a ShardInfo"),
    ("aws::write", "tests: put_all seeds tables"),
    ("core", "tests, testkit: the item model"),
    ("core::hash", "tests: shard()"),
    ("core::inverse", "tests: key_injective"),
    ("core::itemline", "tests: parse_line reads reject files"),
    ("core::marker", "tests: marker items"),
    ("core::plan", "tests, testkit, the example: Plan"),
    ("core::query", "tests: query conditions"),
    (
        "core::transform",
        "testkit's stand-in, the example: transform",
    ),
    ("core::value", "tests, testkit, the example: Item and Value"),
    ("local", "tests, testkit: the local AWS (moto)"),
    (
        "local::child",
        "testkit: its shadow server is a child process",
    ),
    ("ops", "main"),
    (
        "ops::cli",
        "main parses the arguments; tests list the commands",
    ),
    ("ops::cli::exit", "main: exit codes"),
    ("ops::commands", "main runs the command"),
    ("ops::config", "main: the checked Config"),
    ("ops::demo", "tests: demo items; testkit: DEMO_PLAN"),
    ("ops::log", "main installs the log subscriber"),
    ("ops::out", "main prints through it"),
    ("ops::redact", "tests: redaction"),
    ("ops::shutdown", "main: signals"),
    ("phase", "tests call phases directly"),
    ("phase::backfill", "tests: backfill Counters"),
    ("phase::error", "main: Stopped's exit code"),
    ("phase::inplace", "tests: in-place decisions"),
    ("phase::markers", "tests: probe markers"),
    ("phase::query", "tests: run a query"),
    ("phase::verify", "tests: wait for the fleet's tail"),
    ("phase::watch", "tests: a stream Watch"),
    ("state", "tests: StateDir and StateStore"),
    ("state::fleet", "tests: the fleet's snapshots and leases"),
    ("state::fleet::shard", "tests: shard units"),
    ("state::markers", "tests: the markers ledger"),
];

/// Every `pub mod` in `src` (test modules aside), as a module path.
fn public_modules(srcs: &[Source]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for src in srcs {
        for (n, line) in src.code.lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("pub mod ") else {
                continue;
            };
            let name: String = rest
                .bytes()
                .take_while(|&c| is_ident(c))
                .map(char::from)
                .collect();
            let mut path = src.module.clone();
            path.push(name);
            out.insert(path.join("::"), format!("{}:{}", rel(&src.path), n + 1));
        }
    }
    out
}

/// The public surface stays what its users need (lib.rs, "The public
/// surface"): a module is `pub` only when listed in [`PUBLIC_MODULES`] with
/// the user that needs it, and a listed module is still `pub`.
#[test]
fn architecture_invariant_only_listed_modules_are_public() {
    let public = public_modules(&sources());
    let listed: BTreeSet<&str> = PUBLIC_MODULES.iter().map(|(m, _)| *m).collect();
    let unlisted: Vec<String> = public
        .iter()
        .filter(|(m, _)| !listed.contains(m.as_str()))
        .map(|(m, at)| format!("{at}: `pub mod` {m}"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "public modules no user outside the library needs (make them pub(crate), or list \
         them in PUBLIC_MODULES with the user that needs them):\n{}",
        unlisted.join("\n")
    );
    let stale: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|m| !public.contains_key(*m))
        .collect();
    assert!(stale.is_empty(), "listed but not `pub mod`: {stale:?}");
}

// ARCHITECTURE.md itself: a map that stays short, names checks that exist,
// and links to files and headings that exist.

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// ARCHITECTURE.md is a map: a design that needs more room goes to `docs/`
/// and is linked from it.
#[test]
fn architecture_md_is_at_most_400_lines() {
    let lines = repo_file("ARCHITECTURE.md").lines().count();
    assert!(
        lines <= 400,
        "ARCHITECTURE.md has {lines} lines (at most 400): move a design to docs/ and link it"
    );
}

/// The tests a document names as checks: every backticked `a::b::test_name`
/// after "Checked by", up to the end of that sentence (a `.` outside
/// backticks), with the line it starts on.
fn named_checks(md: &str) -> Vec<(usize, String)> {
    const MARK: &str = "Checked by";
    let mut out = Vec::new();
    for (at, _) in md.match_indices(MARK) {
        let line = md[..at].matches('\n').count() + 1;
        let rest = &md[at + MARK.len()..];
        let mut in_code = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                if c == '`' {
                    in_code = !in_code;
                }
                c == '.' && !in_code
            })
            .map_or(rest.len(), |(i, _)| i);
        let names: Vec<String> = rest[..end]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        if names.is_empty() {
            out.push((line, String::new())); // a "Checked by" that names nothing
        }
        out.extend(names.into_iter().map(|n| (line, n)));
    }
    out
}

/// Every `.rs` file under `src/`, `tests/` and `crates/`, as (path
/// components without `.rs`, text).
fn rust_files() -> Vec<(Vec<String>, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = ["src", "tests", "crates"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let parts = path
                    .strip_prefix(root)
                    .unwrap()
                    .iter()
                    .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                    .collect();
                out.push((parts, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out
}

/// `a::b::name` resolves when a file whose path holds `a` then `b` (in
/// order, not necessarily adjacent: `backfill::x` is `tests/it/backfill.rs`,
/// `ops::iam::tests::x` is `src/ops/iam/tests.rs`) defines `fn name`.
fn resolves(check: &str, files: &[(Vec<String>, String)]) -> bool {
    let segs: Vec<&str> = check.split("::").collect();
    let Some((name, modules)) = segs.split_last() else {
        return false;
    };
    let is_ident =
        |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if modules.is_empty() || !segs.iter().all(|s| is_ident(s)) {
        return false;
    }
    files.iter().any(|(parts, text)| {
        let mut want = modules.iter().peekable();
        for p in parts {
            if want.peek().is_some_and(|m| *m == p) {
                want.next();
            }
        }
        want.peek().is_none()
            && text.match_indices(&format!("fn {name}")).any(|(i, m)| {
                !text[i + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            })
    })
}

#[test]
fn every_check_architecture_md_names_is_a_test_that_exists() {
    let md = repo_file("ARCHITECTURE.md");
    let checks = named_checks(&md);
    assert!(
        checks.len() >= 20,
        "ARCHITECTURE.md names its checks: {checks:?}"
    );
    let files = rust_files();
    let bad: Vec<String> = checks
        .iter()
        .filter(|(_, c)| !resolves(c, &files))
        .map(|(line, c)| format!("ARCHITECTURE.md:{line}: `{c}`"))
        .collect();
    assert!(
        bad.is_empty(),
        "checks named after \"Checked by\" that are no `module::fn` in src/, tests/ or crates/:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_reader_takes_backticked_paths_to_the_sentences_end_and_resolves_them() {
    let md = "- **No x.** Text `not_this::one`. Checked by `a::b_c` and\n  `d::e`. Then `f::g`.\n\
              - Checked by nothing.\n";
    assert_eq!(
        named_checks(md),
        [
            (1, "a::b_c".to_string()),
            (1, "d::e".to_string()),
            (3, String::new())
        ]
    );
    let files = vec![(
        vec!["tests".to_string(), "it".to_string(), "tail".to_string()],
        "#[test]\nfn drains_all() {}\nfn drains_all_twice() {}\n".to_string(),
    )];
    assert!(resolves("tail::drains_all", &files));
    assert!(resolves("it::tail::drains_all_twice", &files));
    assert!(
        !resolves("tail::drains", &files),
        "a prefix of a name is not the name"
    );
    assert!(!resolves("lineage::drains_all", &files), "another module");
    assert!(!resolves("drains_all", &files), "no module");
    assert!(!resolves("", &files));
}

/// GitHub's anchor for a heading: lower case, only letters, digits, spaces,
/// `-` and `_` kept, spaces as `-`; a repeated heading gets `-1`, `-2`, ….
fn heading_anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in outside_code_blocks(md).into_iter().map(|(_, l)| l) {
        let Some(text) = line.strip_prefix('#') else {
            continue;
        };
        let text = text.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let slug: String = text
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// (line number, line) of the lines outside fenced code blocks.
fn outside_code_blocks(md: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in md.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((n + 1, line));
        }
    }
    out
}

/// The `[text](target)` links of a document, with their line: not in code
/// blocks, not in code spans.
fn markdown_links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in outside_code_blocks(md) {
        // Code spans blanked, a link's text may hold one: [`x`](y).
        let text: String = line
            .split('`')
            .enumerate()
            .map(|(k, part)| if k % 2 == 0 { part } else { "" })
            .collect::<Vec<_>>()
            .join("");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// A relative link's problem, if any: no such file, or no such heading.
fn broken_link(from: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(file)
    };
    if !path.exists() {
        return Some(format!("no file {}", path.display()));
    }
    let anchor = anchor?;
    if path.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let anchors = heading_anchors(&std::fs::read_to_string(&path).unwrap());
    (!anchors.contains(anchor)).then(|| format!("no heading `#{anchor}` in {}", rel(&path)))
}

#[test]
fn every_relative_markdown_link_resolves_to_a_file_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = vec![root.join("ARCHITECTURE.md"), root.join("README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    let mut bad = Vec::new();
    let mut count = 0;
    for doc in &docs {
        let md = std::fs::read_to_string(doc).unwrap();
        for (line, target) in markdown_links(&md) {
            count += 1;
            if let Some(why) = broken_link(doc, &target) {
                bad.push(format!("{}:{line}: ({target}): {why}", rel(doc)));
            }
        }
    }
    assert!(count >= 10, "the documents link each other ({count} links)");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn anchors_follow_githubs_heading_rule_and_links_skip_code() {
    let md = "# Top\n## Drain barriers, `applied_through` and markers\n## The fleet's tail: shards\n\
              ```\n# not a heading [x](nowhere.md)\n```\n## Top\n\
              See [`a`](b.md#c) and `[no](link.md)` and [d](https://x.y/z).\n";
    let anchors: Vec<String> = heading_anchors(md).into_iter().collect();
    assert_eq!(
        anchors,
        [
            "drain-barriers-applied_through-and-markers",
            "the-fleets-tail-shards",
            "top",
            "top-1"
        ]
    );
    assert_eq!(
        markdown_links(md),
        [(8, "b.md#c".to_string()), (8, "https://x.y/z".to_string())]
    );
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    assert_eq!(broken_link(&here, "https://x.y/z"), None);
    assert_eq!(broken_link(&here, "docs/fleet.md#how-it-works"), None);
    assert!(broken_link(&here, "docs/fleet.md#no-such-heading").is_some());
    assert!(broken_link(&here, "docs/no-such-file.md").is_some());
    assert_eq!(broken_link(&here, "#invariants"), None);
}
