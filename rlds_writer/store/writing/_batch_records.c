/* The batch recorder's two inner loops in C (store/writing/batch_records.py):
 *
 * gather(out, ring, first, envs, starts, counts, offsets, head)
 *     cuts the episodes that end on one vector step out of a field's
 *     time-major ring [L, N, row] into one column, episode j at rows
 *     offsets[j] ...: `head` 1 (observations) puts first[envs[j]] first
 *     then the ring's rows, 2 the same with first[j] (first rows copied
 *     out per episode); 0 (actions, rewards) puts the ring's rows then
 *     `first` (the final step's zero row). Ring rows wrap modulo L.
 *
 * encode(fields, offsets, steps, reasons, constants) -> (buffer, starts, lengths)
 *     writes every episode's tf.train.Example, framed as a TFRecord record
 *     (length, masked CRC-32C of it, data, masked CRC-32C of the data), end
 *     to end in one bytearray: the bytes batch_records.BatchRecordEncoder's
 *     numpy path and EpisodeEncoder give for each episode alone. `fields` in
 *     the Example's order: (index,) for an episode-level field, whose bytes
 *     are constants[reasons[j]][index]; (key, tag, kind, elems, column) for a
 *     per-step field: kind 'f' a float32 column (packed FloatList, tag 0x12),
 *     'q' int64 or 'B' uint8 (packed Int64List of varints, tag 0x1a); the
 *     column is C-contiguous, `elems` values a row. starts and lengths are
 *     int64 arrays as bytes: record j's frame at starts[j], its data length.
 *
 * plan(out, mask, open, start, terminated, t) -> (count, total, oldest)
 *     the bookkeeping of the episodes that end on one vector step: for each
 *     sub-env i (in order) with mask[i] and open[i], clears open[i] and writes
 *     into out [6, N] int64 rows: the sub-env, its first ring row start[i],
 *     its transitions t - start[i], its first row in the batch's columns, its
 *     steps (transitions + 1) and its end reason (0 terminated[i], 1 not,
 *     2 every one where terminated is None: cut short). Returns how many, the
 *     steps in all and the oldest first row (t if none).
 *
 * gather and plan are in _ring_gather.c; encode_ring (_ring_records.c) writes encode's
 * records straight from the ring, without gather; write_shards (_shard_files.c) writes
 * them into shard files: the open one, whole ones and the next one.
 *
 * gather and encode run without the GIL (the env thread and the writer thread overlap).
 * The records' masked CRC-32C is _crc32c's (its capsule, _crc32c.h): one implementation.
 * An optional extension: where it is not built, the CPU has no SSE4.2 or _crc32c does not
 * load (module init raises ImportError), batch_records.py does the same in numpy.
 */
#include "_batch_records.h"

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly. */
#define RLDS_ABI 3

#if HAVE_SSE42

uint32_t (*masked_crc)(const unsigned char *p, size_t n);

/* ------------------------------------------------------------------ encode */

typedef struct {
    int kind; /* 0: constant, 'f', 'q', 'B' */
    Py_ssize_t index;
    const unsigned char *key;
    Py_ssize_t key_len;
    unsigned char tag;
    Py_ssize_t elems;
    Py_buffer column;
    int held;
} Field;

static void
release_fields(Field *fields, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fields[i].held) {
            PyBuffer_Release(&fields[i].column);
        }
    }
    PyMem_Free(fields);
}

static PyObject *
encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode(fields, offsets, steps, reasons, constants)");
        return NULL;
    }
    PyObject *fields_seq = PySequence_Fast(args[0], "encode: fields must be a sequence");
    if (fields_seq == NULL) {
        return NULL;
    }
    PyObject *constants = args[4];
    if (!PyTuple_Check(constants)) {
        Py_DECREF(fields_seq);
        PyErr_SetString(PyExc_TypeError, "encode: constants must be a tuple of tuples of bytes");
        return NULL;
    }
    Py_ssize_t num_fields = PySequence_Fast_GET_SIZE(fields_seq);
    Field *fields = PyMem_Calloc(num_fields ? num_fields : 1, sizeof(Field));
    PyObject *result = NULL, *buffer = NULL;
    Py_buffer offsets_view, steps_view, reasons_view;
    int have = 0;
    int64_t *sizes = NULL, *record_start = NULL, *data_len = NULL, *example_len = NULL;
    if (fields == NULL) {
        Py_DECREF(fields_seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < num_fields; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fields_seq, i);
        Field *f = &fields[i];
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 1) {
            f->kind = 0;
            f->index = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
            if (f->index < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "encode: a negative constant index");
                }
                goto done;
            }
            continue;
        }
        const char *kind;
        Py_ssize_t kind_len;
        int tag;
        PyObject *key, *column;
        if (!PyTuple_Check(item) ||
            !PyArg_ParseTuple(item, "Sis#nO", &key, &tag, &kind, &kind_len, &f->elems, &column)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "encode: a field is (index,) or "
                                                  "(key, tag, kind, elems, column)");
            }
            goto done;
        }
        f->kind = kind_len == 1 ? kind[0] : 0;
        if (f->kind != 'f' && f->kind != 'q' && f->kind != 'B') {
            PyErr_Format(PyExc_ValueError, "encode: unknown kind %s", kind);
            goto done;
        }
        f->key = (const unsigned char *)PyBytes_AS_STRING(key);
        f->key_len = PyBytes_GET_SIZE(key);
        f->tag = (unsigned char)tag;
        if (PyObject_GetBuffer(column, &f->column, PyBUF_C_CONTIGUOUS) < 0) {
            goto done;
        }
        f->held = 1;
    }
    Py_ssize_t count = PyObject_Length(args[1]);
    if (count < 0) {
        goto done;
    }
    if (get_index(args[1], &offsets_view, count, "offsets") < 0) {
        goto done;
    }
    have = 1;
    if (get_index(args[2], &steps_view, count, "steps") < 0) {
        goto done;
    }
    have = 2;
    if (get_index(args[3], &reasons_view, count, "reasons") < 0) {
        goto done;
    }
    have = 3;
    const int64_t *offset = offsets_view.buf, *steps = steps_view.buf,
                  *reason = reasons_view.buf;
    Py_ssize_t num_reasons = PyTuple_GET_SIZE(constants);
    /* Checks, and each constant's length, while holding the GIL. */
    for (Py_ssize_t j = 0; j < count; j++) {
        if (reason[j] < 0 || reason[j] >= num_reasons || steps[j] < 0 || offset[j] < 0) {
            PyErr_Format(PyExc_IndexError, "encode: episode %zd is out of bounds", j);
            goto done;
        }
        for (Py_ssize_t i = 0; i < num_fields; i++) {
            Field *f = &fields[i];
            if (f->kind == 0) {
                PyObject *row = PyTuple_GET_ITEM(constants, reason[j]);
                if (!PyTuple_Check(row) || f->index >= PyTuple_GET_SIZE(row) ||
                    !PyBytes_Check(PyTuple_GET_ITEM(row, f->index))) {
                    PyErr_SetString(PyExc_TypeError, "encode: constants[reason][index] is bytes");
                    goto done;
                }
                continue;
            }
            Py_ssize_t width = f->kind == 'f' ? 4 : f->kind == 'q' ? 8 : 1;
            if ((offset[j] + steps[j]) * f->elems * width > f->column.len) {
                PyErr_Format(PyExc_IndexError, "encode: episode %zd is past a column's end", j);
                goto done;
            }
        }
    }
    /* Pass 1: each field's payload length per record, and the records' lengths. */
    sizes = PyMem_Malloc(sizeof(int64_t) * (count * num_fields + 1));
    record_start = PyMem_Malloc(sizeof(int64_t) * (count + 1));
    data_len = PyMem_Malloc(sizeof(int64_t) * (count + 1));
    example_len = PyMem_Malloc(sizeof(int64_t) * (count + 1));
    if (sizes == NULL || record_start == NULL || data_len == NULL || example_len == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = 0;
    for (Py_ssize_t j = 0; j < count; j++) {
        int64_t example = 0, body;
        for (Py_ssize_t i = 0; i < num_fields; i++) {
            Field *f = &fields[i];
            int64_t payload;
            if (f->kind == 0) {
                payload = PyBytes_GET_SIZE(
                    PyTuple_GET_ITEM(PyTuple_GET_ITEM(constants, reason[j]), f->index));
                example += payload;
            } else {
                int64_t lo = offset[j] * f->elems, hi = (offset[j] + steps[j]) * f->elems;
                if (f->kind == 'f') {
                    payload = (hi - lo) * 4;
                } else if (f->kind == 'B') {
                    const uint8_t *v = f->column.buf;
                    payload = hi - lo;
                    for (int64_t k = lo; k < hi; k++) {
                        payload += v[k] >= 0x80;
                    }
                } else {
                    const int64_t *v = f->column.buf;
                    payload = 0;
                    for (int64_t k = lo; k < hi; k++) {
                        payload += varint_len((uint64_t)v[k]);
                    }
                }
                example += entry_len(f->key_len, payload, &body); /* the payload included */
            }
            sizes[j * num_fields + i] = payload;
        }
        example_len[j] = example;
        data_len[j] = 1 + varint_len(example) + example;
        record_start[j] = total;
        total += 12 + data_len[j] + 4;
    }
    buffer = PyByteArray_FromStringAndSize(NULL, total);
    if (buffer == NULL) {
        goto done;
    }
    unsigned char *base = (unsigned char *)PyByteArray_AS_STRING(buffer);
    /* Constants: gather their pointers per reason once (few reasons). */
    const unsigned char **cptr = PyMem_Malloc(sizeof(char *) * (num_reasons * num_fields + 1));
    if (cptr == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < num_reasons; r++) {
        PyObject *row = PyTuple_GET_ITEM(constants, r);
        for (Py_ssize_t i = 0; i < num_fields; i++) {
            cptr[r * num_fields + i] = NULL;
            if (fields[i].kind == 0 && PyTuple_Check(row) &&
                fields[i].index < PyTuple_GET_SIZE(row)) {
                PyObject *value = PyTuple_GET_ITEM(row, fields[i].index);
                if (PyBytes_Check(value)) {
                    cptr[r * num_fields + i] = (const unsigned char *)PyBytes_AS_STRING(value);
                }
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < count; j++) {
        unsigned char *record = base + record_start[j];
        unsigned char *p = record + 12, *data = p;
        uint64_t length = (uint64_t)data_len[j];
        memcpy(record, &length, 8); /* little-endian (x86-64) */
        uint32_t length_crc = masked_crc(record, 8);
        memcpy(record + 8, &length_crc, 4);
        int64_t example = example_len[j];
        *p++ = 0x0a;
        p = put_varint(p, example);
        for (Py_ssize_t i = 0; i < num_fields; i++) {
            const Field *f = &fields[i];
            int64_t payload = sizes[j * num_fields + i];
            if (f->kind == 0) {
                memcpy(p, cptr[reason[j] * num_fields + i], payload);
                p += payload;
                continue;
            }
            int64_t body;
            entry_len(f->key_len, payload, &body);
            p = put_entry(p, f->key, f->key_len, f->tag, payload, body);
            int64_t lo = offset[j] * f->elems, hi = (offset[j] + steps[j]) * f->elems;
            if (f->kind == 'f') {
                memcpy(p, (const float *)f->column.buf + lo, (hi - lo) * 4);
                p += (hi - lo) * 4;
            } else if (f->kind == 'B' && payload == hi - lo) { /* all below 128 (flags) */
                memcpy(p, (const uint8_t *)f->column.buf + lo, hi - lo);
                p += hi - lo;
            } else if (f->kind == 'B') {
                const uint8_t *v = f->column.buf;
                for (int64_t k = lo; k < hi; k++) {
                    p = put_varint(p, v[k]);
                }
            } else {
                const int64_t *v = f->column.buf;
                for (int64_t k = lo; k < hi; k++) {
                    p = put_varint(p, (uint64_t)v[k]);
                }
            }
        }
        uint32_t data_crc = masked_crc(data, p - data);
        memcpy(p, &data_crc, 4);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(cptr);
    result = records_result(buffer, record_start, data_len, count);
done:
    Py_XDECREF(buffer);
    PyMem_Free(sizes);
    PyMem_Free(record_start);
    PyMem_Free(data_len);
    PyMem_Free(example_len);
    if (have >= 3) {
        PyBuffer_Release(&reasons_view);
    }
    if (have >= 2) {
        PyBuffer_Release(&steps_view);
    }
    if (have >= 1) {
        PyBuffer_Release(&offsets_view);
    }
    release_fields(fields, num_fields);
    Py_DECREF(fields_seq);
    return result;
}

#endif /* HAVE_SSE42 */

static PyMethodDef methods[] = {
#if HAVE_SSE42
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(out, ring, first, envs, starts, counts, offsets, head): episodes' rows of a "
     "time-major ring into one column."},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(fields, offsets, steps, reasons, constants) -> (buffer, starts, lengths): "
     "episodes' framed tf.train.Example records."},
    {"plan", (PyCFunction)(void (*)(void))plan, METH_FASTCALL,
     "plan(out, mask, open, start, terminated, t) -> (count, total, oldest): the episodes "
     "that end on one vector step."},
    {"encode_ring", (PyCFunction)(void (*)(void))encode_ring, METH_FASTCALL,
     "encode_ring(fields, batches, constants) -> (buffer, starts, lengths): episodes' framed "
     "tf.train.Example records straight from the ring (_ring_records.c)."},
    {"write_shards", (PyCFunction)(void (*)(void))write_shards, METH_FASTCALL,
     "write_shards(head_fd, head_end, close_head, paths, buffer, bounds, keep_last) -> "
     "(head, files, errno, tail_fd): slices of buffer written to an open shard and to new "
     "ones, without the GIL (_shard_files.c)."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_batch_records", "The batch recorder's gather and encode (see "
    "_batch_records.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__batch_records(void)
{
#if HAVE_SSE42
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) {
        PyErr_SetString(PyExc_ImportError, "_batch_records: this CPU has no SSE4.2");
        return NULL;
    }
    /* The records' checksums are _crc32c's: where it does not load, neither does this. */
    const Crc32cApi *crc = crc32c_import();
    if (crc == NULL) return NULL;
    masked_crc = crc->masked;
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0) Py_CLEAR(m);
    return m;
#else
    PyErr_SetString(PyExc_ImportError, "_batch_records: built for a CPU without SSE4.2");
    return NULL;
#endif
}