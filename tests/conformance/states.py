"""The entries of a template cache, one per state a crash (or a tool) can leave.

Each entry gets its own compiler flags (`--internal-nc-<dialect>-<state>`, which the stand-in
compiler accepts and writes into its artifact), so no two entries share a content identity:
the mount's content index can never serve one from another, and every entry has a
reference NEFF of its own, made by running the stand-in compiler directly on its HLO.

Entry files are owned by a user that is not root (OWNER), so that a name the mount makes up
can be told from one with the HLO's owner.
"""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import harness

OWNER = 4242  # uid and gid of every entry's files in a template
FAST_GRAPH = "gopjrt_x_squared.hlo.pb"  # 2 instructions: a compile of a few milliseconds
SLOW_GRAPH = "spu_credit_fraud_metrics_test.hlo.pb"  # 386 instructions: about 1 s (RATE below)
SLOWER_GRAPH = "spu_credit_fraud_metrics_train.hlo.pb"  # 944 instructions: about 2.4 s
FAKE_RATE = "400"  # instructions per second, asleep (NEFFCACHE_FAKE_IDLE): the same on every side
TRUNCATED = 5  # bytes of a NEFF whose copy or compile was cut short

NEURON_STATES = ("pending", "compiling", "unlink-placeholder", "leftover-neff", "leftover-done", "done", "failed",
                 "locked-live", "locked-dead", "locked-dead-template", "another-compiler", "interrupted-publish")
LNL_STATES = ("pending", "compiling", "unlink-placeholder", "leftover-neff", "leftover-marker", "leftover-log", "done",
              "failed", "locked-live", "locked-dead", "dead-before-metadata", "dead-after-metadata", "holder-dies",
              "interrupted-publish")
# States a template can hold with no process alive: what the walkers walk.
STATIC_NEURON = ("pending", "leftover-neff", "leftover-done", "done", "failed", "locked-dead-template",
                 "another-compiler", "interrupted-publish")
STATIC_LNL = ("pending", "leftover-neff", "leftover-marker", "leftover-log", "done", "failed", "locked-dead",
              "dead-before-metadata", "dead-after-metadata", "interrupted-publish")
# A compile that must outlast a client's start (about 1 s under load): a live holder's.
GRAPHS = {"compiling": SLOW_GRAPH, "locked-live": SLOWER_GRAPH, "holder-dies": SLOWER_GRAPH}


@dataclass
class Entry:
    dialect: str  # "neuron" or "lnl"
    state: str
    rel: str  # the entry folder, relative to the cache root
    key: str  # MODULE_<graph>+<flags>, or the LNL key: it names the entry in compile logs
    graph: str  # the corpus file of its HLO
    flags: list
    hlo: str  # its input's file name
    neff: str
    marker: str
    log: str  # Neuron: model.log (a failure); LNL: the compiler's log
    lock: str = None  # Neuron: <hlo>.lock in the entry
    root_names: tuple = ()  # LNL: the key's lock and holder files in the root
    reference: dict = field(default_factory=dict)  # sha256 and size of the right NEFF
    hlo_attrs: dict = field(default_factory=dict)  # uid, gid, mtime_ns of the HLO in the template

    @property
    def products(self):
        return (self.neff, self.marker)


@dataclass
class Tools:
    """What building a template needs."""
    fake: str  # fake-neuronx-cc
    neffcache: str
    corpus: str
    scratch: str  # a private folder for references, scratch caches and the memory ledger
    references: dict = field(default_factory=dict)  # (graph, flags) -> the reference NEFF
    locks: dict = field(default_factory=dict)  # (graph, flags) -> a lock: templates are built at once
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead_pid: int = None

    def env(self, **extra):
        env = dict(harness.clean_env(), NEFFCACHE_FAKE_RATE="0", TMPDIR=self.scratch)
        env.update(extra)
        return env


def compiler_template(fake):
    """The daemon's (and our tools') compiler: the stand-in, as the tests run it."""
    return f"{fake} compile --framework=XLA --target=trn1 {{hlo}} --output {{neff}} {{flags}}"


def flags_for(dialect, state):
    return ["-O1", f"--internal-nc-{dialect}-{state}"]


def module_name(dialect, state, flags):
    """MODULE_<19 decimal digits>+<flags hash>: equal-length numbers never contain one another."""
    digest = int(hashlib.md5(f"{dialect}/{state}".encode()).hexdigest(), 16)
    number = 10 ** 18 + digest % (9 * 10 ** 18)
    flags_hash = hashlib.md5(json.dumps(flags).encode()).hexdigest()[:8]
    return f"MODULE_{number}+{flags_hash}"


def lnl_key(state):
    return hashlib.md5(f"conformance/lnl/{state}".encode()).hexdigest()


def reference(tools, graph, flags):
    """The NEFF the stand-in compiler makes of this graph and flags, run directly."""
    ident = (graph, tuple(flags))
    with tools.lock:
        lock = tools.locks.setdefault(ident, threading.Lock())
    with lock:
        return made_reference(tools, ident)


def made_reference(tools, ident):
    graph, flags = ident
    if ident not in tools.references:
        out = os.path.join(tools.scratch, "ref-" + hashlib.md5(repr(ident).encode()).hexdigest() + ".neff")
        argv = [tools.fake, "compile", "--framework=XLA", "--target=trn1", graph, "--output", out, *flags]
        subprocess.run(argv, env=tools.env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out, "rb") as f:
            data = f.read()
        tools.references[ident] = {"bytes": data, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return tools.references[ident]


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


DEAD_ARGV = ["/usr/bin/python3", "-c", "pass"]


def dead_pid(tools):
    """The pid of a process that has exited (one for the whole run)."""
    with tools.lock:
        if tools.dead_pid is None:
            p = subprocess.Popen(DEAD_ARGV)
            p.wait()
            tools.dead_pid = p.pid
        return tools.dead_pid


def dead_holder(tools):
    """LNL's holder file naming a process that has exited."""
    return f"pid:{dead_pid(tools)}\nprocess_name:python3\ncmdline:{DEAD_ARGV}\ntimestamp:{int(time.time())}\n"


def run_our_compile(tools, root, entry, fake_version, fail):
    """`neffcache compile` of one entry, as our tools leave it (a failure recorded with
    NEFFCACHE_FAKE_FAIL, only for this entry)."""
    extra = {"NEFFCACHE_FAKE_VERSION": fake_version}
    if fail:
        extra.update(NEFFCACHE_FAKE_FAIL="1", NEFFCACHE_FAKE_ONLY=entry.key)
    argv = [tools.neffcache, "compile", entry.rel, "--cache", root, "--compiler", compiler_template(tools.fake),
            "-j", "1", "--mem-budget", "off", "--mem-ledger", os.path.join(tools.scratch, "ledger")]
    done = subprocess.run(argv, env=tools.env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if (done.returncode != 0) != fail:
        raise RuntimeError(f"neffcache compile of {entry.rel} exited {done.returncode}: {done.stdout[-2000:]}")


def with_our_compile(tools, template, entry, fake_version, fail):
    """Runs our compile on a copy of the entry in a scratch cache of its own (so it records
    nothing about the template's other entries), then moves the entry back, with the records
    it wrote elsewhere under the root (.neffcache/, LNL's lock and holder files): both sides of
    a comparison start with them."""
    scratch = tempfile.mkdtemp(dir=tools.scratch, prefix="our-compile-")
    shutil.copytree(os.path.join(template, entry.rel), os.path.join(scratch, entry.rel), symlinks=True)
    run_our_compile(tools, scratch, entry, fake_version, fail)
    shutil.rmtree(os.path.join(template, entry.rel))
    shutil.move(os.path.join(scratch, entry.rel), os.path.join(template, entry.rel))
    for name in os.listdir(scratch):
        if name == entry.rel.split("/")[0]:
            continue  # the entry's own folder, moved above
        source, target = os.path.join(scratch, name), os.path.join(template, name)
        if os.path.isdir(source):
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    shutil.rmtree(scratch)


class Template:
    """A cache folder holding one entry per state."""

    def __init__(self, tools, root, fake_version="2.21.0", neuron_version="2.15"):
        self.tools, self.root = tools, root
        self.fake_version, self.neuron_version = fake_version, neuron_version
        self.entries = {}  # (dialect, state) -> Entry
        os.makedirs(root, exist_ok=True)

    # -- Neuron (libneuronxla) ----------------------------------------------------------

    def neuron(self, state):
        flags = flags_for("neuron", state)
        version = "9.9.9" if state == "another-compiler" else self.fake_version
        name = module_name("neuron", state, flags)
        hlo = "model.hlo.pb" if self.neuron_version == "2.12" else "model.hlo_module.pb"
        entry = Entry("neuron", state, f"neuronxcc-{version}/{name}", name,
                      os.path.join(self.tools.corpus, GRAPHS.get(state, FAST_GRAPH)), flags, hlo,
                      neff="model.neff", marker="model.done", log="model.log", lock=hlo + ".lock")
        folder = os.path.join(self.root, entry.rel)
        os.makedirs(folder)
        shutil.copyfile(entry.graph, os.path.join(folder, hlo))
        write(os.path.join(folder, "compile_flags.json"), json.dumps(flags))
        ref = self.add(entry)
        products = {
            "leftover-neff": {"model.neff": ref["bytes"][:TRUNCATED]},  # a rank killed while copying
            "leftover-done": {"model.done": b""},
            "done": {"model.neff": ref["bytes"], "model.done": b""},
            "failed": {"model.log": "ERROR: compilation failed\nCompiler status FAIL\n"},
            "locked-dead-template": {entry.lock: b""},  # a killed rank's lock, anonymous to the mount
        }
        for name, data in products.get(state, {}).items():
            write(os.path.join(folder, name), data)
        if state == "interrupted-publish":
            self.our_publish_interrupted(entry)
        return entry

    # -- LNL (libtorch_neuronx_lite) -----------------------------------------------------

    def lnl(self, state):
        key = lnl_key(state)
        entry = Entry("lnl", state, key, key, os.path.join(self.tools.corpus, GRAPHS.get(state, FAST_GRAPH)),
                      flags_for("lnl", state), "graph.hlo", neff=f"graph_{key}.neff",
                      marker=".compilation_complete", log="log-neuron-cc.txt",
                      root_names=(f".{key}.compilation_metadata.lock", f".{key}.compilation_metadata"))
        folder = os.path.join(self.root, key)
        os.makedirs(folder)
        ref = self.add(entry)
        # As a rank writes them (tests/support/lnl_client.py), byte for byte, so that a rank
        # writing them again changes nothing.
        shutil.copyfile(entry.graph, os.path.join(folder, "graph.hlo"))
        write(os.path.join(folder, "command.txt"), " ".join(self.lnl_command(entry)))
        if state not in ("locked-live", "locked-dead", "dead-before-metadata"):
            write(os.path.join(folder, ".artifact_metadata_v0.json"),
                  json.dumps({"cache_key": key, "version": 0, "num_outputs": 1}))
        if state in ("leftover-log", "done", "dead-after-metadata"):
            self.lnl_compile_in_place(entry, ref)
        if state == "leftover-log":
            os.remove(os.path.join(folder, entry.neff))
        if state in ("leftover-neff", "dead-before-metadata"):
            write(os.path.join(folder, entry.neff), ref["bytes"][:TRUNCATED])
        if state == "holder-dies":  # an earlier run's leftovers: metadata and NEFF, no marker
            write(os.path.join(folder, entry.neff), ref["bytes"])
        if state in ("leftover-marker", "done"):
            write(os.path.join(folder, entry.marker), f"completed:{time.time()}\nneff_size:{ref['size']}\n")
        if state in ("locked-dead", "dead-before-metadata", "dead-after-metadata"):
            lock, holder = entry.root_names
            write(os.path.join(self.root, lock), b"")
            write(os.path.join(self.root, holder), dead_holder(self.tools))
        if state in ("failed", "interrupted-publish"):
            with_our_compile(self.tools, self.root, entry, self.fake_version, state == "failed")
        if state == "interrupted-publish":
            os.remove(os.path.join(folder, entry.marker))
        return entry

    def lnl_command(self, entry):
        folder = os.path.join(self.root, entry.key)
        return [os.path.abspath(self.tools.fake), "compile", os.path.join(folder, "graph.hlo"), "--framework", "XLA",
                "--target", "trn1", "--output", os.path.join(folder, entry.neff), "--logfile",
                os.path.join(folder, entry.log), *entry.flags]

    def lnl_compile_in_place(self, entry, ref):
        """The NEFF and log a rank's compile leaves in the entry (its NEFF is the reference)."""
        subprocess.run(self.lnl_command(entry), env=self.tools.env(), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(os.path.join(self.root, entry.key, entry.neff), "rb") as f:
            if f.read() != ref["bytes"]:
                raise RuntimeError(f"the compile of {entry.key} in place differs from its reference NEFF")

    # -- common ----------------------------------------------------------------------------

    def add(self, entry):
        ref = reference(self.tools, entry.graph, entry.flags)
        entry.reference = {"sha256": ref["sha256"], "size": ref["size"]}
        self.entries[(entry.dialect, entry.state)] = entry
        return ref

    def our_publish_interrupted(self, entry):
        """Our publish cut after the NEFF was in place: everything but the marker."""
        with_our_compile(self.tools, self.root, entry, self.fake_version, False)
        os.remove(os.path.join(self.root, entry.rel, entry.marker))

    def finish(self):
        """Gives the entries' files to OWNER (not the root's own files, nor our records, whose
        owner the daemon checks), then notes each HLO's attributes."""
        for top in os.listdir(self.root):
            if top == ".neffcache" or not os.path.isdir(os.path.join(self.root, top)):
                continue
            for folder, dirs, files in os.walk(os.path.join(self.root, top)):
                for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                    os.lchown(name, OWNER, OWNER)
        for entry in self.entries.values():
            st = os.stat(os.path.join(self.root, entry.rel, entry.hlo))
            entry.hlo_attrs = {"uid": st.st_uid, "gid": st.st_gid, "mtime_ns": st.st_mtime_ns}


def copy_tree(src, dst):
    """cp -a: owners, modes and times kept, so both sides start alike."""
    subprocess.run(["cp", "-a", src, dst], check=True)
