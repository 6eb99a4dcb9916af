/* Moments of float32 / float64 sub-blocks for simstore.stats, in three passes over each.
 *
 * simstore.stats summarises a field sub-block by sub-block: the values cast to float64,
 * their sum, the deviations from the sub-block's mean, the sum of their squares, and the
 * minimum and maximum. With NumPy that is seven passes over each sub-block (a cast, a
 * minimum, a maximum, a sum, a subtraction, a multiplication and a sum). This module
 * takes the bounds, then the sum, then the sum of squared deviations as it forms them,
 * each value cast to float64 as it is loaded: a field of one component is read where it
 * lies, a vector field's components are first split into rows of a scratch, in the
 * values' own type.
 *
 * The results are bit for bit those of the NumPy path (a test compares them on every
 * build): the sums follow NumPy's pairwise summation (blocks of up to 128 values over
 * eight accumulators, longer runs split in two at a multiple of eight), and every
 * deviation and square is rounded to float64 on its own (built with -ffp-contract=off:
 * no fused multiply-add).
 * Statistics are embedded in shards, so the same values must give the same bytes with
 * or without this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define BLOCK 128

/* NumPy's pairwise summation of n values as float64 (for float32 values, each cast on
 * its own: exact), written once for float64 and float32 arrays:
 *
 * - a leaf (n <= 128): eight accumulators a[0..7], then a[i + j] added to accumulator j
 *   for each whole group of eight, combined as NumPy does, then the rest one by one;
 *   with SSE2 the accumulators are four vectors of two lanes, each lane's additions the
 *   same, in the same order, so the result is too;
 * - longer runs split in two at a multiple of eight, the halves' sums added; two halves
 *   that are both leaves are summed side by side (``NAME##_pair``): each leaf's additions
 *   are the same as alone, but one leaf's four chains of additions bound a lone leaf at
 *   a vector per addition's latency, and the two leaves' chains do not wait for each
 *   other.
 *
 * ``SQ`` maps a value (as a double) before it is added, ``SQ_VEC`` two of them; ``LOADV``
 * loads two values as doubles. Summing float32 values straight from the array, not from
 * a float64 copy, reads 4 bytes a value instead of writing and reading 8 twice. */
#if defined(__SSE2__)
#define LOAD_DOUBLES(p) _mm_loadu_pd(p)
#define LOAD_FLOATS(p) \
    _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(p))))
#define ACC_INIT(v, a, LOADV, SQ_VEC)                                           \
    __m128d v##0 = SQ_VEC(LOADV(a + 0)), v##1 = SQ_VEC(LOADV(a + 2));          \
    __m128d v##2 = SQ_VEC(LOADV(a + 4)), v##3 = SQ_VEC(LOADV(a + 6));
#define ACC_ADD(v, a, i, LOADV, SQ_VEC)                                         \
    v##0 = _mm_add_pd(v##0, SQ_VEC(LOADV(a + (i) + 0)));                        \
    v##1 = _mm_add_pd(v##1, SQ_VEC(LOADV(a + (i) + 2)));                        \
    v##2 = _mm_add_pd(v##2, SQ_VEC(LOADV(a + (i) + 4)));                        \
    v##3 = _mm_add_pd(v##3, SQ_VEC(LOADV(a + (i) + 6)));
#define ACC_STORE(v, r)                                                         \
    double r[8];                                                                \
    _mm_storeu_pd(r + 0, v##0);                                                 \
    _mm_storeu_pd(r + 2, v##1);                                                 \
    _mm_storeu_pd(r + 4, v##2);                                                 \
    _mm_storeu_pd(r + 6, v##3);
#else
#define ACC_INIT(v, a, LOADV, SQ_VEC)                                           \
    double v[8];                                                                \
    for (int j_ = 0; j_ < 8; j_++) {                                            \
        v[j_] = SQ((double)(a)[j_]);                                            \
    }
#define ACC_ADD(v, a, i, LOADV, SQ_VEC)                                         \
    for (int j_ = 0; j_ < 8; j_++) {                                            \
        v[j_] += SQ((double)(a)[(i) + j_]);                                     \
    }
#define ACC_STORE(v, r) double *r = v;
#endif
#define ACC_RESULT(r) (((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])))

#define PAIRWISE(NAME, T, LOADV, SQ_VEC, SQ, ATTR)                                  \
    static ATTR double NAME##_pair(const T *a, Py_ssize_t na, const T *b,       \
                              Py_ssize_t nb, double mean)                       \
    {                                                                           \
        (void)mean;                                                             \
        ACC_INIT(va, a, LOADV, SQ_VEC)                                          \
        ACC_INIT(vb, b, LOADV, SQ_VEC)                                          \
        const Py_ssize_t wa = na - (na % 8), wb = nb - (nb % 8);                \
        Py_ssize_t i = 8;                                                       \
        for (; i < wa && i < wb; i += 8) {                                      \
            ACC_ADD(va, a, i, LOADV, SQ_VEC)                                    \
            ACC_ADD(vb, b, i, LOADV, SQ_VEC)                                    \
        }                                                                       \
        for (Py_ssize_t j = i; j < wa; j += 8) {                                \
            ACC_ADD(va, a, j, LOADV, SQ_VEC)                                    \
        }                                                                       \
        for (Py_ssize_t j = i; j < wb; j += 8) {                                \
            ACC_ADD(vb, b, j, LOADV, SQ_VEC)                                    \
        }                                                                       \
        ACC_STORE(va, r)                                                        \
        double ra = ACC_RESULT(r);                                              \
        for (Py_ssize_t j = wa; j < na; j++) {                                  \
            ra += SQ((double)a[j]);                                             \
        }                                                                       \
        ACC_STORE(vb, q)                                                        \
        double rb = ACC_RESULT(q);                                              \
        for (Py_ssize_t j = wb; j < nb; j++) {                                  \
            rb += SQ((double)b[j]);                                             \
        }                                                                       \
        return ra + rb;                                                         \
    }                                                                           \
    static ATTR double NAME(const T *a, Py_ssize_t n, double mean)             \
    {                                                                           \
        (void)mean;                                                             \
        if (n < 8) {                                                            \
            double res = -0.0;                                                  \
            for (Py_ssize_t k = 0; k < n; k++) {                                \
                res += SQ((double)a[k]);                                        \
            }                                                                   \
            return res;                                                         \
        }                                                                       \
        if (n <= BLOCK) {                                                       \
            ACC_INIT(va, a, LOADV, SQ_VEC)                                      \
            const Py_ssize_t whole = n - (n % 8);                               \
            for (Py_ssize_t i = 8; i < whole; i += 8) {                         \
                ACC_ADD(va, a, i, LOADV, SQ_VEC)                                \
            }                                                                   \
            ACC_STORE(va, r)                                                    \
            double res = ACC_RESULT(r);                                         \
            for (Py_ssize_t i = whole; i < n; i++) {                            \
                res += SQ((double)a[i]);                                        \
            }                                                                   \
            return res;                                                         \
        }                                                                       \
        Py_ssize_t half = n / 2;                                                \
        half -= half % 8;                                                       \
        if (n - half <= BLOCK) {                                                \
            return NAME##_pair(a, half, a + half, n - half, mean);              \
        }                                                                       \
        return NAME(a, half, mean) + NAME(a + half, n - half, mean);            \
    }

/* a value as it is; a value's squared deviation from ``mean``, each step rounded */
#define ID(x) (x)
#define SQ(x) (((x) - mean) * ((x) - mean))
#if defined(__SSE2__)
#define ID_VEC(v) (v)
#define SQ_VEC(v) sq_vec((v), mean)
static inline __m128d
sq_vec(__m128d v, double mean)
{
    const __m128d d = _mm_sub_pd(v, _mm_set1_pd(mean));
    return _mm_mul_pd(d, d);
}
#else
#define LOAD_DOUBLES(p) (p)
#define LOAD_FLOATS(p) (p)
#define ID_VEC(v) (v)
#define SQ_VEC(v) (v)
#endif

/* NumPy's pairwise sum of n doubles (or floats, as doubles), and of their squared
 * deviations from ``mean`` */
#define NO_ATTR
PAIRWISE(sum_plain, double, LOAD_DOUBLES, ID_VEC, ID, NO_ATTR)
PAIRWISE(sum_squares, double, LOAD_DOUBLES, SQ_VEC, SQ, NO_ATTR)
PAIRWISE(sum_plain_f, float, LOAD_FLOATS, ID_VEC, ID, NO_ATTR)
PAIRWISE(sum_squares_f, float, LOAD_FLOATS, SQ_VEC, SQ, NO_ATTR)

/* The same sums with AVX2, chosen when the CPU has it (``isa()``): the eight
 * accumulators are two vectors of four lanes, each lane's additions the same as with
 * SSE2 or none, in the same order, and every operation (a float32's cast to float64, a
 * subtraction, a multiplication, an addition) is IEEE's, rounded on its own (no fused
 * multiply-add: the target is "avx2" alone): the same bits on every CPU, half the
 * instructions. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))
#undef ACC_INIT
#undef ACC_ADD
#undef ACC_STORE
#define ACC_INIT(v, a, LOADV, SQ_VEC)                                           \
    __m256d v##0 = SQ_VEC(LOADV(a + 0)), v##1 = SQ_VEC(LOADV(a + 4));
#define ACC_ADD(v, a, i, LOADV, SQ_VEC)                                         \
    v##0 = _mm256_add_pd(v##0, SQ_VEC(LOADV(a + (i) + 0)));                     \
    v##1 = _mm256_add_pd(v##1, SQ_VEC(LOADV(a + (i) + 4)));
#define ACC_STORE(v, r)                                                         \
    double r[8];                                                                \
    _mm256_storeu_pd(r + 0, v##0);                                              \
    _mm256_storeu_pd(r + 4, v##1);
#define LOAD4_DOUBLES(p) _mm256_loadu_pd(p)
#define LOAD4_FLOATS(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#define SQ_VEC4(v) sq_vec4((v), mean)
static inline AVX2 __m256d
sq_vec4(__m256d v, double mean)
{
    const __m256d d = _mm256_sub_pd(v, _mm256_set1_pd(mean));
    return _mm256_mul_pd(d, d);
}
PAIRWISE(sum_plain_avx2, double, LOAD4_DOUBLES, ID_VEC, ID, AVX2)
PAIRWISE(sum_squares_avx2, double, LOAD4_DOUBLES, SQ_VEC4, SQ, AVX2)
PAIRWISE(sum_plain_f_avx2, float, LOAD4_FLOATS, ID_VEC, ID, AVX2)
PAIRWISE(sum_squares_f_avx2, float, LOAD4_FLOATS, SQ_VEC4, SQ, AVX2)
#endif

/* The kernels in use: AVX2's where the CPU has it, else SSE2's (or plain C's). */
#if defined(__SSE2__)
#define BASE_ISA "sse2"
#else
#define BASE_ISA "c"
#endif
typedef double (*sum_d)(const double *, Py_ssize_t, double);
typedef double (*sum_f)(const float *, Py_ssize_t, double);
typedef void (*bounds_f)(const float *, Py_ssize_t, float *, float *);
static void bounds_float(const float *x, Py_ssize_t n, float *lo, float *hi);
static struct {
    const char *name;
    sum_d plain, squares;
    sum_f plain_f, squares_f;
    bounds_f bounds;
} K = {BASE_ISA, sum_plain, sum_squares, sum_plain_f, sum_squares_f, bounds_float};


/* The minimum and maximum of n > 0 values. The minimum and maximum of values that hold
 * no NaN do not depend on the order they are taken in, but for the sign of a zero, which
 * the caller makes positive; the values hold no NaN when the sub-block is used (the
 * caller drops it when its sum is not finite). Four pairs of vector bounds over four
 * vectors a step: one pair's min and max each wait for the last (4 cycles on common
 * cores), so one pair bounds the loop at a vector a cycle. Written once for every vector
 * type (``W`` lanes of ``T``), as PAIRWISE is. */
#define BOUNDS(NAME, T, ATTR, VEC, W, SET1, LOAD, MIN, MAX, STORE)              \
    static ATTR void NAME(const T *x, Py_ssize_t n, T *lo, T *hi)              \
    {                                                                           \
        Py_ssize_t i = 0;                                                       \
        T l = x[0], h = x[0];                                                   \
        VEC vl = SET1(x[0]), vh = vl, vl1 = vl, vh1 = vl;                       \
        VEC vl2 = vl, vh2 = vl, vl3 = vl, vh3 = vl;                             \
        for (; i + 4 * (W) <= n; i += 4 * (W)) {                                \
            const VEC v0 = LOAD(x + i), v1 = LOAD(x + i + (W));                 \
            const VEC v2 = LOAD(x + i + 2 * (W)), v3 = LOAD(x + i + 3 * (W));   \
            vl = MIN(vl, v0);                                                   \
            vh = MAX(vh, v0);                                                   \
            vl1 = MIN(vl1, v1);                                                 \
            vh1 = MAX(vh1, v1);                                                 \
            vl2 = MIN(vl2, v2);                                                 \
            vh2 = MAX(vh2, v2);                                                 \
            vl3 = MIN(vl3, v3);                                                 \
            vh3 = MAX(vh3, v3);                                                 \
        }                                                                       \
        vl = MIN(MIN(vl, vl1), MIN(vl2, vl3));                                  \
        vh = MAX(MAX(vh, vh1), MAX(vh2, vh3));                                  \
        T lanes[W];                                                             \
        STORE(lanes, vl);                                                       \
        for (int j = 0; j < (W); j++) {                                         \
            l = lanes[j] < l ? lanes[j] : l;                                    \
        }                                                                       \
        STORE(lanes, vh);                                                       \
        for (int j = 0; j < (W); j++) {                                         \
            h = lanes[j] > h ? lanes[j] : h;                                    \
        }                                                                       \
        for (; i < n; i++) {                                                    \
            l = x[i] < l ? x[i] : l;                                            \
            h = x[i] > h ? x[i] : h;                                            \
        }                                                                       \
        *lo = l;                                                                \
        *hi = h;                                                                \
    }

#if defined(__SSE2__)
BOUNDS(bounds_float, float, NO_ATTR, __m128, 4, _mm_set1_ps, _mm_loadu_ps, _mm_min_ps,
       _mm_max_ps, _mm_storeu_ps)
BOUNDS(bounds_double, double, NO_ATTR, __m128d, 2, _mm_set1_pd, _mm_loadu_pd, _mm_min_pd,
       _mm_max_pd, _mm_storeu_pd)
#else
/* without SSE2, one value a step */
#define BOUNDS_C(NAME, T)                                                       \
    static void NAME(const T *x, Py_ssize_t n, T *lo, T *hi)                   \
    {                                                                           \
        T l = x[0], h = x[0];                                                   \
        for (Py_ssize_t i = 1; i < n; i++) {                                    \
            l = x[i] < l ? x[i] : l;                                            \
            h = x[i] > h ? x[i] : h;                                            \
        }                                                                       \
        *lo = l;                                                                \
        *hi = h;                                                                \
    }
BOUNDS_C(bounds_float, float)
BOUNDS_C(bounds_double, double)
#endif
#if defined(HAVE_AVX2)
BOUNDS(bounds_float_avx2, float, AVX2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps,
       _mm256_min_ps, _mm256_max_ps, _mm256_storeu_ps)
#endif

/* A sub-block of ``rows`` x ``k`` float32 values (k > 1, one row per point) split into
 * its components, still float32 (component c's values at out[c * rows ...]): each
 * component is then bounded and summed as a field of one component is, with every value
 * cast to float64 as it is loaded. With SSE2, k = 2 (planar vector fields) four rows at
 * a time in two loads and two shuffles, k = 3 (points, 3-D vectors) in three loads and
 * six shuffles. */
static void
split_float(const float *x, Py_ssize_t rows, int k, float *out)
{
    Py_ssize_t r = 0;
#if defined(__SSE2__)
    if (k == 2) {
        float *o0 = out, *o1 = out + rows;
        for (; r + 4 <= rows; r += 4) {
            const __m128 v0 = _mm_loadu_ps(x + 2 * r), v1 = _mm_loadu_ps(x + 2 * r + 4);
            _mm_storeu_ps(o0 + r, _mm_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm_storeu_ps(o1 + r, _mm_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
        }
    }
    else if (k == 3) {
        float *o0 = out, *o1 = out + rows, *o2 = out + 2 * rows;
        for (; r + 4 <= rows; r += 4) {
            /* a0 b0 c0 a1 | b1 c1 a2 b2 | c2 a3 b3 c3 */
            const float *p = x + 3 * r;
            const __m128 v0 = _mm_loadu_ps(p), v1 = _mm_loadu_ps(p + 4);
            const __m128 v2 = _mm_loadu_ps(p + 8);
            const __m128 u = _mm_shuffle_ps(v1, v2, _MM_SHUFFLE(0, 1, 0, 2)); /* a2 . a3 . */
            const __m128 q = _mm_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 0, 2, 1)); /* b0 c0 b1 b2 */
            const __m128 w = _mm_shuffle_ps(v1, v2, _MM_SHUFFLE(0, 2, 0, 3)); /* b2 . b3 . */
            const __m128 y = _mm_shuffle_ps(q, v1, _MM_SHUFFLE(1, 1, 1, 1)); /* c0 . c1 . */
            _mm_storeu_ps(o0 + r, _mm_shuffle_ps(v0, u, _MM_SHUFFLE(2, 0, 3, 0)));
            _mm_storeu_ps(o1 + r, _mm_shuffle_ps(q, w, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm_storeu_ps(o2 + r, _mm_shuffle_ps(y, v2, _MM_SHUFFLE(3, 0, 2, 0)));
        }
    }
#endif
    for (; r < rows; r++) {
        const float *row = x + r * k;
        for (int c = 0; c < k; c++) {
            out[c * rows + r] = row[c];
        }
    }
}

/* A sub-block of ``rows`` x ``k`` float64 values (k > 1) split into its components in
 * the scratch, as the NumPy path lays it out. */
static void
split_double(const double *x, Py_ssize_t rows, int k, double *out)
{
    for (Py_ssize_t r = 0; r < rows; r++) {
        const double *row = x + r * k;
        for (int c = 0; c < k; c++) {
            out[c * rows + r] = row[c];
        }
    }
}

static int
get(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    if (view->ndim > 1) {
        PyErr_Format(PyExc_ValueError, "%s must be one-dimensional", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static char
kind(const Py_buffer *view)
{
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') {
        f++;
    }
    if (f[1] != '\0') {
        return 0;
    }
    if (*f == 'f' && view->itemsize == 4) {
        return 'f';
    }
    if (*f == 'd' && view->itemsize == 8) {
        return 'd';
    }
    return 0;
}

PyDoc_STRVAR(sub_blocks_doc,
"sub_blocks(values, step, k, sums, m2s, mins, maxs, scratch) -> int\n\n"
"Summarise ``values`` (float32 or float64, contiguous, ``k`` components per row, 1 to 9)\n"
"sub-block by sub-block, ``step`` values each (a multiple of ``k``): ``sums[i * k + c]``,\n"
"``m2s[i * k + c]`` (float64) and ``mins[i * k + c]``, ``maxs[i * k + c]`` (the values'\n"
"type) of component c, for the leading sub-blocks whose sums and sums of squared\n"
"deviations are all finite. Returns how many those are. ``scratch``: float64, at least\n"
"``step`` values.");

static PyObject *
sub_blocks(PyObject *self, PyObject *args)
{
    PyObject *ov, *os, *om, *olo, *ohi, *osc;
    Py_ssize_t step;
    int comps;
    if (!PyArg_ParseTuple(args, "OniOOOOO", &ov, &step, &comps, &os, &om, &olo, &ohi, &osc)) {
        return NULL;
    }
    Py_buffer v, s, m, lo, hi, sc;
    if (get(ov, &v, 0, "values") < 0) {
        return NULL;
    }
    if (get(os, &s, 1, "sums") < 0) {
        goto fail_v;
    }
    if (get(om, &m, 1, "m2s") < 0) {
        goto fail_s;
    }
    if (get(olo, &lo, 1, "mins") < 0) {
        goto fail_m;
    }
    if (get(ohi, &hi, 1, "maxs") < 0) {
        goto fail_lo;
    }
    if (get(osc, &sc, 1, "scratch") < 0) {
        goto fail_hi;
    }
    const char k = kind(&v);
    const Py_ssize_t n = v.len / (v.itemsize ? v.itemsize : 1);
    const Py_ssize_t count = step > 0 ? (n + step - 1) / step : 0;
    if (k == 0 || kind(&lo) != k || kind(&hi) != k || kind(&s) != 'd' || kind(&m) != 'd'
        || kind(&sc) != 'd') {
        PyErr_SetString(PyExc_TypeError,
                        "sub_blocks: values and bounds must be float32 or float64 alike, "
                        "sums, m2s and scratch float64");
        goto fail;
    }
    if (comps < 1 || comps > 9 || step <= 0 || step % comps || n % comps || sc.len / 8 < step
        || s.len / 8 < count * comps || m.len / 8 < count * comps
        || lo.len / lo.itemsize < count * comps || hi.len / hi.itemsize < count * comps) {
        PyErr_SetString(PyExc_ValueError, "sub_blocks: step or buffer sizes do not fit");
        goto fail;
    }
    Py_ssize_t done = 0;
    double *sums = (double *)s.buf, *m2s = (double *)m.buf, *buf = (double *)sc.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && done == i; i++) {
        const Py_ssize_t start = i * step;
        const Py_ssize_t size = n - start < step ? n - start : step;
        const Py_ssize_t rows = size / comps;
        const Py_ssize_t at = i * comps;
        int finite = 1;
        /* each sum starts from 0.0, add.reduce's identity: a sum of negative zeros is
           +0.0. A field of one component is bounded and summed where it lies; the components
           of a vector field from their rows of the scratch */
        if (k == 'f') {
            const float *x = (const float *)v.buf + start;
            float *part = (float *)(void *)buf;
            if (comps > 1) {
                split_float(x, rows, comps, part);
                x = part;
            }
            for (int c = 0; c < comps; c++) {
                K.bounds(x + c * rows, rows, (float *)lo.buf + at + c, (float *)hi.buf + at + c);
                sums[at + c] = 0.0 + K.plain_f(x + c * rows, rows, 0.0);
                finite &= isfinite(sums[at + c]) != 0;
            }
            if (!finite) {
                break;
            }
            for (int c = 0; c < comps; c++) {
                m2s[at + c] = 0.0 + K.squares_f(x + c * rows, rows, sums[at + c] / (double)rows);
                finite &= isfinite(m2s[at + c]) != 0;
            }
        }
        else {
            const double *x = (const double *)v.buf + start;
            if (comps > 1) {
                split_double(x, rows, comps, buf);
                x = buf;
            }
            for (int c = 0; c < comps; c++) {
                bounds_double(x + c * rows, rows, (double *)lo.buf + at + c,
                              (double *)hi.buf + at + c);
                sums[at + c] = 0.0 + K.plain(x + c * rows, rows, 0.0);
                finite &= isfinite(sums[at + c]) != 0;
            }
            if (!finite) {
                break;
            }
            for (int c = 0; c < comps; c++) {
                m2s[at + c] = 0.0 + K.squares(x + c * rows, rows, sums[at + c] / (double)rows);
                finite &= isfinite(m2s[at + c]) != 0;
            }
        }
        if (finite) {
            done = i + 1;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sc);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    PyBuffer_Release(&m);
    PyBuffer_Release(&s);
    PyBuffer_Release(&v);
    return PyLong_FromSsize_t(done);
fail:
    PyBuffer_Release(&sc);
fail_hi:
    PyBuffer_Release(&hi);
fail_lo:
    PyBuffer_Release(&lo);
fail_m:
    PyBuffer_Release(&m);
fail_s:
    PyBuffer_Release(&s);
fail_v:
    PyBuffer_Release(&v);
    return NULL;
}

static int
choose(const char *name)
{
    if (strcmp(name, BASE_ISA) == 0) {
        K.name = BASE_ISA;
        K.plain = sum_plain;
        K.squares = sum_squares;
        K.plain_f = sum_plain_f;
        K.squares_f = sum_squares_f;
        K.bounds = bounds_float;
        return 0;
    }
#if defined(HAVE_AVX2)
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        K.name = "avx2";
        K.plain = sum_plain_avx2;
        K.squares = sum_squares_avx2;
        K.plain_f = sum_plain_f_avx2;
        K.squares_f = sum_squares_f_avx2;
        K.bounds = bounds_float_avx2;
        return 0;
    }
#endif
    return -1;
}

PyDoc_STRVAR(isa_doc,
"isa(name=None) -> str\n\n"
"The instruction set the sums use: \"avx2\" where the CPU has it, else \"sse2\" (\"c\"\n"
"off x86; the same bits in every case). With ``name``, use that one instead (ValueError\n"
"where this CPU or build lacks it); returns the one in use before.");

static PyObject *
isa(PyObject *self, PyObject *args)
{
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|z", &name)) {
        return NULL;
    }
    const char *before = K.name;
    if (name != NULL && choose(name) < 0) {
        PyErr_Format(PyExc_ValueError, "isa: %s is not available here", name);
        return NULL;
    }
    return PyUnicode_FromString(before);
}

static PyMethodDef methods[] = {
    {"sub_blocks", sub_blocks, METH_VARARGS, sub_blocks_doc},
    {"isa", isa, METH_VARARGS, isa_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_moments",
    "Two-pass moments of float sub-blocks, bit for bit as simstore.stats's NumPy path.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__moments(void)
{
    (void)choose("avx2");
    return PyModule_Create(&module);
}
