//! Conventions of the `resident` command line itself: shell completions cover every
//! command, and a usage error exits 2 with what was wrong.

use std::process::Command;

use resident_tests::resident_bin;

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
