#!/usr/bin/env python3
"""Checks for smoke.sh's two-GPU steps.

both-gpus.py REPORT        every GPU of the run (indices 0 and 1) took documents: REPORT is
                           a job's report.json, whose `per_gpu` counts them
both-gpus.py --same A B    two generations.jsonl files hold the same records, by id
"""
import json
import sys


def both_gpus_worked(report_path):
    report = json.load(open(report_path, encoding="utf-8"))
    docs = {row["gpu_index"]: row["docs"] for row in report.get("per_gpu", [])}
    if sorted(docs) != [0, 1] or min(docs.values()) <= 0:
        sys.exit(f"{report_path}: documents by GPU {docs}; both GPUs 0 and 1 should have some")
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["--same"] and len(sys.argv) == 4:
        same_records(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2:
        both_gpus_worked(sys.argv[1])
    else:
        sys.exit(__doc__)
