/* Test double of struct r2cc_ar2_ops (see test_strategies_double.h). */
#include "tests/unit/test_strategies_double.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RENDEZVOUS_TIMEOUT_S 5
#define ERR_FAULT	     2	/* an injected failure (ncclSystemError) */
#define ERR_BROKEN	     99 /* timeout or mismatch: the test fails */

struct dbl_handle;

struct call {
	int kind;
	const void *send;
	void *recv;
	size_t count;
	int dtype, op, root;
	int color, key, ok;
	struct dbl_rank *who;
	int all_ok;
	struct dbl_handle *newh;
};

struct dcomm {
	struct dbl_world *w;
	int size;
	bool sub;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived, left, refs;
	bool departing;
	struct call slot[];
};

struct dbl_handle {
	struct dcomm *c;
	int rank;
};

struct dbl_world {
	int nranks;
	struct dcomm *world;
	struct dbl_handle *handles;
	pthread_mutex_t mu;
	bool failed;
	char why[256];
	int live_comms, live_streams, live_events;
};

struct dbl_event {
	uint64_t clock[DBL_MAX_OPS / 64];
	unsigned epoch;
};

struct dbl_istream {
	struct dbl_stream s;
	unsigned epoch;
};

/* ---- element arithmetic ---- */

struct fmt {
	int ebits, mbits, bias;
	bool ieee; /* all-ones exponent is Inf/NaN; else only S.1111.111 is NaN (e4m3) */
};

static const struct fmt F16 = {5, 10, 15, true}, BF16 = {8, 7, 127, true}, E4M3 = {4, 3, 7, false},
			E5M2 = {5, 2, 15, true};

static const struct fmt *fmt_of(int dtype)
{
	switch (dtype) {
	case R2CC_NCCL_FLOAT16:
		return &F16;
	case R2CC_NCCL_BFLOAT16:
		return &BF16;
	case R2CC_NCCL_FLOAT8E4M3:
		return &E4M3;
	case R2CC_NCCL_FLOAT8E5M2:
		return &E5M2;
	default:
		return NULL;
	}
}

static double fdecode(const struct fmt *f, uint32_t bits)
{
	int total = 1 + f->ebits + f->mbits, emax = (1 << f->ebits) - 1;
	uint32_t e = (bits >> f->mbits) & (uint32_t)emax, m = bits & ((1u << f->mbits) - 1);
	double v;

	if (f->ieee && e == (uint32_t)emax)
		v = m ? NAN : INFINITY;
	else if (!f->ieee && e == (uint32_t)emax && m == (1u << f->mbits) - 1)
		v = NAN;
	else if (e == 0)
		v = ldexp((double)m, 1 - f->bias - f->mbits);
	else
		v = ldexp((double)(m + (1u << f->mbits)), (int)e - f->bias - f->mbits);
	return (bits >> (total - 1)) & 1 ? -v : v;
}

static uint32_t fencode(const struct fmt *f, double x)
{
	int total = 1 + f->ebits + f->mbits, emax = (1 << f->ebits) - 1, ex;
	uint32_t sign = signbit(x) ? 1u << (total - 1) : 0, efield, m;
	uint32_t one = 1u << f->mbits;
	double a = fabs(x), q;

	if (isnan(x))
		return sign | ((uint32_t)emax << f->mbits) | (one - 1);
	if (a == 0)
		return sign;
	frexp(a, &ex);
	ex -= 1; /* a = 1.f * 2^ex */
	if (ex < 1 - f->bias)
		ex = 1 - f->bias;
	q = nearbyint(ldexp(a, f->mbits - ex)); /* round to nearest even */
	if (q >= 2.0 * one) {
		q = one;
		ex++;
	}
	if (q < one) {
		efield = 0;
		m = (uint32_t)q;
	} else {
		efield = (uint32_t)(ex + f->bias);
		m = (uint32_t)q - one;
	}
	if (f->ieee && efield >= (uint32_t)emax)
		return sign | ((uint32_t)emax << f->mbits); /* Inf */
	if (!f->ieee && (efield > (uint32_t)emax || (efield == (uint32_t)emax && m == one - 1)))
		return sign | ((uint32_t)emax << f->mbits) | (one - 2); /* saturate */
	return sign | (efield << f->mbits) | m;
}

bool dbl_is_float(int dtype)
{
	return dtype == R2CC_NCCL_FLOAT32 || dtype == R2CC_NCCL_FLOAT64 || fmt_of(dtype);
}

bool dbl_is_signed(int dtype)
{
	return dtype == R2CC_NCCL_INT8 || dtype == R2CC_NCCL_INT32 || dtype == R2CC_NCCL_INT64;
}

double dbl_decode(int dtype, const void *p)
{
	const struct fmt *f = fmt_of(dtype);
	uint16_t h = 0;
	float fl;
	double d;

	if (dtype == R2CC_NCCL_FLOAT32) {
		memcpy(&fl, p, 4);
		return fl;
	}
	if (dtype == R2CC_NCCL_FLOAT64) {
		memcpy(&d, p, 8);
		return d;
	}
	memcpy(&h, p, r2cc_nccl_type_size(dtype));
	return fdecode(f, h);
}

void dbl_encode(int dtype, double v, void *p)
{
	const struct fmt *f = fmt_of(dtype);
	uint16_t h;
	float fl = (float)v;

	if (dtype == R2CC_NCCL_FLOAT32) {
		memcpy(p, &fl, 4);
		return;
	}
	if (dtype == R2CC_NCCL_FLOAT64) {
		memcpy(p, &v, 8);
		return;
	}
	h = (uint16_t)fencode(f, v);
	memcpy(p, &h, r2cc_nccl_type_size(dtype)); /* little-endian low bytes */
}

static int64_t load_int(int dtype, const void *p)
{
	size_t n = r2cc_nccl_type_size(dtype);
	uint64_t u = 0;

	memcpy(&u, p, n);
	if (dbl_is_signed(dtype) && n < 8 && (u >> (8 * n - 1)) & 1)
		u |= ~0ull << (8 * n);
	return (int64_t)u;
}

static double fop(int op, double a, double b)
{
	switch (op) {
	case R2CC_NCCL_SUM:
		return a + b;
	case R2CC_NCCL_PROD:
		return a * b;
	case R2CC_NCCL_MAX:
		return a > b ? a : b;
	default:
		return a < b ? a : b;
	}
}

void dbl_reduce_elem(int dtype, int op, void *acc, const void *in)
{
	size_t n = r2cc_nccl_type_size(dtype);
	float fa, fb;
	int64_t a, b;
	uint64_t u;
	bool less;

	if (dtype == R2CC_NCCL_FLOAT32) {
		memcpy(&fa, acc, 4);
		memcpy(&fb, in, 4);
		fa = op == R2CC_NCCL_SUM    ? fa + fb
		     : op == R2CC_NCCL_PROD ? fa * fb
		     : op == R2CC_NCCL_MAX  ? (fa > fb ? fa : fb)
					    : (fa < fb ? fa : fb);
		memcpy(acc, &fa, 4);
		return;
	}
	if (dbl_is_float(dtype)) {
		dbl_encode(dtype, fop(op, dbl_decode(dtype, acc), dbl_decode(dtype, in)), acc);
		return;
	}
	a = load_int(dtype, acc);
	b = load_int(dtype, in);
	less = dbl_is_signed(dtype) ? a < b : (uint64_t)a < (uint64_t)b;
	switch (op) {
	case R2CC_NCCL_SUM:
		u = (uint64_t)a + (uint64_t)b;
		break;
	case R2CC_NCCL_PROD:
		u = (uint64_t)a * (uint64_t)b;
		break;
	case R2CC_NCCL_MAX:
		u = (uint64_t)(less ? b : a);
		break;
	default:
		u = (uint64_t)(less ? a : b);
		break;
	}
	memcpy(acc, &u, n);
}

/* ---- world and communicators ---- */

static void world_fail(struct dbl_world *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void world_fail(struct dbl_world *w, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&w->mu);
	if (!w->failed) {
		w->failed = true;
		va_start(ap, fmt);
		vsnprintf(w->why, sizeof(w->why), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&w->mu);
}

static void count_live(struct dbl_world *w, int *counter, int delta)
{
	pthread_mutex_lock(&w->mu);
	*counter += delta;
	pthread_mutex_unlock(&w->mu);
}

static struct dcomm *dcomm_new(struct dbl_world *w, int size, bool sub)
{
	struct dcomm *c = calloc(1, sizeof(*c) + sizeof(struct call) * (size_t)size);

	if (!c)
		abort();
	c->w = w;
	c->size = size;
	c->sub = sub;
	c->refs = size;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	return c;
}

static void dcomm_put(struct dcomm *c)
{
	bool last;

	pthread_mutex_lock(&c->mu);
	last = --c->refs == 0;
	pthread_mutex_unlock(&c->mu);
	if (last) {
		pthread_cond_destroy(&c->cv);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
}

struct dbl_world *dbl_world_new(int nranks)
{
	struct dbl_world *w = calloc(1, sizeof(*w));
	int i;

	if (!w)
		abort();
	w->nranks = nranks;
	pthread_mutex_init(&w->mu, NULL);
	w->world = dcomm_new(w, nranks, false);
	w->handles = calloc((size_t)nranks, sizeof(*w->handles));
	if (!w->handles)
		abort();
	for (i = 0; i < nranks; i++) {
		w->handles[i].c = w->world;
		w->handles[i].rank = i;
	}
	return w;
}

void dbl_world_free(struct dbl_world *w)
{
	int i;

	for (i = 0; i < w->nranks; i++)
		dcomm_put(w->world);
	free(w->handles);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

bool dbl_world_failed(struct dbl_world *w, char *why, size_t len)
{
	bool failed;

	pthread_mutex_lock(&w->mu);
	failed = w->failed;
	if (why && len)
		snprintf(why, len, "%s", w->why);
	pthread_mutex_unlock(&w->mu);
	return failed;
}

int dbl_live_comms(struct dbl_world *w)
{
	return __atomic_load_n(&w->live_comms, __ATOMIC_SEQ_CST);
}

int dbl_live_streams(struct dbl_world *w)
{
	return __atomic_load_n(&w->live_streams, __ATOMIC_SEQ_CST);
}

int dbl_live_events(struct dbl_world *w)
{
	return __atomic_load_n(&w->live_events, __ATOMIC_SEQ_CST);
}

static const char *const kind_name[] = {"allreduce", "reduce", "broadcast", "split", "agree"};

/* Called by the last rank to arrive, with c->mu held. */
static void complete(struct dcomm *c)
{
	struct call *s0 = &c->slot[0], *s;
	size_t esize = r2cc_nccl_type_size(s0->dtype), bytes = 0, e;
	unsigned char *tmp = NULL;
	int i, j, color;

	for (i = 1; i < c->size; i++) {
		s = &c->slot[i];
		if (s->kind != s0->kind ||
		    (s->kind <= DBL_BCAST &&
		     (s->count != s0->count || s->dtype != s0->dtype || s->root != s0->root ||
		      (s->kind != DBL_BCAST && s->op != s0->op)))) {
			world_fail(c->w,
				   "mismatch on a %d-rank comm: rank 0 issued %s(count %zu), rank "
				   "%d issued %s(count %zu)",
				   c->size, kind_name[s0->kind], s0->count, i, kind_name[s->kind],
				   s->count);
			return;
		}
	}
	if (s0->kind <= DBL_BCAST && (s0->root < 0 || s0->root >= c->size)) {
		world_fail(c->w, "%s with root %d on a %d-rank comm", kind_name[s0->kind], s0->root,
			   c->size);
		return;
	}
	if (s0->kind <= DBL_BCAST) {
		bytes = s0->count * esize;
		tmp = malloc(bytes ? bytes : 1);
		if (!tmp)
			abort();
	}
	switch (s0->kind) {
	case DBL_ALLREDUCE:
	case DBL_REDUCE:
		memcpy(tmp, s0->send, bytes);
		for (i = 1; i < c->size; i++)
			for (e = 0; e < s0->count; e++)
				dbl_reduce_elem(s0->dtype, s0->op, tmp + e * esize,
						(const unsigned char *)c->slot[i].send + e * esize);
		for (i = 0; i < c->size; i++)
			if (s0->kind == DBL_ALLREDUCE || i == s0->root)
				memcpy(c->slot[i].recv, tmp, bytes);
		break;
	case DBL_BCAST:
		memcpy(tmp, c->slot[s0->root].send, bytes);
		for (i = 0; i < c->size; i++)
			memcpy(c->slot[i].recv, tmp, bytes);
		break;
	case DBL_AGREE:
		for (i = 0; i < c->size; i++)
			s0->all_ok = s0->all_ok && c->slot[i].ok;
		for (i = 0; i < c->size; i++)
			c->slot[i].all_ok = s0->all_ok;
		break;
	case DBL_SPLIT:
		for (i = 0; i < c->size; i++)
			c->slot[i].newh = NULL;
		for (i = 0; i < c->size; i++) {
			int n = 0, *mem;
			struct dcomm *nc;

			color = c->slot[i].color;
			if (color == R2CC_NCCL_SPLIT_NOCOLOR || c->slot[i].newh)
				continue;
			mem = malloc(sizeof(int) * (size_t)c->size);
			if (!mem)
				abort();
			for (j = 0; j < c->size; j++)
				if (c->slot[j].color == color)
					mem[n++] = j;
			/* order by key, then parent rank (insertion sort) */
			for (j = 1; j < n; j++) {
				int v = mem[j], k = j;

				while (k > 0 && (c->slot[mem[k - 1]].key > c->slot[v].key ||
						 (c->slot[mem[k - 1]].key == c->slot[v].key &&
						  mem[k - 1] > v))) {
					mem[k] = mem[k - 1];
					k--;
				}
				mem[k] = v;
			}
			nc = dcomm_new(c->w, n, true);
			for (j = 0; j < n; j++) {
				struct dbl_handle *h = calloc(1, sizeof(*h));

				if (!h)
					abort();
				h->c = nc;
				h->rank = j;
				c->slot[mem[j]].newh = h;
			}
			free(mem);
		}
		break;
	}
	free(tmp);
}

/* The rendezvous: 0, or ERR_BROKEN after a timeout or mismatch. */
static int rendezvous(struct dbl_handle *h, struct call *in)
{
	struct dcomm *c = h->c;
	struct timespec dl;
	int ret = 0;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += RENDEZVOUS_TIMEOUT_S;
	pthread_mutex_lock(&c->mu);
	while (c->departing && !ret)
		ret = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
	if (ret)
		goto timeout;
	c->slot[h->rank] = *in;
	if (++c->arrived == c->size) {
		c->slot[0].all_ok = 1;
		complete(c);
		c->departing = true;
		pthread_cond_broadcast(&c->cv);
	} else {
		while (!c->departing && !ret)
			ret = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
		if (ret)
			goto timeout;
	}
	*in = c->slot[h->rank];
	if (++c->left == c->size) {
		c->arrived = 0;
		c->left = 0;
		c->departing = false;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return dbl_world_failed(c->w, NULL, 0) ? ERR_BROKEN : 0;

timeout:
	pthread_mutex_unlock(&c->mu);
	world_fail(c->w, "deadlock: rank %d of a %d-rank comm waited %ds in %s", h->rank, c->size,
		   RENDEZVOUS_TIMEOUT_S, kind_name[in->kind]);
	return ERR_BROKEN;
}

/* ---- order tracking ---- */

static void bit_set(uint64_t *set, int i)
{
	set[i / 64] |= 1ull << (i % 64);
}

static bool bit_has(const uint64_t *set, int i)
{
	return set[i / 64] >> (i % 64) & 1;
}

static unsigned epoch_of(const struct dbl_rank *r)
{
	return r->epoch;
}

/* A stream's clock; work left from an earlier call counts as the user's earlier work. */
static struct dbl_stream *clock_of(struct dbl_rank *r, void *stream)
{
	struct dbl_istream *is;

	if (stream == &r->user)
		return &r->user;
	is = stream;
	if (is->epoch != epoch_of(r)) {
		bool busy = false;

		for (size_t i = 0; i < DBL_MAX_OPS / 64; i++)
			busy |= is->s.clock[i] != 0;
		memset(is->s.clock, 0, sizeof(is->s.clock));
		if (busy)
			bit_set(is->s.clock, 0);
		is->epoch = epoch_of(r);
	}
	return &is->s;
}

static void note_error(struct dbl_rank *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note_error(struct dbl_rank *r, const char *fmt, ...)
{
	va_list ap;

	if (r->error[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->error, sizeof(r->error), fmt, ap);
	va_end(ap);
}

static void track(struct dbl_rank *r, void *stream, int kind, void *comm, size_t count,
		  uintptr_t rd0, uintptr_t rd1, uintptr_t wr0, uintptr_t wr1)
{
	struct dbl_stream *s = clock_of(r, stream);
	struct dbl_op *o;

	if (r->nops >= DBL_MAX_OPS) {
		note_error(r, "more than %d operations in one call", DBL_MAX_OPS);
		return;
	}
	o = &r->ops[r->nops];
	o->kind = kind;
	o->comm = comm;
	o->on_parent = comm == r->parent;
	o->count = count;
	o->rd[0][0] = rd0;
	o->rd[0][1] = rd1;
	o->wr[0][0] = wr0;
	o->wr[0][1] = wr1;
	memcpy(o->deps, s->clock, sizeof(o->deps));
	bit_set(s->clock, r->nops);
	r->nops++;
}

void dbl_begin(struct dbl_rank *r)
{
	r->epoch++;
	memset(&r->user, 0, sizeof(r->user));
	bit_set(r->user.clock, 0);
	r->nops = 1;
	memset(r->ncalls, 0, sizeof(r->ncalls));
	r->parent_allreduces = 0;
	r->parent_bcasts = 0;
}

static bool overlap(const uintptr_t *a, const uintptr_t *b)
{
	return a[0] < a[1] && b[0] < b[1] && a[0] < b[1] && b[0] < a[1];
}

int dbl_check_order(struct dbl_rank *r)
{
	struct dbl_op *a, *b;
	int i, j;

	if (r->error[0])
		return -1;
	for (i = 1; i < r->nops; i++) {
		a = &r->ops[i];
		if (!bit_has(a->deps, 0)) {
			note_error(r, "op %d (%s) does not follow the user's earlier work", i,
				   kind_name[a->kind]);
			return -1;
		}
		if (!bit_has(r->user.clock, i)) {
			note_error(r, "the user's stream does not wait for op %d (%s)", i,
				   kind_name[a->kind]);
			return -1;
		}
		for (j = i + 1; j < r->nops; j++) {
			b = &r->ops[j];
			if ((overlap(a->wr[0], b->rd[0]) || overlap(a->rd[0], b->wr[0]) ||
			     overlap(a->wr[0], b->wr[0])) &&
			    !bit_has(b->deps, i)) {
				note_error(r,
					   "op %d (%s) and op %d (%s) touch the same memory but "
					   "are not ordered by streams/events",
					   i, kind_name[a->kind], j, kind_name[b->kind]);
				return -1;
			}
		}
	}
	return 0;
}

/* ---- the ops ---- */

static int d_coll(struct dbl_rank *r, int kind, const void *send, void *recv, size_t count,
		  int dtype, int op, int root, void *comm, void *stream)
{
	struct dbl_handle *h = comm;
	struct call c = {.kind = kind,
			 .send = send,
			 .recv = recv,
			 .count = count,
			 .dtype = dtype,
			 .op = op,
			 .root = root,
			 .who = r};
	size_t bytes = count * r2cc_nccl_type_size(dtype);
	uintptr_t s = (uintptr_t)send, d = (uintptr_t)recv;
	bool root_me = h && h->rank == root;

	if (!h) {
		note_error(r, "%s on a NULL communicator", kind_name[kind]);
		return ERR_BROKEN;
	}
	if (!count) {
		note_error(r, "%s with count 0", kind_name[kind]);
		return ERR_BROKEN;
	}
	r->ncalls[kind]++;
	if (kind == DBL_ALLREDUCE && comm == r->parent)
		r->parent_allreduces++;
	if (kind == DBL_BCAST && comm == r->parent)
		r->parent_bcasts++;
	if (kind == DBL_ALLREDUCE)
		track(r, stream, kind, comm, count, s, s + bytes, d, d + bytes);
	else if (kind == DBL_REDUCE)
		track(r, stream, kind, comm, count, s, s + bytes, root_me ? d : 0,
		      root_me ? d + bytes : 0);
	else
		track(r, stream, kind, comm, count, root_me ? s : 0, root_me ? s + bytes : 0, d,
		      d + bytes);
	return rendezvous(h, &c);
}

static int d_allreduce(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
		       int op, void *comm, void *stream)
{
	return d_coll(ctx, DBL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0, comm, stream);
}

static int d_reduce(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype, int op,
		    int root, void *comm, void *stream)
{
	return d_coll(ctx, DBL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, comm, stream);
}

static int d_broadcast(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
		       int root, void *comm, void *stream)
{
	return d_coll(ctx, DBL_BCAST, sendbuf, recvbuf, count, dtype, 0, root, comm, stream);
}

static int d_comm_split(void *ctx, void *comm, int color, int key, void **newcomm)
{
	struct dbl_rank *r = ctx;
	struct call c = {.kind = DBL_SPLIT, .color = color, .key = key, .who = r};
	int ret;

	r->ncalls[DBL_SPLIT]++;
	*newcomm = NULL;
	ret = rendezvous(comm, &c);
	if (ret)
		return ret;
	if (c.newh && r->fail_split) {
		dcomm_put(c.newh->c);
		free(c.newh);
		c.newh = NULL;
	}
	if (r->fail_split)
		return ERR_FAULT;
	if (c.newh) {
		count_live(r->w, &r->w->live_comms, 1);
		__atomic_add_fetch(&r->live_subs, 1, __ATOMIC_SEQ_CST);
	}
	*newcomm = c.newh;
	return 0;
}

static int d_comm_destroy(void *ctx, void *comm)
{
	struct dbl_rank *r = ctx;
	struct dbl_handle *h = comm;

	if (!h || !h->c->sub) {
		note_error(r, "comm_destroy of %s", h ? "the parent" : "NULL");
		return ERR_BROKEN;
	}
	count_live(r->w, &r->w->live_comms, -1);
	__atomic_sub_fetch(&r->live_subs, 1, __ATOMIC_SEQ_CST);
	dcomm_put(h->c);
	free(h);
	return 0;
}

static uint64_t dbl_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int d_comm_abort(void *ctx, void *comm)
{
	struct dbl_rank *r = ctx;

	__atomic_add_fetch(&r->aborts, 1, __ATOMIC_SEQ_CST);
	if (r->abort_waits_for_all) {
		int flagged = __atomic_add_fetch(&r->flagged, 1, __ATOMIC_SEQ_CST);
		uint64_t t0 = dbl_now_ns();
		while (flagged < __atomic_load_n(&r->live_subs, __ATOMIC_SEQ_CST)) {
			if (dbl_now_ns() - t0 > 2000000000ull) {
				pthread_mutex_lock(&r->w->mu);
				note_error(r, "comm_abort waited 2 s for the kernels of a "
					      "sub-communicator not yet aborted");
				pthread_mutex_unlock(&r->w->mu);
				break;
			}
			usleep(1000);
			flagged = __atomic_load_n(&r->flagged, __ATOMIC_SEQ_CST);
		}
		/* destroyed: no longer counted among the flagged */
		__atomic_sub_fetch(&r->flagged, 1, __ATOMIC_SEQ_CST);
	}
	return d_comm_destroy(ctx, comm);
}

static int d_comm_async_error(void *ctx, void *comm, int *err)
{
	struct dbl_rank *r = ctx;

	*err = ((struct dbl_handle *)comm)->c->sub ? r->async_error : 0;
	return 0;
}

static int d_comm_count(void *ctx, void *comm, int *count)
{
	*count = ((struct dbl_handle *)comm)->c->size;
	return 0;
}

static int d_comm_user_rank(void *ctx, void *comm, int *rank)
{
	*rank = ((struct dbl_handle *)comm)->rank;
	return 0;
}

static int d_stream_create(void *ctx, void **stream)
{
	struct dbl_rank *r = ctx;
	struct dbl_istream *s;

	if (r->fail_stream_create)
		return ERR_FAULT;
	s = calloc(1, sizeof(*s));
	if (!s)
		abort();
	count_live(r->w, &r->w->live_streams, 1);
	*stream = s;
	return 0;
}

static int d_stream_destroy(void *ctx, void *stream)
{
	struct dbl_rank *r = ctx;

	count_live(r->w, &r->w->live_streams, -1);
	free(stream);
	return 0;
}

static int d_event_create(void *ctx, void **event)
{
	struct dbl_rank *r = ctx;
	struct dbl_event *e = calloc(1, sizeof(*e));

	if (!e)
		abort();
	count_live(r->w, &r->w->live_events, 1);
	*event = e;
	return 0;
}

static int d_event_destroy(void *ctx, void *event)
{
	struct dbl_rank *r = ctx;

	count_live(r->w, &r->w->live_events, -1);
	free(event);
	return 0;
}

static int d_event_record(void *ctx, void *event, void *stream)
{
	struct dbl_rank *r = ctx;
	struct dbl_event *e = event;

	memcpy(e->clock, clock_of(r, stream)->clock, sizeof(e->clock));
	e->epoch = epoch_of(r);
	return 0;
}

static int d_stream_wait_event(void *ctx, void *stream, void *event)
{
	struct dbl_rank *r = ctx;
	struct dbl_event *e = event;
	struct dbl_stream *s = clock_of(r, stream);
	size_t i;

	if (e->epoch != epoch_of(r)) {
		note_error(r, "wait on an event not recorded in this call");
		return 0;
	}
	for (i = 0; i < DBL_MAX_OPS / 64; i++)
		s->clock[i] |= e->clock[i];
	return 0;
}

static int d_agree(void *ctx, void *comm, int ok, int *all_ok)
{
	struct dbl_rank *r = ctx;
	struct call c = {.kind = DBL_AGREE, .ok = ok, .who = r};
	int ret;

	r->ncalls[DBL_AGREE]++;
	ret = rendezvous(comm, &c);
	if (ret)
		return ret;
	if (r->fail_agree)
		return ERR_FAULT;
	*all_ok = c.all_ok;
	return 0;
}

void dbl_rank_init(struct dbl_rank *r, struct dbl_world *w, int rank)
{
	memset(r, 0, sizeof(*r));
	r->w = w;
	r->rank = rank;
	r->parent = &w->handles[rank];
	dbl_begin(r);
}

struct r2cc_ar2_ops dbl_ops(struct dbl_rank *r)
{
	struct r2cc_ar2_ops ops = {
	    .ctx = r,
	    .allreduce = d_allreduce,
	    .reduce = d_reduce,
	    .broadcast = d_broadcast,
	    .comm_split = d_comm_split,
	    .comm_destroy = d_comm_destroy,
	    .comm_abort = d_comm_abort,
	    .comm_async_error = d_comm_async_error,
	    .comm_count = d_comm_count,
	    .comm_user_rank = d_comm_user_rank,
	    .stream_create = d_stream_create,
	    .stream_destroy = d_stream_destroy,
	    .event_create = d_event_create,
	    .event_record = d_event_record,
	    .event_destroy = d_event_destroy,
	    .stream_wait_event = d_stream_wait_event,
	    .agree = d_agree,
	};
	return ops;
}
