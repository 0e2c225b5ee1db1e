"""One case: the same client steps on the folder side (A, a plain copy of the template) and on
the mount side (M, a neffcachefs mount of B, another copy), observed alike and compared.

A protocol case runs one client on one entry; a walker case runs one walker over a whole cache.
Each side is observed before (listing, lookups of the product names), by the client's own
report, and after (the entry's files, lookups, the LNL root's files for its key); compile
counts are read once every case of a mount has ended (see count_compiles).
"""
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

import harness
import rules
import snapshot

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
NEURON_CLIENT = os.path.join(HERE, "neuron_client.py")
LNL_CLIENT = os.path.join(HERE, "..", "support", "lnl_client.py")
WALKERS = os.path.join(HERE, "walkers.py")
POLL = "0.05"  # seconds between a waiting client's looks (the real ones: 1 s and more)
MARKER_FORMAT = re.compile(r"\Acompleted:\d+\.\d+\nneff_size:\d+\n\Z")


@dataclass
class Settings:
    fake: str
    wait_bound: float  # how long a client may wait on a lock that is never released
    hang_guard: float  # how long anything else may take
    env: dict  # the environment of clients and compiles


@dataclass
class Side:
    name: str  # "folder" or "mount"
    root: str  # the cache as this side's clients see it
    roots: tuple  # every path of the variant's copies, normalized to <root> in contents
    client_log: str  # NEFFCACHE_FAKE_LOG of this side's clients
    tmp: str
    logdir: str
    mount: object = None  # harness.Mount on the mount side

    def path(self, *parts):
        return os.path.join(self.root, *parts)


@dataclass
class Case:
    name: str
    variant: object  # run_conformance.Variant
    state: str = None  # a protocol case's entry state
    walker: str = None  # a walker case's walker
    entry: object = None  # the states.Entry of `state`, once its template is built
    bound: float = 0.0
    observed: dict = field(default_factory=dict)  # side name -> what it saw
    error: str = None  # the harness failed (not a difference)
    seconds: float = 0.0  # wall time of its run


# -- helpers: the processes a state needs beside the client --------------------------------

class Helper:
    """Nothing beside the client."""

    def client_args(self):
        return []

    def while_client(self, client):
        pass

    def finish(self):
        return {}


class BackgroundReader(Helper):
    """Mount side of `compiling`: a reader that opened the NEFF first, so that our compile
    already runs when the client comes."""

    def __init__(self, s, side, case):
        self.s, self.entry = s, case.entry
        self.proc = harness.Proc(["sha256sum", side.path(self.entry.rel, self.entry.neff)], env=s.env,
                                 logdir=side.logdir, name="reader")
        log = case.variant.daemon_log
        harness.wait_until(lambda: not self.proc.alive() or self.entry.key in read(log), s.hang_guard)

    def finish(self):
        self.proc.wait(self.s.hang_guard)
        words = self.proc.stdout().split()
        sha = words[0] if words else None
        return {"reader": "reference" if sha == self.entry.reference["sha256"] else f"{self.proc.stdout()!r}"}


class NeuronHolder(Helper):
    """A process that creates the entry's lock, then either holds it until the client waits
    for it and finishes the entry as a rank does, or is killed holding it (`kill`): what a
    crash leaves."""

    def __init__(self, s, side, case, kill):
        self.s, self.killed = s, kill
        self.waiting = os.path.join(side.tmp, f"waiting-{case.entry.key}")
        argv = neuron_argv(s, side, case) + ["--hold", str(s.hang_guard), "--hold-until", self.waiting]
        self.proc = harness.Proc(argv, env=client_env(s, side), logdir=side.logdir, name="holder")
        lock = side.path(case.entry.rel, case.entry.lock)
        harness.wait_until(lambda: not self.proc.alive() or os.path.exists(lock), s.hang_guard)
        if kill:
            self.proc.kill()
            self.proc.wait(s.hang_guard)

    def client_args(self):
        return [] if self.killed else ["--waiting-file", self.waiting]

    def finish(self):
        if self.killed:
            return {}
        code = self.proc.wait(self.s.hang_guard)
        return {"holder.exit": code, "holder.outcome": last_json(self.proc.stdout()).get("outcome")}


class LnlHolder(Helper):
    """A rank with a slow compile that holds the key's lock; with `kill_when_waiting`, killed
    (with its compiler) once the client waits for it."""

    def __init__(self, s, side, case, kill_when_waiting):
        entry = case.entry
        self.s, self.side, self.kill_when_waiting = s, side, kill_when_waiting
        self.proc = harness.Proc(lnl_argv(s, side, entry), env=client_env(s, side), logdir=side.logdir, name="holder")
        holder = side.path(entry.root_names[1])
        harness.wait_until(lambda: not self.proc.alive() or os.path.exists(holder), s.hang_guard)
        self.waiting = os.path.join(side.tmp, f"waiting-{entry.key}")

    def client_args(self):
        return ["--waiting-file", self.waiting] if self.kill_when_waiting else []

    def while_client(self, client):
        if self.kill_when_waiting:
            harness.wait_until(lambda: not client.alive() or os.path.exists(self.waiting), self.s.hang_guard)
            self.proc.kill()

    def finish(self):
        code = self.proc.wait(self.s.hang_guard)
        return {"holder.exit": code, "holder.outcome": last_json(self.proc.stdout()).get("outcome")}


def helper_for(s, side, case):
    e = case.entry
    if e.state == "compiling" and side.mount:
        return BackgroundReader(s, side, case)
    if e.dialect == "neuron" and e.state in ("locked-live", "locked-dead"):
        return NeuronHolder(s, side, case, kill=e.state == "locked-dead")
    if e.dialect == "lnl" and e.state in ("locked-live", "holder-dies"):
        return LnlHolder(s, side, case, kill_when_waiting=e.state == "holder-dies")
    return Helper()


# -- clients ----------------------------------------------------------------------------------

def client_env(s, side):
    return dict(s.env, NEFFCACHE_FAKE_LOG=side.client_log, TMPDIR=side.tmp)


def neuron_argv(s, side, case):
    v = case.variant
    return [PY, NEURON_CLIENT, side.root, case.entry.rel, "--compiler", s.fake, "--lock", v.lock,
            "--version", v.neuron_version, "--poll", POLL]


def lnl_argv(s, side, entry):
    args = [f"--arg={flag}" for flag in entry.flags]
    return [PY, LNL_CLIENT, side.root, entry.key, entry.graph, s.fake, *args, "--poll", POLL]


def last_json(text):
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def normalize_text(text, side):
    for root in sorted(side.roots, key=len, reverse=True):
        text = text.replace(root, "<root>")
    return text


def neff_label(sha, size, entry):
    if sha is None:
        return None
    return "reference" if sha == entry.reference["sha256"] else f"other ({size} bytes, sha256 {sha[:12]})"


def client_result(proc, code, side, entry):
    """The client's report as the sides compare it: outcome, exit, error, the NEFF it read."""
    if code is None:
        return {"outcome": "timeout", "exit": None, "error": None, "neff": None}
    report = last_json(proc.stdout())
    fatal = [line for line in proc.stderr().splitlines() if line.startswith("FATAL:")]
    error = None
    if report.get("outcome") == "error":
        error = f"{report.get('error')} errno {report.get('errno')}: {normalize_text(report.get('message', ''), side)}"
    elif fatal:
        error = normalize_text(fatal[-1], side)
    outcome = report.get("outcome") or ("fatal" if fatal else "no report")
    return {"outcome": outcome, "exit": code, "error": error,
            "neff": neff_label(report.get("neff_sha256"), report.get("neff_bytes"), entry)}


def bound_of(s, side, case):
    """How long a side's client may run: a case's bound (short where the folder's client waits
    for ever on a dead lock) on the folder side; the mount side, which must end, gets as long as
    anything may take (it clears the lock, then compiles, on a loaded machine)."""
    return s.hang_guard if side.mount else case.bound


def run_client(s, side, case, helper):
    e = case.entry
    argv = (neuron_argv(s, side, case) if e.dialect == "neuron" else lnl_argv(s, side, e)) + helper.client_args()
    proc = harness.Proc(argv, env=client_env(s, side), logdir=side.logdir, name="client")
    helper.while_client(proc)
    return client_result(proc, proc.wait(bound_of(s, side, case)), side, e)


def unlink_products(side, entry):
    """os.unlink of each product name (what an LNL rank does to a dead holder's marker)."""
    out = {}
    for name in entry.products:
        try:
            os.unlink(side.path(entry.rel, name))
            out[name] = "ok"
        except OSError as e:
            out[name] = snapshot.error_text(e)
    return {"unlink": out}


# -- observations ------------------------------------------------------------------------------

def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def lookup(path, with_mtime):
    """os.stat of a name, as exists() and stat() see it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"error": snapshot.error_text(e)}
    return dict(size=st.st_size, **snapshot.attributes(st, with_mtime))


def listing(folder):
    try:
        return sorted(os.listdir(folder))
    except OSError as e:
        return [f"<{snapshot.error_text(e)}>"]


def before(side, entry):
    folder = side.path(entry.rel)
    return {"listed": listing(folder),
            "stat": {name: lookup(os.path.join(folder, name), True) for name in entry.products}}


def holder_pid(path):
    match = re.search(r"^pid:(\d+)$", read(path), re.M)
    return int(match.group(1)) if match else None


def after(side, entry):
    folder = side.path(entry.rel)
    files = {}
    for name in listing(folder):
        try:
            files[name] = snapshot.describe(os.path.join(folder, name), side.roots)
        except OSError as e:
            files[name] = {"error": snapshot.error_text(e)}
    out = {"files": files, "stat": {name: lookup(os.path.join(folder, name), False) for name in entry.products}}
    if (out["stat"][entry.marker] or {}).get("size") and entry.dialect == "lnl":
        del out["stat"][entry.marker]["size"]  # it varies with the digits of the time; its content is compared
    if entry.dialect == "lnl":
        names = listing(side.root)
        out["root"] = sorted(n for n in names if n.startswith(f".{entry.key}.") or n.startswith(f"{entry.key}."))
        out["holder_pid"] = holder_pid(side.path(entry.root_names[1]))
        marker = side.path(entry.rel, entry.marker)
        if (lookup(marker, False) or {}).get("size"):  # a placeholder (size 0) is not opened
            out["marker_raw"] = read(marker)
    return out


def observe_protocol(s, side, case):
    """Runs the case's client on one side and records what that side showed."""
    helper = helper_for(s, side, case)
    seen = {"before": before(side, case.entry)}
    stats_before = side.mount.stats() if side.mount else None
    if case.entry.state == "unlink-placeholder":
        seen["result"] = unlink_products(side, case.entry)
    else:
        seen["result"] = run_client(s, side, case, helper)
    if side.mount:
        seen["stats"] = (stats_before, side.mount.stats())
    seen["helpers"] = helper.finish()
    seen["after"] = after(side, case.entry)
    return seen


def observe_walker(s, side, case):
    dest = os.path.join(side.tmp, "copy") if case.walker in ("copytree", "cp-a", "rsync") else None
    argv = [PY, WALKERS, case.walker, side.root] + (["--dest", dest] if dest else [])
    proc = harness.Proc(argv, env=dict(s.env, TMPDIR=side.tmp), logdir=side.logdir, name="walker")
    code = proc.wait(bound_of(s, side, case))
    report = last_json(proc.stdout())
    after = snapshot.tree(side.root, side.roots) if os.path.isdir(side.root) else None  # None: removed
    return {"exit": code, "errors": report.get("errors"), "seen": report.get("seen", {}), "after": after}


def run_case(s, case):
    """Both sides at once (a dead lock makes the folder side wait out its bound)."""
    observe = observe_walker if case.walker else observe_protocol

    def one(side):
        try:
            case.observed[side.name] = observe(s, side, case)
        except Exception as e:  # a harness failure fails the case, it does not end the run
            case.error = f"{side.name} side: {type(e).__name__}: {e}"

    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(side,)) for side in case.variant.sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    case.seconds = time.monotonic() - start


# -- compile counts ----------------------------------------------------------------------------

def count_compiles(case):
    """Compiles of the case's entry (every compile of the mount, for a walker): the clients'
    on each side, and the daemon's on the mount side, from the stand-in's logs."""
    v = case.variant
    folder, mount = v.sides
    daemon_log = read(v.daemon_log).splitlines()
    if case.walker:
        return {"client": 0, "daemon": 0}, {"client": 0, "daemon": len(daemon_log)}

    def count(lines):
        return sum(case.entry.key in line for line in lines)
    return ({"client": count(read(folder.client_log).splitlines()), "daemon": 0},
            {"client": count(read(mount.client_log).splitlines()), "daemon": count(daemon_log)})


# -- comparison ----------------------------------------------------------------------------------

def entry_of_path(entries, path):
    """The entry a path under the root belongs to (an LNL key's root files included)."""
    for e in entries:
        if path == e.rel or path.startswith(e.rel + "/") or os.path.basename(path) in e.root_names:
            return e
    return None


def differences(case, compiles):
    """Every difference between the two sides, unexplained or not, as rules.Diff."""
    f, m = case.observed["folder"], case.observed["mount"]
    out = []

    def add(kind, name, fv, mv, entry=case.entry):
        if fv != mv:
            out.append(rules.Diff(case.name, kind, name, fv, mv, entry, context))

    context = {"folder_compiles": compiles[0], "mount_compiles": compiles[1],
               "daemon_pid": case.variant.mount.pid if case.variant.mount.proc else None}
    if case.walker:
        entries = list(case.variant.entries.values())
        add("walk.exit", "", f["exit"], m["exit"], None)
        add("walk.errors", "", f["errors"], m["errors"], None)
        for what in ("seen", "after"):
            if f[what] is None or m[what] is None:  # the cache itself is gone on one side
                add(f"walk.{what}", "", f[what], m[what], None)
                continue
            for path in sorted(set(f[what]) | set(m[what])):
                add(f"walk.{what}", path, f[what].get(path), m[what].get(path), entry_of_path(entries, path))
        add("compiles", "", compiles[0], compiles[1], None)
        return out
    context.update(folder_result=f["result"], mount_result=m["result"],
                   mount_holder_pid=m["after"].get("holder_pid"))
    unlinked = f["result"].get("unlink")
    for key in sorted(unlinked or f["result"]):
        fv = unlinked[key] if unlinked else f["result"][key]
        mv = m["result"]["unlink"][key] if unlinked else m["result"][key]
        add("result.unlink" if unlinked else f"result.{key}", key if unlinked else "", fv, mv)
    fl, ml = f["before"]["listed"], m["before"]["listed"]
    for name in sorted(set(fl) | set(ml)):
        add("before.listed", name, name in fl, name in ml)
    for when in ("before", "after"):
        for name in case.entry.products:
            add(f"{when}.stat", name, f[when]["stat"][name], m[when]["stat"][name])
    ff, mf = f["after"]["files"], m["after"]["files"]
    for name in sorted(set(ff) | set(mf)):
        add("after.file", name, ff.get(name), mf.get(name))
    fr, mr = f["after"].get("root", []), m["after"].get("root", [])
    for name in sorted(set(fr) | set(mr)):
        add("root.listed", name, name in fr, name in mr)
    for key in sorted(set(f["helpers"]) | set(m["helpers"])):
        if key != "reader":  # the mount side's alone: checked, not compared
            add(key, "", f["helpers"].get(key), m["helpers"].get(key))
    add("compiles", "", compiles[0], compiles[1])
    return out


def checks(case, compiles):
    """What must hold on a side by itself, whatever the other side did (`compiles`: as
    count_compiles gives them)."""
    if case.walker:
        return []
    e, failures = case.entry, []
    for side in ("folder", "mount"):
        raw = case.observed[side]["after"].get("marker_raw")
        if raw is not None and not MARKER_FORMAT.match(raw):
            failures.append(f"{side} side: the LNL marker {raw!r} is not completed:<float>\\nneff_size:<n>\\n")
    m = case.observed["mount"]
    if e.state == "done" and m["result"].get("outcome") in rules.RAN and "stats" in m:
        (old, new) = m["stats"]
        if new.get("hits", 0) <= old.get("hits", 0):
            failures.append(f"stats.json: the hit on {e.rel} is not counted (hits {old.get('hits')} -> {new.get('hits')})")
        if e.rel not in new.get("opened", []):
            failures.append(f"stats.json: opened does not name {e.rel}")
    if "reader" in m["helpers"] and m["helpers"]["reader"] != "reference":
        failures.append(f"the background reader of the NEFF got {m['helpers']['reader']}")
    # Our interrupted publish is finished by the mount, never handed to the client as a miss:
    # a hit on the reference NEFF, with no compile at all.
    if e.state == "interrupted-publish":
        result, total = m["result"], rules.compile_total(compiles[1])
        if result.get("outcome") != "hit" or result.get("neff") != "reference" or total != 0:
            failures.append(f"mount side: our interrupted publish was not finished: outcome {result.get('outcome')}, "
                            f"NEFF {result.get('neff')}, {total} compiles")
    return failures
