"""The README's "From Python" example, run as written."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def test_the_readme_example_runs_as_written():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert len(example.strip().splitlines()) == 5, example
    done = subprocess.run([sys.executable, "-c", example], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    shape, _, answer = done.stdout.partition("\n")
    assert shape.startswith("(2, 384) alive"), done.stdout
    assert "Paris" in answer, done.stdout
