//! The workspace's layout rules, checked over every crate's sources:
//!
//! - no source file is over [`MAX_LINES`] lines;
//! - no import circle: among the modules of one parent, A depends on B
//!   when any file of A's subtree names `crate::<path to B>` or
//!   `super::B` (in a `use`, grouped or not, or in code); a circle of
//!   such dependencies fails, named with a line that makes each step.
//!   A module and its own parent or child may name each other freely.
//!
//! The scanner reads tokens, not syntax: comments and string literals are
//! skipped, paths are followed through `use` trees, and `#[path]` is not
//! understood (the workspace uses it only in tests, which have no tree).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 1500;

/// A module's path from its crate root (`[]` for the root).
type ModPath = Vec<String>;

/// A dependency between two modules of one parent, with where it is made.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    parent: ModPath,
    from: String,
    to: String,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directories of the workspace's packages: the root package and the
/// members listed in its manifest.
fn crate_dirs() -> Vec<PathBuf> {
    let root = workspace_root();
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let start = manifest.find("members").expect("a members list");
    let list = &manifest[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    let members = list
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty());
    std::iter::once(root.clone())
        .chain(members.map(|m| root.join(m)))
        .collect()
}

/// Every `.rs` file under `dir`, leaving out build output and, for the
/// root package, the member packages (each checked as its own crate).
fn rust_files(dir: &Path, skip: &BTreeSet<PathBuf>, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && !skip.contains(&path) {
                rust_files(&path, skip, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(&'static str),
}

/// The tokens of Rust source that paths are made of, with their lines:
/// identifiers, `::`, braces, commas and semicolons (other punctuation as
/// "."); comments, strings and character literals are dropped.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = src.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' || (c == 'r' && matches!(next, Some('"' | '#'))) {
            // A string, raw (`r"…"`, `r#"…"#`) or not.
            let raw = c == 'r';
            i += usize::from(raw);
            let hashes = chars[i..].iter().take_while(|&&h| h == '#').count();
            if raw && chars.get(i + hashes) != Some(&'"') {
                out.push((Tok::Ident("r".into()), line));
                continue;
            }
            i += hashes + 1;
            while i < chars.len() {
                if !raw && chars[i] == '\\' {
                    i += 2;
                    continue;
                }
                line += usize::from(chars[i] == '\n');
                i += 1;
                if chars[i - 1] == '"' && chars[i..].iter().take(hashes).all(|&h| h == '#') {
                    i += hashes;
                    break;
                }
            }
        } else if c == '\'' {
            // A character literal, or a lifetime's quote.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ident_char(c) || (c == '$' && next.is_some_and(ident_char)) {
            let start = i;
            i += 1;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else {
            let punct = match (c, next) {
                (':', Some(':')) => "::",
                ('{', _) => "{",
                ('}', _) => "}",
                (',', _) => ",",
                (';', _) => ";",
                ('*', _) => "*",
                _ => ".",
            };
            i += if punct == "::" { 2 } else { 1 };
            out.push((Tok::Punct(punct), line));
        }
    }
    out
}

/// The paths a `use` tree starting at `toks[*at]` names, each with the
/// prefix it is grouped under; stops after the tree.
fn use_tree(toks: &[(Tok, usize)], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*at).map(|t| &t.0) {
            Some(Tok::Ident(name)) if name == "as" => {
                *at += 2;
                break;
            }
            Some(Tok::Ident(name)) => {
                // `{self, …}` names the prefix itself.
                if name != "self" || path.is_empty() {
                    path.push(name.clone());
                }
                *at += 1;
            }
            Some(Tok::Punct("::")) => *at += 1,
            Some(Tok::Punct("{")) => {
                *at += 1;
                while !matches!(toks.get(*at).map(|t| &t.0), Some(Tok::Punct("}")) | None) {
                    use_tree(toks, at, &path, out);
                    if matches!(toks.get(*at).map(|t| &t.0), Some(Tok::Punct(","))) {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            _ => break,
        }
    }
    out.push(path);
}

/// Every path that starts at `crate`, `$crate`, `super` or `self` in the
/// source of the module at `module`, resolved from the crate root, with
/// the line naming it. Inline modules (`mod tests { … }`) count as part of
/// `module`'s subtree.
fn named_paths(src: &str, module: &[String]) -> Vec<(ModPath, usize)> {
    let toks = tokens(src);
    let mut found = Vec::new();
    // Inline modules open around the current token, with the brace depth
    // they opened at.
    let (mut inline, mut depth): (Vec<(String, usize)>, usize) = (Vec::new(), 0);
    let here = |k: usize| toks.get(k).map(|t| &t.0);
    let mut i = 0;
    while i < toks.len() {
        let current: ModPath = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|m| m.0.clone()))
            .collect();
        let mut next = i + 1;
        let mut paths = Vec::new();
        match &toks[i].0 {
            Tok::Punct("{") => depth += 1,
            Tok::Punct("}") => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|m| m.1 == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct("{"))) = (here(i + 1), here(i + 2))
                {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    next = i + 3;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                next = i + 1;
                use_tree(&toks, &mut next, &[], &mut paths);
            }
            Tok::Ident(head)
                if matches!(head.as_str(), "crate" | "$crate" | "super" | "self")
                    && here(i + 1) == Some(&Tok::Punct("::"))
                    && (i == 0 || here(i - 1) != Some(&Tok::Punct("::"))) =>
            {
                let mut path = vec![head.clone()];
                while here(next) == Some(&Tok::Punct("::")) {
                    let Some(Tok::Ident(segment)) = here(next + 1) else {
                        break;
                    };
                    path.push(segment.clone());
                    next += 2;
                }
                paths.push(path);
            }
            _ => {}
        }
        let line = toks[i].1;
        found.extend(
            paths
                .iter()
                .filter_map(|p| resolve(p, &current))
                .map(|p| (p, line)),
        );
        i = next;
    }
    found
}

/// `path` from the crate root, as named in module `current`; `None` for
/// paths that start elsewhere (other crates, names in scope).
fn resolve(path: &[String], current: &[String]) -> Option<ModPath> {
    let mut resolved = match path.first()?.as_str() {
        "crate" | "$crate" => return Some(path[1..].to_vec()),
        "self" => current.to_vec(),
        "super" => current.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        resolved.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            resolved.pop()?;
            rest = &rest[1..];
        }
    }
    resolved.extend(rest.iter().cloned());
    Some(resolved)
}

/// A crate's module tree: its root file and the directory its modules'
/// files live in.
struct Tree {
    root: PathBuf,
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl Tree {
    /// The module `file` holds.
    fn module_of(&self, file: &Path) -> ModPath {
        if file == self.root {
            return Vec::new();
        }
        let rel = file.strip_prefix(&self.dir).unwrap().with_extension("");
        let mut parts: ModPath = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        parts
    }
}

/// The sibling dependency that module `from` naming `target` makes, if any.
fn sibling_edge(from: &[String], target: &[String], modules: &BTreeSet<ModPath>) -> Option<Edge> {
    let shared = from.iter().zip(target).take_while(|(a, b)| a == b).count();
    if shared == from.len() || shared == target.len() {
        return None;
    }
    let parent = from[..shared].to_vec();
    let to: ModPath = target[..=shared].to_vec();
    modules.contains(&to).then(|| Edge {
        parent,
        from: from[shared].clone(),
        to: target[shared].clone(),
    })
}

/// Circles among the sibling modules of a tree, each as
/// "in parent: a -> b -> a" with the line that makes each step.
fn circles(tree: &Tree) -> Vec<String> {
    let modules: BTreeSet<ModPath> = tree.files.iter().map(|f| tree.module_of(f)).collect();
    let mut edges: BTreeMap<Edge, String> = BTreeMap::new();
    for file in &tree.files {
        let module = tree.module_of(file);
        let src = fs::read_to_string(file).unwrap();
        for (target, line) in named_paths(&src, &module) {
            if let Some(edge) = sibling_edge(&module, &target, &modules) {
                let shown = file.strip_prefix(workspace_root()).unwrap_or(file);
                edges
                    .entry(edge)
                    .or_insert_with(|| format!("{}:{line}", shown.display()));
            }
        }
    }
    let mut found = Vec::new();
    let mut reported: BTreeSet<BTreeSet<(ModPath, String)>> = BTreeSet::new();
    for start in edges.keys() {
        let Some(cycle) = path_back(&edges, start) else {
            continue;
        };
        let members: BTreeSet<_> = cycle
            .iter()
            .map(|e| (e.parent.clone(), e.from.clone()))
            .collect();
        if !reported.insert(members) {
            continue;
        }
        let parent = if start.parent.is_empty() {
            "crate".to_string()
        } else {
            start.parent.join("::")
        };
        let steps: Vec<String> = cycle
            .iter()
            .map(|e| format!("  {} -> {} ({})", e.from, e.to, edges[e]))
            .collect();
        let names: Vec<&str> = cycle
            .iter()
            .map(|e| e.from.as_str())
            .chain([start.from.as_str()])
            .collect();
        found.push(format!(
            "in {parent}: {}\n{}",
            names.join(" -> "),
            steps.join("\n")
        ));
    }
    found
}

/// The shortest circle of edges that starts with `start` and comes back
/// to its source, if there is one.
fn path_back(edges: &BTreeMap<Edge, String>, start: &Edge) -> Option<Vec<Edge>> {
    let mut queue = std::collections::VecDeque::from([vec![start.clone()]]);
    let mut seen = BTreeSet::from([start.to.clone()]);
    while let Some(steps) = queue.pop_front() {
        let last = steps.last().unwrap();
        if last.to == start.from {
            return Some(steps);
        }
        for next in edges
            .keys()
            .filter(|e| e.parent == start.parent && e.from == last.to)
        {
            if seen.insert(next.to.clone()) || next.to == start.from {
                let mut longer = steps.clone();
                longer.push(next.clone());
                queue.push_back(longer);
            }
        }
    }
    None
}

/// The module trees of a package: its library or main binary under
/// `src/`, and each binary of `src/bin/`.
fn source_trees(package: &Path) -> Vec<Tree> {
    let src = package.join("src");
    let bin = src.join("bin");
    let mut trees = Vec::new();
    if let Some(root) = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|f| f.is_file())
    {
        let mut files = Vec::new();
        rust_files(&src, &BTreeSet::from([bin.clone()]), &mut files);
        trees.push(Tree {
            root,
            dir: src,
            files,
        });
    }
    let Ok(entries) = fs::read_dir(&bin) else {
        return trees;
    };
    for root in entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
    {
        let dir = root.with_extension("");
        let mut files = vec![root.clone()];
        if dir.is_dir() {
            rust_files(&dir, &BTreeSet::new(), &mut files);
        }
        trees.push(Tree { root, dir, files });
    }
    trees
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let dirs = crate_dirs();
    let members: BTreeSet<PathBuf> = dirs[1..].iter().cloned().collect();
    let mut long = Vec::new();
    for dir in &dirs {
        let mut files = Vec::new();
        rust_files(dir, &members, &mut files);
        for file in files {
            let lines = fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_LINES {
                let shown = file.strip_prefix(workspace_root()).unwrap_or(&file);
                long.push(format!("{} has {lines} lines", shown.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by job):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_module_depends_on_a_sibling_that_depends_back() {
    let mut found = Vec::new();
    for package in crate_dirs() {
        for tree in source_trees(&package) {
            let name = package.file_name().unwrap().to_string_lossy().into_owned();
            found.extend(circles(&tree).into_iter().map(|c| format!("{name}: {c}")));
        }
    }
    assert!(
        found.is_empty(),
        "import circles among sibling modules:\n{}",
        found.join("\n")
    );
}

#[cfg(test)]
mod scanner {
    use super::*;

    fn names(src: &str, module: &[&str]) -> Vec<String> {
        let module: ModPath = module.iter().map(|m| m.to_string()).collect();
        named_paths(src, &module)
            .into_iter()
            .map(|(p, _)| p.join("::"))
            .collect()
    }

    #[test]
    fn use_lines_grouped_or_not_are_followed() {
        let src = "pub(crate) use crate::a::B;\nuse crate::{c, d::{self, E}};\nuse super::f as g;";
        assert_eq!(names(src, &["x", "y"]), ["a::B", "c", "d", "d::E", "x::f"]);
    }

    #[test]
    fn paths_in_code_count_and_comments_and_strings_do_not() {
        let src = r##"
            // crate::hidden::x
            /* crate::hidden /* nested */ crate::hidden */
            fn f() -> char { let _ = "crate::hidden"; let _ = r#"crate::hidden"#; '"' }
            fn g<'a>(s: &'a str) { crate::x::f(s); super::super::y::Z::new(); }
            mod tests { use super::*; use super::h; }
        "##;
        assert_eq!(
            names(src, &["m", "n"]),
            ["x::f", "y::Z::new", "m::n", "m::n::h"]
        );
    }

    #[test]
    fn a_circle_of_siblings_is_named_and_parent_and_child_are_not_one() {
        let dir = std::env::temp_dir().join(format!("layout-{}", std::process::id()));
        let files = [
            ("lib.rs", "mod a; mod b; mod c; use crate::a::X;"),
            ("a/mod.rs", "mod inner; use crate::b::f; pub struct X;"),
            ("a/inner.rs", "use super::X; use crate::a::X as Y;"),
            ("b.rs", "pub fn f() { crate::c::g() }"),
            ("c.rs", "pub fn g() { super::a::X; }"),
        ];
        for (name, src) in files {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, src).unwrap();
        }
        let tree = Tree {
            root: dir.join("lib.rs"),
            dir: dir.clone(),
            files: files.iter().map(|(name, _)| dir.join(name)).collect(),
        };
        let found = circles(&tree);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("in crate: a -> b -> c -> a\n"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("c.rs:1"), "{}", found[0]);
    }
}
