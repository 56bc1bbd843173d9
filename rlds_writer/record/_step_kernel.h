/*
 * The C step of `EnvLogger` and `RecordRLDS` (record/step_kernel.py): what
 * the sources of the `_step_kernel` extension share (setup.py lists them).
 *
 * - _step_kernel.c: the step itself (`StepKernel.__call__`) and the module;
 * - _step_kernel_new.c: a StepKernel made from its spec, and let go;
 * - _row_buffer.c: `RowBuffer`, a column's fixed-size rows in one buffer;
 * - _packed_values.h: what a packed scalar column takes as it is (inline:
 *   the step tests such a value on every step).
 *
 * Every TU includes this header first. numpy's C API table is one for the
 * module (PY_ARRAY_UNIQUE_SYMBOL), filled by _step_kernel.c's
 * `import_array()`; the others define NO_IMPORT_ARRAY before including this.
 * What one file defines for another is hidden: the module exports
 * `PyInit__step_kernel` only.
 */
#ifndef RLDS_STEP_KERNEL_H
#define RLDS_STEP_KERNEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL rlds_step_kernel_ARRAY_API
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>

#if defined(__GNUC__)
#define SK_INTERNAL __attribute__((visibility("hidden")))
#define SK_UNUSED __attribute__((unused))
#else
#define SK_INTERNAL
#define SK_UNUSED
#endif

/* A column's rows of one fixed size, end to end in one growing buffer
 * (record/row_columns.py `_ArrayColumn`): the step copies an observation's bytes
 * in, instead of making a `bytes` per step that the episode's end joins. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len; /* bytes used: a whole number of rows */
    Py_ssize_t cap;
    Py_ssize_t row; /* bytes per row */
} RowBuffer;

SK_INTERNAL extern PyTypeObject RowBufferType;

/* Room for `extra` more bytes past the rows, made by doubling; -1
 * (MemoryError set) if there is none. The step reserves a row per column on
 * every step: the common case (room already there) is inline. */
SK_INTERNAL int rows_grow(RowBuffer *b, Py_ssize_t extra);

static inline int
rows_reserve(RowBuffer *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap) return 0;
    return rows_grow(b, extra);
}

#include "_packed_values.h"

/* Appends a packed scalar's row (float_value's, int_value's); the room must be
 * there. Rows of 4 or 8 bytes: each size its own memcpy, which the compiler
 * makes one move (a length known only at run time is a call into libc, paid
 * for every packed value of every step). */
static inline void
rows_put_packed(RowBuffer *b, const Packed *p)
{
    if (b->row == 4)
        memcpy(b->data + b->len, p->bytes, 4);
    else
        memcpy(b->data + b->len, p->bytes, 8);
    b->len += b->row;
}

/* How a column takes its value (the `kernel_leaf` of record/scalar_columns.py, row_columns.py). */
enum {
    LEAF_INT = 0,    /* a Python int within [lo, hi] (the dtype's range), or a type in `types` */
    LEAF_SCALAR = 1, /* a Python float if `float_first`, or a type in `types`; with a
                        float dtype, a Python int only if it converts to a double */
    LEAF_ARRAY = 2,  /* a numpy.ndarray of exactly `dtype` and `shape`: its bytes */
    LEAF_NONE = 3,   /* the dataset has no such field: the value is not looked at */
    LEAF_FLOAT = 4,  /* a float32 or float64 scalar packed into a RowBuffer (`float_value`) */
    LEAF_INT64 = 5,  /* an int64 scalar packed into a RowBuffer (`int_value`) */
};

typedef struct {
    int kind;
    int float_first;
    int int_to_double; /* LEAF_SCALAR of a float dtype: a Python int must fit a double */
    PyObject *list;  /* the column's list of values, or its RowBuffer (LEAF_ARRAY, FLOAT, INT64) */
    int rows;        /* list is a RowBuffer */
    PyObject *types; /* a (frozen)set of types, or None */
    PyObject *dtype; /* LEAF_ARRAY: the numpy dtype object, or None */
    int ndim;
    npy_intp dims[NPY_MAXDIMS];
    Py_ssize_t nbytes;
    long long lo, hi; /* LEAF_INT: the range of ints taken as they are */
} Leaf;

/* The leaves in order: action, reward, discount, observation. */
#define N_LEAVES 4

#define MAX_CHECKS 4

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *env_step;
    /* A bound method's function and self (env_step's): called as function(self,
     * action), without the method object's call (which copies the arguments). */
    PyObject *step_function, *step_self;
    PyObject *result_type;  /* the exact type of the env's result (a tuple type) */
    Py_ssize_t result_size;
    int n_checks;
    Py_ssize_t check_index[MAX_CHECKS];
    PyObject *check_value[MAX_CHECKS]; /* result[check_index[i]] must be this object */
    /* Where the reward, discount and observation come from: an item of the
     * result (index >= 0), or the constant in source_value. */
    Py_ssize_t source_index[N_LEAVES - 1];
    PyObject *source_value[N_LEAVES - 1];
    PyObject *after;
    PyObject *buffer;
    Py_ssize_t count_offset; /* where the buffer's `num_steps` slot lives */
    Py_ssize_t owner_offset; /* its `owner` slot: the ident of the episode's thread */
    PyObject *owner_seen;    /* the last `owner` read (a reference: its address stays its) */
    unsigned long owner_ident; /* ... and its value */
    Leaf leaves[N_LEAVES];
} StepKernel;

/* Names the step looks up, interned once by the module (_step_kernel.c). */
SK_INTERNAL extern PyObject *s_num_steps, *s_owner, *s_refuse, *s_tobytes, *s_rollback,
    *s_action;

/* _step_kernel.c */
SK_INTERNAL PyObject *kernel_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames);
/* _step_kernel_new.c */
SK_INTERNAL PyObject *kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds);
SK_INTERNAL int kernel_traverse(StepKernel *k, visitproc visit, void *arg);
SK_INTERNAL int kernel_clear(StepKernel *k);
SK_INTERNAL void kernel_dealloc(StepKernel *k);

#endif /* RLDS_STEP_KERNEL_H */
