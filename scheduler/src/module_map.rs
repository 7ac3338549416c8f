//! The crate's modules as a map: which top-level module names which (`crate::x` paths in
//! non-test code). The map must have no cycle, and the pure layers (placement, policy, the
//! state machines, budgets) must name no other module, so each reads and tests on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModuleMap = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file of a module: the file itself, or everything under its folder.
fn files_of(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).expect("read module folder") {
        files.extend(files_of(&entry.expect("entry").path()));
    }
    files
}

/// The top-level module names a source text refers to through `crate::`.
fn named_modules(source: &str) -> BTreeSet<String> {
    let ident = |text: &str| -> String {
        text.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                names.extend(group.split(',').map(ident));
            }
            None => {
                names.insert(ident(rest));
            }
        }
    }
    names.remove("");
    names
}

fn module_map(src: &Path) -> ModuleMap {
    let mut map = ModuleMap::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("entry").path();
        let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
        let module = file_name.trim_end_matches(".rs").to_owned();
        if ["lib", "main", "module_map"].contains(&module.as_str()) {
            continue;
        }
        let mut names = BTreeSet::new();
        for file in files_of(&path) {
            let text = file.to_string_lossy();
            if text.contains("/tests/") || text.ends_with("/tests.rs") {
                continue;
            }
            let source = std::fs::read_to_string(&file).expect("read source");
            let code = source
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap_or_default();
            names.extend(named_modules(code));
        }
        names.remove(&module);
        map.insert(module, names);
    }
    let modules: BTreeSet<String> = map.keys().cloned().collect();
    for names in map.values_mut() {
        names.retain(|name| modules.contains(name));
    }
    map
}

/// A cycle through `from`, as the modules along it, if there is one.
fn cycle_from(map: &ModuleMap, from: &str) -> Option<Vec<String>> {
    fn walk(map: &ModuleMap, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
        let here = path.last().expect("not empty").clone();
        for next in &map[&here] {
            if *next == path[0] {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(map, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_owned()];
    walk(map, &mut path, &mut BTreeSet::new()).then_some(path)
}

fn our_map() -> ModuleMap {
    module_map(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn the_modules_form_no_cycle() {
    let map = our_map();
    assert!(map.len() > 8, "read the modules: {map:?}");
    for module in map.keys() {
        if let Some(cycle) = cycle_from(&map, module) {
            panic!("module cycle: {}\n{map:#?}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_pure_layers_name_no_other_module() {
    let map = our_map();
    for pure in ["placement", "policy", "state", "budget"] {
        assert_eq!(map[pure], BTreeSet::new(), "{pure} names other modules");
    }
}

#[test]
fn paths_and_groups_are_read_and_cycles_found() {
    let names = named_modules("use crate::{core::X, store};\nlet x = crate::metrics::now();");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["core", "metrics", "store"]
    );
    let map: ModuleMap = [("a", &["b"][..]), ("b", &["c"]), ("c", &["a"]), ("d", &[])]
        .into_iter()
        .map(|(m, names)| (m.into(), names.iter().map(|n| n.to_string()).collect()))
        .collect();
    assert_eq!(
        cycle_from(&map, "a").unwrap().join(" -> "),
        "a -> b -> c -> a"
    );
    assert_eq!(cycle_from(&map, "d"), None);
}
