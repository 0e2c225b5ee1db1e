#!/usr/bin/python3
"""Differential conformance suite: the same client steps on a plain folder and through a
neffcachefs mount of a copy of it, in every state a crash can leave, compared.

Every difference between the two sides must be allowed by a rule of the table in
docs/SEMANTICS.md ("## Where the mount differs from a local disk, and why"); any other
difference fails its case. Prints one line per case (PASS/FAIL, and for a FAIL each
unexplained difference: what, the folder's value, the mount's value). Exits 0 only when every
case passes and the table's ids are the suite's rules. See README.md beside this file.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import harness  # noqa: E402
import rules  # noqa: E402
import states  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WALKERS = ("rmtree", "rmtree-entries", "copytree", "walk", "glob", "scandir", "cp-a", "rsync")
# Neuron states a client runs on in every variant (neuron-excl adds the unlink of placeholders).
NEURON_CASES = tuple(s for s in states.NEURON_STATES if s != "unlink-placeholder")
# A client that waits for a lock nobody will release: these states get the short bound.
WAITS_FOREVER = {("neuron", "locked-dead"), ("neuron", "locked-dead-template")}


@dataclass
class Variant:
    """One mount: a template copied to a folder (A) and to the mount's backing (B)."""
    name: str
    template: str  # which template: neuron-2.15, neuron-2.12, lnl, walk
    states: tuple = ()
    lock: str = "excl"  # Neuron clients: how they create the entry's lock
    neuron_version: str = "2.15"
    fake_version: str = "2.21.0"
    walker: str = None
    dir: str = None
    entries: dict = field(default_factory=dict)  # state -> states.Entry (walk: (dialect, state) -> Entry)
    sides: tuple = ()
    mount: harness.Mount = None

    @property
    def daemon_log(self):
        return os.path.join(self.dir, "daemon-compiles.log")


def variants():
    return [
        Variant("neuron-excl", "neuron-2.15", states.NEURON_STATES, lock="excl"),
        Variant("neuron-look", "neuron-2.15", NEURON_CASES, lock="look"),
        # The 2.12 client differs in its hit test alone: the states where that matters.
        Variant("neuron-2.12", "neuron-2.12", ("pending", "leftover-neff", "leftover-done", "done", "failed",
                                               "interrupted-publish"), neuron_version="2.12", fake_version="2.12.0"),
        Variant("lnl", "lnl", states.LNL_STATES),
        *(Variant(f"walk-{w}", "walk", walker=w) for w in WALKERS),
    ]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neffcachefs", default=os.path.join(REPO, "build", "fuse", "neffcachefs"))
    ap.add_argument("--neffcache", default=os.path.join(REPO, "build", "tools", "neffcache"))
    ap.add_argument("--fake-compiler", default=os.path.join(REPO, "build", "tools", "fake-neuronx-cc"))
    ap.add_argument("--corpus", default=os.path.join(REPO, "tests", "corpus"))
    ap.add_argument("--differences", default=os.path.join(REPO, "docs", "SEMANTICS.md"),
                    help="the markdown file holding the allowed-differences table")
    ap.add_argument("--only", help="run only the cases whose name matches this regular expression")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    ap.add_argument("--jobs", type=int, default=12, help="cases at once (each runs its two sides at once)")
    ap.add_argument("--wait-bound", type=float, default=6.0,
                    help="seconds a client may wait on a lock that is never released (then: timeout)")
    ap.add_argument("--hang-guard", type=float, default=20.0, help="seconds anything else may take")
    ap.add_argument("-v", "--verbose", action="store_true", help="also show the allowed differences, by rule")
    ap.add_argument("--self-test", action="store_true",
                    help="check the suite itself: the mount side is a second plain folder, so every case must pass")
    a = ap.parse_args()
    for opt in ("neffcachefs", "neffcache", "fake_compiler"):
        setattr(a, opt, os.path.abspath(getattr(a, opt)))
        if not os.access(getattr(a, opt), os.X_OK):
            ap.error(f"--{opt.replace('_', '-')}: {getattr(a, opt)} is not an executable")
    return a


def case_list(vs, only):
    out = []
    for v in vs:
        names = [(f"walk/{v.walker}", None)] if v.walker else [(f"{v.name}/{s}", s) for s in v.states]
        for name, state in names:
            if only is None or re.search(only, name):
                out.append(cases.Case(name, v, state=state, walker=v.walker))
    return out


# -- templates ---------------------------------------------------------------------------------

def build_template(tools, kind, root, wanted):
    """The template `kind` with an entry for each state in `wanted`: its entries by state
    (walk: every static state of both layouts, by (dialect, state))."""
    if kind == "walk":
        t = states.Template(tools, root)
        for s in states.STATIC_NEURON:
            t.neuron(s)
        for s in states.STATIC_LNL:
            t.lnl(s)
        t.finish()
        return dict(t.entries)
    if kind == "lnl":
        t = states.Template(tools, root)
        for s in wanted:
            t.lnl(s)
    else:
        version = kind.split("-")[1]
        t = states.Template(tools, root, fake_version="2.12.0" if version == "2.12" else "2.21.0",
                            neuron_version=version)
        for s in wanted:
            t.neuron(s)
    t.finish()
    return {state: e for (_d, state), e in t.entries.items()}


def build_templates(tools, todo, work):
    """Builds the templates the cases `todo` need, at once; returns kind -> (root, entries)."""
    wanted = {}
    for c in todo:
        wanted.setdefault(c.variant.template, set()).add(c.state)
    with concurrent.futures.ThreadPoolExecutor(len(wanted) or 1) as pool:
        futures = {k: pool.submit(build_template, tools, k, os.path.join(work, "templates", k), sorted(w - {None}))
                   for k, w in wanted.items()}
        return {k: (os.path.join(work, "templates", k), f.result()) for k, f in futures.items()}


# -- mounts ----------------------------------------------------------------------------------

def prepare(a, v, template, entries, work, settings):
    """Copies the template to A and B, mounts B at M, and makes the two sides (with
    --self-test the mount side is B itself, unmounted)."""
    v.dir = os.path.join(work, v.name)
    v.entries = entries
    folder, backing, mnt = (os.path.join(v.dir, n) for n in ("folder", "backing", "mnt"))
    os.makedirs(v.dir)
    states.copy_tree(template, folder)
    states.copy_tree(template, backing)
    roots = (folder, backing, mnt, template)
    sides = []
    for name, root in (("folder", folder), ("mount", backing if a.self_test else mnt)):
        tmp = os.path.join(v.dir, f"tmp-{name}")
        os.makedirs(tmp)
        sides.append(cases.Side(name, root, roots, os.path.join(v.dir, f"{name}-client-compiles.log"), tmp,
                                os.path.join(v.dir, "logs")))
    os.makedirs(os.path.join(v.dir, "tmp-daemon"))
    env = dict(settings.env, NEFFCACHE_FAKE_LOG=v.daemon_log, NEFFCACHE_FAKE_VERSION=v.fake_version,
               TMPDIR=os.path.join(v.dir, "tmp-daemon"))
    v.mount = harness.Mount(a.neffcachefs, backing, mnt, states.compiler_template(a.fake_compiler), env,
                            os.path.join(v.dir, "logs"),
                            extra=["-j", "4", "--mem-budget", "off", "--mem-ledger", os.path.join(work, "ledger")])
    v.sides = tuple(sides)
    if not a.self_test:
        sides[1].mount = v.mount
        v.mount.start()


# -- judging ---------------------------------------------------------------------------------

def show(value, limit=240):
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def judge(case, shown_per_rule=5):
    """(passed, lines to print under the case's verdict): every unexplained difference and
    failed check, and the allowed differences (at most `shown_per_rule` of each rule)."""
    if case.error:
        return False, [f"harness: {case.error}"]
    try:
        compiles = cases.count_compiles(case)
        found = cases.differences(case, compiles)
        failures = cases.checks(case, compiles)
    except Exception as e:  # an observation missing: the harness failed, not the comparison
        return False, [f"harness: cannot compare: {type(e).__name__}: {e}"]
    unexplained, allowed = [], {}
    for d in found:
        where = f" [{d.entry.dialect} {d.entry.state}]" if case.walker and d.entry else ""  # a key says nothing
        what = f"{d.kind}{' ' + d.name if d.name else ''}{where}: folder {show(d.folder)}, mount {show(d.mount)}"
        rule = rules.explain(d)
        if rule is None:
            unexplained.append(what)
        else:
            allowed.setdefault(rule, []).append(what)
    lines = unexplained + [f"check: {f}" for f in failures]
    for rule, whats in allowed.items():
        lines += [f"(allowed by {rule}) {w}" for w in whats[:shown_per_rule]]
        if len(whats) > shown_per_rule:
            lines.append(f"(allowed by {rule}) ... and {len(whats) - shown_per_rule} more")
    return not unexplained and not failures, lines


class Phases:
    """Wall time of each phase of a run, for the summary line."""

    def __init__(self):
        self.last, self.spent = time.monotonic(), []

    def done(self, name):
        now = time.monotonic()
        self.spent.append(f"{name} {now - self.last:.1f} s")
        self.last = now


def run(a, work):
    settings = cases.Settings(a.fake_compiler, a.wait_bound, a.hang_guard,
                              env=dict(harness.clean_env(), NEFFCACHE_FAKE_RATE=states.FAKE_RATE, NEFFCACHE_FAKE_IDLE="1"))
    table = rules.check_table(a.differences)
    vs = variants()
    todo = case_list(vs, a.only)
    used = [v for v in vs if any(c.variant is v for c in todo)]
    scratch = os.path.join(work, "scratch")
    os.makedirs(scratch)
    tools = states.Tools(a.fake_compiler, a.neffcache, a.corpus, scratch)
    phases = Phases()
    templates = build_templates(tools, todo, work)
    phases.done("templates")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(prepare, a, v, *templates[v.template], work, settings) for v in used]:
            f.result()
    phases.done("mounts")
    for c in todo:
        c.entry = c.variant.entries[c.state] if c.state else None
        forever = c.entry and (c.entry.dialect, c.entry.state) in WAITS_FOREVER
        c.bound = a.wait_bound if forever else a.hang_guard
    # The longest first: cases that wait out their bound, then those with live holders.
    todo.sort(key=lambda c: 0 if c.bound == a.wait_bound else 1 if c.entry and "lock" in c.entry.state else 2)
    pool = concurrent.futures.ThreadPoolExecutor(a.jobs)
    try:
        for f in [pool.submit(cases.run_case, settings, c) for c in todo]:
            f.result()
    except BaseException:  # Ctrl-C: end the processes the cases wait for before waiting for the cases
        harness.cleanup()
        pool.shutdown(cancel_futures=True)
        raise
    pool.shutdown()
    # A compile the daemon starts late (eagerly, or a publish it finishes) is counted too:
    # every daemon of a variant that ran cases must be idle first.
    time.sleep(0.3)
    for v in used:
        if v.mount and v.mount.proc:
            harness.wait_until(v.mount.idle, a.hang_guard)
    phases.done("cases")
    return table, todo, phases


def report(table, todo, verbose):
    """Prints the verdicts; returns how many cases failed (the table counts as one)."""
    print(("FAIL" if table else "PASS") + " differences-table")
    for line in table:
        print(f"    {line}")
    failed = 1 if table else 0
    for case in sorted(todo, key=lambda c: c.name):
        passed, lines = judge(case)
        failed += not passed
        print(("PASS " if passed else "FAIL ") + case.name + (f" ({case.seconds:.1f} s)" if verbose else ""))
        for line in lines:
            if verbose or not line.startswith("(allowed"):
                print(f"    {line}")
    return failed


def interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main():
    a = parse_args()
    os.umask(0o022)  # what the mount's published files are judged against (mode 0644)
    signal.signal(signal.SIGTERM, interrupt)  # ends a run as Ctrl-C does: through the cleanup below
    work = tempfile.mkdtemp(prefix="neffcache-conformance-", dir="/tmp")
    start = time.monotonic()
    ok = False
    try:
        table, todo, phases = run(a, work)
        failed = report(table, todo, a.verbose)
        ok = failed == 0
        print(f"{len(todo)} cases, {failed} failed (the differences table included), "
              f"{time.monotonic() - start:.1f} s ({', '.join(phases.spent)})", flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        harness.cleanup()
        if a.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
