/*
 * Raw-bytes frames of a batch copied into each sub-env's framed chunk, in one
 * call per field per step (record/batch/frame_chunks.py, which does the same
 * with numpy, one row at a time, where this is not built).
 *
 * A chunk is a writable buffer of rows `stride` bytes apart, each row being
 * the frame's `BytesList` entry head (`prefix` bytes, written once when the
 * chunk was made) and then the frame's bytes: the rows of an episode in one
 * chunk are a stretch of its record as written, so the writer hashes and
 * writes them in one part (store/features/field_encoding.py `_framed_parts`).
 *
 *   copy(batch, rows, envs, chunks, fill, places, row_nbytes, stride, prefix,
 *        capacity)
 *
 * batch: the step's frames, C-contiguous, `row_nbytes` bytes each; rows:
 * int64, the batch rows to copy (None: rows 0 .. len(envs) - 1); envs: int64,
 * the sub-env of each; chunks: a list, sub-env -> its current chunk; fill:
 * int64 [N], sub-env -> the place of its next row (its low 20 bits: the row in
 * the chunk; above: the chunk's number, so places of different chunks are
 * never consecutive); places: int64 [len(envs)], out: each copied row's place.
 * Every index and every chunk's room (`capacity` rows) is checked before any
 * byte is copied; the copies run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes. */
#define RLDS_ABI 1

#define ROW_BITS 20
#define ROW_MASK ((int64_t)((1 << ROW_BITS) - 1))

typedef struct {
    Py_buffer batch, rows, envs, fill, places;
    Py_buffer *chunks; /* one per sub-env, or unset (buf NULL) */
    Py_ssize_t num_envs;
} Views;

static void
release(Views *v)
{
    Py_buffer *all[] = {&v->batch, &v->rows, &v->envs, &v->fill, &v->places};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (all[i]->obj != NULL) PyBuffer_Release(all[i]);
    }
    if (v->chunks != NULL) {
        for (Py_ssize_t i = 0; i < v->num_envs; i++) {
            if (v->chunks[i].obj != NULL) PyBuffer_Release(&v->chunks[i]);
        }
        PyMem_Free(v->chunks);
    }
}

static int
int64_view(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL ||
        (strcmp(view->format, "l") != 0 && strcmp(view->format, "q") != 0)) {
        PyErr_Format(PyExc_TypeError, "copy: %s must be a contiguous int64 array", name);
        return -1;
    }
    return 0;
}

static PyObject *
copy(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *batch, *rows, *envs, *chunks, *fill, *places;
    Py_ssize_t row_nbytes, stride, prefix, capacity;
    if (!PyArg_ParseTuple(args, "OOOO!OOnnnn", &batch, &rows, &envs, &PyList_Type, &chunks,
                          &fill, &places, &row_nbytes, &stride, &prefix, &capacity)) {
        return NULL;
    }
    Views v;
    memset(&v, 0, sizeof(v));
    if (row_nbytes < 0 || prefix < 0 || stride != prefix + row_nbytes || capacity < 1 ||
        capacity > ROW_MASK + 1) {
        PyErr_SetString(PyExc_ValueError, "copy: inconsistent row_nbytes, stride, prefix, capacity");
        return NULL;
    }
    if (PyObject_GetBuffer(batch, &v.batch, PyBUF_C_CONTIGUOUS) < 0) goto fail;
    if (int64_view(envs, &v.envs, 0, "envs") < 0) goto fail;
    if (rows != Py_None && int64_view(rows, &v.rows, 0, "rows") < 0) goto fail;
    if (int64_view(fill, &v.fill, 1, "fill") < 0) goto fail;
    if (int64_view(places, &v.places, 1, "places") < 0) goto fail;
    Py_ssize_t k = v.envs.len / 8, n = v.fill.len / 8;
    Py_ssize_t batch_rows = row_nbytes ? v.batch.len / row_nbytes : 0;
    if (PyList_GET_SIZE(chunks) != n || v.places.len / 8 != k ||
        (rows != Py_None && v.rows.len / 8 != k) || (row_nbytes && v.batch.len % row_nbytes)) {
        PyErr_SetString(PyExc_ValueError, "copy: the arrays' lengths disagree");
        goto fail;
    }
    v.num_envs = n;
    v.chunks = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (v.chunks == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    const int64_t *row_at = rows != Py_None ? (const int64_t *)v.rows.buf : NULL;
    const int64_t *env_at = (const int64_t *)v.envs.buf;
    int64_t *fill_at = (int64_t *)v.fill.buf;
    /* Every check first: a refused call copies nothing and moves no place. */
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t row = row_at ? row_at[j] : j, env = env_at[j];
        if (row < 0 || row >= batch_rows || env < 0 || env >= n) {
            PyErr_Format(PyExc_IndexError, "copy: row %lld or sub-env %lld out of range",
                         (long long)row, (long long)env);
            goto fail;
        }
        Py_buffer *chunk = &v.chunks[env];
        if (chunk->obj == NULL) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(chunks, env), chunk,
                                   PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
                goto fail;
            }
            if (chunk->len < capacity * stride) {
                PyErr_SetString(PyExc_ValueError, "copy: a chunk smaller than its capacity");
                goto fail;
            }
        }
        if ((fill_at[env] & ROW_MASK) >= capacity) {
            PyErr_Format(PyExc_ValueError, "copy: sub-env %lld's chunk is full", (long long)env);
            goto fail;
        }
    }
    /* A sub-env named twice fills two rows: counted here, not above (its
     * second row was checked against the same fill). */
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t env = env_at[j];
        if ((fill_at[env] & ROW_MASK) >= capacity) {
            for (Py_ssize_t i = 0; i < j; i++) fill_at[env_at[i]]--; /* undo */
            PyErr_Format(PyExc_ValueError, "copy: sub-env %lld's chunk is full", (long long)env);
            goto fail;
        }
        ((int64_t *)v.places.buf)[j] = fill_at[env]++;
    }
    const char *src = (const char *)v.batch.buf;
    const int64_t *place_at = (const int64_t *)v.places.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t row = row_at ? row_at[j] : j;
        char *dst = (char *)v.chunks[env_at[j]].buf + (place_at[j] & ROW_MASK) * stride + prefix;
        memcpy(dst, src + row * row_nbytes, (size_t)row_nbytes);
    }
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
fail:
    release(&v);
    return NULL;
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS,
     "copy(batch, rows, envs, chunks, fill, places, row_nbytes, stride, prefix, capacity)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_frame_rows",
    "Raw-bytes frames of a batch copied into each sub-env's framed chunk.", -1, methods,
};

PyMODINIT_FUNC
PyInit__frame_rows(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0 ||
        PyModule_AddIntConstant(m, "ROW_BITS", ROW_BITS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
