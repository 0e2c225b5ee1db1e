#!/usr/bin/python3
"""One torch-xla rank (libneuronxla's cache wrapper) on one entry of a Neuron compile cache.

Written from ../shared/notes/neuron-cache-facts.md alone ("How a torch-xla rank takes an entry
and waits", "What a rank looks at first"), not from neffcache's code, so that the conformance
suite runs the same steps on a plain folder and through a mount.

    neuron_client.py ROOT ENTRY --compiler PATH [--lock excl|look] [--version 2.15|2.12]
                     [--poll SECONDS] [--waiting-file PATH] [--hold SECONDS [--hold-until PATH]]
                     [--inputs-from DIR]

ENTRY is the entry folder relative to ROOT (neuronxcc-<v>/MODULE_<graph>+<flags>).

Every look runs under the cache-wide lock (ROOT/lock, opened for writing and kept open, flocked
around each look). A rank looks for the finished entry (2.15+: model.done; 2.12: model.neff),
then for a cached failure (model.log), else takes the entry's existence lock
(<hlo>.lock) and compiles: the HLO is read back into a private work folder, the compiler runs
there, the NEFF is copied into the entry as model.neff, model.done is written, the lock removed.
A rank that does not get the lock polls the lock file until it is gone and looks again.

When a rank writes the HLO into the entry is not in the facts. By default the entry holds its
inputs before the rank runs; with --inputs-from, the rank makes the entry folder, and writes the
HLO and compile_flags.json (copied from DIR) once the entry's lock is its own, before it compiles.

Prints one JSON line: {"outcome": hit|waited|compiled|cached_failure, "neff_bytes", "neff_sha256"}.
An error prints {"outcome": "error", "error": <exception class>, "errno": n, "message": ...},
a one-line message on stderr, and exits 1.
"""
import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The HLO's name in an entry and the file whose presence means "done", by release.
HLO_NAME = {"2.15": "model.hlo_module.pb", "2.12": "model.hlo.pb"}
DONE_NAME = {"2.15": "model.done", "2.12": "model.neff"}


@contextlib.contextmanager
def cache_lock(lock_file):
    """The cache-wide lock around one look (the file itself stays open for the rank's life)."""
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(lock_file, fcntl.LOCK_UN)


def take_entry_lock(path, mode):
    """True when this rank now owns the entry's lock file.

    Which create libneuronxla uses is not known, so both are offered: `excl` creates with
    O_CREAT|O_EXCL; `look` checks that the name is free, then creates it without O_EXCL (safe
    only because the caller holds the cache-wide lock)."""
    if mode == "excl":
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return True
        except FileExistsError:
            return False
    if os.path.exists(path):
        return False
    open(path, "w").close()
    return True


def wait_for_release(lock_path, poll, waiting_file):
    """Polls the lock file's existence, with no timeout, as the real client does."""
    if waiting_file:
        open(waiting_file, "w").close()
    while os.path.exists(lock_path):
        time.sleep(poll)


def copy_out(entry):
    """A hit: the NEFF is copied out to a temporary folder, then read there."""
    with tempfile.TemporaryDirectory(prefix="neuron-client-hit-") as tmp:
        local = os.path.join(tmp, "model.neff")
        shutil.copyfile(os.path.join(entry, "model.neff"), local)
        with open(local, "rb") as f:
            return f.read()


def compile_entry(entry, hlo_name, compiler):
    """Compiles the entry's HLO in a private work folder; returns the NEFF's bytes.

    A compiler failure is recorded as model.log (the cached failure later ranks find)."""
    module = os.path.basename(entry)
    with open(os.path.join(entry, "compile_flags.json")) as f:
        flags = json.load(f)
    workroot = os.path.join(tempfile.gettempdir(), "neuroncc_compile_workdir")
    os.makedirs(workroot, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workroot) as work:
        hlo = os.path.join(work, f"model.{module}.hlo_module.pb")
        neff = os.path.join(work, f"model.{module}.neff")
        shutil.copyfile(os.path.join(entry, hlo_name), hlo)  # download_hlo
        command = [compiler, "compile", "--framework=XLA", "--target=trn1", hlo, "--output", neff,
                   *flags, "--verbose=35"]
        run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            with open(os.path.join(entry, "model.log"), "wb") as f:
                f.write(run.stdout)
            raise RuntimeError(f"neuronx-cc exited with status {run.returncode}")
        with open(neff, "rb") as f:
            return f.read()


def publish(entry, neff, lock_path):
    """model.neff first, then model.done, then the lock is released (removed)."""
    with open(os.path.join(entry, "model.neff"), "wb") as f:
        f.write(neff)
    open(os.path.join(entry, "model.done"), "w").close()
    os.remove(lock_path)


def report(outcome, neff=None):
    result = {"outcome": outcome, "neff_bytes": None, "neff_sha256": None}
    if neff is not None:
        result.update(neff_bytes=len(neff), neff_sha256=hashlib.sha256(neff).hexdigest())
    print(json.dumps(result), flush=True)


def look_or_lock(a, entry, lock_path, lock_file):
    """The rank's loop: (outcome, NEFF) once the entry is done or failed; None once the
    entry's lock is this rank's."""
    waited = False
    while True:
        with cache_lock(lock_file):
            if os.path.exists(os.path.join(entry, DONE_NAME[a.version])):
                return ("waited" if waited else "hit"), copy_out(entry)
            if os.path.exists(os.path.join(entry, "model.log")):
                return "cached_failure", None
            if take_entry_lock(lock_path, a.lock):
                return None
        waited = True
        wait_for_release(lock_path, a.poll, a.waiting_file)


def hold_lock(a, lock_path, lock_file):
    """For tests: a process that takes the entry's lock at once, without looking first, and
    holds it (a live holder, or, killed meanwhile, what a crash leaves)."""
    with cache_lock(lock_file):
        if not take_entry_lock(lock_path, a.lock):
            raise FileExistsError(errno.EEXIST, "the entry is locked already", lock_path)
    deadline = time.monotonic() + a.hold
    while time.monotonic() < deadline and not (a.hold_until and os.path.exists(a.hold_until)):
        time.sleep(0.02)


def run(a):
    entry = os.path.join(a.root, a.entry)
    hlo_name = HLO_NAME[a.version]
    lock_path = os.path.join(entry, hlo_name + ".lock")
    lock_file = open(os.path.join(a.root, "lock"), "w")  # as the cache object opens it
    if a.hold:
        hold_lock(a, lock_path, lock_file)
    else:
        if a.inputs_from:
            os.makedirs(entry, exist_ok=True)
        found = look_or_lock(a, entry, lock_path, lock_file)
        if found:
            return report(*found)
        if a.inputs_from and not os.path.exists(os.path.join(entry, hlo_name)):
            shutil.copyfile(os.path.join(a.inputs_from, "compile_flags.json"), os.path.join(entry, "compile_flags.json"))
            shutil.copyfile(os.path.join(a.inputs_from, hlo_name), os.path.join(entry, hlo_name))
    try:
        neff = compile_entry(entry, hlo_name, a.compiler)
    except Exception:  # a failed compile releases the entry (a kill leaves the lock, as the facts say)
        with contextlib.suppress(OSError):
            os.remove(lock_path)
        raise
    with cache_lock(lock_file):
        publish(entry, neff, lock_path)
    return report("compiled", neff)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("entry")
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--lock", choices=("excl", "look"), default="excl")
    ap.add_argument("--version", choices=sorted(HLO_NAME), default="2.15")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--hold", type=float, default=0.0,
                    help="for tests: take the entry's lock at once (no look first), hold it this many "
                         "seconds, then compile and publish")
    ap.add_argument("--inputs-from", help="the entry's inputs, written by the rank under its lock (see above)")
    ap.add_argument("--hold-until", help="for tests: with --hold, release the lock early once this file exists")
    ap.add_argument("--waiting-file", help="for tests: a file made once this rank waits for another's lock")
    a = ap.parse_args()
    try:
        run(a)
    except Exception as e:  # one line and exit 1, as a rank's error ends it
        err = getattr(e, "errno", None)
        print(json.dumps({"outcome": "error", "error": type(e).__name__, "errno": err, "message": str(e)}),
              flush=True)
        print(f"neuron_client: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
