#!/usr/bin/env bash
# The man pages of a build render with `man -l`, without a warning, and each shows what its
# program's --help lists (every long option; for neffcache, every command):
#   check_man.sh MAN_DIR NEFFCACHEFS NEFFCACHE NEFFCACHE_CC NEURON_PARALLEL_COMPILE
set -uo pipefail
man_dir=$1
declare -A programs=([neffcachefs.8]=$2 [neffcache.1]=$3 [neffcache-cc.1]=$4 [neuron_parallel_compile.1]=$5)
status=0
say() { echo "check_man: $*" >&2; status=1; }
for page in "${!programs[@]}"; do
  file=$man_dir/$page.gz
  [ -f "$file" ] || { say "$file is missing"; continue; }
  text=$(MANWIDTH=100 man --warnings -l "$file" 2>"$man_dir/$page.warnings" | col -b)
  [ -s "$man_dir/$page.warnings" ] && say "$page: $(head -3 "$man_dir/$page.warnings")"
  for heading in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
    grep -q "^$heading" <<<"$text" || say "$page: no $heading section"
  done
  program=${programs[$page]}
  help_option=--help
  [ "$page" = neffcache-cc.1 ] && help_option=--neffcache-help
  for option in $("$program" $help_option | grep -oE '(^|[ ,])--[a-z][a-z0-9_-]+' | tr -d ' ,' | sort -u); do
    grep -qF -- "$option" <<<"$text" || say "$page: $option (in its --help) is not on the page"
  done
  if [ "$page" = neffcache.1 ]; then
    for command in $("$program" --help | sed -n '/^Subcommands:/,$p' | grep -oE '^  [a-z][a-z0-9-]*'); do
      grep -q "^   neffcache $command\$" <<<"$text" || say "$page: no section for the command $command"
    done
  fi
done
exit $status
