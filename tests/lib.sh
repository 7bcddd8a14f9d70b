# The checkers the shell tests share; a test sources it from the repository root
# (". tests/lib.sh") and ends with "exit $rc".
#   rc        1 once any check failed, else 0
#   n         how many checks passed
#   fail MSG  prints "FAIL: MSG" and sets rc; the test goes on
#   ok        counts a passed check
#   run NAME WANT_STATUS CMD...
#             runs CMD with its output in $T/NAME.out; a status other than WANT_STATUS
#             fails, with the output's last $RUN_TAIL lines (default 8)
rc=0
n=0
fail() {
	echo "FAIL: $*"
	rc=1
}
ok() { n=$((n + 1)); }
run() {
	local name=$1 want=$2 st=0
	shift 2
	"$@" >"$T/$name.out" 2>&1 || st=$?
	if [ "$st" != "$want" ]; then
		fail "$name: exit status $st, expected $want: $*"
		tail -n "${RUN_TAIL:-8}" "$T/$name.out" | sed 's/^/    | /'
		return 1
	fi
	ok
}
