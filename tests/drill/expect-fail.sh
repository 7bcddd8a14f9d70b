#!/usr/bin/env bash
# Negative test: runs a command that must FAIL, and passes only if it did fail, for the
# expected reason: non-zero exit, a last line starting with FAIL, and WORD somewhere in
# the output (so that a crash or a usage error does not count as the checker working).
#   expect-fail.sh WORD COMMAND [ARGS...]
set -u
word=$1; shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
last=$(printf '%s\n' "$out" | tail -n 1)
if [ $rc -eq 0 ]; then
	echo "expect-fail: '$*' passed; it should have failed"; exit 1
fi
case "$last" in FAIL*) ;; *) echo "expect-fail: last line is not FAIL (rc=$rc)"; exit 1 ;; esac
if ! printf '%s\n' "$out" | grep -q -- "$word"; then
	echo "expect-fail: the output never says '$word'"; exit 1
fi
echo "expect-fail: failed as expected (rc=$rc, '$word' reported)"
