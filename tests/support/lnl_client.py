#!/usr/bin/python3
"""One rank's use of an LNL compile cache (vLLM Neuron, TorchNeuron: libtorch_neuronx_lite).

Written for the tests from the steps in ../shared/notes/lnl-cache-facts.md ("How a rank uses
the cache, step by step") alone, with the libraries LNL itself uses (Debian's python3-filelock
and python3-psutil), and apart from neuron-client-sim, so that a test whose client and daemon
share one misreading of the facts does not pass by agreement.

    lnl_client.py ROOT KEY HLO COMPILER [--target T] [--arg A]... [--remote DIR] [--save-cache]
                  [--poll SECONDS] [--waiting-file PATH]

Prints one JSON line: {"outcome": hit|waited|fetched|compiled, "neff_bytes": n, "neff_sha256": h}
(and "saved": promoted|taken after --save-cache). Any error ends it with "FATAL: ..." on
stderr and exit status 1, as LNL ends the process.
"""
import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import filelock
import psutil


def fatal(message):
    print(f"FATAL: {message}", file=sys.stderr)
    sys.exit(1)


def complete(entry, key):
    """Step 1: graph.hlo, the NEFF and the marker exist, and the metadata is listed."""
    for name in ("graph.hlo", f"graph_{key}.neff", ".compilation_complete"):
        if not os.path.exists(os.path.join(entry, name)):
            return False
    try:
        names = os.listdir(entry)
    except OSError:
        return False
    return any(n.startswith(".artifact_metadata_v") and n.endswith(".json") for n in names)


def load(entry, key, outcome, extra=None):
    try:
        with open(os.path.join(entry, ".cache_accessed"), "w") as f:
            f.write(str(int(time.time())))
    except OSError:
        pass  # a read-only cache: ignored
    with open(os.path.join(entry, ".artifact_metadata_v0.json")) as f:
        meta = json.load(f)
    if meta.get("cache_key") != os.path.basename(entry):
        fatal(f"cache key mismatch in {entry}")
    with open(os.path.join(entry, f"graph_{key}.neff"), "rb") as f:
        neff = f.read()
    result = {"outcome": outcome, "neff_bytes": len(neff), "neff_sha256": hashlib.sha256(neff).hexdigest()}
    result.update(extra or {})
    print(json.dumps(result), flush=True)


def read_holder(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name] = value
    return fields if fields.get("pid", "").isdigit() else None


def comm(pid):
    """The process name as /proc/<pid>/comm has it (at most 15 characters)."""
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def holder_alive(fields):
    """The holder is this host's process with that pid, name and command line."""
    try:
        pid = int(fields["pid"])
        return comm(pid) == fields.get("process_name") and str(psutil.Process(pid).cmdline()) == fields.get("cmdline")
    except (OSError, psutil.Error, KeyError, ValueError):
        return False


def clear_dead_holder(entry, holder_path, lock_path):
    marker = os.path.join(entry, ".compilation_complete")
    if os.path.exists(marker):
        os.remove(marker)  # an error here ends the process, as in LNL
    for path in (holder_path, lock_path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def copy_entry(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != ".cache_accessed" and os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def fetch(remote_entry, root, key):
    """Step 6; False when anything failed (the caller compiles instead)."""
    entry = os.path.join(root, key)
    tmp, trash = f"{entry}.tmp.{os.getpid()}", f"{entry}.trash.{os.getpid()}"
    try:
        copy_entry(remote_entry, tmp)
        if os.path.exists(entry):
            os.rename(entry, trash)
        os.rename(tmp, entry)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    except OSError as e:
        print(f"WARNING: fetch failed: {e}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def save_cache(entry, remote, key):
    """Step 7: "promoted", or "taken" when another node has the key."""
    if not complete(entry, key):
        fatal(f"{entry} is not complete")
    target = os.path.join(remote, key)
    if os.path.exists(target):
        return "taken"
    staging = f"{target}.tmp.{socket.gethostname()}.{os.getpid()}"
    try:
        copy_entry(entry, staging)
        try:
            os.rename(staging, target)
        except OSError as e:
            if e.errno in (17, 39):  # EEXIST, ENOTEMPTY: another node won
                return "taken"
            raise
        return "promoted"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("key")
    ap.add_argument("hlo")
    ap.add_argument("compiler")
    ap.add_argument("--target", default="trn1")
    ap.add_argument("--arg", action="append", default=[])
    ap.add_argument("--remote")
    ap.add_argument("--save-cache", action="store_true")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--waiting-file", help="for tests: a file made once this rank waits for another's compile")
    a = ap.parse_args()
    root, key = a.root, a.key
    entry = os.path.join(root, key)
    if complete(entry, key):
        return load(entry, key, "hit")
    os.makedirs(root, exist_ok=True)
    lock_path = os.path.join(root, f".{key}.compilation_metadata.lock")
    holder_path = os.path.join(root, f".{key}.compilation_metadata")
    holder = read_holder(holder_path)
    if holder is not None and not holder_alive(holder):
        clear_dead_holder(entry, holder_path, lock_path)
    lock = filelock.UnixFileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return wait(entry, key, holder_path, lock_path, a.poll, a.waiting_file)
    try:
        me = psutil.Process()
        with open(holder_path, "w") as f:
            f.write(f"pid:{me.pid}\nprocess_name:{comm(me.pid)}\ncmdline:{me.cmdline()}\ntimestamp:{int(time.time())}\n")
        if complete(entry, key):
            return load(entry, key, "hit")
        if a.remote and complete(os.path.join(a.remote, key), key) and fetch(os.path.join(a.remote, key), root, key):
            return load(entry, key, "fetched")
        if os.environ.get("VLLM_NEURON_DISABLE_WARMUP_COMPILE") == "1":
            fatal(f"{key} is not cached and compiling is disabled")
        os.makedirs(entry, exist_ok=True)
        hlo, neff = os.path.join(entry, "graph.hlo"), os.path.join(entry, f"graph_{key}.neff")
        with open(a.hlo, "rb") as src, open(hlo, "wb") as dst:
            dst.write(src.read())
        command = [os.path.abspath(a.compiler), "compile", hlo, "--framework", "XLA", "--target", a.target,
                   "--output", neff, "--logfile", os.path.join(entry, "log-neuron-cc.txt")] + a.arg
        with open(os.path.join(entry, "command.txt"), "w") as f:
            f.flush()  # created empty, then written
            f.write(" ".join(command))
        run = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run.returncode != 0:
            fatal(f"neuronx-cc exited with status {run.returncode}")
        if not os.path.exists(hlo) or not os.path.exists(neff):
            fatal("the compile left no NEFF")
        with open(os.path.join(entry, ".artifact_metadata_v0.json"), "w") as f:
            json.dump({"cache_key": key, "version": 0, "num_outputs": 1}, f)
        with open(os.path.join(entry, ".compilation_complete"), "w") as f:
            # the time as Python prints time.time(): a float, e.g. completed:1764340000.123456
            f.write(f"completed:{time.time()}\nneff_size:{os.path.getsize(neff)}\n")
    except OSError as e:
        fatal(e)
    finally:
        lock.release()
    extra = {"saved": save_cache(entry, a.remote, key)} if a.save_cache and a.remote else {}
    return load(entry, key, "compiled", extra)


def wait(entry, key, holder_path, lock_path, poll, waiting_file):
    """Step 5."""
    holder = None
    for _ in range(10):
        holder = read_holder(holder_path)
        if holder is not None:
            break
        time.sleep(0.2)
    if holder is None:
        fatal("the lock is held and nobody is named as its holder")
    if waiting_file:
        open(waiting_file, "w").close()
    timeout = float(os.environ.get("NEURON_LIBTORCH_COMPILATION_TIMEOUT", "600"))
    start = time.time()
    while True:
        if complete(entry, key):
            return load(entry, key, "waited")
        if not holder_alive(holder):
            clear_dead_holder(entry, holder_path, lock_path)
            fatal("Lock holder process died - cache invalidated, please retry compilation")
        if time.time() - start > timeout:
            fatal(f"timed out waiting for the compile of {key}")
        time.sleep(poll)


if __name__ == "__main__":
    main()
