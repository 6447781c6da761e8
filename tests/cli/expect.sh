#!/usr/bin/env bash
# expect.sh EXIT REGEX [-f FILE REGEX]... [-s FILE]... -- COMMAND...
# Runs COMMAND; passes when it exits with EXIT, its output (stdout and stderr) matches REGEX, and
# each FILE exists and matches its REGEX. An exit status of 2 must come with exactly one line on
# standard error and no C++ backtrace. With -s FILE, exits 77 (skipped) when FILE does not exist.
set -u
want_exit=$1; want=$2; shift 2
files=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    -f) files+=("$2" "$3"); shift 3 ;;
    -s) [[ -e $2 ]] || { echo "skipped: $2 does not exist"; exit 77; }; shift 2 ;;
    *) echo "expect.sh: bad argument $1" >&2; exit 99 ;;
  esac
done
shift  # --
for ((i = 0; i < ${#files[@]}; i += 2)); do rm -f "${files[i]}"; done
out=$(mktemp); err=$(mktemp)
"$@" >"$out" 2>"$err"
code=$?
status=0
if [[ $code != "$want_exit" ]]; then
  echo "exit status $code, expected $want_exit"; status=1
fi
if ! cat "$out" "$err" | grep -Eq -- "$want"; then
  echo "output does not match /$want/"; status=1
fi
if [[ $want_exit == 2 ]]; then
  lines=$(wc -l <"$err")
  [[ $lines == 1 ]] || { echo "expected one line on stderr, got $lines"; status=1; }
  if grep -Eq "Exception raised from|frame #|terminate called" "$err"; then
    echo "stderr carries a C++ backtrace"; status=1
  fi
fi
for ((i = 0; i < ${#files[@]}; i += 2)); do
  if [[ ! -f ${files[i]} ]]; then
    echo "missing ${files[i]}"; status=1
  elif ! grep -Eq -- "${files[i+1]}" "${files[i]}"; then
    echo "${files[i]} does not match /${files[i+1]}/"; status=1
  fi
done
if [[ $status != 0 ]]; then
  echo "--- command: $*"; echo "--- stdout:"; head -c 4000 "$out"; echo "--- stderr:"; head -c 4000 "$err"
fi
rm -f "$out" "$err"
exit $status
