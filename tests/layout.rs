//! The workspace's layout rules, checked over every crate's sources:
//!
//! - no source file is over [`MAX_LINES`] lines;
//! - no import circle: among the modules of one parent, A depends on B
//!   when any file of A's subtree names `crate::<path to B>` or
//!   `super::B` (in a `use`, grouped or not, or in code); a circle of
//!   such dependencies fails, named with a line that makes each step.
//!   A module and its own parent or child may name each other freely.
//!   Names a `use` brings into a module (`pub use comm::hang_report` at
//!   the crate root, say) are followed to what they stand for, so a
//!   re-export cannot hide a step;
//! - the engine is built in layers ([`ENGINE_LAYERS`]): a module of the
//!   engine's crate root names modules of its own layer or below, never
//!   one above (each offending pair is listed when the check fails); every
//!   module of the root is placed in a layer.
//!
//! The scanner reads tokens, not syntax: comments and string literals are
//! skipped, paths are followed through `use` trees, and `#[path]` is not
//! understood (the workspace uses it only in tests, which have no tree).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 1200;

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

/// A path a file names, as written, with the module it is named in and
/// its line; `alias` is the name a `use` brings it in under.
#[derive(Debug, Clone)]
struct Named {
    path: Vec<String>,
    module: ModPath,
    line: usize,
    alias: Option<String>,
}

/// The paths a `use` tree starting at `toks[*at]` names, each with the
/// prefix it is grouped under and the name it is brought in as (none for
/// a glob or `as _`); stops after the tree.
fn use_tree(
    toks: &[(Tok, usize)],
    at: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix.to_vec();
    let mut alias = None;
    let mut glob = false;
    loop {
        match toks.get(*at).map(|t| &t.0) {
            Some(Tok::Ident(name)) if name == "as" => {
                if let Some(Tok::Ident(name)) = toks.get(*at + 1).map(|t| &t.0) {
                    alias = Some(name.clone()).filter(|n| n != "_");
                    glob = alias.is_none();
                }
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
            Some(Tok::Punct("*")) => {
                glob = true;
                *at += 1;
            }
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
    let name = if glob {
        None
    } else {
        alias.or_else(|| path.last().cloned())
    };
    out.push((path, name));
}

/// Every path that starts at `crate`, `$crate`, `super` or `self` in the
/// source of the module at `module`, and every path of a `use`, with the
/// line naming it. Inline modules (`mod tests { … }`) count as part of
/// `module`'s subtree.
fn named_paths(src: &str, module: &[String]) -> Vec<Named> {
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
                paths.push((path, None));
            }
            _ => {}
        }
        let line = toks[i].1;
        found.extend(paths.into_iter().map(|(path, alias)| Named {
            path,
            module: current.clone(),
            line,
            alias,
        }));
        i = next;
    }
    found
}

/// Resolves the paths of one crate from its root: through `crate`,
/// `self` and `super`, through a module's own children (a `use` of
/// `child::x` in the 2018 editions' way), and through the names `use`
/// declarations bring into modules.
struct Resolver {
    modules: BTreeSet<ModPath>,
    /// `module::name` -> what a `use` in `module` brought in as `name`.
    aliases: BTreeMap<ModPath, ModPath>,
}

impl Resolver {
    fn new(modules: BTreeSet<ModPath>, named: &[Named]) -> Resolver {
        let mut resolver = Resolver {
            modules,
            aliases: BTreeMap::new(),
        };
        for n in named {
            let Some(name) = &n.alias else { continue };
            if let Some(target) = resolver.written(&n.path, &n.module) {
                let mut at = n.module.clone();
                at.push(name.clone());
                if target != at {
                    resolver.aliases.insert(at, target);
                }
            }
        }
        resolver
    }

    /// `path` from the crate root as written in module `current`, before
    /// aliases; `None` for paths that start elsewhere (other crates,
    /// names in scope).
    fn written(&self, path: &[String], current: &[String]) -> Option<ModPath> {
        let first = path.first()?.as_str();
        let mut resolved = match first {
            "crate" | "$crate" => return Some(path[1..].to_vec()),
            "self" | "super" => current.to_vec(),
            _ => {
                let mut child = current.to_vec();
                child.push(first.to_string());
                if !self.modules.contains(&child) && !self.aliases.contains_key(&child) {
                    return None;
                }
                let mut relative = current.to_vec();
                relative.extend(path.iter().cloned());
                return Some(relative);
            }
        };
        let mut rest = &path[1..];
        if first == "super" {
            resolved.pop()?;
            while rest.first().is_some_and(|s| s == "super") {
                resolved.pop()?;
                rest = &rest[1..];
            }
        }
        resolved.extend(rest.iter().cloned());
        Some(resolved)
    }

    /// `path` from the crate root, every alias among its prefixes replaced
    /// by what it stands for.
    fn resolve(&self, path: &[String], current: &[String]) -> Option<ModPath> {
        let mut resolved = self.written(path, current)?;
        // Aliases of aliases are followed; a bound keeps a loop of `use`s
        // (which rustc refuses anyway) from spinning.
        for _ in 0..16 {
            let Some(k) = (1..=resolved.len())
                .rev()
                .find(|&k| self.aliases.contains_key(&resolved[..k]))
            else {
                break;
            };
            let mut expanded = self.aliases[&resolved[..k]].clone();
            expanded.extend(resolved[k..].iter().cloned());
            resolved = expanded;
        }
        Some(resolved)
    }
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

/// Every dependency between sibling modules of a tree, with the first
/// line (`file:line`) that makes it.
fn sibling_edges(tree: &Tree) -> BTreeMap<Edge, String> {
    let modules: BTreeSet<ModPath> = tree.files.iter().map(|f| tree.module_of(f)).collect();
    let named: Vec<(&PathBuf, Named)> = tree
        .files
        .iter()
        .flat_map(|file| {
            let src = fs::read_to_string(file).unwrap();
            named_paths(&src, &tree.module_of(file))
                .into_iter()
                .map(move |n| (file, n))
        })
        .collect();
    let all: Vec<Named> = named.iter().map(|(_, n)| n.clone()).collect();
    let resolver = Resolver::new(modules, &all);
    let mut edges: BTreeMap<Edge, String> = BTreeMap::new();
    for (file, n) in &named {
        let Some(target) = resolver.resolve(&n.path, &n.module) else {
            continue;
        };
        if let Some(edge) = sibling_edge(&tree.module_of(file), &target, &resolver.modules) {
            let shown = file.strip_prefix(workspace_root()).unwrap_or(file);
            edges
                .entry(edge)
                .or_insert_with(|| format!("{}:{}", shown.display(), n.line));
        }
    }
    edges
}

/// Circles among the sibling modules of a tree, each as
/// "in parent: a -> b -> a" with the line that makes each step.
fn circles(tree: &Tree) -> Vec<String> {
    let edges = sibling_edges(tree);
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

/// The engine's (`rccl-rs/`) modules of its crate root in layers, bottom
/// up: what every part stands on, the setup a communicator needs, the
/// communicator, one call planned and connected, the two executors, the
/// seam that hands a planned call to one of them, the typed API.
const ENGINE_LAYERS: &[&[&str]] = &[
    &[
        "error",
        "types",
        "debug",
        "net",
        "selection",
        "config",
        "kernels",
        "fault",
        "memory",
        "encryption",
    ],
    &[
        "bootstrap",
        "job",
        "tuning",
        "plugins",
        "queue",
        "agreement",
    ],
    &["comm"],
    &["op", "plan", "connect", "onesided"],
    &["host_executor", "device_executor"],
    &["launch", "group"],
    &["api", "deterministic"],
];

/// The pairs of `tree`'s root modules where a module of a lower layer
/// names one of a higher layer, each as "from (layer) -> to (layer),
/// file:line"; and the root modules in no layer.
fn upward(tree: &Tree, layers: &[&[&str]]) -> (Vec<String>, Vec<String>) {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let root_modules: BTreeSet<String> = tree
        .files
        .iter()
        .filter_map(|f| tree.module_of(f).first().cloned())
        .collect();
    let unplaced = root_modules
        .into_iter()
        .filter(|m| layer_of(m).is_none())
        .collect();
    let up = sibling_edges(tree)
        .into_iter()
        .filter(|(e, _)| e.parent.is_empty())
        .filter_map(|(e, at)| {
            let (from, to) = (layer_of(&e.from)?, layer_of(&e.to)?);
            (from < to).then(|| format!("{} (L{from}) -> {} (L{to}), {at}", e.from, e.to))
        })
        .collect();
    (up, unplaced)
}

#[test]
fn the_engine_never_names_a_higher_layer() {
    let engine = workspace_root().join("rccl-rs");
    let tree = source_trees(&engine).remove(0);
    let (up, unplaced) = upward(&tree, ENGINE_LAYERS);
    assert!(
        unplaced.is_empty(),
        "modules of rccl-rs/src in no layer of ENGINE_LAYERS (place each): {unplaced:?}"
    );
    assert!(
        up.is_empty(),
        "{} pairs of the engine's modules name a higher layer:\n{}",
        up.len(),
        up.join("\n")
    );
}

#[cfg(test)]
mod scanner {
    use super::*;

    fn names(src: &str, module: &[&str]) -> Vec<String> {
        let module: ModPath = module.iter().map(|m| m.to_string()).collect();
        let resolver = Resolver::new(BTreeSet::new(), &[]);
        named_paths(src, &module)
            .into_iter()
            .filter_map(|n| resolver.resolve(&n.path, &n.module))
            .map(|p| p.join("::"))
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

    /// A tree of `files` (name, source) in a fresh directory, handed to
    /// `check`, removed after.
    fn with_tree<T>(tag: &str, files: &[(&str, &str)], check: impl FnOnce(&Tree) -> T) -> T {
        let dir = std::env::temp_dir().join(format!("layout-{tag}-{}", std::process::id()));
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
        let result = check(&tree);
        fs::remove_dir_all(&dir).unwrap();
        result
    }

    #[test]
    fn a_circle_of_siblings_is_named_and_parent_and_child_are_not_one() {
        let files = [
            ("lib.rs", "mod a; mod b; mod c; use crate::a::X;"),
            ("a/mod.rs", "mod inner; use crate::b::f; pub struct X;"),
            ("a/inner.rs", "use super::X; use crate::a::X as Y;"),
            ("b.rs", "pub fn f() { crate::c::g() }"),
            ("c.rs", "pub fn g() { super::a::X; }"),
        ];
        let found = with_tree("circle", &files, circles);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("in crate: a -> b -> c -> a\n"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("c.rs:1"), "{}", found[0]);
    }

    #[test]
    fn a_circle_through_a_re_export_at_the_root_is_named() {
        // `b` names `a` only through the root's `pub use a::report` and
        // `c` through the root's private alias of `a::deep`.
        let files = [
            (
                "lib.rs",
                "mod a; mod b; mod c; pub use a::report; use a::deep as d;",
            ),
            (
                "a/mod.rs",
                "pub mod deep; use crate::b::watch; pub fn report() {}",
            ),
            ("a/deep.rs", "pub fn f() {}"),
            ("b.rs", "pub fn watch() { crate::report(); }"),
            ("c.rs", "use crate::d::f;"),
        ];
        let found = with_tree("reexport", &files, |tree| {
            (circles(tree), sibling_edges(tree))
        });
        assert_eq!(found.0.len(), 1, "{:?}", found.0);
        assert!(
            found.0[0].starts_with("in crate: a -> b -> a\n"),
            "{}",
            found.0[0]
        );
        assert!(found.0[0].contains("b.rs:1"), "{}", found.0[0]);
        let c_to_a = Edge {
            parent: vec![],
            from: "c".into(),
            to: "a".into(),
        };
        assert!(found.1.contains_key(&c_to_a), "{:?}", found.1);
    }

    #[test]
    fn names_of_higher_layers_are_counted_once_a_pair_and_unplaced_modules_named() {
        let files = [
            ("lib.rs", "mod low; mod high; mod stray;"),
            ("low.rs", "use crate::high::A; fn f() { crate::high::b(); }"),
            ("high.rs", "use crate::low::C; pub struct A; pub fn b() {}"),
            ("stray.rs", ""),
        ];
        let (up, unplaced) = with_tree("layers", &files, |tree| {
            upward(tree, &[&["low"], &["high"]])
        });
        assert_eq!(up.len(), 1, "{up:?}");
        assert!(up[0].starts_with("low (L0) -> high (L1), "), "{}", up[0]);
        assert_eq!(unplaced, ["stray"]);
    }
}
