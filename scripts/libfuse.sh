#!/usr/bin/env bash
# Builds libfuse from Debian trixie's source package of fuse3 (bookworm has 3.14; FUSE
# passthrough needs 3.16, and trixie's binary packages need trixie's glibc), as root.
#   libfuse.sh install PREFIX  the static library, its headers and fuse3.pc into PREFIX
#                              (scripts/setup.sh)
#   libfuse.sh example DIR     libfuse's passthrough_hp example, statically linked, into DIR
#                              (bench/run.sh: the limit of a FUSE open, to measure ours against)
set -euo pipefail
what=${1:-} dest=${2:-}
if [[ $what != install && $what != example ]] || [ -z "$dest" ]; then
  echo "usage: $0 install PREFIX | example DIR" >&2
  exit 2
fi

# Source packages only (deb-src): nothing from trixie can be installed through it.
src=/etc/apt/sources.list.d/trixie-src.sources
if ! grep -qs '^Types: deb-src' "$src"; then
  cat >"$src" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt checks the files against trixie's signed index; dpkg-source applies Debian's patches
# (among them the 3.17.3 fixes of the capability conversion).
(cd "$work" && apt-get source -qq --download-only -o APT::Sandbox::User=root fuse3 >/dev/null &&
  dpkg-source -x fuse3_*.dsc src >/dev/null 2>&1)
options=(-Ddefault_library=static -Dutils=false -Dtests=false -Dbuildtype=release -Db_pie=true)
if [ "$what" = install ]; then
  meson setup "$work/build" "$work/src" --prefix="$dest" --libdir=lib -Dexamples=false "${options[@]}" >/dev/null
  ninja -C "$work/build" >/dev/null
  rm -rf "$dest"
  ninja -C "$work/build" install >/dev/null
  echo "libfuse $(sed -n 's/^Version: //p' "$dest/lib/pkgconfig/fuse3.pc") built into $dest"
else
  meson setup "$work/build" "$work/src" -Dexamples=true "${options[@]}" >/dev/null
  ninja -C "$work/build" example/passthrough_hp >/dev/null
  mkdir -p "$dest"
  cp "$work/build/example/passthrough_hp" "$dest/"
  echo "libfuse's passthrough_hp built into $dest"
fi
