"""The README's Python example is bindings/python/examples/quickstart.py, and it runs."""

import os
import re
import subprocess
import sys

from conftest import REPO

EXAMPLE = REPO / "bindings" / "python" / "examples" / "quickstart.py"


def test_readme_example_is_the_quickstart():
    blocks = re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(), re.S | re.M)
    assert blocks == [EXAMPLE.read_text()]


def test_quickstart_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package
    r = subprocess.run([sys.executable, str(EXAMPLE)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert lines[0].startswith('1 PUT t1 {"id":"t1","done":false} ')
    assert lines[1].endswith("count=1)") and lines[2] == "['{\"list\":\"u1\"}']"
    assert (tmp_path / "quickstart.bsdb").exists()
