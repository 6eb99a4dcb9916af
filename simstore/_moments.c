/* Moments of float32 / float64 sub-blocks in two passes over each, for simstore.stats.
 *
 * simstore.stats summarises a field sub-block by sub-block: the values cast to float64,
 * their sum, the deviations from the sub-block's mean, the sum of their squares, and the
 * minimum and maximum. With NumPy that is seven passes over each sub-block (a cast, a
 * minimum, a maximum, a sum, a subtraction, a multiplication and a sum). This module
 * computes the same numbers in two: the first casts the values into a float64 scratch
 * while it takes their minimum and maximum (for float32 fields of more than three
 * components and float64 fields of more than one, over the scratch right after), then sums the scratch; the second sums the squared
 * deviations as it forms them.
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

/* The eight accumulators of a run of 8 to 128 values: a[0..7], then a[i + j] added to
 * accumulator j for each whole group of eight; ``res`` combines them as NumPy does. With
 * SSE2 the accumulators are four vectors of two lanes: each lane's additions are the
 * same, in the same order, so the result is too. ``SQ`` maps a loaded value. */
#if defined(__SSE2__)
#define LEAF(SQ_VEC, SQ)                                                        \
    __m128d v0 = SQ_VEC(_mm_loadu_pd(a + 0)), v1 = SQ_VEC(_mm_loadu_pd(a + 2)); \
    __m128d v2 = SQ_VEC(_mm_loadu_pd(a + 4)), v3 = SQ_VEC(_mm_loadu_pd(a + 6)); \
    Py_ssize_t i = 8;                                                           \
    const Py_ssize_t whole = n - (n % 8);                                       \
    for (; i < whole; i += 8) {                                                 \
        v0 = _mm_add_pd(v0, SQ_VEC(_mm_loadu_pd(a + i + 0)));                   \
        v1 = _mm_add_pd(v1, SQ_VEC(_mm_loadu_pd(a + i + 2)));                   \
        v2 = _mm_add_pd(v2, SQ_VEC(_mm_loadu_pd(a + i + 4)));                   \
        v3 = _mm_add_pd(v3, SQ_VEC(_mm_loadu_pd(a + i + 6)));                   \
    }                                                                           \
    double r[8];                                                                \
    _mm_storeu_pd(r + 0, v0);                                                   \
    _mm_storeu_pd(r + 2, v1);                                                   \
    _mm_storeu_pd(r + 4, v2);                                                   \
    _mm_storeu_pd(r + 6, v3);
#else
#define LEAF(SQ_VEC, SQ)                                                        \
    double r[8];                                                                \
    for (int j = 0; j < 8; j++) {                                               \
        r[j] = SQ(a[j]);                                                        \
    }                                                                           \
    Py_ssize_t i = 8;                                                           \
    const Py_ssize_t whole = n - (n % 8);                                       \
    for (; i < whole; i += 8) {                                                 \
        for (int j = 0; j < 8; j++) {                                           \
            r[j] += SQ(a[i + j]);                                               \
        }                                                                       \
    }
#endif

#define PAIRWISE(NAME, SQ_VEC, SQ)                                              \
    static double NAME(const double *a, Py_ssize_t n, double mean)             \
    {                                                                           \
        (void)mean;                                                             \
        if (n < 8) {                                                            \
            double res = -0.0;                                                  \
            for (Py_ssize_t k = 0; k < n; k++) {                                \
                res += SQ(a[k]);                                                \
            }                                                                   \
            return res;                                                         \
        }                                                                       \
        if (n <= BLOCK) {                                                       \
            LEAF(SQ_VEC, SQ)                                                    \
            double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])); \
            for (; i < n; i++) {                                                \
                res += SQ(a[i]);                                                \
            }                                                                   \
            return res;                                                         \
        }                                                                       \
        Py_ssize_t half = n / 2;                                                \
        half -= half % 8;                                                       \
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
#define ID_VEC(v) (v)
#define SQ_VEC(v) (v)
#endif

/* NumPy's pairwise sum of n doubles, and of their squared deviations from ``mean`` */
PAIRWISE(sum_plain, ID_VEC, ID)
PAIRWISE(sum_squares, SQ_VEC, SQ)

/* add.reduce starts from add's identity, +0.0: a sum of negative zeros is +0.0 */
static double
reduce_plain(const double *a, Py_ssize_t n)
{
    return 0.0 + sum_plain(a, n, 0.0);
}

static double
reduce_squares(const double *a, Py_ssize_t n, double mean)
{
    return 0.0 + sum_squares(a, n, mean);
}

/* Casts one sub-block into the scratch and takes its bounds. The minimum and maximum of
 * values that hold no NaN do not depend on the order they are taken in, but for the sign
 * of a zero, which the caller makes positive; the values hold no NaN when the sub-block
 * is used (the caller drops it when its sum is not finite). */
static void
cast_bounds_float(const float *x, Py_ssize_t n, double *out, float *lo, float *hi)
{
    Py_ssize_t i = 0;
    float l = x[0], h = x[0];
#if defined(__SSE2__)
    __m128 vl = _mm_set1_ps(x[0]), vh = vl;
    /* four pairs of bounds over 16 values a step: one pair's min and max each wait for
       the last (4 cycles on common cores), so one pair bounds the loop at a value a cycle;
       the order in which values are compared does not change a min or max of numbers,
       and a NaN is caught by the sums, whose block NumPy then redoes */
    __m128 vl1 = vl, vh1 = vl, vl2 = vl, vh2 = vl, vl3 = vl, vh3 = vl;
    for (; i + 16 <= n; i += 16) {
        const __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
        const __m128 v2 = _mm_loadu_ps(x + i + 8), v3 = _mm_loadu_ps(x + i + 12);
        vl = _mm_min_ps(vl, v0);
        vh = _mm_max_ps(vh, v0);
        vl1 = _mm_min_ps(vl1, v1);
        vh1 = _mm_max_ps(vh1, v1);
        vl2 = _mm_min_ps(vl2, v2);
        vh2 = _mm_max_ps(vh2, v2);
        vl3 = _mm_min_ps(vl3, v3);
        vh3 = _mm_max_ps(vh3, v3);
        _mm_storeu_pd(out + i, _mm_cvtps_pd(v0));
        _mm_storeu_pd(out + i + 2, _mm_cvtps_pd(_mm_movehl_ps(v0, v0)));
        _mm_storeu_pd(out + i + 4, _mm_cvtps_pd(v1));
        _mm_storeu_pd(out + i + 6, _mm_cvtps_pd(_mm_movehl_ps(v1, v1)));
        _mm_storeu_pd(out + i + 8, _mm_cvtps_pd(v2));
        _mm_storeu_pd(out + i + 10, _mm_cvtps_pd(_mm_movehl_ps(v2, v2)));
        _mm_storeu_pd(out + i + 12, _mm_cvtps_pd(v3));
        _mm_storeu_pd(out + i + 14, _mm_cvtps_pd(_mm_movehl_ps(v3, v3)));
    }
    vl = _mm_min_ps(_mm_min_ps(vl, vl1), _mm_min_ps(vl2, vl3));
    vh = _mm_max_ps(_mm_max_ps(vh, vh1), _mm_max_ps(vh2, vh3));
    for (; i + 4 <= n; i += 4) {
        const __m128 v = _mm_loadu_ps(x + i);
        vl = _mm_min_ps(vl, v);
        vh = _mm_max_ps(vh, v);
        _mm_storeu_pd(out + i, _mm_cvtps_pd(v));
        _mm_storeu_pd(out + i + 2, _mm_cvtps_pd(_mm_movehl_ps(v, v)));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, vl);
    for (int j = 0; j < 4; j++) {
        l = lanes[j] < l ? lanes[j] : l;
    }
    _mm_storeu_ps(lanes, vh);
    for (int j = 0; j < 4; j++) {
        h = lanes[j] > h ? lanes[j] : h;
    }
#endif
    for (; i < n; i++) {
        const float v = x[i];
        out[i] = (double)v;
        l = v < l ? v : l;
        h = v > h ? v : h;
    }
    *lo = l;
    *hi = h;
}

/* The minimum and maximum of n > 0 doubles, with four pairs of bounds side by side (see
 * cast_bounds_float). */
static void
bounds_double(const double *x, Py_ssize_t n, double *lo, double *hi)
{
    Py_ssize_t i = 0;
    double l = x[0], h = x[0];
#if defined(__SSE2__)
    __m128d vl = _mm_set1_pd(x[0]), vh = vl, vl1 = vl, vh1 = vl, vl2 = vl, vh2 = vl;
    __m128d vl3 = vl, vh3 = vl;
    for (; i + 8 <= n; i += 8) {
        const __m128d v0 = _mm_loadu_pd(x + i), v1 = _mm_loadu_pd(x + i + 2);
        const __m128d v2 = _mm_loadu_pd(x + i + 4), v3 = _mm_loadu_pd(x + i + 6);
        vl = _mm_min_pd(vl, v0);
        vh = _mm_max_pd(vh, v0);
        vl1 = _mm_min_pd(vl1, v1);
        vh1 = _mm_max_pd(vh1, v1);
        vl2 = _mm_min_pd(vl2, v2);
        vh2 = _mm_max_pd(vh2, v2);
        vl3 = _mm_min_pd(vl3, v3);
        vh3 = _mm_max_pd(vh3, v3);
    }
    vl = _mm_min_pd(_mm_min_pd(vl, vl1), _mm_min_pd(vl2, vl3));
    vh = _mm_max_pd(_mm_max_pd(vh, vh1), _mm_max_pd(vh2, vh3));
    double lanes[2];
    _mm_storeu_pd(lanes, vl);
    l = lanes[0] < lanes[1] ? lanes[0] : lanes[1];
    _mm_storeu_pd(lanes, vh);
    h = lanes[0] > lanes[1] ? lanes[0] : lanes[1];
#endif
    for (; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    *lo = l;
    *hi = h;
}

/* float64 values need no cast: copied into the scratch (which the sums read from the
 * CPU's cache), their bounds taken over the copy. */
static void
cast_bounds_double(const double *x, Py_ssize_t n, double *out, double *lo, double *hi)
{
    memcpy(out, x, (size_t)n * sizeof(double));
    bounds_double(out, n, lo, hi);
}

/* A sub-block of ``rows`` x ``k`` values (k > 1, one row per point) cast component by
 * component into the scratch (component c's values at out[c * rows ...]), as the NumPy
 * path lays it out; then each component's bounds, taken over its row of the scratch
 * (the cast is exact, so the bounds are the values'). Bounds taken in the casting loop,
 * a chain of comparisons per component, ran at about NumPy's speed. */
#define CAST_COMPONENTS(TYPE)                                                   \
    static void cast_components_##TYPE(const TYPE *x, Py_ssize_t rows, int k,  \
                                       double *out, TYPE *lo, TYPE *hi)         \
    {                                                                           \
        for (Py_ssize_t r = 0; r < rows; r++) {                                 \
            const TYPE *row = x + r * k;                                        \
            for (int c = 0; c < k; c++) {                                       \
                out[c * rows + r] = (double)row[c];                             \
            }                                                                   \
        }                                                                       \
        for (int c = 0; c < k; c++) {                                           \
            double l, h;                                                        \
            bounds_double(out + c * rows, rows, &l, &h);                        \
            lo[c] = (TYPE)l;                                                    \
            hi[c] = (TYPE)h;                                                    \
        }                                                                       \
    }

CAST_COMPONENTS(float)
CAST_COMPONENTS(double)

/* k = 2 (a planar vector field) with SSE2: two rows of float32 per load, split into
 * their components. */
static void
cast_pairs_float(const float *x, Py_ssize_t rows, double *out, float *lo, float *hi)
{
    Py_ssize_t r = 0;
    double *out0 = out, *out1 = out + rows;
    float l0 = x[0], h0 = x[0], l1 = x[1], h1 = x[1];
#if defined(__SSE2__)
    __m128 vl = _mm_setr_ps(x[0], x[1], x[0], x[1]), vh = vl;
    __m128 vl1 = vl, vh1 = vl; /* two pairs of bounds: see cast_bounds_float */
    for (; r + 4 <= rows; r += 4) {
        const __m128 v0 = _mm_loadu_ps(x + 2 * r), v1 = _mm_loadu_ps(x + 2 * r + 4);
        vl = _mm_min_ps(vl, v0);
        vh = _mm_max_ps(vh, v0);
        vl1 = _mm_min_ps(vl1, v1);
        vh1 = _mm_max_ps(vh1, v1);
        const __m128 s0 = _mm_shuffle_ps(v0, v0, _MM_SHUFFLE(3, 1, 2, 0));
        const __m128 s1 = _mm_shuffle_ps(v1, v1, _MM_SHUFFLE(3, 1, 2, 0));
        _mm_storeu_pd(out0 + r, _mm_cvtps_pd(s0));
        _mm_storeu_pd(out1 + r, _mm_cvtps_pd(_mm_movehl_ps(s0, s0)));
        _mm_storeu_pd(out0 + r + 2, _mm_cvtps_pd(s1));
        _mm_storeu_pd(out1 + r + 2, _mm_cvtps_pd(_mm_movehl_ps(s1, s1)));
    }
    vl = _mm_min_ps(vl, vl1);
    vh = _mm_max_ps(vh, vh1);
    for (; r + 2 <= rows; r += 2) {
        const __m128 v = _mm_loadu_ps(x + 2 * r); /* a0 b0 a1 b1 */
        vl = _mm_min_ps(vl, v);
        vh = _mm_max_ps(vh, v);
        const __m128 split = _mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 1, 2, 0)); /* a0 a1 b0 b1 */
        _mm_storeu_pd(out0 + r, _mm_cvtps_pd(split));
        _mm_storeu_pd(out1 + r, _mm_cvtps_pd(_mm_movehl_ps(split, split)));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, vl);
    l0 = lanes[0] < lanes[2] ? lanes[0] : lanes[2];
    l1 = lanes[1] < lanes[3] ? lanes[1] : lanes[3];
    _mm_storeu_ps(lanes, vh);
    h0 = lanes[0] > lanes[2] ? lanes[0] : lanes[2];
    h1 = lanes[1] > lanes[3] ? lanes[1] : lanes[3];
#endif
    for (; r < rows; r++) {
        const float a = x[2 * r], b = x[2 * r + 1];
        out0[r] = (double)a;
        out1[r] = (double)b;
        l0 = a < l0 ? a : l0;
        h0 = a > h0 ? a : h0;
        l1 = b < l1 ? b : l1;
        h1 = b > h1 ? b : h1;
    }
    lo[0] = l0;
    hi[0] = h0;
    lo[1] = l1;
    hi[1] = h1;
}

/* k = 3 (points, 3-D vectors) with SSE2: four rows, twelve values, in three loads
 * (a0 b0 c0 a1 | b1 c1 a2 b2 | c2 a3 b3 c3): each load's lanes always hold the same
 * components, so three pairs of vector bounds serve them and are sorted out by lane at
 * the end; the values go out to the three component rows as doubles, one by one (the
 * generic loop, with k unknown to the compiler, ran at a quarter of this speed). */
static void
cast_triples_float(const float *x, Py_ssize_t rows, double *out, float *lo, float *hi)
{
    Py_ssize_t r = 0;
    double *o0 = out, *o1 = out + rows, *o2 = out + 2 * rows;
    float l[3] = {x[0], x[1], x[2]}, h[3] = {x[0], x[1], x[2]};
#if defined(__SSE2__)
    if (rows >= 4) {
        __m128 l0 = _mm_loadu_ps(x), l1 = _mm_loadu_ps(x + 4), l2 = _mm_loadu_ps(x + 8);
        __m128 h0 = l0, h1 = l1, h2 = l2;
        for (; r + 4 <= rows; r += 4) {
            const float *p = x + 3 * r;
            const __m128 v0 = _mm_loadu_ps(p), v1 = _mm_loadu_ps(p + 4);
            const __m128 v2 = _mm_loadu_ps(p + 8);
            l0 = _mm_min_ps(l0, v0);
            h0 = _mm_max_ps(h0, v0);
            l1 = _mm_min_ps(l1, v1);
            h1 = _mm_max_ps(h1, v1);
            l2 = _mm_min_ps(l2, v2);
            h2 = _mm_max_ps(h2, v2);
            for (int j = 0; j < 4; j++) {
                o0[r + j] = (double)p[3 * j];
                o1[r + j] = (double)p[3 * j + 1];
                o2[r + j] = (double)p[3 * j + 2];
            }
        }
        float lows[12], highs[12];
        _mm_storeu_ps(lows, l0);
        _mm_storeu_ps(lows + 4, l1);
        _mm_storeu_ps(lows + 8, l2);
        _mm_storeu_ps(highs, h0);
        _mm_storeu_ps(highs + 4, h1);
        _mm_storeu_ps(highs + 8, h2);
        for (int j = 0; j < 12; j++) { /* lane j holds component j % 3 */
            const int c = j % 3;
            l[c] = lows[j] < l[c] ? lows[j] : l[c];
            h[c] = highs[j] > h[c] ? highs[j] : h[c];
        }
    }
#endif
    for (; r < rows; r++) {
        const float *p = x + 3 * r;
        for (int c = 0; c < 3; c++) {
            const float v = p[c];
            out[c * rows + r] = (double)v;
            l[c] = v < l[c] ? v : l[c];
            h[c] = v > h[c] ? v : h[c];
        }
    }
    for (int c = 0; c < 3; c++) {
        lo[c] = l[c];
        hi[c] = h[c];
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
        if (k == 'f') {
            const float *x = (const float *)v.buf + start;
            float *l = (float *)lo.buf + at, *h = (float *)hi.buf + at;
            if (comps == 1) {
                cast_bounds_float(x, rows, buf, l, h);
            }
            else if (comps == 2) {
                cast_pairs_float(x, rows, buf, l, h);
            }
            else if (comps == 3) {
                cast_triples_float(x, rows, buf, l, h);
            }
            else {
                cast_components_float(x, rows, comps, buf, l, h);
            }
        }
        else {
            const double *x = (const double *)v.buf + start;
            double *l = (double *)lo.buf + at, *h = (double *)hi.buf + at;
            if (comps == 1) {
                cast_bounds_double(x, rows, buf, l, h);
            }
            else {
                cast_components_double(x, rows, comps, buf, l, h);
            }
        }
        int finite = 1;
        for (int c = 0; c < comps; c++) {
            sums[at + c] = reduce_plain(buf + c * rows, rows);
            finite &= isfinite(sums[at + c]) != 0;
        }
        if (!finite) {
            break;
        }
        for (int c = 0; c < comps; c++) {
            m2s[at + c] = reduce_squares(buf + c * rows, rows, sums[at + c] / (double)rows);
            finite &= isfinite(m2s[at + c]) != 0;
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

static PyMethodDef methods[] = {
    {"sub_blocks", sub_blocks, METH_VARARGS, sub_blocks_doc},
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
    return PyModule_Create(&module);
}
