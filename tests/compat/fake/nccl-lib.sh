# Sourced by the test doubles of tests/compat/fake: the libnccl.so.2 that the dynamic
# loader would take from LD_LIBRARY_PATH (lib) and its ncclGetVersion() (code), as the
# programs they stand in for see them; exit 127 with the loader's message when there is
# none.   fake_nccl_lib PROGRAM
fake_nccl_lib() {
	local d dirs
	lib=
	IFS=':' read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
	for d in "${dirs[@]}"; do
		[ -e "$d/libnccl.so.2" ] && { lib=$d/libnccl.so.2; break; }
	done
	[ -n "$lib" ] || { echo "$1: error while loading shared libraries: libnccl.so.2: cannot open shared object file"; exit 127; }
	code=$(python3 -c 'import ctypes, sys
v = ctypes.c_int(0); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); print(v.value)' "$lib")
}
