/* A batch checked and copied into a ring row, and the plan's episodes handed out as
 * fresh arrays (see _vector_step.h, _vector_step.c). */
#define NO_IMPORT_ARRAY
#include "_vector_step.h"

/* A 2-D strided source [rows, cols] of 4- or 8-byte items into contiguous `dst`, the
 * source walked along its smaller stride (a transposed batch, as Gymnasium's vector
 * CartPole returns, is read in memory order). */
#define COPY_2D(type)                                                                   \
    do {                                                                                \
        type *d = (type *)dst;                                                          \
        if (s1 <= s0) {                                                                 \
            for (npy_intp i = 0; i < rows; i++) {                                       \
                for (npy_intp j = 0; j < cols; j++) {                                   \
                    memcpy(d + i * cols + j, src + i * s0 + j * s1, sizeof(type));      \
                }                                                                       \
            }                                                                           \
        } else {                                                                        \
            for (npy_intp j = 0; j < cols; j++) {                                       \
                for (npy_intp i = 0; i < rows; i++) {                                   \
                    memcpy(d + i * cols + j, src + i * s0 + j * s1, sizeof(type));      \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    } while (0)

VS_INTERNAL int
copy_2d(char *dst, const char *src, const npy_intp *dims, const npy_intp *strides,
        npy_intp itemsize)
{
    npy_intp rows = dims[0], cols = dims[1], s0 = strides[0], s1 = strides[1];
    if (s0 < 0 || s1 < 0) {
        return 0;
    }
    if (itemsize == 4) {
        COPY_2D(uint32_t);
    } else if (itemsize == 8) {
        COPY_2D(uint64_t);
    } else {
        return 0;
    }
    return 1;
}
#undef COPY_2D

/* The strided source's items into contiguous `dst`, the last axis innermost. */
VS_INTERNAL char *
copy_strided(char *dst, const char *src, int ndim, const npy_intp *dims,
             const npy_intp *strides, npy_intp itemsize)
{
    if (ndim == 0) {
        memcpy(dst, src, itemsize);
        return dst + itemsize;
    }
    if (ndim == 1) {
        npy_intp n = dims[0], s = strides[0];
#define COPY_ITEMS(type)                                        \
    for (npy_intp i = 0; i < n; i++) {                          \
        memcpy(dst + i * sizeof(type), src + i * s, sizeof(type)); \
    }                                                           \
    return dst + n * sizeof(type);
        switch (itemsize) {
        case 1: COPY_ITEMS(uint8_t)
        case 2: COPY_ITEMS(uint16_t)
        case 4: COPY_ITEMS(uint32_t)
        case 8: COPY_ITEMS(uint64_t)
        default:
            for (npy_intp i = 0; i < n; i++) {
                memcpy(dst + i * itemsize, src + i * s, itemsize);
            }
            return dst + n * itemsize;
        }
#undef COPY_ITEMS
    }
    for (npy_intp i = 0; i < dims[0]; i++) {
        dst = copy_strided(dst, src + i * strides[0], ndim - 1, dims + 1, strides + 1, itemsize);
    }
    return dst;
}

/* 1: the value fits its column as it is; 2: numpy casts it (same_kind); 0: neither. */
VS_INTERNAL int
value_fits(PyObject *value, PyArrayObject *column)
{
    if (!PyArray_CheckExact(value)) {
        return 0;
    }
    PyArrayObject *v = (PyArrayObject *)value;
    int ndim = PyArray_NDIM(v);
    if (ndim != PyArray_NDIM(column) - 1 || PyArray_ISOBJECT(v)) {
        return 0;
    }
    for (int d = 0; d < ndim; d++) {
        if (PyArray_DIM(v, d) != PyArray_DIM(column, d + 1)) {
            return 0;
        }
    }
    if (PyArray_EquivTypes(PyArray_DESCR(v), PyArray_DESCR(column)) && PyArray_ISALIGNED(v)) {
        return 1;
    }
    return PyArray_CanCastTypeTo(PyArray_DESCR(v), PyArray_DESCR(column),
                                 NPY_SAME_KIND_CASTING)
               ? 2
               : 0;
}

VS_INTERNAL const unsigned char *
flags_of(PyObject *obj, npy_intp n, npy_intp *stride)
{
    if (!PyArray_CheckExact(obj)) {
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != NPY_BOOL || PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n) {
        return NULL;
    }
    *stride = PyArray_STRIDE(a, 0);
    return PyArray_DATA(a);
}

/* Numpy's cast of `value` into the column's row (a view made for the call). */
VS_INTERNAL int
cast_into(PyArrayObject *column, char *row, PyArrayObject *value)
{
    PyArray_Descr *descr = PyArray_DESCR(column);
    Py_INCREF(descr);
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, PyArray_NDIM(column) - 1,
                                          PyArray_DIMS(column) + 1,
                                          PyArray_STRIDES(column) + 1, row,
                                          NPY_ARRAY_CARRAY, NULL);
    if (view == NULL) {
        return -1;
    }
    int status = PyArray_CopyInto((PyArrayObject *)view, value);
    Py_DECREF(view);
    return status;
}

/* The plan's first `count` episodes as six fresh int64 arrays (the batch keeps them;
 * the plan is reused) and the tuple of their first rows of each head. */
VS_INTERNAL PyObject *
planned(VectorStep *self, Py_ssize_t count)
{
    Py_ssize_t n = self->num_envs, nf = self->nfields;
    PyObject *out = PyTuple_New(7), *firsts = NULL;
    if (out == NULL) {
        return NULL;
    }
    npy_intp dims[NPY_MAXDIMS] = {count};
    for (int r = 0; r < 6; r++) {
        PyObject *row = PyArray_SimpleNew(1, dims, NPY_INT64);
        if (row == NULL) {
            goto fail;
        }
        memcpy(PyArray_DATA((PyArrayObject *)row), self->plan + r * n, count * sizeof(int64_t));
        PyTuple_SET_ITEM(out, r, row);
    }
    Py_ssize_t nheads = 0;
    for (Py_ssize_t k = 0; k < nf; k++) {
        nheads += PyTuple_GET_ITEM(self->heads, k) != Py_None;
    }
    firsts = PyTuple_New(nheads);
    if (firsts == NULL) {
        goto fail;
    }
    PyTuple_SET_ITEM(out, 6, firsts);
    const int64_t *env = self->plan;
    for (Py_ssize_t k = 0, h = 0; k < nf; k++) {
        PyArrayObject *head = (PyArrayObject *)PyTuple_GET_ITEM(self->heads, k);
        if ((PyObject *)head == Py_None) {
            continue;
        }
        int ndim = PyArray_NDIM(head);
        for (int d = 1; d < ndim; d++) {
            dims[d] = PyArray_DIM(head, d);
        }
        PyArray_Descr *descr = PyArray_DESCR(head);
        Py_INCREF(descr);
        PyObject *first = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, dims, NULL, NULL, 0,
                                               NULL);
        if (first == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(firsts, h++, first);
        npy_intp b = PyArray_NBYTES(head) / n;
        char *dst = PyArray_BYTES((PyArrayObject *)first);
        const char *src = PyArray_BYTES(head);
        for (Py_ssize_t j = 0; j < count; j++) {
            memcpy(dst + j * b, src + env[j] * b, b);
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}
