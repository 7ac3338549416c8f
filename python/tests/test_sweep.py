"""Cluster.sweep: `resident sweep` from Python, a dict declaration giving the CLI's results
on a TOML file of the same keys; resumed; stopped by Ctrl-C without losing a finished trial;
a bad declaration refused with what to do."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import resident
from conftest import MINILM, REPO, RESIDENT_BIN, WIKI, interrupt


def _labelled_records(path, count: int) -> None:
    with open(WIKI) as source, open(path, "w") as out:
        for line, _ in zip(source, range(count)):
            record = json.loads(line)
            out.write(json.dumps({"id": record["id"], "text": record["text"], "topic": record["topic"]}) + "\n")


def _declaration(data, output) -> dict:
    return {
        "name": "py-probe",
        "model": str(MINILM),
        "replicas": 2,
        "trial": "classifier",
        "data": str(data),
        "metric": "accuracy",
        "mode": "max",
        "trials": 8,
        "seed": 3,
        "output": str(output),
        "search": {"algorithm": "tpe", "startup_trials": 3},
        "scheduler": {"kind": "asha", "max_epochs": 6, "grace_epochs": 1, "reduction_factor": 2},
        "space": {"lr": {"loguniform": [1e-4, 1e-1]}, "hidden": {"choice": [0, 32]}},
    }


def _toml(declaration: dict) -> str:
    lines, tables = [], []
    for key, value in declaration.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    for name, table in tables:
        lines.append(f"[{name}]")
        for key, value in table.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _results(output) -> list[tuple]:
    rows = [json.loads(line) for line in open(output / "results.jsonl")]
    return sorted((r["trial_id"], json.dumps(r["params"], sort_keys=True), r["epochs"], r["metric"]) for r in rows)


def test_a_dict_sweep_gives_the_cli_s_trials_and_resumes(local_cluster, tmp_path):
    data = tmp_path / "wiki300.jsonl"
    _labelled_records(data, 300)
    declaration = _declaration(data, tmp_path / "py")
    summary = local_cluster.sweep(declaration, progress=False)
    assert summary["trials"] == 8 and summary["model_loads"] == 2
    assert summary["best_params"]["hidden"] in (0, 32)

    # The same keys as a TOML file, through the CLI in its own process.
    cli = dict(declaration, output=str(tmp_path / "cli"))
    (tmp_path / "sweep.toml").write_text(_toml(cli))
    subprocess.run([str(RESIDENT_BIN), "sweep", "--config", str(tmp_path / "sweep.toml")],
                   check=True, capture_output=True)
    assert _results(tmp_path / "py") == _results(tmp_path / "cli")

    # A path works as the CLI's file does, and a rerun keeps every finished trial.
    again = local_cluster.sweep(tmp_path / "sweep.toml", output=str(tmp_path / "py"), progress=False)
    assert again["resumed_trials"] == 8 and again["best_trial"] == summary["best_trial"]


def test_a_bad_declaration_is_refused_before_anything_runs(local_cluster, tmp_path):
    declaration = _declaration(tmp_path / "missing.jsonl", tmp_path / "out")
    declaration["search"] = {"algorithm": "random", "startup_trials": 4}
    with pytest.raises(resident.BadInput, match="startup_trials is TPE's"):
        local_cluster.sweep(declaration, progress=False)
    declaration["search"] = {"algorithm": "tpe"}
    declaration["spce"] = {}
    with pytest.raises(resident.BadInput, match="unknown field `spce`"):
        local_cluster.sweep(declaration, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_pbt_sweep_gives_its_best_policy_and_head(local_cluster, tmp_path):
    data = tmp_path / "wiki300.jsonl"
    _labelled_records(data, 300)
    declaration = dict(
        _declaration(data, tmp_path / "pbt"),
        search={"algorithm": "random"},
        scheduler={"kind": "pbt", "max_epochs": 4, "perturbation_interval": 2},
    )
    summary = local_cluster.sweep(declaration, progress=False)
    assert summary["trials"] == 8 and summary["stopped_early"] == 0
    policy = summary["best_policy"]
    assert policy[0]["start_epoch"] == 0 and policy[-1]["end_epoch"] == 4
    assert policy[-1]["trial"] == summary["best_trial"]
    assert summary["best_head"] == "best_head.safetensors"
    assert (tmp_path / "pbt" / "best_head.safetensors").stat().st_size > 0
    rows = [json.loads(line) for line in open(tmp_path / "pbt" / "results.jsonl")]
    copies = [p for r in rows for p in r["schedule"] if "cloned_from" in p]
    assert len(copies) == 2, "one round of 8 trials: the worst two copy"
    assert all(p["epoch"] == 2 for p in copies)
    declaration["search"] = {"algorithm": "tpe"}
    with pytest.raises(resident.BadInput, match="PBT starts its whole population at once"):
        local_cluster.sweep(dict(declaration, output=str(tmp_path / "never")), progress=False)


# The interrupted sweep's trials.
TRIALS = 32

# A sweep in a Python process of its own, on its own local cluster.
SWEEP_CHILD = """
import json, sys
import resident
cluster = resident.local()
cluster.sweep(json.loads(sys.argv[1]), progress=False)
print("finished", flush=True)
"""


def test_ctrl_c_stops_a_sweep_and_a_rerun_keeps_every_finished_trial(local_cluster, tmp_path):
    data = tmp_path / "wiki1000.jsonl"
    _labelled_records(data, 1000)
    # Enough trials that the sweep is mid-way when the second one is written.
    declaration = dict(_declaration(data, tmp_path / "out"), trials=TRIALS)
    results = tmp_path / "out" / "results.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", SWEEP_CHILD, json.dumps(declaration)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 180
    while not (results.exists() and results.read_text().count("\n") >= 2):
        assert child.poll() is None, child.communicate()
        assert time.time() < deadline, "no two trials finished in 180 s"
        time.sleep(0.01)
    took_s, stdout, stderr = interrupt(child)
    assert took_s < 2.0, f"control came back {took_s:.2f} s after SIGINT"
    assert "KeyboardInterrupt" in stderr and "finished" not in stdout, (stdout, stderr[-2000:])
    # Every line written is a whole trial (no torn line), and the sweep had trials left.
    kept = [json.loads(line) for line in results.read_text().splitlines()]
    assert 2 <= len(kept) < TRIALS, kept

    # The rerun keeps every finished trial as it was and runs the rest, none twice.
    summary = local_cluster.sweep(declaration, progress=False)
    assert summary["trials"] == TRIALS and summary["resumed_trials"] >= len(kept), summary
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len({row["trial_id"] for row in rows}) == len(rows) == TRIALS, rows
    for row in kept:
        assert row in rows, row
