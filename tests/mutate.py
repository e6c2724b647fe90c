#!/usr/bin/env python3
"""Mutation check of the rule code (`make mutate`; also run by `make soak`).

Copies the tree (tracked and untracked, not ignored, files) to a temporary directory, builds the
quick suite there once (it must pass), then for each mutant of tests/mutants.txt (file @@ text @@
replacement: a one-line change of a rule operator) applies it, rebuilds, and runs the suite until
a test fails (the mutant is killed) or all pass (it survives). Exits non-zero when a mutant
survives, does not apply (its text is not in the file exactly once) or does not compile,
listing each. Built without the PostgreSQL backend: the shared rules run the same on every
backend, and the suite stays within minutes.

Usage: tests/mutate.py [--list FILE] [--only SUBSTRING] [--lines N,M] [--suite test_a,...]
       [--jobs N] [--keep]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The quick suite, cheapest and most likely to kill first. Each entry: binary, environment.
SUITE = [
    ("test_planner", {}),
    ("test_wcp", {}),
    ("test_read", {}),
    ("test_torn", {}),
    ("test_contract", {}),
    ("test_property", {"BS_BACKEND": "memory"}),
    ("test_property", {"BS_BACKEND": "lmdb"}),
    ("test_compact", {}),
]
TIMEOUT = 300  # seconds per test binary: a hang counts as a kill


def parse(path):
    mutants = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split(" @@ ")
            if len(parts) != 3:
                sys.exit(f"{path}:{n}: expected 'file @@ text @@ replacement'")
            mutants.append((n, parts[0].strip(), parts[1], parts[2]))
    return mutants


def copy_tree(dst):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = os.path.join(ROOT, os.fsdecode(f))
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        out = os.path.join(dst, os.fsdecode(f))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out)


def build(tree, jobs):
    bins = sorted({"build/tests/" + b for b, _ in SUITE})
    r = subprocess.run(["make", "-s", f"-j{jobs}", "PG=0"] + bins, cwd=tree,
                       capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr


def run_suite(tree):
    """The first failing test (its name), or None when the whole suite passes."""
    for b, env in SUITE:
        e = dict(os.environ, BS_TEST_QUICK="1", **env)
        e.pop("BS_TEST_PG_URL", None)
        name = b + "".join(f" {k}={v}" for k, v in env.items())
        try:
            r = subprocess.run([os.path.join(tree, "build/tests", b)], cwd=tree, env=e,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return name + " (timeout)"
        if r.returncode != 0:
            return name
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", default=os.path.join(ROOT, "tests", "mutants.txt"))
    ap.add_argument("--only", default="", help="only mutants whose line contains this")
    ap.add_argument("--lines", default="", help="only the mutants of these lines (1,5,9)")
    ap.add_argument("--suite", default="", help="only the suite's binaries named (test_a,test_b)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the temporary tree")
    a = ap.parse_args()
    lines = {int(x) for x in a.lines.split(",") if x}
    if a.suite:
        SUITE[:] = [t for t in SUITE if t[0] in a.suite.split(",")]
    mutants = [m for m in parse(a.list)
               if a.only in " @@ ".join(m[1:]) and (not lines or m[0] in lines)]
    tree = tempfile.mkdtemp(prefix="bs-mutate.")
    t0 = time.time()
    try:
        copy_tree(tree)
        ok, log = build(tree, a.jobs)
        if not ok:
            sys.exit("mutate: the unmutated tree does not build:\n" + log[-3000:])
        failed = run_suite(tree)
        if failed:
            sys.exit(f"mutate: the unmutated tree fails {failed}")
        survived, broken, killed = [], [], 0
        for n, path, text, repl in mutants:
            label = f"mutants.txt:{n} {path}: {text.strip()} -> {repl.strip()}"
            f = os.path.join(tree, path)
            with open(f, encoding="utf-8") as fh:
                orig = fh.read()
            if orig.count(text) != 1:
                broken.append(f"{label} (the text occurs {orig.count(text)} times)")
                continue
            with open(f, "w", encoding="utf-8") as fh:
                fh.write(orig.replace(text, repl))
            try:
                ok, log = build(tree, a.jobs)
                if not ok:
                    broken.append(f"{label} (does not compile)")
                    continue
                by = run_suite(tree)
            finally:
                with open(f, "w", encoding="utf-8") as fh:
                    fh.write(orig)
            if by:
                killed += 1
                print(f"killed   {label}  [{by}]", flush=True)
            else:
                survived.append(label)
                print(f"SURVIVED {label}", flush=True)
        total = len(mutants)
        print(f"mutate: {killed} of {total} mutants killed, {len(survived)} survived, "
              f"{len(broken)} did not apply ({time.time() - t0:.0f} s)")
        for s in survived:
            print("  survived: " + s)
        for s in broken:
            print("  broken:   " + s)
        return 1 if survived or broken else 0
    finally:
        if a.keep:
            print("mutate: tree kept in " + tree)
        else:
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
