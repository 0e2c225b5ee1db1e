#!/usr/bin/env python3
"""Checks that programs load on every target of the packages (docs/INSTALL.md#where-it-runs).

    check_elf.py PROGRAM_OR_FOLDER...

Reads each ELF file (folders: every ELF file under them; links are skipped) with readelf and
fails, naming the program and the need, on any of:
- a shared library (NEEDED) other than glibc's, libgcc_s 1, libcrypto and libssl 3, libarchive 13
  and zlib: what every target has under one soname (neffcachefs loads libsystemd only under
  systemd, with dlopen: a minimal container image has none);
- a glibc symbol version above GLIBC_2.34 (Amazon Linux 2023 has glibc 2.34), or a libgcc_s one
  above GCC_7.0.0 (its GCC 11 has those);
- any other symbol version than OPENSSL_3.0.0: libstdc++'s GLIBCXX_ and CXXABI_
  (Amazon Linux 2023 has GCC 11's libstdc++) and Debian's CURL_OPENSSL_4 among them.
Exit status 0 when every file passes, 1 otherwise, 2 on bad use or when no ELF file was found.
"""
import os
import re
import subprocess
import sys

ALLOWED_LIBRARIES = {
    # glibc
    "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
    "libutil.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
    # GCC's unwinder
    "libgcc_s.so.1",
    # OpenSSL 3, libarchive, zlib
    "libcrypto.so.3", "libssl.so.3", "libarchive.so.13", "libz.so.1",
}
# The newest version each may be needed at: [prefix, highest version].
MAX_VERSION = {"GLIBC_": (2, 34), "GCC_": (7, 0, 0)}


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def readelf(option, path):
    return subprocess.run(["readelf", "--wide", option, path], check=True, capture_output=True, text=True).stdout


def problems(path):
    found = []
    for library in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("--dynamic", path)):
        if library not in ALLOWED_LIBRARIES:
            found.append(f"needs {library}")
    # The version needs (.gnu.version_r): "File: libc.so.6 ..." then "Name: GLIBC_2.34 ...".
    needs = set()
    library = None
    for line in readelf("--version-info", path).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            library = m.group(1)
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and library:
            needs.add((library, m.group(1)))
    refused = {}
    for library, version in sorted(needs):
        m = re.fullmatch(r"(GLIBC_|GCC_)(\d+(?:\.\d+)*)", version)
        if m:
            allowed = tuple(int(n) for n in m.group(2).split(".")) <= MAX_VERSION[m.group(1)]
        else:
            allowed = version == "OPENSSL_3.0.0"
        if not allowed:
            refused.setdefault(library, []).append(version)
    for library, versions in refused.items():
        found.append(f"needs {library} at {', '.join(versions)}")
    return found


def main(args):
    if not args:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    files = []
    for arg in args:
        if os.path.isdir(arg):
            for folder, _, names in os.walk(arg):
                files += [os.path.join(folder, n) for n in sorted(names)]
        else:
            files.append(arg)
    files = [f for f in files if not os.path.islink(f) and os.path.isfile(f) and is_elf(f)]
    if not files:
        print(f"check_elf: no ELF file in {' '.join(args)}", file=sys.stderr)
        return 2
    failed = 0
    for path in files:
        found = problems(path)
        failed += bool(found)
        for problem in found:
            print(f"check_elf: {path} {problem}", flush=True)
        if not found:
            print(f"check_elf: {path}: loads on every target")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
