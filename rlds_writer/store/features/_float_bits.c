/*
 * A float32 payload's signalling NaNs quieted, as TFDS's serializer makes
 * them (store/features/field_encoding.py `quiet_nans`, which falls back to
 * numpy where this is not built).
 *
 * Every float column of every episode is scanned once as it is encoded;
 * numpy's `isnan` and `any` took about 1.5 us a column (a Catch episode has
 * three), this one scan about 0.1 us. `quiet_nans(payload)` returns the
 * payload itself where it holds no signalling NaN (the common case: nothing
 * is copied), else a new `bytes` with each one's quiet bit set (its sign and
 * payload kept; a quiet NaN or any other value is left as it is).
 *
 * The payload is little-endian float32 (`<f4`): on a big-endian machine the
 * module refuses to load, and numpy's way is taken.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly. */
#define RLDS_ABI 1

#define QUIET_BIT 0x00400000u
/* Values per block: a block is tested without a branch per value (vector code). */
#define BLOCK 256

/* AVX2 where the CPU has it (picked at load; the scan takes half the time of
 * SSE2's), else the baseline. Needs GCC's ifunc support (glibc). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define SCAN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SCAN_CLONES
#endif

static inline uint32_t
word_at(const unsigned char *p, Py_ssize_t i)
{
    uint32_t w;
    memcpy(&w, p + 4 * i, 4); /* no alignment assumed */
    return w;
}

/* A NaN whose quiet bit is clear: without its sign, above infinity
 * (0x7f800000) and below the quiet NaNs (0x7fc00000), in one comparison. */
static inline uint32_t
signalling(uint32_t w)
{
    return (w & 0x7fffffffu) - 0x7f800001u < 0x003fffffu;
}

/* The index of the first signalling NaN among `n` float32 values, or -1. */
SCAN_CLONES static Py_ssize_t
first_signalling(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        uint32_t any = 0;
        for (int j = 0; j < BLOCK; j++) any |= signalling(word_at(p, i + j));
        if (any) break;
    }
    for (; i < n; i++) {
        if (signalling(word_at(p, i))) return i;
    }
    return -1;
}

static PyObject *
quiet_nans(PyObject *Py_UNUSED(module), PyObject *payload)
{
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 4) {
        PyErr_Format(PyExc_ValueError,
                     "quiet_nans: a float32 payload (a multiple of 4 bytes) expected, got %zd "
                     "bytes",
                     view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n = view.len / 4;
    Py_ssize_t first = first_signalling(view.buf, n);
    if (first < 0) {
        PyBuffer_Release(&view);
        return Py_NewRef(payload);
    }
    PyObject *out = PyBytes_FromStringAndSize(view.buf, view.len);
    PyBuffer_Release(&view);
    if (out == NULL) return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = first; i < n; i++) {
        uint32_t w = word_at(bytes, i);
        if (signalling(w)) {
            w |= QUIET_BIT;
            memcpy(bytes + 4 * i, &w, 4);
        }
    }
    return out;
}

static PyMethodDef float_bits_methods[] = {
    {"quiet_nans", quiet_nans, METH_O,
     "quiet_nans(payload): a little-endian float32 payload with each signalling NaN quieted\n"
     "(a new bytes), or the payload itself if it holds none"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef float_bits_module = {
    PyModuleDef_HEAD_INIT, "_float_bits",
    "Signalling NaNs of float32 payloads quieted (store/features/field_encoding.py).", -1,
    float_bits_methods,
};

PyMODINIT_FUNC
PyInit__float_bits(void)
{
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "_float_bits reads little-endian words only");
    return NULL;
#else
    PyObject *m = PyModule_Create(&float_bits_module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0) Py_CLEAR(m);
    return m;
#endif
}
