#!/usr/bin/env bash
# What libr2cc.so exports (shim/exports.map): every name of intercept/verbs_funcs.def at
# exactly the version given there, mlx5dv_create_qp@MLX5_1.3 and
# mlx5dv_reg_dmabuf_mr@MLX5_1.25, and, with no version, dlvsym, the NCCL API
# (nccl*) and r2cc_nic_stats/r2cc_version; nothing else.
#   tests/preload/exports.sh [BUILD]
set -u
B=${1:-build}
lib=$B/lib/libr2cc.so
[ -f "$lib" ] || { echo "exports: $lib missing (make)"; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
got=$(objdump -T "$lib" | awk '$2 ~ /^[gw]/ && $4 != "*UND*" && $(NF-1) != $NF {print $(NF-1), $NF}' | sort)
want=$( {
	sed -n 's/^R2CC_VERBS_\(FN\|OWN\)([^,]*, \([a-z0-9_]*\), "\([A-Z0-9_.]*\)",.*/\3 \2/p' \
		"$here/intercept/verbs_funcs.def"
	echo "MLX5_1.3 mlx5dv_create_qp"
	echo "MLX5_1.25 mlx5dv_reg_dmabuf_mr"
} | sort)
rc=0
[ "$(echo "$want" | wc -l)" -ge 30 ] || { echo "exports: read too few names from verbs_funcs.def"; exit 1; }
versioned=$(echo "$got" | grep -v '^Base ')
if [ "$versioned" != "$want" ]; then
	echo "FAIL exports: versioned names differ from verbs_funcs.def (- wanted, + exported)"
	diff <(echo "$want") <(echo "$versioned") | grep '^[<>]' | sed 's/^</-/; s/^>/+/'
	rc=1
fi
other=$(echo "$got" | awk '$1 == "Base" {print $2}' | grep -vE '^(nccl[A-Za-z]+|dlvsym|r2cc_nic_stats|r2cc_version)$')
if [ -n "$other" ]; then
	echo "FAIL exports: unversioned names beyond the NCCL API, dlvsym and r2cc_*:"
	echo "$other" | sed 's/^/    /'
	rc=1
fi
[ $rc -eq 0 ] && echo "ok exports ($(echo "$want" | wc -l) versioned, $(echo "$got" | grep -c '^Base ') unversioned)"
exit $rc
