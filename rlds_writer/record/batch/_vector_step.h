/* A vector step's ring bookkeeping (record/batch/vector_step.py): what the sources of
 * the `_vector_step` extension share (setup.py lists them).
 *
 * - _vector_step.c: `VectorStep`, its step, and the module;
 * - _vector_rows.c: a batch checked and copied into a ring row, and the plan's
 *   episodes handed out as fresh arrays.
 *
 * Every TU includes this header first. numpy's C API table is one for the
 * module (PY_ARRAY_UNIQUE_SYMBOL), filled by _vector_step.c's `import_array()`;
 * _vector_rows.c defines NO_IMPORT_ARRAY before including this. What one file
 * defines for the other is hidden: the module exports `PyInit__vector_step` only.
 */
#ifndef RLDS_VECTOR_STEP_H
#define RLDS_VECTOR_STEP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL rlds_vector_step_ARRAY_API
#include <numpy/arrayobject.h>

#if defined(__GNUC__)
#define VS_INTERNAL __attribute__((visibility("hidden")))
#else
#define VS_INTERNAL
#endif

#define MAX_FIELDS 256

typedef struct {
    PyObject_HEAD
    PyObject *columns; /* tuple of ndarrays [L, N, ...] */
    PyObject *heads;   /* tuple of ndarrays [N, ...] or None */
    PyObject *keep;    /* the arrays below, referenced while in use */
    Py_ssize_t nfields, num_envs, size, discount;
    unsigned char *open, *pending, *spilled;
    int64_t *start, *plan, *apart;
} VectorStep;

/* 1: the value fits its column as it is; 2: numpy casts it (same_kind); 0: neither. */
VS_INTERNAL int value_fits(PyObject *value, PyArrayObject *column);
/* A bool [n] array's data and stride, or NULL. */
VS_INTERNAL const unsigned char *flags_of(PyObject *obj, npy_intp n, npy_intp *stride);
/* Numpy's cast of `value` into the column's row `row` (0, or -1 with an exception). */
VS_INTERNAL int cast_into(PyArrayObject *column, char *row, PyArrayObject *value);
/* A 2-D strided batch into contiguous `dst`: 1, or 0 where it does not apply. */
VS_INTERNAL int copy_2d(char *dst, const char *src, const npy_intp *dims,
                        const npy_intp *strides, npy_intp itemsize);
/* Any strided batch into contiguous `dst`; returns the end of what it wrote. */
VS_INTERNAL char *copy_strided(char *dst, const char *src, int ndim, const npy_intp *dims,
                               const npy_intp *strides, npy_intp itemsize);
/* The plan's first `count` episodes: (envs, starts, transitions, offsets, steps,
 * reasons, firsts), fresh arrays (NULL with an exception). */
VS_INTERNAL PyObject *planned(VectorStep *self, Py_ssize_t count);

#endif /* RLDS_VECTOR_STEP_H */
