//! Conventions of the `resident` command line itself: shell completions cover every
//! command, a usage error exits 2 with what was wrong, and each class of failure has its
//! own exit status (0 ok, 2 bad input, 3 cannot be placed, 4 finished with failures, 5
//! cluster unreachable or credentials refused), against a real secure cluster.

use std::process::Command;

use resident_tests::resident_bin;
use resident_tests::secure::SecureSetup;

#[test]
fn completions_cover_every_command_and_a_bad_shell_is_a_usage_error() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(resident_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        for command in [
            "embed",
            "sweep",
            "agent",
            "scheduler",
            "jobs",
            "pools",
            "model",
            "push",
        ] {
            assert!(
                script.contains(command),
                "{shell} completion lacks `{command}`"
            );
        }
    }
    let output = Command::new(resident_bin())
        .args(["completions", "nushell"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid value 'nushell'") && stderr.contains("bash"),
        "{stderr}"
    );
}

/// Runs `resident ARGS` with `env`; its exit status and stderr.
fn status_of<A: AsRef<std::ffi::OsStr>>(
    args: &[A],
    env: &[(&str, &std::ffi::OsStr)],
) -> (Option<i32>, String) {
    let output = Command::new(resident_bin())
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .env("RESIDENT_LOG", "warn")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn each_class_of_failure_exits_with_its_own_status() {
    let setup = SecureSetup::new(&[("ops", "admin"), ("node", "agent")]);
    let (_scheduler, url) = setup.spawn_scheduler();
    let _agent = setup.spawn_agent(
        &url,
        "t4-node",
        "T4:16GiB",
        Some("node"),
        &[],
        std::process::Stdio::null(),
    );
    let ca = setup.ca();
    let ops: Vec<(&str, &std::ffi::OsStr)> = vec![
        ("RESIDENT_CA", ca.as_os_str()),
        ("RESIDENT_TOKEN", std::ffi::OsStr::new(setup.token("ops"))),
    ];
    let dir = tempfile::tempdir().unwrap();
    let input = resident_tests::sample(dir.path(), 5);
    let out = dir.path().join("out");
    let (input, out) = (input.to_str().unwrap(), out.to_str().unwrap());
    let model = resident_tests::minilm_dir();
    let embed_from = |input: &str, extra: &[&'static str]| -> Vec<String> {
        let base = [
            "embed",
            "--cluster",
            &url,
            "--model",
            &model,
            "--input",
            input,
            "--output",
            out,
        ];
        base.iter().chain(extra).map(|a| a.to_string()).collect()
    };
    let embed = |extra: &[&'static str]| embed_from(input, extra);

    // 0: it worked.
    let (code, stderr) = status_of(&["jobs", "--cluster", &url], &ops);
    assert_eq!(code, Some(0), "{stderr}");
    // 2: bad input, with what was wrong.
    let (code, stderr) = status_of(&embed_from("/no/such/corpus.jsonl", &[]), &ops);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/no/such/corpus.jsonl"), "{stderr}");
    let (code, stderr) = status_of(&["job", "cancel", "no-such-job", "--cluster", &url], &ops);
    assert_eq!(code, Some(2), "{stderr}");
    // 3: no node can host the pool (the only GPU has 16 GiB).
    let (code, stderr) = status_of(
        &embed(&["--gpus-per-actor", "1", "--vram-gib", "100"]),
        &ops,
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("cannot be placed"), "{stderr}");
    // 5: the cluster cannot be reached, or refuses the credentials.
    let (code, stderr) = status_of(&["jobs", "--cluster", "https://127.0.0.1:1"], &ops);
    assert_eq!(code, Some(5), "{stderr}");
    let (code, stderr) = status_of(
        &["jobs", "--cluster", &url],
        &[
            ("RESIDENT_CA", ca.as_os_str()),
            ("RESIDENT_TOKEN", "rtk_wrong".as_ref()),
        ],
    );
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("not known to this cluster"), "{stderr}");
}

/// On a terminal (a pseudo-terminal from `script`), a local job shows one line saying what
/// it runs on, its bar and its summary, and none of the embedded scheduler's and agent's
/// log lines; `-v` brings them back.
#[test]
fn a_local_job_on_a_terminal_shows_what_it_runs_on_its_bar_and_summary_only() {
    let dir = tempfile::tempdir().unwrap();
    let input = resident_tests::sample(dir.path(), 20);
    let run_on_a_terminal = |out: &str, verbose: bool| {
        let command = format!(
            "{} embed {} --model {} --input {} --output {} > /dev/null",
            resident_bin().display(),
            if verbose { "-v" } else { "" },
            resident_tests::minilm_dir(),
            input.display(),
            dir.path().join(out).display(),
        );
        let output = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env_remove("RESIDENT_LOG")
            .env_remove("RUST_LOG")
            .output()
            .expect("script(1) from util-linux runs the command on a pseudo-terminal");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).replace('\r', "\n")
    };
    let quiet = run_on_a_terminal("quiet", false);
    let lines: Vec<&str> = quiet.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines[0].starts_with("resident embed of ")
            && lines[0].contains(" on a local cluster in this process ("),
        "{quiet}"
    );
    assert!(quiet.contains("embedded 20 documents"), "{quiet}");
    assert!(
        !quiet.contains("INFO"),
        "internals on a quiet terminal: {quiet}"
    );
    assert!(
        !quiet.contains("principal="),
        "audit lines on a quiet terminal: {quiet}"
    );
    let verbose = run_on_a_terminal("verbose", true);
    assert!(
        verbose.contains("INFO") && verbose.contains("scheduler listening"),
        "-v shows the internals: {verbose}"
    );
}
