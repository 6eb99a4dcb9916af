/* Fixed-width rows copied from a mapped shard file into a batch's buffer.
 *
 * A Parquet shard stores a fixed-shape tensor field as a byte column whose plain,
 * uncompressed pages hold each row as a 4-byte little-endian length and the row's bytes.
 * The loader reads such a column without decoding it: it knows where each row's bytes
 * start in the file and copies them into the batch. With NumPy that copy is a fancy
 * index of a strided view of the mapped file, which gathers the rows into a temporary
 * and then scatters the temporary into the batch: twice the memory written, and in a
 * new process the temporary is fresh memory to fault in. Here each row is copied once,
 * from the mapped file to its row of the batch, with the interpreter released.
 *
 * gather(src, offsets, width, dst, slots, check) -> bool
 *
 *   src      a readable buffer (the mapped file);
 *   offsets  int64, C-contiguous: where row i's bytes start in src;
 *   width    the bytes of every row;
 *   dst      a writable C-contiguous buffer of whole rows of ``width`` bytes;
 *   slots    int64, C-contiguous, as long as offsets: row i goes to row slots[i] of dst;
 *   check    also check that the 4 bytes before each row hold ``width`` (little-endian).
 *
 * Every offset and slot is checked before any byte is copied: one out of range raises
 * IndexError (as indexing the view would), and a failed length check returns False
 * with dst untouched (the caller then decodes the column instead).
 *
 * unshuffle(src, dst, elementsize) -> None
 *
 *   Undo a byte shuffle (numcodecs' Shuffle(elementsize) layout, which compressed shards
 *   store a tensor's bytes in): byte i of plane j (src[j * n + i]) goes to byte j of
 *   element i (dst[i * elementsize + j]), n = len(src) / elementsize. Done here so that a
 *   read does not import numcodecs (9-10 ms, inside a fresh process's first batch).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
int64_buffer(PyObject *obj, Py_buffer *view, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (view->itemsize != 8 || view->format == NULL
        || !(strcmp(view->format, "q") == 0 || strcmp(view->format, "l") == 0
             || strcmp(view->format, "<q") == 0 || strcmp(view->format, "=q") == 0
             || strcmp(view->format, "<l") == 0 || strcmp(view->format, "=l") == 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int64 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
        | ((uint32_t)p[3] << 24);
}

PyDoc_STRVAR(gather_doc,
"gather(src, offsets, width, dst, slots, check) -> bool\n\n"
"Copy row i (width bytes at offsets[i] of src) to row slots[i] of dst. With check, first\n"
"check that the 4 bytes before each row hold width (little-endian): False, and nothing\n"
"copied, if one does not. An offset or slot out of range raises IndexError.");

static PyObject *
gather(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *off_obj, *dst_obj, *slot_obj;
    Py_ssize_t width;
    int check;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnOOp", &src_obj, &off_obj, &width, &dst_obj, &slot_obj,
                          &check)) {
        return NULL;
    }
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "width must be positive");
        return NULL;
    }
    Py_buffer src, off, dst, slot;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (int64_buffer(off_obj, &off, "offsets") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&off);
        PyBuffer_Release(&src);
        return NULL;
    }
    if (int64_buffer(slot_obj, &slot, "slots") < 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&off);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *own = NULL;
    Py_ssize_t n = off.len / 8;
    Py_ssize_t rows = dst.len / width;
    const int64_t *at;
    const int64_t *to;
    const unsigned char *from = (const unsigned char *)src.buf;
    unsigned char *into = (unsigned char *)dst.buf;
    if (slot.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "offsets and slots differ in length");
        goto done;
    }
    if (dst.len % width != 0) {
        PyErr_SetString(PyExc_ValueError, "dst is not a whole number of rows");
        goto done;
    }
    /* The offsets and slots are checked, then used, from a private copy taken while the
     * interpreter is held: the caller's arrays may lie in dst (a row copied would then
     * change a slot already checked) or be changed by another thread meanwhile, and a
     * value used unchecked writes or reads outside the buffers. */
    own = PyMem_Malloc(n > 0 ? (size_t)n * 16 : 1);
    if (own == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(own, off.buf, (size_t)n * 8);
    memcpy(own + n, slot.buf, (size_t)n * 8);
    at = own;
    to = own + n;
    Py_ssize_t bad = -1;
    int kind = 0; /* 1: offset out of range, 2: slot out of range, 3: length mismatch */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && kind == 0; i++) {
        int64_t a = at[i];
        if (a < (check ? 4 : 0) || a > (int64_t)src.len - (int64_t)width) {
            kind = 1;
        } else if (to[i] < 0 || to[i] >= rows) {
            kind = 2;
        } else if (check && le32(from + a - 4) != (uint32_t)width) {
            kind = 3;
        }
        if (kind) {
            bad = i;
        }
    }
    if (kind == 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            memcpy(into + (size_t)to[i] * (size_t)width, from + at[i], (size_t)width);
        }
    }
    Py_END_ALLOW_THREADS
    if (kind == 1) {
        PyErr_Format(PyExc_IndexError, "row %zd: %lld bytes at offset %lld are outside the "
                     "%zd bytes of the source", bad, (long long)width, (long long)at[bad],
                     src.len);
    } else if (kind == 2) {
        PyErr_Format(PyExc_IndexError, "row %zd: slot %lld is outside the %zd rows of dst",
                     bad, (long long)to[bad], rows);
    } else {
        result = PyBool_FromLong(kind == 0);
    }
done:
    PyMem_Free(own);
    PyBuffer_Release(&slot);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&off);
    PyBuffer_Release(&src);
    return result;
}

/* Element-major: each element's bytes gathered from the planes and written in order; with
 * K a constant the compiler unrolls and vectorises it (4 MiB of float32: 0.09 ms, against
 * 1.1 ms plane by plane). */
#define UNSHUFFLE(K)                                                                      \
    for (Py_ssize_t i_ = 0; i_ < n; i_++) {                                              \
        for (Py_ssize_t j_ = 0; j_ < (K); j_++) {                                        \
            to[(K) * i_ + j_] = from[j_ * n + i_];                                       \
        }                                                                                \
    }

PyDoc_STRVAR(unshuffle_doc,
"unshuffle(src, dst, elementsize) -> None\n\n"
"Undo numcodecs' Shuffle(elementsize): src[j * n + i] -> dst[i * elementsize + j], n =\n"
"len(src) / elementsize. src and dst are C-contiguous buffers of the same length, a\n"
"whole number of elements (ValueError otherwise).");

static PyObject *
unshuffle(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *dst_obj;
    Py_ssize_t size;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOn", &src_obj, &dst_obj, &size)) {
        return NULL;
    }
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "elementsize must be positive");
        return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    if (src.len != dst.len) {
        PyErr_SetString(PyExc_ValueError, "src and dst differ in length");
    } else if (src.len % size != 0) {
        PyErr_SetString(PyExc_ValueError, "the buffer is not a whole number of elements");
    } else if (src.buf == dst.buf && src.len > 0 && size > 1) {
        PyErr_SetString(PyExc_ValueError, "src and dst are the same buffer");
    } else {
        const unsigned char *from = (const unsigned char *)src.buf;
        unsigned char *to = (unsigned char *)dst.buf;
        Py_ssize_t n = src.len / size;
        Py_BEGIN_ALLOW_THREADS
        if (size == 1) {
            memmove(to, from, (size_t)n);
        } else if (size == 2) {
            UNSHUFFLE(2);
        } else if (size == 4) { /* float32, int32: the common case */
            UNSHUFFLE(4);
        } else if (size == 8) {
            UNSHUFFLE(8);
        } else {
            UNSHUFFLE(size);
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, gather_doc},
    {"unshuffle", unshuffle, METH_VARARGS, unshuffle_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows",
    "Fixed-width rows copied from a mapped file into a batch, each once.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}
