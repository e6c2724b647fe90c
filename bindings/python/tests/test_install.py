"""Packaging: the installed package carries the C library in its extension module and needs
nothing else at run time: no environment variable, no libbucketstore.so anywhere; it links the
system's LMDB and nettle (and libpq when the build found it). make py-test runs this against a
package pip-installed from a clean copy of the tree (tests/py_package_check.sh)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import bucketstore as bs
import bucketstore._ffi as F
import bucketstore._native as N
from conftest import REPO

PROBE = "import bucketstore; print(bucketstore.checksum_put('test', 't1', '{\"id\":\"t1\"}', " \
        "hash='sha256'))"


def test_the_library_is_the_extension_module():
    assert F.lib._name == N.__file__
    assert re.search(r"\.cpython-[^/]*\.so$", N.__file__)
    assert os.path.dirname(N.__file__) == os.path.dirname(bs.__file__)
    want = re.search(r'#define BS_VERSION_STRING "(.*)"', (REPO / "storage.h").read_text())
    assert want and bs.library_version() == want.group(1)


def test_installed_package_has_type_information():
    pkg = os.path.dirname(bs.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    assert os.path.exists(os.path.join(pkg, "_native.pyi"))


def test_imports_with_no_environment(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "BUCKETSTORE_LIB")}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2634521662"]


def test_links_the_system_libraries():
    if not shutil.which("ldd"):
        pytest.skip("no ldd (Debian's libc-bin)")  # recorded: make test STRICT=1 fails on it
    out = subprocess.run(["ldd", N.__file__], capture_output=True, text=True, check=True).stdout
    assert "liblmdb.so" in out and "libnettle.so" in out
    assert "libbucketstore" not in out
    with_pg = subprocess.run(["pkg-config", "--exists", "libpq"]).returncode == 0 \
        if shutil.which("pkg-config") else False
    assert ("libpq.so" in out) == with_pg
