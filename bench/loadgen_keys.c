/* Key ids for cairn-loadgen: uniform, or zipfian with the rejection-free
 * method of Gray et al. ("Quickly generating billion-record synthetic
 * databases", SIGMOD 1994) that YCSB's ZipfianGenerator also uses: after an
 * O(n) computation of zeta(n, theta), each draw costs one pow(). The rank is
 * then hashed (FNV-1a) onto the key space so that hot keys are not all
 * neighbours, which would otherwise put every hot key in the same 100-key
 * prefix. The hash makes a few ranks collide; the skew stays. */
#include "loadgen_keys.h"

#include <math.h>

uint64_t lg_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double lg_rng_unit(uint64_t *state)
{
    return (double)(lg_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t lg_rng_below(uint64_t *state, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)lg_rng_next(state) * n) >> 64);
}

static double zeta(uint64_t n, double theta)
{
    double s = 0;
    for (uint64_t i = 1; i <= n; i++)
        s += 1.0 / pow((double)i, theta);
    return s;
}

int lg_keygen_init(lg_keygen *g, uint64_t n, lg_dist dist, double theta)
{
    g->n = n;
    g->dist = dist;
    g->theta = theta;
    g->alpha = g->zetan = g->eta = g->half_pow_theta = 0;
    if (n == 0)
        return -1;
    if (dist == LG_DIST_UNIFORM)
        return 0;
    if (dist != LG_DIST_ZIPFIAN || !(theta > 0 && theta < 1))
        return -1;
    double zeta2 = zeta(2, theta);
    g->zetan = zeta(n, theta);
    g->alpha = 1.0 / (1.0 - theta);
    g->eta = (1.0 - pow(2.0 / (double)n, 1.0 - theta)) / (1.0 - zeta2 / g->zetan);
    g->half_pow_theta = 1.0 + pow(0.5, theta);
    return 0;
}

uint64_t lg_keygen_zipf_rank(const lg_keygen *g, uint64_t *rng)
{
    double u = lg_rng_unit(rng);
    double uz = u * g->zetan;
    if (uz < 1.0)
        return 0;
    if (uz < g->half_pow_theta)
        return g->n > 1 ? 1 : 0;
    uint64_t r = (uint64_t)((double)g->n * pow(g->eta * u - g->eta + 1.0, g->alpha));
    return r < g->n ? r : g->n - 1;
}

static uint64_t fnv1a64(uint64_t v)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) {
        h ^= v & 0xff;
        h *= 0x100000001b3ull;
        v >>= 8;
    }
    return h;
}

uint64_t lg_keygen_next(const lg_keygen *g, uint64_t *rng)
{
    if (g->dist == LG_DIST_UNIFORM)
        return lg_rng_below(rng, g->n);
    return fnv1a64(lg_keygen_zipf_rank(g, rng)) % g->n;
}

size_t lg_key_min_size(uint64_t n)
{
    size_t digits = 1;
    for (uint64_t v = n > 0 ? n - 1 : 0; v >= 10; v /= 10)
        digits++;
    return digits + 1;
}

void lg_key_format(char *out, size_t key_size, uint64_t id)
{
    out[0] = 'k';
    for (size_t i = key_size; i > 1; i--) {
        out[i - 1] = (char)('0' + id % 10);
        id /= 10;
    }
}
