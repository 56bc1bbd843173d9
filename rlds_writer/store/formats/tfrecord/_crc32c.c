/* CRC-32C (Castagnoli) with the SSE4.2 `crc32` instruction: the checksum of
 * every TFRecord header and record (store/formats/tfrecord/tfrecord.py).
 *
 * An optional extension. Loading it instead of google_crc32c saves that
 * package's import (about 1.6 ms of every new writer); where it is not built,
 * or the CPU has no SSE4.2 (module init raises ImportError), tfrecord.py uses
 * google_crc32c. `extend(crc, data)` has google_crc32c.extend's meaning.
 * Other extensions that frame records take the same functions, TFRecord's
 * mask included, from its capsule `C_API` (_crc32c.h): one implementation.
 *
 * Speed: one `crc32` instruction takes 3 cycles to give its result but can
 * start every cycle, so a long buffer is hashed as three independent streams
 * over three adjacent blocks, and the three results are joined. Joining uses
 * that the CRC register is linear: the register after A then B equals the
 * register after A moved past len(B) zero bytes, XOR the register after B
 * started from zero; moving a register past L bytes is multiplying it by
 * x^(8L) modulo the polynomial, done with four table look-ups for the two
 * block lengths used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_crc32c.h"

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly. */
#define RLDS_ABI 2

#if HAVE_SSE42

#define POLY 0x82f63b78u /* CRC-32C, bit-reflected */
#define LONG_BLOCK 4096
#define SHORT_BLOCK 256
/* Buffers at least this large are hashed without the GIL (as google_crc32c does). */
#define RELEASE_GIL_AT (1 << 20)

/* shift[b][k][i]: the register byte i at byte position k, moved past one block
 * of length LONG_BLOCK (b = 0) or SHORT_BLOCK (b = 1). */
static uint32_t shift_tables[2][4][256];

/* a * b modulo POLY, in the reflected representation (bit 31 is x^0). */
static uint32_t
mult_mod_poly(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
        if (a & m) {
            product ^= b;
        }
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return product;
}

/* x^(8 * n) modulo POLY. */
static uint32_t
x_pow_8n(size_t n)
{
    uint32_t square = 1u << 23; /* x^8 */
    uint32_t result = 1u << 31; /* x^0 */
    while (n) {
        if (n & 1) {
            result = mult_mod_poly(square, result);
        }
        square = mult_mod_poly(square, square);
        n >>= 1;
    }
    return result;
}

static void
fill_shift_table(uint32_t table[4][256], size_t length)
{
    uint32_t op = x_pow_8n(length);
    for (int k = 0; k < 4; k++) {
        table[k][0] = 0;
        /* Linear in the byte: each entry is its lowest bit's entry XOR the rest's. */
        for (int bit = 0; bit < 8; bit++) {
            table[k][1 << bit] = mult_mod_poly(op, 1u << (8 * k + bit));
        }
        for (int i = 1; i < 256; i++) {
            int low = i & -i;
            table[k][i] = table[k][low] ^ table[k][i ^ low];
        }
    }
}

static inline uint32_t
shift(uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

static inline uint64_t
load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Hashes `n` bytes from the raw register `crc` in streams of three `block`s. */
#define THREE_STREAMS(block, table)                                             \
    while (n >= 3 * (block)) {                                                  \
        uint64_t c1 = 0, c2 = 0;                                                \
        const unsigned char *end = p + (block);                                 \
        do {                                                                    \
            c0 = _mm_crc32_u64(c0, load64(p));                                  \
            c1 = _mm_crc32_u64(c1, load64(p + (block)));                        \
            c2 = _mm_crc32_u64(c2, load64(p + 2 * (block)));                    \
            p += 8;                                                             \
        } while (p < end);                                                      \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c1;                         \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c2;                         \
        p += 2 * (block);                                                       \
        n -= 3 * (block);                                                       \
    }

__attribute__((target("sse4.2"))) static uint32_t
crc32c_extend(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c0 = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    THREE_STREAMS(LONG_BLOCK, shift_tables[0])
    THREE_STREAMS(SHORT_BLOCK, shift_tables[1])
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        p += 8;
        n -= 8;
    }
    while (n) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    return ~(uint32_t)c0;
}

/* TFRecord's masked CRC-32C (store/formats/tfrecord/tfrecord.py `_mask`). */
__attribute__((target("sse4.2"))) static uint32_t
masked_crc32c(const unsigned char *p, size_t n)
{
    uint32_t crc = crc32c_extend(0, p, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static const Crc32cApi c_api = {CRC32C_API_VERSION, crc32c_extend, masked_crc32c};

static PyObject *
extend(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "extend(crc, data) takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long long crc = PyLong_AsUnsignedLongLong(args[0]);
    if (crc == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (crc > 0xffffffffull) {
        PyErr_SetString(PyExc_ValueError, "extend: crc must be in [0, 2**32)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t result;
    if (view.len >= RELEASE_GIL_AT) {
        Py_BEGIN_ALLOW_THREADS
        result = crc32c_extend((uint32_t)crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        result = crc32c_extend((uint32_t)crc, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(result);
}

/* The CRC-32C of a record given as parts, in one call: a record of camera
 * frames is two parts per frame, and a Python call per part cost about as
 * much as hashing a small frame. Without the GIL from RELEASE_GIL_AT bytes. */
static PyObject *
extend_parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "extend_parts(crc, parts) takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    unsigned long long crc = PyLong_AsUnsignedLongLong(args[0]);
    if (crc == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (crc > 0xffffffffull) {
        PyErr_SetString(PyExc_ValueError, "extend_parts: crc must be in [0, 2**32)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "extend_parts: parts must be a list of buffers");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t got = 0, total = 0;
    PyObject *result = NULL;
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0) {
            goto done;
        }
        total += views[got].len;
    }
    uint32_t value = (uint32_t)crc;
    if (total >= RELEASE_GIL_AT) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            value = crc32c_extend(value, views[i].buf, (size_t)views[i].len);
        }
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            value = crc32c_extend(value, views[i].buf, (size_t)views[i].len);
        }
    }
    result = PyLong_FromUnsignedLong(value);
done:
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&views[i]);
    }
    PyMem_Free(views);
    Py_DECREF(seq);
    return result;
}

#endif /* HAVE_SSE42 */

static PyMethodDef methods[] = {
#if HAVE_SSE42
    {"extend", (PyCFunction)(void (*)(void))extend, METH_FASTCALL,
     "extend(crc, data) -> int: the CRC-32C of the bytes hashed so far (crc) and then data."},
    {"extend_parts", (PyCFunction)(void (*)(void))extend_parts, METH_FASTCALL,
     "extend_parts(crc, parts) -> int: extend() over each bytes-like part in order."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_crc32c", "CRC-32C with SSE4.2 (see _crc32c.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__crc32c(void)
{
#if HAVE_SSE42
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) {
        PyErr_SetString(PyExc_ImportError, "_crc32c: this CPU has no SSE4.2");
        return NULL;
    }
    fill_shift_table(shift_tables[0], LONG_BLOCK);
    fill_shift_table(shift_tables[1], SHORT_BLOCK);
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New((void *)&c_api, CRC32C_CAPSULE, NULL);
    if (PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0
        || PyModule_AddObject(m, "C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
#else
    PyErr_SetString(PyExc_ImportError, "_crc32c: built for a CPU without SSE4.2 CRC32C");
    return NULL;
#endif
}
