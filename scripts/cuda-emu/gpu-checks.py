#!/usr/bin/env python3
"""Checks for smoke.sh's steps of several GPUs.

gpu-checks.py used REPORT 0,1   the GPUs that took documents are exactly those listed, each
                                with some: REPORT is a job's report.json, whose `per_gpu`
                                counts them
gpu-checks.py same A B          two generations.jsonl files hold the same records, by id
"""
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


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["used", report, listed]:
            gpus_used(report, listed)
        case ["same", one, two]:
            same_records(one, two)
        case _:
            sys.exit(__doc__)
