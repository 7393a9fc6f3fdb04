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

/// A module's path in the crate, from its file under `src/`: `a/b/mod.rs` is `a::b`, `a/b.rs`
/// is `a::b`, `lib.rs` the root.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" | "lib.rs" => {}
        file => parts.push(file.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// The source without comments (a doc link names a module it does not import).
fn without_comments(source: &str) -> String {
    source
        .lines()
        .map(|l| match l.find("//") {
            Some(at) if !l[..at].contains('"') => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a source names that starts at `crate`, `super` or `self`, with `use` trees
/// expanded (`use a::{b, c::{d, e}}` names `a::b`, `a::c::d`, `a::c::e`).
fn paths(source: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let mut head = prefix.to_vec();
            head.extend(
                tree[..open]
                    .split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            let inner = &tree[open + 1..tree.rfind('}').unwrap()];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&head, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&head, &inner[start..], out);
        } else if !tree.is_empty() {
            let mut path = prefix.to_vec();
            let tree = tree.split(" as ").next().unwrap();
            path.extend(tree.split("::").map(|s| s.trim().to_owned()));
            out.push(path);
        }
    }
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        if before.is_none_or(|c| c.is_whitespace() || c == '{' || c == ';') {
            let tree = tail[..end].trim();
            if tree.starts_with("crate::")
                || tree.starts_with("super::")
                || tree.starts_with("self::")
            {
                expand(&[], tree, &mut out);
            }
            rest = &tail[end..];
        } else {
            rest = tail;
        }
    }
    // Paths in code: `crate::a::b(...)`, `super::super::x`.
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = source[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            let before = source[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String = source[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let parts: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            // `use` lines were expanded above; this one may be one of them: harmless.
            out.push(parts);
        }
    }
    out
}

/// The modules of `src/` by path, each with its file.
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
    let src = root().join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    all.into_iter()
        .filter(|p| p.file_name().unwrap() != "tests.rs" && p.file_name().unwrap() != "main.rs")
        .map(|p| (module_of(p.strip_prefix(&src).unwrap()), p))
        .collect()
}

/// The module a path names, from the module `at`: the longest prefix that is a module.
fn resolve(
    at: &[String],
    path: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => rest = &path[1..],
        "self" => {
            base = at.to_vec();
            rest = &path[1..];
        }
        "super" => {
            base = at.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut found = None;
    for i in 0..=rest.len() {
        let mut candidate = base.clone();
        candidate.extend(rest[..i].iter().cloned());
        if modules.contains_key(&candidate) {
            found = Some(candidate);
        }
    }
    found
}

/// Which modules each module uses (test code and comments aside). A module's use of one of
/// its ancestors is left out: a module is part of its ancestors (it may use their items, and
/// they declare it), so that is no circle.
fn uses() -> BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>> {
    let modules = modules();
    let mut out = BTreeMap::new();
    for (module, file) in &modules {
        let source = without_comments(&without_tests(&std::fs::read_to_string(file).unwrap()));
        let mut used = std::collections::BTreeSet::new();
        for path in paths(&source) {
            if let Some(target) = resolve(module, &path, &modules)
                && target != *module
                && !module.starts_with(&target)
            {
                used.insert(target);
            }
        }
        out.insert(module.clone(), used);
    }
    out
}

/// A circle in `graph`, if any: the modules of one, in order.
fn circle(
    graph: &BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
) -> Option<Vec<String>> {
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut names: Vec<String> =
                        stack[from..].iter().map(|n| n.join("::")).collect();
                    names.push(next.join("::"));
                    return Some(names);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node)
            && let Some(c) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_import_circle_anywhere_in_src() {
    let graph = uses();
    assert!(graph.len() > 100, "{} modules read", graph.len());
    if let Some(c) = circle(&graph) {
        panic!("an import circle: {}", c.join(" -> "));
    }
}

/// The rooms of `src/controller`, from docs/architecture.md's table "The rooms of the
/// reconcile loop": each room's row (top row 0) and whether it is pure.
fn rooms() -> BTreeMap<String, (usize, bool)> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let table = doc
        .split("## The rooms of the reconcile loop")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/architecture.md has a section \"The rooms of the reconcile loop\"");
    let mut out = BTreeMap::new();
    for (row, line) in table.lines().filter(|l| l.starts_with("| `")).enumerate() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let pure = cells.get(1).is_some_and(|c| c.trim() == "pure");
        for name in cells[0].split('`').skip(1).step_by(2) {
            out.insert(name.trim_end_matches(".rs").to_owned(), (row, pure));
        }
    }
    out
}

/// The room of a module under `controller` (`None` for `controller` itself and its tests).
fn room_of(module: &[String]) -> Option<&str> {
    (module.first().map(String::as_str) == Some("controller"))
        .then(|| module.get(1).map(String::as_str))
        .flatten()
}

#[test]
fn every_room_of_the_loop_uses_only_rooms_above_it_and_pure_rooms_do_no_io() {
    let rooms = rooms();
    assert!(rooms.len() >= 6, "{rooms:?}");
    let modules = modules();
    let graph = uses();
    let mut wrong = Vec::new();
    for (module, used) in &graph {
        let Some(room) = room_of(module) else {
            continue;
        };
        let Some(&(row, pure)) = rooms.get(room) else {
            wrong.push(format!(
                "{}: its room {room} is not in the table",
                module.join("::")
            ));
            continue;
        };
        for target in used {
            if target.as_slice() == ["controller"] {
                wrong.push(format!(
                    "{} imports through `controller`'s re-exports: import from the room that defines it",
                    module.join("::")
                ));
            }
            if let Some(other) = room_of(target)
                && other != room
                && rooms.get(other).is_none_or(|&(r, _)| r > row)
            {
                wrong.push(format!("{} uses {}", module.join("::"), target.join("::")));
            }
        }
        if pure {
            let source = without_comments(&without_tests(
                &std::fs::read_to_string(&modules[module]).unwrap(),
            ));
            for io in [
                "async ",
                ".await",
                "kube::Api",
                "kube::Client",
                "Api<",
                "tokio::",
                "std::fs",
                "std::time::Instant",
            ] {
                if source.contains(io) {
                    wrong.push(format!(
                        "{} is in a pure room and has `{io}`",
                        module.join("::")
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the rooms of docs/architecture.md broken:\n{}",
        wrong.join("\n")
    );
}

/// Each room has a module doc, and `controller/mod.rs` holds only the map and re-exports.
#[test]
fn every_room_says_what_it_holds() {
    let dir = root().join("src/controller");
    for (room, _) in rooms() {
        let file = if dir.join(&room).is_dir() {
            dir.join(&room).join("mod.rs")
        } else {
            dir.join(format!("{room}.rs"))
        };
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.starts_with("//! "),
            "{} has no module doc",
            file.display()
        );
    }
    let map = without_tests(&std::fs::read_to_string(dir.join("mod.rs")).unwrap());
    for line in without_comments(&map)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        assert!(
            line.starts_with("pub mod ")
                || line.starts_with("mod ")
                || line.starts_with("pub use ")
                || !line.contains(['(', '=']),
            "controller/mod.rs holds code: {line}"
        );
    }
}

#[test]
fn no_file_in_src_is_longer_than_450_lines_before_its_tests() {
    let src = root().join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let long: Vec<String> = all
        .iter()
        .filter(|p| p.file_name().unwrap() != "tests.rs")
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let before = text
                .lines()
                .take_while(|l| l.trim() != "#[cfg(test)]")
                .count();
            (before > 450).then(|| format!("{}: {before}", p.strip_prefix(&src).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by job: {long:?}");
}

/// The checks above see what they are meant to see: a circle, a nested `use` tree, an import of
/// an ancestor (no circle), a doc link (not an import).
#[test]
fn the_circle_check_sees_what_it_is_meant_to_see() {
    let source = "use crate::{a::{b, c::d}, e as f};\n/// [`crate::g`]\nfn x() { super::h::i(); }";
    let named: Vec<String> = paths(&without_comments(source))
        .iter()
        .map(|p| p.join("::"))
        .collect();
    for want in ["crate::a::b", "crate::a::c::d", "crate::e", "super::h::i"] {
        assert!(named.contains(&want.to_owned()), "{want} in {named:?}");
    }
    assert!(!named.iter().any(|n| n.contains('g')), "{named:?}");
    let m = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    let graph = BTreeMap::from([
        (m("a"), [m("b")].into()),
        (m("b"), [m("c")].into()),
        (m("c"), [m("a")].into()),
    ]);
    assert_eq!(circle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let graph = BTreeMap::from([(m("a"), [m("b")].into()), (m("b"), [].into())]);
    assert_eq!(circle(&graph), None);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        [(m("x"), PathBuf::new()), (m("x::y"), PathBuf::new())].into();
    assert_eq!(resolve(&m("x::y"), &m("super::Z"), &modules), Some(m("x")));
}
