//! The layers of docs/architecture.md, held: every `crate::` path in `src/` (test code aside)
//! names a module in the same row of its table or a row above it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each module's row in the table, top row 0. `main.rs` is the module `main`.
fn layers() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let table = doc
        .split("## The layers")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/architecture.md has a section \"The layers\"");
    let mut out = BTreeMap::new();
    let rows = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split(" | ").next().unwrap());
    for (row, first) in rows.enumerate() {
        // The module names are the backticked words before any parenthesis.
        let names = first.split('(').next().unwrap();
        for name in names.split('`').skip(1).step_by(2) {
            out.insert(name.trim_end_matches(".rs").to_owned(), row);
        }
    }
    out
}

/// The source without test-only items (`#[cfg(test)]` and the item after it).
fn without_tests(source: &str) -> String {
    let mut out = String::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let mut depth = 0i64;
        for item in lines.by_ref() {
            depth += item.matches('{').count() as i64 - item.matches('}').count() as i64;
            if depth <= 0 && (item.ends_with('}') || item.ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// The modules `source` names: `crate::a::...` and `use crate::{a, b}`.
fn named(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in source.split("crate::").skip(1) {
        if let Some(group) = part.strip_prefix('{') {
            let group = group.split('}').next().unwrap();
            for item in group.split(',') {
                let name = item.trim().split("::").next().unwrap().trim();
                if !name.is_empty() {
                    out.push(name.to_owned());
                }
            }
        } else {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            out.push(name);
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_in_src_uses_one_below_it_in_the_architecture_table() {
    let layers = layers();
    let src = root().join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut wrong = Vec::new();
    let mut unplaced = Vec::new();
    for path in all {
        let relative = path.strip_prefix(&src).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        // lib.rs only declares the modules; a tests.rs is a `#[cfg(test)] mod tests;`.
        if module == "lib" || path.file_name().unwrap() == "tests.rs" {
            continue;
        }
        let Some(&row) = layers.get(&module) else {
            unplaced.push(module);
            continue;
        };
        let source = without_tests(&std::fs::read_to_string(&path).unwrap());
        for used in named(&source) {
            // `crate::Error`, `crate::Result`: the root's two types.
            if used.is_empty() || used == module {
                continue;
            }
            match layers.get(&used) {
                Some(&at) if at <= row => {}
                Some(_) => wrong.push(format!("{} uses {used}", relative.display())),
                None => unplaced.push(used),
            }
        }
    }
    unplaced.sort();
    unplaced.dedup();
    assert!(
        unplaced.is_empty(),
        "modules missing from docs/architecture.md's table: {unplaced:?}"
    );
    assert!(
        wrong.is_empty(),
        "imports that point down docs/architecture.md's layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_what_it_is_meant_to_see() {
    let source = "use crate::{api, tls::CertStore};\nfn f() { crate::metrics::now(); }\n\
                  #[cfg(test)]\nmod tests {\n    use crate::testing::FakeApi;\n}\nuse crate::x;\n";
    assert_eq!(
        named(&without_tests(source)),
        ["api", "tls", "metrics", "x"]
    );
    let layers = layers();
    assert!(layers["api"] < layers["admission"]);
    assert!(layers["tls"] < layers["metrics"]);
    assert_eq!(layers["listen"], layers["metrics"]);
    assert!(layers["controller"] < layers["main"]);
}
