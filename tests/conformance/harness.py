"""Processes and mounts for the conformance suite, and their cleanup.

Every process is started in a session of its own, so that a kill takes its children (a
compiler) with it. Everything started is registered, and `cleanup()` ends it all: the
driver calls it on exit, on Ctrl-C and on SIGTERM, so no mount or process outlives a run.
"""
import json
import os
import signal
import subprocess
import threading
import time

_lock = threading.Lock()
_processes = []  # every Proc started, to kill at cleanup
_mounts = []  # every Mount started, to unmount at cleanup
_stopping = threading.Event()  # set by cleanup: no process starts after it


class Proc:
    """A child process in its own session, its output kept in files (no pipe can fill)."""

    def __init__(self, argv, env=None, cwd=None, logdir=None, name="proc"):
        if _stopping.is_set():
            raise RuntimeError("the run is stopping")
        os.makedirs(logdir, exist_ok=True)
        self.out_path = os.path.join(logdir, f"{name}.{time.monotonic_ns()}.out")
        self.err_path = self.out_path[:-4] + ".err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        with _lock:
            _processes.append(self)
        self.timed_out = False

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """Signals the whole process group (the client and the compiler it runs)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, bound):
        """The exit status, or None after `bound` seconds (then the group is killed)."""
        try:
            return self.popen.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            self.popen.wait()
            return None

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()


def clean_env():
    """Our environment without anything that changes the stand-ins or the clients."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("NEFFCACHE_", "NEURON_", "VLLM_")) and k != "TMPDIR"}


def wait_until(predicate, bound, step=0.02):
    """Polls `predicate` until it holds or `bound` seconds pass; its last value."""
    deadline = time.monotonic() + bound
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline or _stopping.is_set():
            return value
        time.sleep(step)


class Mount:
    """neffcachefs BACKING MNT in the foreground, up once its stats.json can be read."""

    def __init__(self, binary, backing, mnt, compiler, env, logdir, extra=()):
        self.backing, self.mnt, self.logdir = backing, mnt, logdir
        self.argv = [binary, backing, mnt, "-f", "--compiler", compiler, *extra]
        self.env = env
        self.proc = None

    @property
    def pid(self):
        return self.proc.pid

    def stats_path(self):
        return os.path.join(self.mnt, ".neffcache", "stats.json")

    def stats(self):
        with open(self.stats_path()) as f:
            return json.load(f)

    def idle(self):
        """True when the daemon runs and queues no compile and answers no waiter."""
        try:
            s = self.stats()
        except (OSError, ValueError):
            return False
        entries = s.get("entries", {})
        return entries.get("queued", 0) == 0 and entries.get("running", 0) == 0 and s.get("waiters", 0) == 0

    def start(self, bound=30.0):
        os.makedirs(self.mnt, exist_ok=True)
        self.proc = Proc(self.argv, env=self.env, logdir=self.logdir, name="neffcachefs")
        with _lock:
            _mounts.append(self)

        def up():
            if not self.proc.alive():
                raise RuntimeError(f"neffcachefs exited with {self.proc.popen.returncode}: {self.proc.stderr()[-2000:]}")
            try:
                self.stats()
                return True
            except (OSError, ValueError):
                return False

        if not wait_until(up, bound):
            raise RuntimeError(f"neffcachefs did not come up in {bound} s: {self.proc.stderr()[-2000:]}")

    def stop(self):
        """Unmounts (lazily if busy) and waits for the daemon; kills it if it lingers."""
        if self.proc is None or self.proc.popen.returncode is not None:
            return
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if subprocess.run(["fusermount3", "-u", self.mnt], **quiet).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], **quiet)
        if self.proc.wait(10) is None:  # killed by wait(); the kernel then ends the mount
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], **quiet)

    def log(self):
        return self.proc.stderr() if self.proc else ""


def cleanup():
    """Kills every process still running and unmounts every mount (idempotent)."""
    _stopping.set()
    with _lock:
        processes, mounts = list(_processes), list(_mounts)
    daemons = {m.proc for m in mounts if m.proc}
    for p in processes:
        if p not in daemons and p.alive():
            p.kill()
    stopping = [threading.Thread(target=m.stop) for m in mounts]  # each waits for its daemon
    for t in stopping:
        t.start()
    for t in stopping:
        t.join()
