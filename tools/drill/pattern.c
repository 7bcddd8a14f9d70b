/*
 * What the drill sends: message sizes and byte patterns, both derived from
 * (seed, sender, receiver, sequence) alone, so that sender and receiver agree
 * without telling each other and any lost, duplicated, misplaced or corrupted byte
 * shows. Patterns are 64-bit words of a mixing function of the word's index.
 */
#include "tools/drill/drill.h"

#include <string.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* splitmix64's finaliser: cheap, and every input bit reaches every output bit. */
uint64_t drill_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t drill_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	return drill_mix(drill_mix(drill_mix(drill_mix(a) ^ b) ^ c) ^ d);
}

uint64_t drill_msg_key(uint64_t seed, int src, int dst, uint64_t seq)
{
	return drill_hash(seed ^ 0x5041545445524eull, (uint64_t)src, (uint64_t)dst, seq);
}

/*
 * Sizes from 0 B to `max`: zero-byte messages, tiny ones, the edges NCCL's
 * send path treats differently (128-byte chunk alignment, the 8 KiB adaptive
 * routing threshold), and a spread up to `max`.
 */
uint64_t drill_msg_size(uint64_t seed, int src, int dst, uint64_t seq, uint64_t max)
{
	static const uint64_t edges[] = {1, 127, 128, 129, 8191, 8192, 8193, 65536};
	uint64_t h = drill_hash(seed ^ 0x53495a45ull, (uint64_t)src, (uint64_t)dst, seq);
	uint64_t u = h % 100, r = drill_mix(h), s;

	if (u < 8)
		s = 0;
	else if (u < 16)
		s = u == 15 ? max : edges[r % (sizeof(edges) / sizeof(edges[0]))];
	else if (u < 36)
		s = 1 + r % 256;
	else if (u < 62)
		s = 257 + r % (64 * KIB - 256);
	else if (u < 90)
		s = 64 * KIB + r % (MIB - 64 * KIB);
	else
		s = max > MIB ? MIB + r % (max - MIB + 1) : r % (max + 1);
	return s < max ? s : max;
}

static uint64_t drill_word(uint64_t key, uint64_t i)
{
	return drill_mix(key + i * 0xd6e8feb86659fd93ull);
}

void drill_pattern_fill(void *buf, uint64_t len, uint64_t key)
{
	uint64_t *w = buf, n = len / 8, i, last;

	for (i = 0; i < n; i++)
		w[i] = drill_word(key, i);
	if (len % 8) {
		last = drill_word(key, n);
		memcpy((char *)buf + n * 8, &last, len % 8);
	}
}

uint64_t drill_pattern_check(const void *buf, uint64_t len, uint64_t key, uint64_t *first,
			     uint8_t *got, uint8_t *want)
{
	const uint64_t *w = buf;
	uint64_t n = len / 8, bad = 0;

	for (uint64_t i = 0; i <= n; i++) {
		uint64_t expect = drill_word(key, i), have = 0;
		unsigned bytes = i < n ? 8 : (unsigned)(len % 8);

		if (!bytes)
			break;
		if (i < n)
			have = w[i];
		else
			memcpy(&have, (const char *)buf + n * 8, bytes);
		if (bytes < 8) {
			uint64_t mask = (1ull << (8 * bytes)) - 1;

			have &= mask;
			expect &= mask;
		}
		if (have == expect)
			continue;
		for (unsigned b = 0; b < bytes; b++) {
			uint8_t hb = (uint8_t)(have >> (8 * b)), eb = (uint8_t)(expect >> (8 * b));

			if (hb == eb)
				continue;
			if (!bad) {
				*first = i * 8 + b;
				*got = hb;
				*want = eb;
			}
			bad++;
		}
	}
	return bad;
}

/* The ordered pairs take the NICs in turn, so that a process's send connections use
 * every NIC once it has as many peers as NICs; both ends agree. */
int drill_pair_nic(const struct drill_opts *o, int from, int to)
{
	return (from * (o->procs - 1) + (to > from ? to - 1 : to)) % o->nics;
}
