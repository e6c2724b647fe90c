"""Packaging: `pip install --no-build-isolation` of bindings/python, and where the installed
package finds libbucketstore.so: BUCKETSTORE_LIB, else next to the package, else
ctypes.util.find_library (here: through LD_LIBRARY_PATH)."""

import ctypes.util
import os
import shutil
import subprocess
import sys

import pytest

import bucketstore._ffi as F
from conftest import REPO

PROBE = "import bucketstore, bucketstore._ffi as f; print(f.lib._name); " \
        "print(bucketstore.checksum_put('test', 't1', '{\"id\":\"t1\"}', hash='sha256'))"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package pip-installed into a fresh directory (built from a copy of the sources, so
    the tree gets no build/ or egg-info)."""
    d = tmp_path_factory.mktemp("pip")
    src = d / "src"
    shutil.copytree(REPO / "bindings" / "python", src,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so*", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                    "--no-deps", "--no-index", "--target", str(d / "site"), str(src)],
                   check=True, capture_output=True)
    return d / "site"


def probe(site, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("BUCKETSTORE_LIB", "PYTHONPATH")}
    e.update(env, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True, text=True,
                          cwd=str(site.parent))


def test_installed_package_has_type_information(installed):
    assert (installed / "bucketstore" / "py.typed").exists()
    assert (installed / "bucketstore" / "_core.py").exists()


def test_library_from_environment_wins(installed, tmp_path):
    so = tmp_path / "libbucketstore.so"
    shutil.copy(F.lib._name, so)
    r = probe(installed, BUCKETSTORE_LIB=str(so))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(so), "2634521662"]
    bad = probe(installed, BUCKETSTORE_LIB=str(tmp_path / "missing.so"))
    assert bad.returncode != 0 and "missing.so" in bad.stderr and "ImportError" in bad.stderr


def test_library_via_find_library(installed, tmp_path):
    if not shutil.which("ld"):
        pytest.skip("find_library needs ld to search LD_LIBRARY_PATH")
    shutil.copy(F.lib._name, tmp_path / "libbucketstore.so.0")  # as `make install` lays it out
    os.symlink("libbucketstore.so.0", tmp_path / "libbucketstore.so")
    r = probe(installed, LD_LIBRARY_PATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0].startswith("libbucketstore.so")


def test_library_next_to_the_package(installed):
    local = installed / "bucketstore" / "libbucketstore.so"
    shutil.copy(F.lib._name, local)
    try:
        r = probe(installed, LD_LIBRARY_PATH="")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(local), "2634521662"]
    finally:
        local.unlink()
    if ctypes.util.find_library("bucketstore"):
        return  # installed system-wide: it would be found
    r = probe(installed, LD_LIBRARY_PATH="")  # nowhere to be found
    assert r.returncode != 0 and "cannot load libbucketstore.so" in r.stderr
