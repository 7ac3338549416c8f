//! No crate of the workspace has a cycle between its module files (issue 46): each file can
//! be read, tested and moved with only what it names below it. The graph is read from the
//! sources by `resident_tests::module_graph`; these tests first show that it finds the cycles
//! it should, then run it on every crate named in the workspace manifest.

use std::path::Path;

use resident_tests::module_graph::{ModuleGraph, cycles, describe_cycle, display};
use resident_tests::{repo_root, workspace_members};

fn write(dir: &Path, path: &str, text: &str) {
    let path = dir.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn cycles_in(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        write(dir.path(), path, text);
    }
    let graph = ModuleGraph::of_crate(dir.path()).unwrap();
    cycles(&graph)
        .iter()
        .map(|cycle| {
            cycle
                .iter()
                .map(|m| display(m))
                .collect::<Vec<_>>()
                .join(" -> ")
        })
        .collect()
}

#[test]
fn a_trait_beside_the_dispatch_to_its_implementors_is_a_cycle() {
    let found = cycles_in(&[
        ("lib.rs", "pub mod encoder;\n"),
        (
            "encoder/mod.rs",
            "mod bert;\npub trait Encoder {}\npub fn load() -> Box<dyn Encoder> { bert::Bert::boxed() }\n",
        ),
        (
            "encoder/bert.rs",
            "use super::Encoder;\npub struct Bert;\nimpl Encoder for Bert {}\n",
        ),
    ]);
    assert_eq!(found, ["encoder -> encoder::bert -> encoder"]);
}

#[test]
fn the_trait_in_a_leaf_breaks_it_and_a_facade_reexport_is_followed() {
    let found = cycles_in(&[
        ("lib.rs", "pub mod encoder;\npub use encoder::Encoder;\n"),
        (
            "encoder/mod.rs",
            "mod bert;\nmod kind;\npub use kind::Encoder;\npub fn load() -> Box<dyn Encoder> { bert::Bert::boxed() }\n",
        ),
        ("encoder/kind.rs", "pub trait Encoder {}\n"),
        (
            "encoder/bert.rs",
            "use crate::Encoder;\nuse super::{self as parent};\npub struct Bert;\nimpl Encoder for Bert {}\n",
        ),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn siblings_paths_groups_and_inline_modules_are_read() {
    let found = cycles_in(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "pub fn f() { crate::b::g() }\n"),
        (
            "b.rs",
            // A nested group, and an inline module whose `super` is b itself.
            "use crate::{c::{self, H}};\npub fn g() {}\nmod inner { use super::g; }\n",
        ),
        (
            "c.rs",
            "// crate::a::f() in a comment\nconst S: &str = \"crate::a::f\";\npub struct H;\npub fn k() { crate::a::f() }\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> c -> a"]);
    // An alias outside a group: `Renamed::f` names `a`.
    let found = cycles_in(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { crate::b::g() }\n"),
        (
            "b.rs",
            "use crate::a as Renamed;\npub fn g() { Renamed::f() }\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn test_code_and_names_from_other_crates_make_no_edge() {
    let found = cycles_in(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "pub use other::Thing;\npub fn f() { crate::b::g() }\n",
        ),
        (
            "b.rs",
            "pub fn g() {}\nuse crate::a::Thing;\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n}\n",
        ),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = repo_root();
    let members = workspace_members();
    let mut report = Vec::new();
    for member in &members {
        let graph = ModuleGraph::of_crate(&root.join(member).join("src")).unwrap();
        assert!(!graph.files.is_empty(), "{member} has source files");
        for cycle in cycles(&graph) {
            report.push(format!("{member}:\n{}", describe_cycle(&graph, &cycle)));
        }
    }
    assert!(
        report.is_empty(),
        "{} module cycles: move what both files need to a leaf file that names neither \
         (a trait beside the dispatch to its implementors: the trait in its own file)\n{}",
        report.len(),
        report.join("\n")
    );
}
