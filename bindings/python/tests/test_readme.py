"""The README's examples run. The Python example of the repository's README and the first of
the binding's README is bindings/python/examples/quickstart.py, and it runs, twice on the same
file; every other `python` block of the binding's README is run as it stands and its output
compared with the `text` block under it, and all of them pass `mypy --strict`."""

import os
import re
import subprocess
import sys

import pytest

import bucketstore as bs
from conftest import REPO

EXAMPLE = REPO / "bindings" / "python" / "examples" / "quickstart.py"
README = REPO / "bindings" / "python" / "README.md"


def blocks(readme, lang):
    return re.findall(r"^```%s\n(.*?)^```$" % lang, readme.read_text(), re.S | re.M)


def examples():
    """The binding's README's (python block, the text block right under it) pairs, after the
    quickstart; a python block without its output is an error (an example nobody checks)."""
    text = README.read_text()
    found = re.findall(r"^```python\n(.*?)^```\n(?:\n```text\n(.*?)^```$)?", text, re.S | re.M)
    assert found and found[0][0] == EXAMPLE.read_text()
    for code, out in found[1:]:
        assert out, f"an example of {README} without a text block of its output:\n{code}"
    return found[1:]


def run(path, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package
    return subprocess.run([sys.executable, str(path)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, check=True).stdout


def test_readme_example_is_the_quickstart():
    assert blocks(REPO / "README.md", "python") == [EXAMPLE.read_text()]
    assert blocks(README, "python")[0] == EXAMPLE.read_text()
    assert len(examples()) >= 3  # raw reads, errors, backup: the README's promises shown


def test_quickstart_runs(tmp_path):
    out = [run(EXAMPLE, tmp_path) for _ in range(2)]
    assert out[0].splitlines() == [
        '1 PUT t1 {"id":"t1","done":false} 2604604380',
        "Checksum(checksum=-1690362916, count=1)",
        "[{'list': 'u1'}]"]
    assert out[1] == out[0]  # run again: the same file, stream and result
    with bs.open(tmp_path / "quickstart.bsdb") as db:
        assert [s.name for s in db.streams()] == ["rules-v1"]


@pytest.mark.parametrize("i", range(len(examples())))
def test_readme_example_runs(i, tmp_path):
    code, want = examples()[i]
    (tmp_path / "example.py").write_text(code)
    assert run(tmp_path / "example.py", tmp_path) == want


def test_readme_examples_typecheck(tmp_path):
    """mypy --strict on every example of the binding's README, as the package check runs it on
    examples/ (a stub-typed package: the examples use it as its users would)."""
    for i, (code, _) in enumerate(examples()):
        (tmp_path / f"readme_example_{i}.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                        str(tmp_path / "cache"), "--no-error-summary", str(tmp_path)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
