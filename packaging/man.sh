#!/bin/sh
# Writes a manual page on stdout from a program's --help text on stdin, so that the
# page says exactly what the program says:
#   PROGRAM --help | packaging/man.sh NAME "one-line description" VERSION DATE DOCDIR
# The text goes in unfilled (.nf), escaped for troff: backslashes, and lines that
# would start with a control character.
set -eu
name=$1 desc=$2 version=$3 date=$4 docdir=$5
printf '.TH %s 1 "%s" "r2cc %s" "R2CC"\n' "$(echo "$name" | tr '[:lower:]' '[:upper:]')" "$date" "$version"
printf '.SH NAME\n%s \\- %s\n' "$(echo "$name" | sed 's/-/\\-/g')" "$desc"
printf '.SH DESCRIPTION\n.nf\n'
sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/-/\\-/g'
printf '.fi\n.SH SEE ALSO\n'
printf 'r2cc(1), r2cc\\-verbs\\-drill(1), r2cc\\-drill(1), r2cc\\-demo(1), softverbs\\-ctl(1); '
printf 'the documents in %s (README.md first).\n' "$docdir"
