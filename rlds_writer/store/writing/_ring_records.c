/* The batch recorder's records straight from its time-major ring (record/batch/ring.py),
 * part of the _batch_records extension:
 *
 * encode_ring(fields, batches, constants) -> (buffer, starts, lengths)
 *     the bytes `encode` gives for the episodes once gathered into columns
 *     (`gather`) with their RLDS flags, without the columns: each record is
 *     written from the ring's rows. `fields` in the Example's order, each
 *       (index,)            an episode-level field: constants[reason][index] (bytes);
 *       (key, tag, flag)    an RLDS flag, 0 is_first, 1 is_last, 2 is_terminal (true at
 *                           the last step of an episode whose reason is 0), one byte a step;
 *       (key, tag, src, elems, ring, zero, slot)
 *                           a per-step field: ring [L, N, elems] of values of the struct
 *                           code `src` (f d: FloatList, tag 0x12, as float32; b h i q
 *                           B H I Q: Int64List of varints, tag 0x1a); slot >= 0: an
 *                           observation-like field, its first row the batch's
 *                           firsts[slot][j], then the rows; slot -1: a transition field,
 *                           the rows then `zero` (the final step's row).
 *     `batches` a sequence of (envs, starts, counts, reasons, firsts): int64 [E] each and
 *     a tuple of [E, elems] arrays, episode j being counts[j] ring rows of column envs[j]
 *     from row starts[j] (modulo L), counts[j] + 1 steps. Records of every batch, in
 *     order, end to end; starts and lengths as int64 bytes, as `encode` returns them.
 *
 * One pass over the episodes (each one's lengths, then its bytes, its rows read while
 * they are in the cache: rows N apart, a cache line each, asked for one episode ahead)
 * into a buffer as long as the records can be, cut to their length after; without the
 * GIL: the env thread steps on. Its arguments are parsed and checked in _ring_args.c.
 */
#include "_ring_records.h"

#if HAVE_SSE42

static inline uint64_t
int_at(char src, const char *row, Py_ssize_t e)
{
    switch (src) { /* as numpy's cast to int64 (uint64: its bits) */
    case 'b': return (uint64_t)(int64_t)((const int8_t *)row)[e];
    case 'h': return (uint64_t)(int64_t)((const int16_t *)row)[e];
    case 'i': return (uint64_t)(int64_t)((const int32_t *)row)[e];
    case 'B': return ((const uint8_t *)row)[e];
    case 'H': return ((const uint16_t *)row)[e];
    case 'I': return ((const uint32_t *)row)[e];
    default: {
        uint64_t v;
        memcpy(&v, row + 8 * e, 8);
        return v;
    }
    }
}

/* Pointers to episode j's rows of field f, in the Example's order (steps of them). */
static void
episode_rows(const RingField *f, const Batch *b, Py_ssize_t j, const char **rows)
{
    const int64_t *env = b->index[0].buf, *start = b->index[1].buf, *n = b->index[2].buf;
    const char *column = (const char *)f->ring.buf + env[j] * f->row;
    Py_ssize_t stride = f->num_envs * f->row, k = 0;
    if (f->slot >= 0) {
        rows[k++] = (const char *)b->firsts[f->slot].buf + j * f->row;
    }
    int64_t r = start[j] % f->size;
    for (int64_t i = 0; i < n[j]; i++) {
        rows[k++] = column + r * stride;
        if (++r == f->size) {
            r = 0;
        }
    }
    if (f->slot < 0) {
        rows[k] = f->zero.buf;
    }
}

/* Episode j's ring rows of every field asked for ahead: a row a cache line, rows N apart
 * (the hardware prefetches no such stride), read once the previous episode is written. */
static void
prefetch_episode(const RingField *fields, Py_ssize_t num_fields, const Batch *b, Py_ssize_t j)
{
    if (j >= b->count) {
        return;
    }
    const int64_t *env = b->index[0].buf, *start = b->index[1].buf, *n = b->index[2].buf;
    for (Py_ssize_t i = 0; i < num_fields; i++) {
        const RingField *f = &fields[i];
        if (f->kind != 2) {
            continue;
        }
        const char *column = (const char *)f->ring.buf + env[j] * f->row;
        Py_ssize_t stride = f->num_envs * f->row;
        int64_t r = start[j] % f->size;
        for (int64_t k = 0; k < n[j]; k++) {
            __builtin_prefetch(column + r * stride);
            if (++r == f->size) {
                r = 0;
            }
        }
    }
}

/* The most bytes a record of `steps` steps takes (each varint at its longest). */
static int64_t
record_bound(const RingField *fields, Py_ssize_t num_fields, const int64_t *constant_len,
             int64_t steps)
{
    int64_t example = 0, body;
    for (Py_ssize_t i = 0; i < num_fields; i++) {
        const RingField *f = &fields[i];
        if (f->kind == 0) {
            example += constant_len[i];
            continue;
        }
        int64_t most = f->kind == 1                       ? 1
                       : f->src == 'f' || f->src == 'd'   ? 4
                       : f->src == 'B'                    ? 2
                       : f->src == 'H'                    ? 3
                       : f->src == 'I'                    ? 5
                                                          : 10;
        example += entry_len(f->key_len, steps * (f->kind == 1 ? 1 : f->elems) * most, &body);
    }
    return 12 + 1 + varint_len(example) + example + 4;
}

static int64_t
payload_len(const RingField *f, const char **rows, int64_t steps)
{
    if (f->kind == 1) {
        return steps;
    }
    if (f->src == 'f' || f->src == 'd') {
        return steps * f->elems * 4;
    }
    int64_t payload = 0;
    for (int64_t k = 0; k < steps; k++) {
        for (Py_ssize_t e = 0; e < f->elems; e++) {
            payload += varint_len(int_at(f->src, rows[k], e));
        }
    }
    return payload;
}

#define COPY_ROWS(width)                                                                    \
    for (int64_t k = 0; k < steps; k++, p += (width)) {                                     \
        memcpy(p, rows[k], (width));                                                        \
    }

static unsigned char *
put_payload(unsigned char *p, const RingField *f, const char **rows, int64_t steps, int64_t reason)
{
    if (f->kind == 1) {
        memset(p, 0, steps);
        if (f->index == 0) {
            p[0] = 1;
        } else if (f->index == 1 || reason == 0) {
            p[steps - 1] = 1;
        }
        return p + steps;
    }
    if (f->src == 'f') { /* fixed sizes copy inline (a call per row otherwise) */
        switch (f->row) {
        case 4: COPY_ROWS(4); return p;
        case 8: COPY_ROWS(8); return p;
        case 12: COPY_ROWS(12); return p;
        case 16: COPY_ROWS(16); return p;
        default: COPY_ROWS(f->row); return p;
        }
    }
    for (int64_t k = 0; k < steps; k++) {
        const char *row = rows[k];
        if (f->src == 'd') {
            for (Py_ssize_t e = 0; e < f->elems; e++) {
                float v = (float)((const double *)row)[e];
                memcpy(p, &v, 4);
                p += 4;
            }
        } else {
            for (Py_ssize_t e = 0; e < f->elems; e++) {
                p = put_varint(p, int_at(f->src, row, e));
            }
        }
    }
    return p;
}

__attribute__((visibility("hidden"))) PyObject *
encode_ring(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_ring(fields, batches, constants: tuple)");
        return NULL;
    }
    PyObject *constants = args[2];
    Py_ssize_t num_reasons = PyTuple_GET_SIZE(constants);
    PyObject *fields_seq = PySequence_Fast(args[0], "encode_ring: fields must be a sequence");
    if (fields_seq == NULL) {
        return NULL;
    }
    PyObject *batches_seq = PySequence_Fast(args[1], "encode_ring: batches must be a sequence");
    if (batches_seq == NULL) {
        Py_DECREF(fields_seq);
        return NULL;
    }
    Py_ssize_t num_fields = PySequence_Fast_GET_SIZE(fields_seq);
    Py_ssize_t num_batches = PySequence_Fast_GET_SIZE(batches_seq);
    RingField *fields = PyMem_Calloc(num_fields ? num_fields : 1, sizeof(RingField));
    Batch *batches = PyMem_Calloc(num_batches ? num_batches : 1, sizeof(Batch));
    const unsigned char **cptr = PyMem_Calloc(num_reasons * num_fields + 1, sizeof(char *));
    int64_t *clen = PyMem_Calloc(num_reasons * num_fields + 1, sizeof(int64_t));
    int64_t *sizes = NULL, *record_start = NULL, *data_len = NULL;
    const char **rows = NULL;
    PyObject *buffer = NULL, *result = NULL;
    if (fields == NULL || batches == NULL || cptr == NULL || clen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < num_fields; i++) {
        if (parse_field(PySequence_Fast_GET_ITEM(fields_seq, i), &fields[i]) < 0) {
            goto done;
        }
        if (fields[i].kind != 0) {
            continue;
        }
        for (Py_ssize_t r = 0; r < num_reasons; r++) {
            PyObject *row = PyTuple_GET_ITEM(constants, r), *value;
            if (!PyTuple_Check(row) || fields[i].index >= PyTuple_GET_SIZE(row) ||
                !PyBytes_Check(value = PyTuple_GET_ITEM(row, fields[i].index))) {
                PyErr_SetString(PyExc_TypeError, "encode_ring: constants[reason][index] is bytes");
                goto done;
            }
            cptr[r * num_fields + i] = (const unsigned char *)PyBytes_AS_STRING(value);
            clen[r * num_fields + i] = PyBytes_GET_SIZE(value);
        }
    }
    Py_ssize_t count = 0;
    int64_t most = 1, bound = 0;
    for (Py_ssize_t b = 0; b < num_batches; b++) {
        Batch *batch = &batches[b];
        if (parse_batch(PySequence_Fast_GET_ITEM(batches_seq, b), batch) < 0 ||
            check(fields, num_fields, batch, num_reasons) < 0) {
            goto done;
        }
        const int64_t *n = batch->index[2].buf, *reason = batch->index[3].buf;
        for (Py_ssize_t j = 0; j < batch->count; j++) {
            most = n[j] + 1 > most ? n[j] + 1 : most;
            bound += record_bound(fields, num_fields, clen + reason[j] * num_fields, n[j] + 1);
        }
        count += batch->count;
    }
    record_start = PyMem_Malloc(sizeof(int64_t) * (count + 1));
    data_len = PyMem_Malloc(sizeof(int64_t) * (count + 1));
    sizes = PyMem_Malloc(sizeof(int64_t) * (num_fields + 1));
    rows = PyMem_Malloc(sizeof(char *) * most * (num_fields + 1));
    if (!sizes || !record_start || !data_len || !rows) {
        PyErr_NoMemory();
        goto done;
    }
    /* At most `bound` bytes (varints at their longest), cut to the length written: one
     * pass, each episode's rows read while they are in the cache. */
    buffer = PyByteArray_FromStringAndSize(NULL, bound);
    if (buffer == NULL) {
        goto done;
    }
    unsigned char *base = (unsigned char *)PyByteArray_AS_STRING(buffer);
    int64_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t e = 0;
    for (Py_ssize_t b = 0; b < num_batches; b++) {
        const Batch *batch = &batches[b];
        const int64_t *n = batch->index[2].buf, *reason = batch->index[3].buf;
        prefetch_episode(fields, num_fields, batch, 0);
        for (Py_ssize_t j = 0; j < batch->count; j++, e++) {
            prefetch_episode(fields, num_fields, batch, j + 1);
            int64_t steps = n[j] + 1, example = 0, body;
            const int64_t *constant_len = clen + reason[j] * num_fields;
            for (Py_ssize_t i = 0; i < num_fields; i++) {
                const RingField *f = &fields[i];
                if (f->kind == 0) {
                    example += sizes[i] = constant_len[i];
                    continue;
                }
                if (f->kind == 2) {
                    episode_rows(f, batch, j, rows + i * most);
                }
                sizes[i] = payload_len(f, rows + i * most, steps);
                example += entry_len(f->key_len, sizes[i], &body);
            }
            unsigned char *record = base + total;
            unsigned char *p = record + 12, *data = p;
            data_len[e] = 1 + varint_len(example) + example;
            record_start[e] = total;
            total += 12 + data_len[e] + 4;
            uint64_t length = (uint64_t)data_len[e];
            memcpy(record, &length, 8); /* little-endian (x86-64) */
            uint32_t length_crc = masked_crc(record, 8);
            memcpy(record + 8, &length_crc, 4);
            *p++ = 0x0a;
            p = put_varint(p, example);
            for (Py_ssize_t i = 0; i < num_fields; i++) {
                const RingField *f = &fields[i];
                if (f->kind == 0) {
                    memcpy(p, cptr[reason[j] * num_fields + i], sizes[i]);
                    p += sizes[i];
                    continue;
                }
                entry_len(f->key_len, sizes[i], &body);
                p = put_entry(p, f->key, f->key_len, f->tag, sizes[i], body);
                p = put_payload(p, f, rows + i * most, steps, reason[j]);
            }
            uint32_t data_crc = masked_crc(data, p - data);
            memcpy(p, &data_crc, 4);
        }
    }
    Py_END_ALLOW_THREADS
    if (PyByteArray_Resize(buffer, total) < 0) {
        goto done;
    }
    result = records_result(buffer, record_start, data_len, count);
done:
    Py_XDECREF(buffer);
    PyMem_Free(sizes);
    PyMem_Free(record_start);
    PyMem_Free(data_len);
    PyMem_Free(rows);
    PyMem_Free(cptr);
    PyMem_Free(clen);
    for (Py_ssize_t i = 0; fields && i < num_fields; i++) {
        if (fields[i].held >= 1) {
            PyBuffer_Release(&fields[i].ring);
        }
        if (fields[i].held >= 2) {
            PyBuffer_Release(&fields[i].zero);
        }
    }
    for (Py_ssize_t b = 0; batches && b < num_batches; b++) {
        for (int i = 0; i < batches[b].held; i++) {
            PyBuffer_Release(&batches[b].index[i]);
        }
        for (Py_ssize_t s = 0; s < batches[b].held_firsts; s++) {
            PyBuffer_Release(&batches[b].firsts[s]);
        }
        PyMem_Free(batches[b].firsts);
    }
    PyMem_Free(fields);
    PyMem_Free(batches);
    Py_DECREF(batches_seq);
    Py_DECREF(fields_seq);
    return result;
}

#endif /* HAVE_SSE42 */
