#!/usr/bin/env python3
"""Checks for smoke.sh's steps of several GPUs.

gpu-checks.py used REPORT 0,1   the GPUs that took documents are exactly those listed, each
                                with some: REPORT is a job's report.json, whose `per_gpu`
                                counts them
gpu-checks.py same A B          two generations.jsonl files hold the same records, by id
gpu-checks.py scored OUT N      a `resident generate --score` job with choices: each record of
                                OUT/generations.jsonl scored each of its N choices (a finite,
                                negative log-probability each, a best one), and OUT/report.json counts
                                them all with an accuracy
gpu-checks.py suite RESULTS T   a `resident eval` results.json: the tasks T (comma-separated)
                                each with finite metric rows, all of them on one pool
"""
import math
import json
import sys


def gpus_used(report_path, listed):
    wanted = sorted(int(index) for index in listed.split(","))
    report = json.load(open(report_path, encoding="utf-8"))
    docs = {row["gpu_index"]: row["docs"] for row in report.get("per_gpu", [])}
    if sorted(docs) != wanted or min(docs.values()) <= 0:
        sys.exit(f"{report_path}: documents by GPU {docs}; GPUs {wanted} should each have some")
    print(f"documents by GPU: {docs}")


def records(path):
    with open(path, encoding="utf-8") as lines:
        return {record["id"]: record for record in map(json.loads, lines)}


def same_records(one_path, two_path):
    one, two = records(one_path), records(two_path)
    if one.keys() != two.keys():
        sys.exit(f"ids differ: {sorted(one.keys() ^ two.keys())}")
    differ = [key for key in sorted(one) if one[key] != two[key]]
    if differ:
        first = differ[0]
        sys.exit(f"{len(differ)} records differ; {first}: {one[first]} != {two[first]}")
    print(f"{len(one)} records alike")


def scored(out, choices):
    lines = list(records(f"{out}/generations.jsonl").values())
    for line in lines:
        scores = [score["logprob"] for score in line.get("choice_scores", [])]
        if len(scores) != choices or not all(math.isfinite(s) and s < 0 for s in scores):
            sys.exit(f"record {line['id']}: choice log-probabilities {scores}, {choices} "
                     "finite negative ones wanted")
        if line.get("best") not in range(choices):
            sys.exit(f"record {line['id']}: best {line.get('best')}")
    report = json.load(open(f"{out}/report.json", encoding="utf-8"))
    if report.get("choice_records") != len(lines) or not 0 <= report.get("accuracy", -1) <= 1:
        sys.exit(f"report: choice_records {report.get('choice_records')} of {len(lines)}, "
                 f"accuracy {report.get('accuracy')}")
    print(f"{len(lines)} records scored, accuracy {report['accuracy']}")


def suite(results_path, names):
    results = json.load(open(results_path, encoding="utf-8"))
    tasks = {task["name"]: task for task in results["tasks"]}
    if sorted(tasks) != sorted(names.split(",")):
        sys.exit(f"tasks {sorted(tasks)}, wanted {names}")
    for name, task in tasks.items():
        values = [row["value"] for row in task["metrics"]]
        if not values or not all(math.isfinite(v) for v in values):
            sys.exit(f"task {name}: metrics {task['metrics']}")
    pools = {task["pool"] for task in tasks.values()}
    if len(pools) != 1:
        sys.exit(f"the tasks ran on pools {pools}, not one")
    print({name: [(r["metric"], r["value"]) for r in t["metrics"]] for name, t in tasks.items()})


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["used", report, listed]:
            gpus_used(report, listed)
        case ["same", one, two]:
            same_records(one, two)
        case ["scored", out, choices]:
            scored(out, int(choices))
        case ["suite", results, names]:
            suite(results, names)
        case _:
            sys.exit(__doc__)
