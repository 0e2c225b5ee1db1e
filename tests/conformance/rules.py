"""The allowed differences: one rule per row of the table in docs/SEMANTICS.md
("## Where the mount differs from a local disk, and why", first column an id in backticks).

A difference between the folder side and the mount side of a case is explained when one
rule's predicate holds for it. A rule without a predicate is a documented difference the
suite does not exercise: it explains nothing, but keeps the table and the suite one list.
"""
import errno
import os
import re
from dataclasses import dataclass, field

HEADING = "## Where the mount differs from a local disk, and why"
MODE = "0o644"  # what the mount publishes a NEFF or marker with, under umask 022
RAN = ("compiled", "hit", "waited")  # outcomes of a client that got a NEFF


@dataclass
class Diff:
    """One thing the two sides of a case saw differently."""
    case: str
    kind: str  # result.<field>, before.listed, before.stat, after.file, after.stat, root.listed,
    #            holder.<field>, compiles, walk.<what>
    name: str  # the file name (a path under the root for walkers), or ""
    folder: object
    mount: object
    entry: object = None  # the states.Entry it concerns, if any
    context: dict = field(default_factory=dict)  # the case's results, compile counts, the daemon's pid

    @property
    def base(self):
        return os.path.basename(self.name)


def neff_is_reference(value, entry):
    """A file description (snapshot.describe) or stat that is the entry's reference NEFF."""
    return isinstance(value, dict) and value.get("size") == entry.reference["size"] and \
        value.get("sha256", entry.reference["sha256"][:16]) == entry.reference["sha256"][:16]


def compile_total(value):
    return sum(value.values())


def mount_got_reference(d):
    result = d.context.get("mount_result", {})
    return result.get("outcome") in RAN and result.get("neff") == "reference"


# -- compile-on-open ---------------------------------------------------------------------
# States in which an entry is pending to the mount. `locked-dead`: the lock of a client that
# died, created through the mount, which the mount removes (dead-client-lock); the entry is
# pending from then on.
PENDING = ("pending", "compiling", "unlink-placeholder", "locked-dead")


def looks_published(entry, name, value):
    """What a lookup of a product name may find on the mount: a placeholder (size 0, with the
    attributes the product will have: mode 0644, the HLO's owner and mtime) or the product our
    compile published (the reference NEFF; a marker of any size)."""
    if not isinstance(value, dict) or value.get("mode") != MODE:
        return False
    if (value.get("uid"), value.get("gid")) != (entry.hlo_attrs["uid"], entry.hlo_attrs["gid"]):
        return False
    placeholder = value.get("size") == 0 and value.get("mtime_ns", entry.hlo_attrs["mtime_ns"]) == \
        entry.hlo_attrs["mtime_ns"]
    published = name == entry.marker or value.get("size") == entry.reference["size"]
    return placeholder or published


def compile_on_open(d):
    e = d.entry
    if e is None or e.state not in PENDING or d.kind.startswith("walk."):
        return False  # never a name in a listing, never an entry in another state
    if d.kind in ("before.stat", "after.stat"):
        return d.name in e.products and looks_published(e, d.name, d.mount)
    if d.kind == "before.listed":  # our own lock, while our compile runs
        return e.dialect == "neuron" and e.state == "compiling" and d.name == e.lock and d.mount and not d.folder
    if d.kind == "after.file":  # what the entry lists afterwards: the products, once published
        if d.name == e.neff:
            return neff_is_reference(d.mount, e)
        if d.name == e.log and e.dialect == "lnl":  # the log of our compile, not the client's
            return d.mount is not None and d.context["mount_compiles"]["daemon"] > 0
        return False
    if d.kind == "root.listed":  # the key's lock and holder, the holder naming the daemon
        return e.dialect == "lnl" and d.mount and not d.folder and \
            d.context.get("mount_holder_pid") == d.context.get("daemon_pid")
    if d.kind == "result.outcome":
        return d.folder == "compiled" and d.mount in ("hit", "waited") and mount_got_reference(d)
    if d.kind == "compiles":  # the daemon's compile instead of the client's, at most one
        f, m = d.folder, d.mount
        return compile_total(m) == compile_total(f) <= 1 and m["client"] <= f["client"]
    return False


# -- neffcache-files -----------------------------------------------------------------------
NEFFCACHE_RECORD = ".neffcache-meta.json"
NEFFCACHE_COMPILE_LOG = ".neffcache-compile.log"


def neffcache_files(d):
    """Our record in a Neuron entry, extra on the mount side or rewritten there (where the
    mount compiled, finished a publish or serves what we published); our compile log where
    the daemon compiled. Never a temporary or a lock of ours left behind."""
    e = d.entry
    if e is None or e.dialect != "neuron" or not d.mount:
        return False
    if d.base == NEFFCACHE_RECORD:
        return True
    return d.base == NEFFCACHE_COMPILE_LOG and d.context.get("mount_compiles", {}).get("daemon", 0) > 0


# -- dead-client-lock ----------------------------------------------------------------------
def dead_client_lock(d):
    e = d.entry
    if e is None or e.dialect != "neuron" or e.state != "locked-dead":
        return False
    folder_waited = d.context.get("folder_result", {}).get("outcome") == "timeout"
    completed = folder_waited and mount_got_reference(d)
    if d.kind.startswith("result."):
        return completed
    if d.kind == "compiles":
        return completed and compile_total(d.folder) == 0 and compile_total(d.mount) == 1
    if d.name == e.lock:  # gone on the mount, kept on the folder
        return d.kind in ("before.listed", "after.file", "after.stat") and bool(d.folder) and not d.mount
    if d.kind in ("after.file", "after.stat") and d.name in e.products:
        return completed and d.folder is None and d.mount is not None
    return False


# -- interrupted-publish -------------------------------------------------------------------
def finished_marker(e, value):
    """A marker of the finished publish: a stat of it has the attributes our publish gives
    (mode 0644, the HLO's owner), and it is the written marker (an LNL one has content) or,
    before the daemon wrote it, the placeholder a lookup finds (size 0, the HLO's mtime)."""
    if not value:
        return False
    if not isinstance(value, dict):
        return True  # a listing: the name alone
    if "mode" in value and (value["mode"] != MODE or (value.get("uid"), value.get("gid")) !=
                            (e.hlo_attrs["uid"], e.hlo_attrs["gid"])):
        return False
    placeholder = value.get("size") == 0 and value.get("mtime_ns", e.hlo_attrs["mtime_ns"]) == e.hlo_attrs["mtime_ns"]
    return e.dialect == "neuron" or value.get("size") != 0 or placeholder


def interrupted_publish(d):
    e = d.entry
    if e is None or e.state != "interrupted-publish":
        return False
    if d.base == e.marker:  # the mount shows the entry done; the folder's client may have compiled
        return finished_marker(e, d.mount)
    if d.kind in ("after.stat", "after.file") and d.name == e.neff:  # both hold it: ours, the client's
        return d.folder is not None and neff_is_reference(d.mount, e)
    if d.kind == "after.file" and d.name == e.log:  # the log of our earlier compile
        return d.folder is not None and d.mount is not None
    if d.kind == "root.listed":  # the mount's client never had to take the key's lock
        return bool(d.folder) and not d.mount
    if d.kind == "result.outcome":
        return d.folder == "compiled" and d.mount == "hit" and mount_got_reference(d)
    if d.kind == "compiles":
        return compile_total(d.mount) == compile_total(d.folder) - 1
    return False


# -- placeholder-unlink --------------------------------------------------------------------
def placeholder_unlink(d):
    e = d.entry
    return e is not None and e.state in PENDING and d.kind == "result.unlink" and d.name in e.products and \
        d.folder == "FileNotFoundError errno 2" and d.mount == "ok"


# -- stats-folder ------------------------------------------------------------------------------
def stats_folder(d):
    """The backing folder's .neffcache at the root (our index and LNL records): a walker of the
    folder sees it, the mount never shows it."""
    return d.kind.startswith("walk.") and d.name.split("/")[0] == ".neffcache" and bool(d.folder) and not d.mount


# -- mount-point -------------------------------------------------------------------------------
def mount_point(d):
    """shutil.rmtree of the whole cache: the folder goes; the mount point stays, emptied, and
    rmtree ends with EBUSY on it."""
    busy = [{"class": "OSError", "errno": errno.EBUSY, "path": "."}]
    if d.kind == "walk.errors":
        return d.folder == [] and d.mount == busy
    if d.kind == "walk.seen" and d.name == ".":  # rmtree's own report on the root
        return d.folder == "removed" and d.mount == f"OSError errno {errno.EBUSY} at ."
    if d.kind == "walk.after" and d.name == "":
        return d.folder is None and d.mount == {}
    return False


RULES = {
    "compile-on-open": compile_on_open,
    "neffcache-files": neffcache_files,
    "dead-client-lock": dead_client_lock,
    "interrupted-publish": interrupted_publish,
    "placeholder-unlink": placeholder_unlink,
    # Documented, not exercised by this suite:
    "placeholder-write": None,
    "placeholder-rename": None,
    "passthrough-etxtbsy": None,  # layers only: tests/fuse/test_handlers.cpp
    "twin-write": None,  # our twins only: tests/fuse/test_passthrough.cpp
    "mknod-device": None,
    "collapse-insert-range": None,
    "stats-folder": stats_folder,
    "mount-point": mount_point,
    "bucket-products": None,  # over a bucket only
    "other-host-lock": None,  # over a bucket only: tests/fuse/test_s3_hosts.cpp
    "other-host-key-lock": None,  # over a bucket only: tests/fuse/test_s3_lnl.cpp
    "layers": None,
    "read-only": None,
}


def explain(diff):
    """The id of the first rule that allows `diff`, or None."""
    for rule_id, predicate in RULES.items():
        if predicate is not None and predicate(diff):
            return rule_id
    return None


def table_ids(path):
    """The ids in the first column of the table under HEADING in the markdown file `path`."""
    with open(path) as f:
        lines = f.read().splitlines()
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise ValueError(f"{path}: no heading {HEADING!r}") from None
    ids, in_table = set(), False
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break  # the first table ends
            continue
        in_table = True
        first = line.strip("|").split("|")[0].strip()
        match = re.fullmatch(r"`([^`]+)`", first)
        if match:
            ids.add(match.group(1))
    return ids


def check_table(path):
    """Lines describing how the table's ids and the suite's rules differ (none: they agree)."""
    try:
        ids = table_ids(path)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems = []
    if ids - RULES.keys():
        problems.append(f"rows without a rule in the suite: {', '.join(sorted(ids - RULES.keys()))}")
    if RULES.keys() - ids:
        problems.append(f"rules without a row in {path}: {', '.join(sorted(RULES.keys() - ids))}")
    return problems
