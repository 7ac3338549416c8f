//! The README's SDK example cannot drift: its code block is the body of the `readme-sdk`
//! example, which must run (on this machine without a GPU) and print every task once.

use std::process::Command;

use resident_tests::{repo_root, workspace_bin};

/// The lines between the markers, without their common indentation.
fn marked_region(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source
        .lines()
        .skip_while(|l| !l.contains("README:begin"))
        .skip(1)
        .take_while(|l| !l.contains("README:end"))
        .collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").to_owned())
        .collect()
}

/// The first ```rust block after the `## SDK` heading.
fn readme_sdk_block(readme: &str) -> Vec<String> {
    readme
        .lines()
        .skip_while(|l| *l != "## SDK")
        .skip_while(|l| *l != "```rust")
        .skip(1)
        .take_while(|l| *l != "```")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_sdk_example_is_the_one_that_runs() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/src/readme_sdk.rs")).unwrap();
    let (block, region) = (readme_sdk_block(&readme), marked_region(&example));
    assert!(
        !block.is_empty(),
        "README.md has no ```rust block under ## SDK"
    );
    assert_eq!(
        block, region,
        "README.md's SDK example and examples/src/readme_sdk.rs differ"
    );

    let output = Command::new(workspace_bin("readme-sdk"))
        .env("RESIDENT_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "readme-sdk failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tasks: Vec<&str> = stdout.lines().filter(|l| l.starts_with("task ")).collect();
    assert_eq!(tasks.len(), 2, "{stdout}");
    assert!(
        tasks.iter().any(|l| l.starts_with("task 0 on stats-")),
        "{stdout}"
    );
    assert!(stdout.contains("3 outputs, first from stats-"), "{stdout}");
}
