//! No non-test function of the workspace runs past 80 lines, except a dispatch match
//! (issue 46): a long procedure is split into named phases that can be read one at a time.
//! `resident_tests::function_length` measures; these tests first show that it measures
//! what it should, then run it on every workspace member's sources.

use std::path::{Path, PathBuf};

use resident_tests::function_length::{LongFunction, long_functions};
use resident_tests::{repo_root, workspace_members};

const LIMIT: usize = 80;

fn function(name: &str, body_lines: usize) -> String {
    let body: String = (0..body_lines)
        .map(|i| format!("    let x{i} = {i};\n"))
        .collect();
    format!("pub fn {name}(a: u32) -> Result<(), String> {{\n{body}    Ok(())\n}}\n")
}

#[test]
fn a_function_is_counted_from_its_fn_to_its_closing_brace() {
    let source = format!(
        "use std::fmt;\n\n{}\n{}",
        function("short", 10),
        function("long", 90)
    );
    assert_eq!(
        long_functions(&source, LIMIT),
        [LongFunction {
            name: "long".into(),
            line: 17,
            lines: 93,
        }]
    );
}

#[test]
fn braces_and_line_breaks_in_strings_and_comments_do_not_mislead_it() {
    let tricky = "pub fn tricky() {\n    let s = \"}}}\n\n{\";\n    // }\n    /* {\n */\n    let c = '}';\n}\n";
    let source = format!("{tricky}{}", function("after", 90));
    assert_eq!(
        long_functions(&source, LIMIT),
        [LongFunction {
            name: "after".into(),
            line: 10,
            lines: 93,
        }]
    );
}

#[test]
fn test_items_and_declarations_without_a_body_are_left_out() {
    let source = format!(
        "pub trait T {{\n    fn declared(&self) -> u32;\n}}\npub struct S {{ f: fn(u32) -> u32 }}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
        function("long_test", 90)
    );
    assert_eq!(long_functions(&source, LIMIT), []);
}

#[test]
fn a_body_that_is_one_match_is_a_dispatch_and_may_be_long() {
    let arms: String = (0..90).map(|i| format!("        {i} => {i},\n")).collect();
    let dispatch = format!(
        "fn dispatch(c: u32) -> u32 {{\n    use std::cmp::Ordering as O;\n    match c {{\n{arms}        _ => 0,\n    }}\n}}\n"
    );
    let not_only = format!(
        "fn more(c: u32) -> u32 {{\n    let d = c + 1;\n    match d {{\n{arms}        _ => 0,\n    }}\n}}\n"
    );
    let found = long_functions(&format!("{dispatch}{not_only}"), LIMIT);
    let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["more"]);
}

/// The Rust files of a member, test files and folders left out.
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "tests" | "target" | "fixtures") && !name.starts_with('.') {
                source_files(&path, out);
            }
        } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_function_runs_past_80_lines() {
    let root = repo_root();
    let members = workspace_members();
    let mut report = Vec::new();
    let mut files = Vec::new();
    // `tests` is the integration suite and its harness: test code throughout.
    for member in members.iter().filter(|m| **m != "tests") {
        let mut member_files = Vec::new();
        source_files(&root.join(member).join("src"), &mut member_files);
        assert!(!member_files.is_empty(), "{member} has source files");
        files.extend(member_files);
    }
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for long in long_functions(&source, LIMIT) {
            report.push(format!(
                "{}:{} `{}` is {} lines",
                file.strip_prefix(&root).unwrap().display(),
                long.line,
                long.name,
                long.lines
            ));
        }
    }
    assert!(files.len() > 200, "read {} files", files.len());
    assert!(
        report.is_empty(),
        "{} functions run past {LIMIT} lines: split each into named phases (a dispatch \
         match, a body that is one `match`, may be longer)\n{}",
        report.len(),
        report.join("\n")
    );
}
