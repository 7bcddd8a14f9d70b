/* Data patterns and reference results of r2cc-perf, shared by the CUDA kernels and the
 * host-only unit test (hence plain C with PERF_HD on every function).
 *
 * Every input element is a small integer chosen from (seed, rank, index) by a hash, in a
 * range picked for the (type, reduction, rank count) so that every partial result any
 * reduction order can produce is exactly representable in the type: sums stay below the
 * largest integer the type holds exactly, products are powers of two with a sign, max and
 * min need nothing. The expected output of any rank is then recomputed from the same
 * formula for every contributing rank, independently of NCCL, and compared exactly.
 * The single exception is avg of a floating type over a rank count that is not a power of
 * two: NCCL multiplies by a rounded 1/n there, so that comparison allows a small
 * documented tolerance (perf_pattern_tolerance).
 */
#ifndef R2CC_BENCH_PERF_PATTERN_H
#define R2CC_BENCH_PERF_PATTERN_H

#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define PERF_HD __host__ __device__ static inline
#else
#define PERF_HD static inline
#endif

/* Data types, in nccl-tests' order and with its names (perf_opts.c holds the names). */
enum perf_type {
	PERF_INT8,
	PERF_UINT8,
	PERF_INT32,
	PERF_UINT32,
	PERF_INT64,
	PERF_UINT64,
	PERF_HALF,
	PERF_FLOAT,
	PERF_DOUBLE,
	PERF_BF16,
	PERF_F8E4M3,
	PERF_F8E5M2,
	PERF_NTYPES
};

enum perf_redop { PERF_SUM, PERF_PROD, PERF_MAX, PERF_MIN, PERF_AVG, PERF_NOPS };

enum perf_coll {
	PERF_ALLREDUCE,
	PERF_ALLGATHER,
	PERF_REDUCESCATTER,
	PERF_BROADCAST,
	PERF_REDUCE,
	PERF_ALLTOALL,
	PERF_SENDRECV,
	PERF_NCOLLS
};

PERF_HD int perf_type_size(int t)
{
	switch (t) {
	case PERF_INT8:
	case PERF_UINT8:
	case PERF_F8E4M3:
	case PERF_F8E5M2:
		return 1;
	case PERF_HALF:
	case PERF_BF16:
		return 2;
	case PERF_INT32:
	case PERF_UINT32:
	case PERF_FLOAT:
		return 4;
	default:
		return 8;
	}
}

PERF_HD int perf_type_is_float(int t)
{
	return t >= PERF_HALF;
}

PERF_HD int perf_type_is_signed(int t)
{
	return t == PERF_INT8 || t == PERF_INT32 || t == PERF_INT64 || perf_type_is_float(t);
}

/* Exponent and mantissa widths of the floating types (double and float are handled by
 * the C conversions directly). */
PERF_HD void perf_float_format(int t, int *ebits, int *mbits)
{
	switch (t) {
	case PERF_HALF:
		*ebits = 5, *mbits = 10;
		break;
	case PERF_BF16:
		*ebits = 8, *mbits = 7;
		break;
	case PERF_F8E4M3:
		*ebits = 4, *mbits = 3;
		break;
	case PERF_F8E5M2:
		*ebits = 5, *mbits = 2;
		break;
	case PERF_FLOAT:
		*ebits = 8, *mbits = 23;
		break;
	default:
		*ebits = 11, *mbits = 52;
		break;
	}
}

/* Largest magnitude up to which every integer is exact in the type (capped at 2^20 so
 * sums of many ranks stay far from any overflow). */
PERF_HD int64_t perf_type_exact_limit(int t)
{
	switch (t) {
	case PERF_INT8:
		return 127;
	case PERF_UINT8:
		return 255;
	case PERF_HALF:
		return 2048;
	case PERF_BF16:
		return 256;
	case PERF_F8E4M3:
		return 16;
	case PERF_F8E5M2:
		return 8;
	default:
		return 1 << 20;
	}
}

/* Largest power of two whose exponent a product may reach (int8: 2^6 = 64 <= 127). */
PERF_HD int perf_type_max_twos(int t)
{
	switch (t) {
	case PERF_INT8:
		return 6;
	case PERF_UINT8:
		return 7;
	case PERF_F8E4M3:
		return 8;
	case PERF_HALF:
	case PERF_F8E5M2:
		return 15;
	default:
		return 30;
	}
}

/* Exact decoding of an 8/16-bit float; NaN for infinities and NaN encodings. */
PERF_HD double perf_small_float_decode(uint32_t bits, int t)
{
	int ebits, mbits;
	perf_float_format(t, &ebits, &mbits);
	int bias = (1 << (ebits - 1)) - 1;
	uint32_t sign = (bits >> (ebits + mbits)) & 1;
	uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
	uint32_t m = bits & ((1u << mbits) - 1);
	double v;
	if (t == PERF_F8E4M3) {
		if (e == 15 && m == 7)
			return NAN;
	} else if (e == (1u << ebits) - 1) {
		return NAN;
	}
	if (e == 0)
		v = ldexp((double)m, 1 - bias - mbits);
	else
		v = ldexp((double)(m | (1u << mbits)), (int)e - bias - mbits);
	return sign ? -v : v;
}

/* Encoding of a value into an 8/16-bit float; *exact is cleared when the value is not
 * representable exactly (the patterns never produce such inputs; the unit test checks). */
PERF_HD uint32_t perf_small_float_encode(double v, int t, int *exact)
{
	int ebits, mbits, x;
	perf_float_format(t, &ebits, &mbits);
	int bias = (1 << (ebits - 1)) - 1;
	uint32_t sign = v < 0 ? 1 : 0;
	double a = v < 0 ? -v : v;
	if (a == 0)
		return sign << (ebits + mbits);
	double f = frexp(a, &x); /* a = f * 2^x, f in [0.5, 1) */
	int e = x - 1 + bias;
	double mant;
	uint32_t bits;
	if (e <= 0) { /* subnormal */
		mant = ldexp(a, bias - 1 + mbits);
		e = 0;
	} else {
		mant = (f * 2 - 1) * (double)(1u << mbits);
	}
	if (mant != floor(mant) || e >= (1 << ebits) - (t == PERF_F8E4M3 ? 0 : 1))
		*exact = 0;
	bits = (sign << (ebits + mbits)) | ((uint32_t)e << mbits) |
	       ((uint32_t)mant & ((1u << mbits) - 1));
	return bits;
}

/* Element of a buffer of type t as a double (all pattern values are exact in a double). */
PERF_HD double perf_load(const void *buf, uint64_t i, int t)
{
	switch (t) {
	case PERF_INT8:
		return ((const int8_t *)buf)[i];
	case PERF_UINT8:
		return ((const uint8_t *)buf)[i];
	case PERF_INT32:
		return ((const int32_t *)buf)[i];
	case PERF_UINT32:
		return ((const uint32_t *)buf)[i];
	case PERF_INT64:
		return (double)((const int64_t *)buf)[i];
	case PERF_UINT64:
		return (double)((const uint64_t *)buf)[i];
	case PERF_FLOAT:
		return ((const float *)buf)[i];
	case PERF_DOUBLE:
		return ((const double *)buf)[i];
	case PERF_HALF:
	case PERF_BF16:
		return perf_small_float_decode(((const uint16_t *)buf)[i], t);
	default:
		return perf_small_float_decode(((const uint8_t *)buf)[i], t);
	}
}

/* Stores v (an exact pattern value) as element i of a buffer of type t. */
PERF_HD void perf_store(void *buf, uint64_t i, int t, int64_t v)
{
	int exact = 1;
	switch (t) {
	case PERF_INT8:
		((int8_t *)buf)[i] = (int8_t)v;
		break;
	case PERF_UINT8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	case PERF_INT32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case PERF_UINT32:
		((uint32_t *)buf)[i] = (uint32_t)v;
		break;
	case PERF_INT64:
		((int64_t *)buf)[i] = v;
		break;
	case PERF_UINT64:
		((uint64_t *)buf)[i] = (uint64_t)v;
		break;
	case PERF_FLOAT:
		((float *)buf)[i] = (float)v;
		break;
	case PERF_DOUBLE:
		((double *)buf)[i] = (double)v;
		break;
	case PERF_HALF:
	case PERF_BF16:
		((uint16_t *)buf)[i] = (uint16_t)perf_small_float_encode((double)v, t, &exact);
		break;
	default:
		((uint8_t *)buf)[i] = (uint8_t)perf_small_float_encode((double)v, t, &exact);
		break;
	}
}

/* What one check needs to know to produce any rank's input and any rank's expected
 * output; passed by value to the kernels. */
struct perf_pattern {
	int type, op, nranks;
	uint32_t seed;
	int64_t lo, hi; /* value range of an active rank's element */
	int active_mod; /* rank r takes part at index i when (r + i) % active_mod == 0 */
};

/* Chooses the value range for (type, op, nranks); seed changes from check to check so
 * that stale data from a previous iteration is never accepted. */
PERF_HD struct perf_pattern perf_pattern_make(int type, int op, int nranks, uint32_t seed)
{
	struct perf_pattern p;
	int64_t limit = perf_type_exact_limit(type);
	int64_t active;
	p.type = type, p.op = op, p.nranks = nranks, p.seed = seed;
	p.active_mod = 1;
	if (op == PERF_PROD) {
		int twos = perf_type_max_twos(type);
		p.active_mod = (nranks + twos - 1) / twos;
		p.lo = 1, p.hi = 2;
		return p;
	}
	if (op == PERF_MAX || op == PERF_MIN) {
		p.hi = limit;
		p.lo = perf_type_is_signed(type) ? -limit : 0;
		return p;
	}
	/* sum and avg: every partial sum of the active ranks stays within +-limit */
	if (nranks > limit)
		p.active_mod = (int)((nranks + limit - 1) / limit);
	active = (nranks + p.active_mod - 1) / p.active_mod;
	p.hi = limit / active;
	if (op == PERF_AVG) {
		/* small values keep the tolerance of a rounded 1/n below one contribution */
		if (p.hi > 4)
			p.hi = 4;
		p.lo = 0;
	} else {
		p.lo = perf_type_is_signed(type) ? -p.hi : 0;
	}
	return p;
}

PERF_HD uint32_t perf_hash(uint32_t seed, int rank, uint64_t i)
{
	uint64_t x = ((uint64_t)seed << 32) ^ ((uint64_t)(uint32_t)rank * 0x9E3779B97F4A7C15ull) ^
		     (i * 0xBF58476D1CE4E5B9ull);
	x ^= x >> 31;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 29;
	x *= 0xD6E8FEB86D2D5AF3ull;
	x ^= x >> 32;
	return (uint32_t)x;
}

/* Input element i of rank r. */
PERF_HD int64_t perf_value(const struct perf_pattern *p, int r, uint64_t i)
{
	uint32_t h = perf_hash(p->seed, r, i);
	int active = p->active_mod == 1 || (uint64_t)(r + i) % (uint64_t)p->active_mod == 0;
	if (p->op == PERF_PROD) {
		int64_t v = (active && (h & 1)) ? 2 : 1;
		return (perf_type_is_signed(p->type) && (h & 2)) ? -v : v;
	}
	if (!active)
		return 0;
	return p->lo + (int64_t)((h >> 2) % (uint64_t)(p->hi - p->lo + 1));
}

/* Reduction over all ranks of element i: exact for everything but float avg. */
PERF_HD double perf_reduce_expect(const struct perf_pattern *p, uint64_t i)
{
	int64_t acc = perf_value(p, 0, i);
	for (int r = 1; r < p->nranks; r++) {
		int64_t v = perf_value(p, r, i);
		switch (p->op) {
		case PERF_PROD:
			acc *= v;
			break;
		case PERF_MAX:
			acc = v > acc ? v : acc;
			break;
		case PERF_MIN:
			acc = v < acc ? v : acc;
			break;
		default:
			acc += v;
			break;
		}
	}
	if (p->op == PERF_AVG) {
		if (!perf_type_is_float(p->type))
			return (double)(acc / p->nranks);
		return (double)acc / p->nranks;
	}
	return (double)acc;
}

/* Allowed |got - expected|: 0 except float avg over a rank count that is not a power of
 * two, where NCCL's rounded 1/n gives an error of a few units in the last place of the
 * largest partial sum (hi * ranks / n <= 4 * ranks / n, so the tolerance stays below the
 * smallest contribution 1/n for half, float and double; for bfloat16 and fp8 it does not,
 * and a missing contribution may go unnoticed there). */
PERF_HD double perf_pattern_tolerance(const struct perf_pattern *p)
{
	int ebits, mbits;
	if (p->op != PERF_AVG || !perf_type_is_float(p->type) || (p->nranks & (p->nranks - 1)) == 0)
		return 0;
	perf_float_format(p->type, &ebits, &mbits);
	return ldexp((double)(p->hi + 1) * (p->nranks + 2), -mbits);
}

/* Geometry of one collective call, in elements, as nccl-tests lays it out. */
struct perf_geom {
	uint64_t sendcount, recvcount, paramcount;
	uint64_t send_inplace_off, recv_inplace_off; /* per rank, in elements */
};

/* Expected value of output element i (0 <= i < recvcount) of rank `rank`. */
PERF_HD double perf_expect(const struct perf_pattern *p, int coll, const struct perf_geom *g,
			   int rank, int root, uint64_t i)
{
	int n = p->nranks;
	switch (coll) {
	case PERF_ALLGATHER:
		return (double)perf_value(p, (int)(i / g->paramcount), i % g->paramcount);
	case PERF_REDUCESCATTER:
		return perf_reduce_expect(p, (uint64_t)rank * g->recvcount + i);
	case PERF_BROADCAST:
		return (double)perf_value(p, root, i);
	case PERF_ALLTOALL: {
		uint64_t j = i / g->paramcount;
		return (double)perf_value(p, (int)j,
					  (uint64_t)rank * g->paramcount + i % g->paramcount);
	}
	case PERF_SENDRECV:
		return (double)perf_value(p, (rank - 1 + n) % n, i);
	default: /* allreduce, reduce */
		return perf_reduce_expect(p, i);
	}
}

/* Whether output element value got matches expected value want. */
PERF_HD int perf_match(double got, double want, double tol)
{
	double d = got - want;
	if (got != got)
		return 0;
	return d <= tol && d >= -tol;
}

#endif
