"""The Python example of the README and of the binding's README is
bindings/python/examples/quickstart.py, and it runs, twice on the same file."""

import os
import re
import subprocess
import sys

import bucketstore as bs
from conftest import REPO

EXAMPLE = REPO / "bindings" / "python" / "examples" / "quickstart.py"


def test_readme_example_is_the_quickstart():
    for readme in (REPO / "README.md", REPO / "bindings" / "python" / "README.md"):
        blocks = re.findall(r"^```python\n(.*?)^```$", readme.read_text(), re.S | re.M)
        assert blocks == [EXAMPLE.read_text()], readme


def test_quickstart_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package
    out = [subprocess.run([sys.executable, str(EXAMPLE)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert out[0].splitlines() == [
        '1 PUT t1 {"id":"t1","done":false} 2604604380',
        "Checksum(checksum=-1690362916, count=1)",
        "[{'list': 'u1'}]"]
    assert out[1] == out[0]  # run again: the same file, stream and result
    with bs.open(tmp_path / "quickstart.bsdb") as db:
        assert [s.name for s in db.streams()] == ["rules-v1"]
