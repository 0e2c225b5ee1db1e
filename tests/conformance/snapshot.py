"""What a folder holds, in the form the conformance suite compares: names, kinds, sizes,
contents (as SHA-256) and, where asked, attributes.

Contents are normalized first, so that two sides of a comparison that differ only in where
they live compare equal: every cache root the caller names becomes "<root>", and the time in
an LNL completion marker becomes "<time>" (its format is checked on its own).
"""
import hashlib
import os
import re
import stat

MARKER_TIME = re.compile(rb"\Acompleted:[^\n]*\n")
# Files whose content carries only a time or a pid: their presence is compared, not their bytes.
CONTENT_IGNORED = (".cache_accessed",)


def is_holder_file(name):
    """LNL's file naming a key's lock holder (<root>/.<key>.compilation_metadata)."""
    return name.startswith(".") and name.endswith(".compilation_metadata")


def normalize(data, roots):
    for root in sorted(roots, key=len, reverse=True):  # the longest first: one may prefix another
        data = data.replace(os.fsencode(root), b"<root>")
    return MARKER_TIME.sub(b"completed:<time>\n", data)


def kind(mode):
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def attributes(st, with_mtime=True):
    out = {"mode": oct(stat.S_IMODE(st.st_mode)), "uid": st.st_uid, "gid": st.st_gid}
    if with_mtime:
        out["mtime_ns"] = st.st_mtime_ns
    return out


def describe(path, roots=(), attrs=False, read_empty=False):
    """One name: its kind, and for a file its size and content hash.

    A file whose size is 0 is not opened unless `read_empty`: through a mount, a name of size 0
    may be a placeholder whose open starts a compile, and looking must change nothing."""
    st = os.lstat(path)
    info = {"type": kind(st.st_mode)}
    if attrs:
        info.update(attributes(st, with_mtime=info["type"] != "dir"))
    if info["type"] == "symlink":
        info["target"] = os.readlink(path)
    if info["type"] != "file":
        return info
    name = os.path.basename(path)
    if name in CONTENT_IGNORED or is_holder_file(name) or (st.st_size == 0 and not read_empty):
        info["size"] = st.st_size
        return info
    with open(path, "rb") as f:
        data = normalize(f.read(), roots)
    info.update(size=len(data), sha256=hashlib.sha256(data).hexdigest()[:16])
    return info


def tree(root, roots=(), attrs=False, read_empty=False):
    """Every name under `root` (not `root` itself), by its path relative to `root`."""
    out = {}

    def visit(folder, rel):
        for name in sorted(os.listdir(folder)):
            path, sub = os.path.join(folder, name), f"{rel}{name}"
            try:
                out[sub] = describe(path, roots, attrs, read_empty)
            except OSError as e:
                out[sub] = {"error": error_text(e)}
                continue
            if out[sub]["type"] == "dir":
                visit(path, sub + "/")

    visit(root, "")
    return out


def error_text(e):
    """An OSError as the suite compares it: its class and errno, without paths."""
    return f"{type(e).__name__} errno {e.errno}"
