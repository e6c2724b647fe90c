"""Builds bucketstore._native: the C library (every library .c of the repository, compiled in)
plus the binding's C glue, as one extension module, so the wheel is platform-tagged and needs
no libbucketstore.so at run time. It links Debian's liblmdb and nettle, and libpq when
pkg-config finds it (the Makefile's rule: the PostgreSQL backend is built then).

The library sources are taken from the repository (../../) when this is a checkout and copied
into csrc/ (so that an sdist carries them); an sdist builds from its csrc/."""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CSRC = os.path.join(HERE, "csrc")
HEADERS = ("storage.h", "storage_backend.h", "internal.h", "lmdb_internal.h", "mem_internal.h",
           "pg_internal.h")


def library_files():
    """The library's files in the checkout: what the Makefile's LIB_SRCS and headers are."""
    names = sorted(f for f in os.listdir(REPO) if f.endswith(".c") and not f.startswith("cli_"))
    return names + [h for h in HEADERS if os.path.exists(os.path.join(REPO, h))]


def sync_sources():
    """csrc/ = the checkout's library files (none stale), when building from the checkout."""
    if not os.path.exists(os.path.join(REPO, "storage.h")) or \
            os.path.exists(os.path.join(HERE, "PKG-INFO")):
        return
    want = library_files()
    os.makedirs(CSRC, exist_ok=True)
    for f in set(os.listdir(CSRC)) - set(want):
        os.remove(os.path.join(CSRC, f))
    for f in want:
        src, dst = os.path.join(REPO, f), os.path.join(CSRC, f)
        if not os.path.exists(dst) or open(src, "rb").read() != open(dst, "rb").read():
            shutil.copyfile(src, dst)


def pkg_config(*args):
    try:
        r = subprocess.run(["pkg-config", *args], capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.split() if r.returncode == 0 else None


def require_headers():
    """A missing system library is a message naming its Debian package, not a compiler error."""
    missing = [pkg for header, pkg in (("lmdb.h", "liblmdb-dev"), ("nettle/sha2.h", "nettle-dev"),
                                       ("xxhash.h", "libxxhash-dev"))
               if not any(os.path.exists(os.path.join(d, header))
                          for d in ("/usr/include", "/usr/local/include"))]
    if missing:
        sys.exit("bucketstore: missing C headers; on Debian: apt-get install " + " ".join(missing))


sync_sources()
if not any(a in sys.argv for a in ("sdist", "egg_info", "--help")):
    require_headers()
# What a PostgreSQL URL's UnsupportedError tells the user of a package built without libpq (the
# library's own advice, make PG=1, is for the repository's build).
NO_PG_ADVICE = ("the bucketstore package was built without libpq: install libpq-dev (Debian), "
                "then reinstall the package")
pq_cflags = pkg_config("--cflags", "libpq")
pq_libs = pkg_config("--libs", "libpq")
with_pg = pq_cflags is not None and pq_libs is not None
sources = sorted(f for f in os.listdir(CSRC) if f.endswith(".c")
                 and (with_pg or not f.startswith("pg")))

setup(
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=[Extension(
        "bucketstore._native",
        sources=["_native.c"] + ["csrc/" + f for f in sources],
        include_dirs=["csrc"] + [f[2:] for f in (pq_cflags or []) if f.startswith("-I")],
        define_macros=[("_GNU_SOURCE", None)] + ([("BS_HAVE_PG", None)] if with_pg else
                                                 [("BS_NO_PG_ADVICE", '"%s"' % NO_PG_ADVICE)]),
        extra_compile_args=["-std=c11", "-fvisibility=hidden", "-O2"],
        libraries=["lmdb", "nettle", "pthread"] + ([l[2:] for l in pq_libs if l.startswith("-l")]
                                                   if with_pg else []),
    )],
)
