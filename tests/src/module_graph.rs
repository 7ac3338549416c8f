//! A crate's modules as a file-level graph: which module file names which, through `crate::`,
//! `super::` and `self::` paths, `use` trees and paths that start with a child module's name.
//! A name reached through an import or a re-export counts against the module that defines
//! it, not the one that passes it on, so a facade `mod.rs` makes no cycle with its files.
//! Test code (`#[cfg(test)]` items, `tests.rs`, `tests/` folders), comments and string
//! literals are left out. `tests/tests/suite/module_cycles.rs` runs it on every crate of the
//! workspace: a cycle between two files means neither can be read, tested or moved alone.
//!
//! Written here rather than taken from a crate: the maintained module-graph tools
//! (cargo-modules) resolve through rust-analyzer, far too heavy for one test, and none
//! answers "which file names which" without a build.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate, `[]` for the crate root.
pub type ModulePath = Vec<String>;

/// The modules of one crate and, for each, the modules it names (with the first path that
/// names each, as evidence).
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Every module file, by module path.
    pub files: BTreeMap<ModulePath, PathBuf>,
    /// From each module to the modules it names, each with the first path seen.
    pub edges: BTreeMap<ModulePath, BTreeMap<ModulePath, String>>,
}

/// A module path as Rust writes it (`crate` for the root).
pub fn display(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

impl ModuleGraph {
    /// The graph of the library or binary crate rooted at `src` (binaries under `src/bin` are
    /// crates of their own and left out).
    pub fn of_crate(src: &Path) -> std::io::Result<ModuleGraph> {
        let mut graph = ModuleGraph::default();
        for file in rust_files(src)? {
            let relative = file.strip_prefix(src).expect("under src");
            if let Some(module) = module_path_of(relative) {
                graph.files.insert(module, file);
            }
        }
        // Each file's code, split into its own and that of the modules written inline in it
        // (`mod x86 { .. }`), whose `self` and `super` start one level down.
        let mut parts: BTreeMap<ModulePath, Vec<(ModulePath, String)>> = BTreeMap::new();
        for (module, file) in &graph.files {
            let text = std::fs::read_to_string(file)?;
            let code = without_test_items(&code_only(&text));
            parts.insert(module.clone(), split_inline_modules(module, &code));
        }
        let imports: BTreeMap<ModulePath, Imports> = parts
            .iter()
            .map(|(module, parts)| (module.clone(), imported_names(&graph, module, &parts[0].1)))
            .collect();
        for (module, parts) in &parts {
            let mut named = BTreeMap::new();
            for (context, code) in parts {
                let own_imports;
                let context_imports = if context == module {
                    &imports[module]
                } else {
                    own_imports = imported_names(&graph, context, code);
                    &own_imports
                };
                for path in referenced_paths(&graph, context, context_imports, code) {
                    // A path to a module itself (`use crate::store::{self, ..}`) only names
                    // it: its items, once used, make the edges.
                    if graph.files.contains_key(&path) {
                        continue;
                    }
                    let Some(target) = graph.resolve(&imports, &path, 0) else {
                        continue;
                    };
                    if target != *module {
                        named.entry(target).or_insert_with(|| path.join("::"));
                    }
                }
            }
            graph.edges.insert(module.clone(), named);
        }
        Ok(graph)
    }

    fn children_of(&self, module: &[String]) -> BTreeSet<String> {
        self.files
            .keys()
            .filter(|path| path.len() == module.len() + 1 && path.starts_with(module))
            .map(|path| path[module.len()].clone())
            .collect()
    }

    /// The module that defines what an absolute path names: the deepest module file along
    /// it, followed through that module's imports and re-exports; `None` where that leads
    /// out of the crate.
    fn resolve(
        &self,
        imports: &BTreeMap<ModulePath, Imports>,
        path: &[String],
        depth: usize,
    ) -> Option<ModulePath> {
        let mut module = Vec::new();
        let mut rest = path;
        while let Some((first, tail)) = rest.split_first() {
            let mut deeper = module.clone();
            deeper.push(first.clone());
            if !self.files.contains_key(&deeper) {
                break;
            }
            module = deeper;
            rest = tail;
        }
        if let (Some(name), true) = (rest.first(), depth < 8) {
            match imports.get(&module).and_then(|names| names.get(name)) {
                Some(Some(source)) => {
                    let mut followed = source.clone();
                    followed.extend(rest[1..].iter().cloned());
                    return self.resolve(imports, &followed, depth + 1);
                }
                Some(None) => return None,
                None => {}
            }
        }
        Some(module)
    }
}

/// The `.rs` files under `dir`, leaving out `bin/` at the top and test-only files.
fn rust_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                let top_bin = folder == dir && name == "bin";
                if !top_bin && name != "tests" {
                    pending.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the root.
fn module_path_of(relative: &Path) -> Option<ModulePath> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.is_empty() && (stem == "lib" || stem == "main") {
        return Some(Vec::new());
    }
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    Some(parts)
}

/// The source with comments, string and character literals blanked out (lifetimes kept);
/// the line breaks inside them stay, so a line of the result is the same line of the source.
pub fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut at = 0;
    while at < chars.len() {
        let here = chars[at];
        let next = chars.get(at + 1).copied();
        if here == '/' && next == Some('/') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if here == '/' && next == Some('*') {
            let mut depth = 0;
            while at < chars.len() {
                if chars[at] == '/' && chars.get(at + 1) == Some(&'*') {
                    depth += 1;
                    at += 2;
                } else if chars[at] == '*' && chars.get(at + 1) == Some(&'/') {
                    depth -= 1;
                    at += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    keep_newline(chars[at], &mut out);
                    at += 1;
                }
            }
            out.push(' ');
        } else if here == 'r' && matches!(next, Some('"') | Some('#')) && !ident_before(&chars, at)
        {
            let hashes = chars[at + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(at + 1 + hashes) != Some(&'"') {
                out.push(here);
                at += 1;
                continue;
            }
            at += 2 + hashes;
            while at < chars.len() {
                if chars[at] == '"'
                    && chars[at + 1..].iter().take_while(|c| **c == '#').count() >= hashes
                {
                    at += 1 + hashes;
                    break;
                }
                keep_newline(chars[at], &mut out);
                at += 1;
            }
            out.push_str("\"\"");
        } else if here == '"' {
            at += 1;
            while at < chars.len() && chars[at] != '"' {
                let step = if chars[at] == '\\' { 2 } else { 1 };
                for &c in &chars[at..(at + step).min(chars.len())] {
                    keep_newline(c, &mut out);
                }
                at += step;
            }
            at += 1;
            out.push_str("\"\"");
        } else if here == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let close = if next == Some('\\') {
                chars[at + 2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map(|p| at + 2 + p)
            } else if chars.get(at + 2) == Some(&'\'') {
                Some(at + 2)
            } else {
                None
            };
            match close {
                Some(close) => {
                    out.push_str("' '");
                    at = close + 1;
                }
                None => {
                    out.push(here);
                    at += 1;
                }
            }
        } else {
            out.push(here);
            at += 1;
        }
    }
    out
}

fn keep_newline(c: char, out: &mut String) {
    if c == '\n' {
        out.push('\n');
    }
}

fn ident_before(chars: &[char], at: usize) -> bool {
    at > 0 && (chars[at - 1].is_alphanumeric() || chars[at - 1] == '_')
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code without items marked `#[cfg(test)]` (test modules, test-only functions); each
/// leaves its line breaks, so lines keep their numbers.
pub fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        // The item ends at its first `;` outside braces, or where its first brace closes.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (index, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = index + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = index + 1;
                    break;
                }
                _ => {}
            }
        }
        out.extend(rest[..end].chars().filter(|c| *c == '\n'));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A file's code as its own part first, then one part for each module written inline in it
/// (`mod name { .. }`, nested ones too), each with its module path; an inline module's code
/// is blanked out of its parent's part.
fn split_inline_modules(module: &[String], code: &str) -> Vec<(ModulePath, String)> {
    let mut own = String::with_capacity(code.len());
    let mut inner = Vec::new();
    let mut rest = code;
    while let Some((before, name, body, after)) = next_inline_module(rest) {
        own.push_str(before);
        let mut path = module.to_vec();
        path.push(name.to_owned());
        inner.extend(split_inline_modules(&path, body));
        rest = after;
    }
    own.push_str(rest);
    let mut parts = vec![(module.to_vec(), own)];
    parts.extend(inner);
    parts
}

/// The first `mod name {` in `code`: the text before it, the name, the block's inside and
/// the text after its closing brace.
fn next_inline_module(code: &str) -> Option<(&str, &str, &str, &str)> {
    let mut from = 0;
    while let Some(found) = code[from..].find("mod ") {
        let at = from + found;
        from = at + 4;
        if code[..at].chars().next_back().is_some_and(is_ident_char) {
            continue;
        }
        let after_keyword = code[at + 4..].trim_start();
        let name_len = after_keyword
            .chars()
            .take_while(|c| is_ident_char(*c))
            .count();
        let name = &after_keyword[..name_len];
        let after_name = after_keyword[name_len..].trim_start();
        if name.is_empty() || !after_name.starts_with('{') {
            continue;
        }
        let open = code.len() - after_name.len();
        let mut depth = 0usize;
        for (index, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        let close = open + index;
                        return Some((
                            &code[..at],
                            name,
                            &code[open + 1..close],
                            &code[close + 1..],
                        ));
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    None
}

/// The body of each `use` item (`a::{b, c::d as e}`).
fn use_items(code: &str) -> Vec<&str> {
    let mut items = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(is_ident_char) {
            continue;
        }
        let body = &code[at + 4..];
        if let Some(end) = body.find(';') {
            items.push(body[..end].trim());
        }
    }
    items
}

/// A use tree (without aliases) expanded into its paths, each with the name it binds (`None`
/// for a glob).
fn expand_use_tree(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    expand_into(&tree, &[], &mut out);
    out
}

fn expand_into(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    for branch in split_top_level(tree) {
        let branch = branch.trim_start_matches("::");
        if branch.is_empty() {
            continue;
        }
        if let Some(brace) = branch.find('{') {
            let head = branch[..brace].trim_end_matches("::");
            let inner = &branch[brace + 1..];
            let inner = inner.strip_suffix('}').unwrap_or(inner);
            let mut path = prefix.to_vec();
            path.extend(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            expand_into(inner, &path, out);
            continue;
        }
        let mut path = prefix.to_vec();
        path.extend(branch.split("::").map(str::to_owned));
        let last = path.last().cloned().unwrap_or_default();
        if last == "*" {
            path.pop();
            out.push((path, None));
        } else if last == "self" {
            path.pop();
            let name = path.last().cloned();
            out.push((path, name));
        } else {
            out.push((path, Some(last)));
        }
    }
}

fn split_top_level(tree: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&tree[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    parts
}

/// The names a module's `use` items bring into scope, each with the absolute path it names,
/// or `None` for a name from outside the crate.
type Imports = BTreeMap<String, Option<ModulePath>>;

/// A path written in `module` made absolute, if it starts inside the crate: at `crate`,
/// `self`, `super`, a child module or a name imported from inside the crate.
fn absolute(
    module: &[String],
    children: &BTreeSet<String>,
    imports: &Imports,
    path: &[String],
) -> Option<ModulePath> {
    let (first, rest) = path.split_first()?;
    let mut base: ModulePath = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().checked_sub(1)?].to_vec(),
        name if children.contains(name) => {
            let mut base = module.to_vec();
            base.push(name.to_owned());
            base
        }
        name => imports.get(name).cloned().flatten()?,
    };
    let mut rest = rest;
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The names a module brings into scope with `use` (glob imports are left out: what they
/// bring is not known without a compiler).
fn imported_names(graph: &ModuleGraph, module: &[String], code: &str) -> Imports {
    let children = graph.children_of(module);
    let mut names = Imports::new();
    for item in use_items(code) {
        for (path, name) in expand_aliased(item) {
            if let Some(name) = name {
                let inside = absolute(module, &children, &Imports::new(), &path);
                names.insert(name, inside);
            }
        }
    }
    names
}

/// `expand_use_tree` with `as` aliases read before whitespace is removed.
fn expand_aliased(item: &str) -> Vec<(Vec<String>, Option<String>)> {
    let mut aliases = BTreeMap::new();
    let words: Vec<&str> = item
        .split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
        .filter(|w| !w.is_empty())
        .collect();
    for window in words.windows(3) {
        if window[1] == "as" {
            // `crate::a::Foo as Bar` outside a group is one word before `as`: its last
            // segment is the name the path ends in.
            let original = window[0].rsplit("::").next().unwrap_or(window[0]);
            aliases.insert(original.to_owned(), window[2].to_owned());
        }
    }
    let mut without_aliases = String::new();
    let mut skip = 0;
    for token in tokenize_use(item) {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        if token == "as" {
            skip = 1;
            continue;
        }
        without_aliases.push_str(&token);
    }
    expand_use_tree(&without_aliases)
        .into_iter()
        .map(|(path, name)| {
            let last = path.last().cloned().unwrap_or_default();
            let name = match (&name, aliases.get(&last)) {
                (Some(n), Some(alias)) if *n == last => Some(alias.clone()),
                _ => name,
            };
            (path, name)
        })
        .collect()
}

fn tokenize_use(item: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in item.chars() {
        if is_ident_char(c) || c == '*' {
            word.push(c);
        } else {
            if !word.is_empty() {
                tokens.push(std::mem::take(&mut word));
            }
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

/// Every path into the crate that `module`'s code writes, made absolute: the paths of its
/// `use` items and every `crate::`, `self::`, `super::` or `child::` path elsewhere.
fn referenced_paths(
    graph: &ModuleGraph,
    module: &[String],
    imports: &Imports,
    code: &str,
) -> Vec<ModulePath> {
    let children = graph.children_of(module);
    let mut paths = Vec::new();
    for item in use_items(code) {
        for (path, _) in expand_aliased(item) {
            paths.extend(absolute(module, &children, &Imports::new(), &path));
        }
    }
    let chars: Vec<char> = code.chars().collect();
    let mut at = 0;
    while at < chars.len() {
        if !is_ident_char(chars[at]) || ident_before(&chars, at) {
            at += 1;
            continue;
        }
        // A path starts here unless it continues one (`x::here`).
        let continues = at >= 2 && chars[at - 1] == ':' && chars[at - 2] == ':';
        let mut segments = Vec::new();
        let mut end = at;
        loop {
            let start = end;
            while end < chars.len() && is_ident_char(chars[end]) {
                end += 1;
            }
            segments.push(chars[start..end].iter().collect::<String>());
            let more = chars.get(end) == Some(&':')
                && chars.get(end + 1) == Some(&':')
                && chars.get(end + 2).is_some_and(|c| is_ident_char(*c));
            if !more {
                break;
            }
            end += 2;
        }
        if !continues && segments.len() > 1 {
            paths.extend(absolute(module, &children, imports, &segments));
        }
        at = end.max(at + 1);
    }
    paths
}

/// The cycles of a graph, one per strongly connected group of two or more modules, each as
/// the modules along one cycle through the group (the first module repeated at the end).
pub fn cycles(graph: &ModuleGraph) -> Vec<Vec<ModulePath>> {
    let mut found = Vec::new();
    let mut reported: BTreeSet<ModulePath> = BTreeSet::new();
    for start in graph.edges.keys() {
        if reported.contains(start) {
            continue;
        }
        if let Some(cycle) = shortest_cycle(graph, start) {
            // Report each group once: every module reachable both ways from `start`.
            let group = group_of(graph, start);
            reported.extend(group);
            found.push(cycle);
        }
    }
    found
}

fn reachable(graph: &ModuleGraph, from: &ModulePath, reverse: bool) -> BTreeSet<ModulePath> {
    let mut seen = BTreeSet::from([from.clone()]);
    let mut pending = vec![from.clone()];
    while let Some(here) = pending.pop() {
        let next: Vec<ModulePath> = if reverse {
            graph
                .edges
                .iter()
                .filter(|(_, to)| to.contains_key(&here))
                .map(|(m, _)| m.clone())
                .collect()
        } else {
            graph
                .edges
                .get(&here)
                .map(|to| to.keys().cloned().collect())
                .unwrap_or_default()
        };
        for module in next {
            if seen.insert(module.clone()) {
                pending.push(module);
            }
        }
    }
    seen
}

/// The modules of `module`'s strongly connected group (those it reaches and that reach it),
/// itself included.
pub fn group_of(graph: &ModuleGraph, module: &ModulePath) -> BTreeSet<ModulePath> {
    let forward = reachable(graph, module, false);
    let backward = reachable(graph, module, true);
    forward.intersection(&backward).cloned().collect()
}

/// The shortest cycle through `start` (breadth first), if any.
fn shortest_cycle(graph: &ModuleGraph, start: &ModulePath) -> Option<Vec<ModulePath>> {
    let mut came_from: BTreeMap<ModulePath, ModulePath> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(here) = queue.pop_front() {
        for next in graph.edges.get(&here).into_iter().flat_map(|to| to.keys()) {
            if next == start {
                let mut back = vec![here.clone()];
                while back.last() != Some(start) {
                    let previous = came_from[back.last().expect("not empty")].clone();
                    back.push(previous);
                }
                back.reverse();
                back.push(start.clone());
                return Some(back);
            }
            if !came_from.contains_key(next) && next != start {
                came_from.insert(next.clone(), here.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// A cycle as one line per step, each with the file and the path that makes the step.
pub fn describe_cycle(graph: &ModuleGraph, cycle: &[ModulePath]) -> String {
    let mut lines = Vec::new();
    for step in cycle.windows(2) {
        let file = graph.files.get(&step[0]).map(|f| f.display().to_string());
        let evidence = graph
            .edges
            .get(&step[0])
            .and_then(|to| to.get(&step[1]))
            .cloned()
            .unwrap_or_default();
        lines.push(format!(
            "  {} ({}) names {} through `{evidence}`",
            display(&step[0]),
            file.unwrap_or_default(),
            display(&step[1]),
        ));
    }
    lines.join("\n")
}
