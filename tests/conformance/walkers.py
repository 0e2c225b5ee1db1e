#!/usr/bin/python3
"""Tools that walk a whole cache folder as people and scripts do, each reporting what it saw.

    walkers.py NAME ROOT [--dest DIR]

NAME is one of: rmtree (of the whole cache), rmtree-entries (of each entry), copytree, walk,
glob, scandir, cp-a, rsync. The copying walkers copy
ROOT into DIR (which must not exist yet). Prints one JSON object:
  {"walker": NAME, "errors": [...], "seen": {path relative to ROOT (or DIR): what it was}}
Each error is {"class", "errno", "path"} (paths relative to ROOT, or "<dest>/..."). A walker
stops where the Python function or the command it stands for stops; os.walk and glob skip
what they cannot read, as they do for a script.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshot  # noqa: E402  (beside this file)


class Walk:
    def __init__(self, root, dest):
        self.root, self.dest = root, dest
        self.errors, self.seen = [], {}

    def rel(self, path):
        """A path as reported: relative to the root, or under <dest>."""
        if not path:
            return None
        path = os.fsdecode(path)
        if self.dest and path.startswith(self.dest):
            return "<dest>" + path[len(self.dest):]
        return os.path.relpath(path, self.root) if path.startswith(self.root) else path

    def error(self, e, path=None):
        self.errors.append({"class": type(e).__name__, "errno": getattr(e, "errno", None),
                            "path": self.rel(path or getattr(e, "filename", None))})

    def copied(self):
        """What a copy holds, with the attributes a copy keeps."""
        self.seen = snapshot.tree(self.dest, roots=(self.root, self.dest), attrs=True, read_empty=True)


def rmtree_stop(w):
    """shutil.rmtree's default on an error (raise), knowing the path that failed."""
    def stop(_function, path, exc_info):
        w.error(exc_info[1], path)
        raise exc_info[1]
    return stop


def rmtree(w):
    """shutil.rmtree of the whole cache, as the cache API's clean() does."""
    try:
        shutil.rmtree(w.root, onerror=rmtree_stop(w))
        w.seen["."] = "removed"
    except OSError as e:
        w.seen["."] = f"{type(e).__name__} errno {e.errno} at {w.errors[-1]['path']}"


def entry_folders(root):
    """The folders rmtree-entries removes one by one: each entry (a Neuron compiler folder's
    children, each other folder of the root), then every other name of the root."""
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith("neuronxcc-") and os.path.isdir(path):
            yield from (os.path.join(path, child) for child in sorted(os.listdir(path)))
        yield path


def rmtree_entries(w):
    """shutil.rmtree of each entry on its own, as a tool that cleans some entries does."""
    for path in entry_folders(w.root):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=rmtree_stop(w))
            else:
                os.remove(path)
            w.seen[w.rel(path)] = "removed"
        except OSError as e:
            w.seen[w.rel(path)] = f"{type(e).__name__} errno {e.errno} at {w.errors[-1]['path']}"


def copytree(w):
    try:
        shutil.copytree(w.root, w.dest, copy_function=shutil.copy2)
    except shutil.Error as e:  # copytree goes on after a file's error and raises them all at the end
        for src, _dst, why in e.args[0]:
            number = re.search(r"\[Errno (\d+)\]", str(why))
            w.errors.append({"class": "shutil.Error", "errno": int(number.group(1)) if number else None,
                             "path": w.rel(src)})
    except OSError as e:
        w.error(e)
    if os.path.isdir(w.dest):
        w.copied()


def walk(w):
    for folder, dirs, files in os.walk(w.root, onerror=w.error):
        for name in dirs:
            w.seen[w.rel(os.path.join(folder, name))] = "dir"
        for name in files:
            w.seen[w.rel(os.path.join(folder, name))] = "file"


def glob_all(w):
    for path in glob.glob("**", root_dir=w.root, recursive=True):
        w.seen[path] = True


def scandir(w):
    """os.scandir and entry.stat() on every name; the first error ends it, as in a script."""
    def visit(folder):
        with os.scandir(folder) as it:
            for entry in sorted(it, key=lambda e: e.name):
                st = entry.stat(follow_symlinks=False)
                info = {"type": snapshot.kind(st.st_mode), "size": st.st_size}
                info.update(snapshot.attributes(st, with_mtime=info["type"] != "dir"))
                w.seen[w.rel(entry.path)] = info
                if entry.is_dir(follow_symlinks=False):
                    visit(entry.path)
    try:
        visit(w.root)
    except OSError as e:
        w.error(e)


def command_copy(argv):
    def run(w):
        os.makedirs(w.dest)
        done = subprocess.run(argv(w.root, w.dest), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            # Every line names the file it failed on; the suite compares them without paths' roots.
            for line in done.stderr.splitlines():
                line = line.replace(w.dest, "<dest>").replace(w.root, "<root>")
                w.errors.append({"class": f"exit {done.returncode}", "errno": None, "path": line})
        w.copied()
    return run


WALKERS = {
    "rmtree": rmtree,
    "rmtree-entries": rmtree_entries,
    "copytree": copytree,
    "walk": walk,
    "glob": glob_all,
    "scandir": scandir,
    "cp-a": command_copy(lambda root, dest: ["cp", "-a", root + "/.", dest]),
    "rsync": command_copy(lambda root, dest: ["rsync", "-a", root + "/", dest + "/"]),
}
COPIES = ("copytree", "cp-a", "rsync")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("walker", choices=sorted(WALKERS))
    ap.add_argument("root")
    ap.add_argument("--dest")
    a = ap.parse_args()
    if a.walker in COPIES and not a.dest:
        ap.error(f"{a.walker} needs --dest")
    w = Walk(os.path.abspath(a.root), os.path.abspath(a.dest) if a.dest else None)
    WALKERS[a.walker](w)
    print(json.dumps({"walker": a.walker, "errors": w.errors, "seen": w.seen}))


if __name__ == "__main__":
    main()
