//! The shape of the codebase, checked: the relay's crates depend on each other only along the
//! arrows docs/architecture.md draws, the fakes reach the relay only through its core and its
//! local runtime, and no crate's top-level modules import each other in a cycle. A new arrow
//! or a new cycle fails here with the path that makes it.
#![allow(clippy::unwrap_used, reason = "a test")]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace crates each relay crate (and the fakes) may depend on, normal dependencies
/// only. Everything else of the workspace is refused.
const ALLOWED: &[(&str, &[&str])] = &[
    ("tether-relay-core", &["tether-client", "tether-proto"]),
    ("tether-store", &["tether-relay-core", "tether-client"]),
    (
        "tether-egress",
        &[
            "tether-relay-core",
            "tether-store",
            "tether-client",
            "tether-proto",
        ],
    ),
    (
        "tether-local",
        &[
            "tether-relay-core",
            "tether-client",
            "tether-oci",
            "tether-proto",
            "tether-signals",
            "tether-mountinfo",
        ],
    ),
    (
        "tether-providers",
        &[
            "tether-relay-core",
            "tether-client",
            "tether-oci",
            "tether-proto",
        ],
    ),
    (
        "tether-relay",
        &[
            "tether-relay-core",
            "tether-store",
            "tether-egress",
            "tether-local",
            "tether-providers",
            "tether-client",
            "tether-oci",
            "tether-proto",
        ],
    ),
    (
        "tether-fakes",
        &[
            "tether-relay-core",
            "tether-local",
            "tether-client",
            "tether-proto",
            "tether-oci",
        ],
    ),
    ("tether-client", &["tether-proto"]),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every workspace package: its name, its source directory and its normal dependencies.
fn packages() -> Vec<(String, PathBuf, BTreeSet<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect();
            let name = p["name"].as_str().unwrap().to_string();
            (name, manifest.parent().unwrap().join("src"), deps)
        })
        .collect()
}

#[test]
fn the_relays_crates_depend_on_each_other_only_along_the_arrows() {
    let packages = packages();
    let workspace: BTreeSet<&str> = packages.iter().map(|(n, _, _)| n.as_str()).collect();
    for (name, allowed) in ALLOWED {
        let (_, _, deps) = packages
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no workspace crate {name}"));
        let refused: Vec<&String> = deps
            .iter()
            .filter(|d| workspace.contains(d.as_str()) && !allowed.contains(&d.as_str()))
            .collect();
        assert!(
            refused.is_empty(),
            "{name} depends on {refused:?}, against the arrows of docs/architecture.md \
             (it may use {allowed:?}): move the shared part down into a crate both may use"
        );
    }
}

#[test]
fn no_crate_has_a_cycle_among_its_top_level_modules() {
    let mut failures = Vec::new();
    for (name, src, _) in packages() {
        if !src.is_dir() {
            continue;
        }
        let graph = module_graph(&src);
        if let Some(cycle) = find_cycle(&graph) {
            failures.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        failures.is_empty(),
        "top-level modules that import each other in a cycle (move what both need into a \
         module below them):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_checker_finds_a_cycle_and_ignores_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    fs::write(
        src.join("a.rs"),
        "use super::b::X;\n// crate::c in a comment\n",
    )
    .unwrap();
    fs::create_dir(src.join("b")).unwrap();
    fs::write(src.join("b/mod.rs"), "mod inner;").unwrap();
    fs::write(src.join("b/inner.rs"), "fn f() { super::super::c::g(); }").unwrap();
    fs::write(
        src.join("c.rs"),
        "pub fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::Y;\n}\n",
    )
    .unwrap();
    assert_eq!(find_cycle(&module_graph(src)), None);
    fs::write(src.join("c.rs"), "pub fn g() { crate::a::y(); }").unwrap();
    assert_eq!(
        find_cycle(&module_graph(src)).unwrap(),
        ["a", "b", "c", "a"].map(String::from).to_vec()
    );
}

/// The crate's top-level modules and which of them each one names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut tops = BTreeSet::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if name == "lib" || name == "main" || name == "tests" {
            continue;
        }
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
            tops.insert(name);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        tops.iter().map(|t| (t.clone(), BTreeSet::new())).collect();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).unwrap();
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().to_string())
            .collect();
        if parts.iter().any(|p| p == "tests" || p == "tests.rs") {
            continue;
        }
        let owner = parts[0].trim_end_matches(".rs").to_string();
        if !tops.contains(&owner) {
            continue;
        }
        // How many `super::` reach the crate root from this file's module.
        let depth = parts.len() - usize::from(parts.last().unwrap() == "mod.rs");
        let text = without_tests(&strip_comments(&fs::read_to_string(&file).unwrap()));
        for named in named_top_modules(&text, depth) {
            if named != owner && tops.contains(&named) {
                graph.get_mut(&owner).unwrap().insert(named);
            }
        }
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The text without `//` comments (doc comments included: links are not imports).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text without its `#[cfg(test)] mod NAME { ... }` blocks.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        let Some(open) = after.find(['{', ';']).filter(|_| after.starts_with("mod ")) else {
            // Test-only code that is not a module (a function, an import): kept.
            rest = after;
            continue;
        };
        if after.as_bytes()[open] == b';' {
            rest = &after[open + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The top-level modules `text` names, through `crate::NAME` or `depth` times `super::`.
fn named_top_modules(text: &str, depth: usize) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let bytes = text.as_bytes();
    let word_start = |at: usize| {
        at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_'
                || bytes[at - 1] == b':')
    };
    for (at, _) in text.match_indices("crate::") {
        if word_start(at) {
            named.insert(ident(&text[at + "crate::".len()..]));
        }
    }
    let chain = "super::".repeat(depth);
    for (at, _) in text.match_indices(&chain) {
        let after = &text[at + chain.len()..];
        if word_start(at) && !after.starts_with("super::") {
            named.insert(ident(after));
        }
    }
    named
}

/// A cycle in `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}
