#!/usr/bin/env python3
"""Checks that every test file compiles on its own.

The test targets compile many test files as one unit (neffcache_unity, CMakeLists.txt), so a
file could use a helper, a `using` or an include of a file before it in its unit and still
build. This parses each file alone, with its unit's command from compile_commands.json and
-fsyntax-only (no code is generated: about a second a file with the precompiled header),
several at a time. Prints each file that fails with the compiler's first lines, and exits 1.

Whether a file compiles alone depends only on its text, the headers it can see and the command;
a pass is remembered under the hash of those (the headers: every file its unit's depfile names,
and its precompiled header's; the paths in the command without the clone's folder),
in ~/.cache/neffcache/test-files-alone, outside every clone as ccache's cache is, so that a run
parses again only what changed: a test file, or every file when a header changed (all 62 took
about 70 s of wall on 2 cores with clang alone, 271 s with GCC beside the other tests).

usage: check_test_files.py BUILD_DIR [--jobs N]
"""
import argparse
import concurrent.futures
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neffcache",
                     "test-files-alone")

# The options of a unit's command that name its outputs: dropped, since nothing is written.
OUTPUT_OPTIONS = {"-o", "-MF", "-MT", "-MQ"}
OUTPUT_FLAGS = {"-MD", "-MMD", "-c"}


def units(build_dir):
    """(unit source, its command's words) of each generated unit of the test targets."""
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        commands = json.load(f)
    for c in commands:
        if re.search(r"/unity/neffcache(_s3)?_tests_\d+\.cpp$", c["file"]):
            words = c["arguments"] if "arguments" in c else shlex.split(c["command"])
            yield c["file"], c["directory"], words


def alone_command(words, unit, source):
    """The unit's command for `source` alone: no outputs, syntax only."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in OUTPUT_OPTIONS:
            skip = True
            continue
        if w in OUTPUT_FLAGS or w == unit:
            continue
        out.append(w)
    # (ccache would only pass a syntax check on.)
    if os.path.basename(out[0]) == "ccache":
        out = out[1:]
    return out + ["-fsyntax-only", source]


def headers_hash(words, directory, sources):
    """The hash of every file the unit's depfile names (its headers, the precompiled one's too)
    but its test files, `sources`: whether one compiles alone does not depend on the others."""
    # (-MF where the command names it, else CMake's name for it: the object's, with .d.)
    depfile = words[words.index("-MF") + 1] if "-MF" in words else words[words.index("-o") + 1] + ".d"
    h = hashlib.sha256()
    if not depfile or not os.path.exists(os.path.join(directory, depfile)):
        h.update(os.urandom(16))  # (not built yet: nothing remembered)
        return h
    names = depfile_names(os.path.join(directory, depfile))
    # GCC leaves the headers of the precompiled header (-include X, built as X.gch) out of the
    # unit's depfile: they are in X.gch's own.
    for i, w in enumerate(words[:-1]):
        if w == "-include" and os.path.exists(pch_depfile := os.path.join(directory, words[i + 1] + ".gch.d")):
            names += depfile_names(pch_depfile)
    for name in sorted(set(names)):
        path = os.path.normpath(os.path.join(directory, name))
        if path in sources:
            continue
        h.update(name.encode())
        h.update(file_digest(path))
    return h


@functools.cache
def file_digest(path):
    """A header's digest, read once for all the units that include it."""
    try:
        with open(path, "rb") as f:
            # (The precompiled header's generated files name the clone's folder.)
            return hashlib.sha256(f.read().replace(ROOT.encode(), b"<root>")).digest()
    except OSError:
        return b"missing"


def depfile_names(path):
    """The files a depfile names as its target's prerequisites."""
    with open(path) as f:
        return f.read().replace("\\\n", " ").split()[1:]


# The clone, left out of the key: another clone of the same sources (CI's) finds the passes.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def key_of(headers, source, command):
    h = headers.copy()
    h.update("\0".join(w.replace(ROOT, "<root>") for w in command).encode())
    with open(source, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def check(job):
    source, directory, command, key = job
    if os.path.exists(os.path.join(CACHE, key)):
        return source, 0, ""
    r = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if r.returncode == 0:
        os.makedirs(CACHE, exist_ok=True)
        open(os.path.join(CACHE, key), "w").close()
    return source, r.returncode, r.stderr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = p.parse_args()
    jobs = []
    for unit, directory, words in units(a.build_dir):
        with open(unit) as f:
            included = re.findall(r'^#include "(.+)"$', f.read(), re.M)
        sources = [os.path.normpath(os.path.join(os.path.dirname(unit), rel)) for rel in included]
        headers = headers_hash(words, directory, set(sources))
        for source in sources:
            command = alone_command(words, unit, source)
            jobs.append((source, directory, command, key_of(headers, source, command)))
    if not jobs:
        print(f"check_test_files: no test units in {a.build_dir}/compile_commands.json", file=sys.stderr)
        return 1
    failed = []
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for source, rc, err in pool.map(check, jobs):
            if rc != 0:
                failed.append(source)
                print(f"{source} does not compile on its own:\n" + "\n".join(err.splitlines()[:20]))
    print(f"check_test_files: {len(jobs) - len(failed)} of {len(jobs)} test files compile on their own")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
