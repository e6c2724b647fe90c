"""Drift check: the ctypes mirror in bucketstore._ffi against the real storage.h.

A C program generated from the mirror prints sizeof and offsetof of every mirrored struct and
the value of every mirrored constant, compiled against the tree's storage.h; the field names
and their order are parsed from the header. A storage.h change that the binding does not
mirror (a field appended to bs_commit_result, a renamed field, a new code value) fails here."""

import ctypes
import re
import shutil
import subprocess

import pytest

import bucketstore._core as core
import bucketstore._ffi as F
from conftest import REPO

HEADER = REPO / "storage.h"


def header_fields(text, name):
    """The field names of `typedef struct name {...} name;` in declaration order."""
    m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
    assert m, f"{name} not found in storage.h"
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names = []
    for decl in (d.strip() for d in body.split(";")):
        if not decl:
            continue
        fp = re.match(r"[^(]*\(\s*\*\s*(\w+)\s*\)", decl)  # function pointer
        if fp:
            names.append(fp.group(1))
            continue
        parts = decl.split(",")
        names.append(re.search(r"(\w+)\s*(\[[^\]]*\])?$", parts[0].strip()).group(1))
        names += [re.match(r"\s*\**\s*(\w+)", p).group(1) for p in parts[1:]]
    return names


def test_field_names_match_header():
    text = HEADER.read_text()
    for cname, cls in F.STRUCTS:
        assert [f for f, *_ in cls._fields_] == header_fields(text, cname), cname


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler (the layout check needs one)"
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "storage.h"',
             "int main(void) {"]
    for cname, cls in F.STRUCTS:
        lines.append(f'  printf("size {cname} %zu\\n", sizeof({cname}));')
        for f, *_ in cls._fields_:
            lines.append(f'  printf("off {cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    for k in F.CONSTANTS:
        lines.append(f'  printf("const {k} %lld\\n", (long long)({k}));')
    lines += ["  return 0;", "}"]
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", str(REPO), "-o", str(d / "layout"), str(d / "layout.c")],
                   check=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


def test_sizes_and_offsets_match(compiled):
    for cname, cls in F.STRUCTS:
        assert int(compiled[f"size {cname}"]) == ctypes.sizeof(cls), f"sizeof {cname}"
        for f, *_ in cls._fields_:
            assert int(compiled[f"off {cname}.{f}"]) == getattr(cls, f).offset, f"{cname}.{f}"


def test_constants_match(compiled):
    for k, v in F.CONSTANTS.items():
        assert int(compiled[f"const {k}"]) == v, k


def test_every_status_code_is_mirrored():
    # a code added to storage.h gets a constant and an exception class of its own
    codes = dict(re.findall(r"#define (BS_E[A-Z]+)\s+\((-\d+)\)", HEADER.read_text()))
    assert codes and "BS_EUSER" in codes
    for name, value in codes.items():
        assert F.CONSTANTS.get(name) == int(value), name
        assert core._CODE_CLASSES[int(value)].__name__ != "BucketstoreError", name
        assert core.BucketstoreError(int(value)).name == name
    # one class per code: no two codes share one
    classes = [core._CODE_CLASSES[int(v)] for v in codes.values()]
    assert len(set(classes)) == len(codes), sorted(c.__name__ for c in classes)
