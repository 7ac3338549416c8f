//! `scripts/check-sources.sh`, the test command's first step, against small git repositories
//! made here: it must fail, naming the file, on the mistake that once hid `models/build.rs`
//! (an ignore rule meant for fetched weights that swallows a crate file), on a crate file
//! left untracked, and on an `include` list that leaves a build script out; and pass once
//! each is fixed.

use std::path::Path;
use std::process::{Command, Output};

use resident_tests::repo_root;

fn git(repo: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=test", "-c", "user.email=test@localhost"])
        .args(args)
        .current_dir(repo)
        .status()
        .expect("run git");
    assert!(status.success(), "git {args:?}");
}

fn write(repo: &Path, path: &str, text: &str) {
    let path = repo.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A workspace like ours: a root manifest, a `models` crate with a build script and a kernel,
/// and fetched weights beside it, committed as git allows under `ignore_rules`.
fn workspace(ignore_rules: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    git(repo, &["init", "-q"]);
    write(repo, ".gitignore", ignore_rules);
    write(repo, "Cargo.toml", "[workspace]\nmembers = [\"models\"]\n");
    write(
        repo,
        "models/Cargo.toml",
        "[package]\nname = \"m\"\ninclude = [\"Cargo.toml\", \"build.rs\", \"src/**\"]\n",
    );
    write(repo, "models/build.rs", "fn main() {}\n");
    write(repo, "models/src/lib.rs", "\n");
    write(repo, "models/src/kernels.cu", "\n");
    write(repo, "models/minilm/model.safetensors", "weights");
    let script = std::fs::read_to_string(repo_root().join("scripts/check-sources.sh")).unwrap();
    write(repo, "scripts/check-sources.sh", &script);
    git(repo, &["add", "."]);
    git(repo, &["commit", "-q", "-m", "workspace"]);
    dir
}

/// This repository's own `.gitignore`.
fn our_ignore_rules() -> String {
    std::fs::read_to_string(repo_root().join(".gitignore")).unwrap()
}

fn check(repo: &Path) -> Output {
    Command::new("bash")
        .arg("scripts/check-sources.sh")
        .current_dir(repo)
        .output()
        .expect("run check-sources.sh")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs the check, which must fail and say `expected`; returns all it said.
fn check_fails_saying(repo: &Path, expected: &str) -> String {
    let output = check(repo);
    let said = stderr(&output);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains(expected),
        "{expected:?} missing from:\n{said}"
    );
    said
}

#[test]
fn an_ignore_rule_that_would_swallow_a_build_script_fails_naming_it() {
    // The old rule: everything under models/ but the manifest and src/.
    let repo = workspace("/models/*\n!/models/Cargo.toml\n!/models/src/\n");
    let said = check_fails_saying(
        repo.path(),
        "a crate file would be ignored: models/build.rs (rule .gitignore:1:/models/*)",
    );
    assert!(
        !said.contains("models/src/"),
        "src/ was named back in: {said}"
    );
}

#[test]
fn our_ignore_rules_pass_and_an_untracked_crate_file_fails() {
    let repo = workspace(&our_ignore_rules());
    let output = check(repo.path());
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("every crate file is tracked"),
        "{output:?}"
    );

    write(repo.path(), "models/src/new_module.rs", "\n");
    check_fails_saying(
        repo.path(),
        "a crate file is not tracked: models/src/new_module.rs",
    );
}

#[test]
fn an_include_list_without_the_build_script_fails() {
    let repo = workspace(&our_ignore_rules());
    write(
        repo.path(),
        "models/Cargo.toml",
        "[package]\nname = \"m\"\ninclude = [\"Cargo.toml\", \"src/**\"]\n",
    );
    check_fails_saying(
        repo.path(),
        "models/Cargo.toml has an include list without \"build.rs\"",
    );
}
