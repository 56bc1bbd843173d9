/* What the batch recorder's C files share (_batch_records.c, _ring_records.c,
 * _ring_gather.c): SSE4.2's presence, protobuf varints, the masked CRC-32C of TFRecord
 * frames (_crc32c's), index checks.
 */
#ifndef RLDS_BATCH_RECORDS_H
#define RLDS_BATCH_RECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/tfrecord/_crc32c.h"

#if HAVE_SSE42

static inline int
get_index(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len != count * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd int64 values", name, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline int
varint_len(uint64_t v)
{
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *
put_varint(unsigned char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* TFRecord's masked CRC-32C of p[0:n]: `_crc32c`'s (store/formats/tfrecord/_crc32c.h),
 * taken at module init; callable without the GIL. */
__attribute__((visibility("hidden"))) extern uint32_t (*masked_crc)(const unsigned char *p,
                                                                    size_t n);

/* The length of a per-step field's whole map entry, its payload of `payload` bytes included. */
static inline int64_t
entry_len(Py_ssize_t key_len, int64_t payload, int64_t *entry_body)
{
    int64_t feature = payload ? 1 + varint_len(1 + varint_len(payload) + payload) + 1 +
                                    varint_len(payload) + payload
                              : 2;
    int64_t body = 1 + varint_len(key_len) + key_len + 1 + varint_len(feature) + feature;
    *entry_body = body;
    return 1 + varint_len(body) + body;
}

/* A per-step field's map entry up to its payload: key, Feature (tag 0x12 FloatList, 0x1a
 * Int64List), packed list head. */
static inline unsigned char *
put_entry(unsigned char *p, const unsigned char *key, Py_ssize_t key_len, unsigned char tag,
          int64_t payload, int64_t body)
{
    *p++ = 0x0a;
    p = put_varint(p, body);
    *p++ = 0x0a;
    p = put_varint(p, key_len);
    memcpy(p, key, key_len);
    p += key_len;
    *p++ = 0x12;
    if (!payload) {
        *p++ = 2;
        *p++ = tag;
        *p++ = 0;
        return p;
    }
    int64_t inner = 1 + varint_len(payload) + payload;
    p = put_varint(p, 1 + varint_len(inner) + inner);
    *p++ = tag;
    p = put_varint(p, inner);
    *p++ = 0x0a;
    return put_varint(p, payload);
}

/* What `encode` and `encode_ring` return: `(buffer, starts, lengths)`, record
 * j's frame at starts[j] and its data lengths[j] bytes (int64 bytes each);
 * NULL with an error set. */
static inline PyObject *
records_result(PyObject *buffer, const int64_t *starts, const int64_t *lengths, Py_ssize_t count)
{
    PyObject *result = NULL;
    PyObject *s = PyBytes_FromStringAndSize((const char *)starts, sizeof(int64_t) * count);
    PyObject *n = PyBytes_FromStringAndSize((const char *)lengths, sizeof(int64_t) * count);
    if (s && n) {
        result = PyTuple_Pack(3, buffer, s, n);
    }
    Py_XDECREF(s);
    Py_XDECREF(n);
    return result;
}

/* The module's functions (described in _batch_records.c) defined in other files:
 * _ring_records.c encode_ring, _ring_gather.c gather and plan, _shard_files.c write_shards. */
__attribute__((visibility("hidden"))) PyObject *encode_ring(PyObject *module,
                                                            PyObject *const *args,
                                                            Py_ssize_t nargs);
__attribute__((visibility("hidden"))) PyObject *gather(PyObject *module, PyObject *const *args,
                                                       Py_ssize_t nargs);
__attribute__((visibility("hidden"))) PyObject *plan(PyObject *module, PyObject *const *args,
                                                     Py_ssize_t nargs);
__attribute__((visibility("hidden"))) PyObject *write_shards(PyObject *module,
                                                             PyObject *const *args,
                                                             Py_ssize_t nargs);

#endif /* HAVE_SSE42 */
#endif /* RLDS_BATCH_RECORDS_H */
