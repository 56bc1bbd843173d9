/*
 * The mid-episode step of `EnvLogger` and `RecordRLDS` in C (see
 * record/step_kernel.py).
 *
 * A `StepKernel` is called as `step(action)`. It steps the env and, when the
 * env's result is of the expected type and size, its items say the episode
 * goes on (`checks`: items that must be these very objects, such as
 * `StepType.MID`, or `False` for terminated and truncated), and every value
 * passes the same test as the generated Python step (record/appender.py),
 * appends the action, reward, discount and a copy of the observation to the
 * columns (a list, or for an array a `RowBuffer`: the rows end to end in one
 * growing buffer; a float32, float64 or int64 scalar goes into one packed, as
 * numpy casts it) and counts the step. Anything else (another step type, an
 * episode's end, a value to cast or refuse, a buffer before `start`) goes to
 * `after(action, result)`, the Python step without the env call, which
 * decides as always. So the kernel never refuses a value: it only takes the
 * common case faster, and stores what the Python step would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>

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

static PyTypeObject RowBufferType;

/* Room for `extra` more bytes; -1 (MemoryError set) if there is none. */
static int
rows_reserve(RowBuffer *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 16 * b->row;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static PyObject *
rows_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t row;
    static char *kwlist[] = {"row", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:RowBuffer", kwlist, &row)) return NULL;
    if (row < 1) {
        PyErr_Format(PyExc_ValueError, "RowBuffer: a row of at least 1 byte expected, got %zd",
                     row);
        return NULL;
    }
    RowBuffer *b = (RowBuffer *)type->tp_alloc(type, 0);
    if (b == NULL) return NULL;
    b->row = row;
    return (PyObject *)b;
}

static void
rows_dealloc(RowBuffer *b)
{
    PyMem_Free(b->data);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static Py_ssize_t
rows_length(RowBuffer *b)
{
    return b->len / b->row;
}

static PyObject *
rows_append(RowBuffer *b, PyObject *value)
{
    Py_buffer view;
    if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len != b->row) {
        PyErr_Format(PyExc_ValueError, "RowBuffer: a row of %zd bytes expected, got %zd",
                     b->row, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (rows_reserve(b, b->row) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(b->data + b->len, view.buf, (size_t)b->row);
    b->len += b->row;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* A Python int (exactly) within [lo, hi]: 1 (*out set), 0 (outside it, or
 * past long long), -1 (an error is set). */
static int
long_within(PyObject *v, long long lo, long long hi, long long *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

/* What the packed scalar columns take as they are, listed once: `float_value`
 * and `int_value` take these, and the module hands the same lists to Python
 * (NUMBER_TYPES, INT64_TYPES, FLOAT32_EXACT_INT, FLOAT64_EXACT_INT), whose
 * compiled step tests values with them (record/scalar_columns.py). */
/* The largest Python int a float column of `row` bytes holds exactly: 2**24, 2**53. */
#define FLOAT_EXACT_INT(row) ((row) == 4 ? (1LL << 24) : (1LL << 53))
/* The scalar types a float column takes (`float_value` reads each its own way). */
#define NUMBER_SCALARS(X) X(PyFloat_Type) X(PyDoubleArrType_Type) X(PyFloatArrType_Type)
/* The numpy integer scalars an int64 column takes: each holds its values in
 * int64 (np.long is 32 bits on some platforms; np.uint, an unsigned long, is
 * not taken). X(type object, its PyArrayScalar_VAL name). */
#define INT64_SCALARS(X) \
    X(PyLongArrType_Type, Long) X(PyLongLongArrType_Type, LongLong) \
    X(PyIntArrType_Type, Int) X(PyShortArrType_Type, Short) X(PyByteArrType_Type, Byte) \
    X(PyUIntArrType_Type, UInt) X(PyUShortArrType_Type, UShort) X(PyUByteArrType_Type, UByte)

/* A packed scalar's bytes, as they go into its RowBuffer (the first 4 of a float32). */
typedef union {
    double f;
    float f32;
    long long i;
    char bytes[8];
} Packed;

/* A value of a scalar float column of `row` bytes (4: float32, 8: float64) as
 * the bytes numpy's cast gives: a Python float (np.float64 is one) or a
 * Python int the dtype holds exactly (|x| <= 2**24 or 2**53: no rounding to
 * agree on) through C's cast of a double (numpy's: overflow to inf, a NaN
 * quieted), an np.float32 as it is into float32 (numpy copies its bits: a
 * signalling NaN stays one, which a trip through a double would quiet).
 * 1: taken (*out set); 0: anything else, left to numpy (record/values.py
 * `cast_value`); -1: an error is set. */
static int
float_value(PyObject *v, Py_ssize_t row, Packed *out)
{
    PyTypeObject *t = Py_TYPE(v);
    double d;
    if (t == &PyFloat_Type || t == &PyDoubleArrType_Type) {
        d = PyFloat_AS_DOUBLE(v);
    } else if (t == &PyFloatArrType_Type) {
        if (row == 4) {
            memcpy(out->bytes, &PyArrayScalar_VAL(v, Float), 4);
            return 1;
        }
        d = (double)PyArrayScalar_VAL(v, Float);
    } else if (t == &PyLong_Type) {
        long long exact = FLOAT_EXACT_INT(row), x;
        int taken = long_within(v, -exact, exact, &x);
        if (taken != 1) return taken;
        d = (double)x;
    } else {
        return 0;
    }
    if (row == 4) out->f32 = (float)d;
    else out->f = d;
    return 1;
}

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

static PyObject *
rows_append_number(RowBuffer *b, PyObject *value)
{
    Packed p;
    if (b->row != 4 && b->row != 8) {
        PyErr_SetString(PyExc_TypeError, "RowBuffer.append_number: rows of 4 or 8 bytes only");
        return NULL;
    }
    int taken = float_value(value, b->row, &p);
    if (taken < 0) return NULL;
    if (!taken) Py_RETURN_FALSE;
    if (rows_reserve(b, b->row) < 0) return NULL;
    rows_put_packed(b, &p);
    Py_RETURN_TRUE;
}

/* A value of an int64 scalar column: a Python int within int64, or a numpy
 * integer scalar of INT64_SCALARS (each holds its value exactly).
 * 1: taken (*out set); 0: anything else, left to the Python step (which
 * refuses an int out of range by name, or casts); -1: an error is set. */
static int
int_value(PyObject *v, long long *out)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type) return long_within(v, LLONG_MIN, LLONG_MAX, out);
#define TAKE_INT(type, name) \
    if (t == &type) { \
        *out = (long long)PyArrayScalar_VAL(v, name); \
        return 1; \
    }
    INT64_SCALARS(TAKE_INT)
#undef TAKE_INT
    return 0;
}

/* A tuple of `n` type objects. */
static PyObject *
type_tuple(PyTypeObject *const *types, Py_ssize_t n)
{
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF((PyObject *)types[i]);
        PyTuple_SET_ITEM(out, i, (PyObject *)types[i]);
    }
    return out;
}

static int
add_owned(PyObject *m, const char *name, PyObject *value)
{
    if (value == NULL) return -1;
    int rc = PyModule_AddObjectRef(m, name, value);
    Py_DECREF(value);
    return rc;
}

/* NUMBER_TYPES, INT64_TYPES, FLOAT32_EXACT_INT and FLOAT64_EXACT_INT: the lists
 * above, for the Python step's test of the same values. */
static int
add_packed_types(PyObject *m)
{
#define NUMBER_TYPE(type) &type,
#define INT64_TYPE(type, unused) &type,
    PyTypeObject *const numbers[] = {NUMBER_SCALARS(NUMBER_TYPE)};
    PyTypeObject *const ints[] = {INT64_SCALARS(INT64_TYPE)};
#undef NUMBER_TYPE
#undef INT64_TYPE
    if (add_owned(m, "NUMBER_TYPES", type_tuple(numbers, sizeof numbers / sizeof *numbers)) < 0
        || add_owned(m, "INT64_TYPES", type_tuple(ints, sizeof ints / sizeof *ints)) < 0
        || add_owned(m, "FLOAT32_EXACT_INT", PyLong_FromLongLong(FLOAT_EXACT_INT(4))) < 0
        || add_owned(m, "FLOAT64_EXACT_INT", PyLong_FromLongLong(FLOAT_EXACT_INT(8))) < 0)
        return -1;
    return 0;
}

static PyObject *
rows_append_int(RowBuffer *b, PyObject *value)
{
    Packed p;
    if (b->row != 8) {
        PyErr_SetString(PyExc_TypeError, "RowBuffer.append_int: rows of 8 bytes only");
        return NULL;
    }
    int taken = int_value(value, &p.i);
    if (taken < 0) return NULL;
    if (!taken) Py_RETURN_FALSE;
    if (rows_reserve(b, 8) < 0) return NULL;
    rows_put_packed(b, &p);
    Py_RETURN_TRUE;
}

/* An int64 column's values as one byte each (their packed varints) if all lie
 * in [0, 128), else None. */
static PyObject *
rows_take_small_ints(RowBuffer *b, PyObject *Py_UNUSED(ignored))
{
    if (b->row != 8) {
        PyErr_SetString(PyExc_TypeError, "RowBuffer.take_small_ints: rows of 8 bytes only");
        return NULL;
    }
    Py_ssize_t n = b->len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, b->data + 8 * i, 8);
        if (v < 0 || v > 127) Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) return NULL;
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, b->data + 8 * i, 8);
        dst[i] = (char)v;
    }
    return out;
}

static PyObject *
rows_truncate(RowBuffer *b, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "RowBuffer.truncate: a row count >= 0 expected");
        return NULL;
    }
    if (n < rows_length(b)) b->len = n * b->row;
    Py_RETURN_NONE;
}

/* Past this, `clear` lets the memory go (one very long episode must not
 * keep it for the rest of the recording). */
#define ROWS_KEPT_BYTES (8 << 20)

static PyObject *
rows_clear(RowBuffer *b, PyObject *Py_UNUSED(ignored))
{
    b->len = 0; /* the buffer stays: the next episode fills it again */
    if (b->cap > ROWS_KEPT_BYTES) {
        PyMem_Free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
rows_take(RowBuffer *b, PyObject *Py_UNUSED(ignored))
{
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
}

static PyMethodDef rows_methods[] = {
    {"append", (PyCFunction)rows_append, METH_O, "append(row): copies one row's bytes in"},
    {"append_number", (PyCFunction)rows_append_number, METH_O,
     "append_number(x): appends a float, np.float32 or int as a float32 (4-byte rows) or\n"
     "float64 (8-byte rows), cast as numpy casts it; False (nothing appended) for anything else"},
    {"truncate", (PyCFunction)rows_truncate, METH_O, "truncate(n): keeps the first n rows"},
    {"clear", (PyCFunction)rows_clear, METH_NOARGS,
     "clear(): no rows (the memory stays, up to 8 MiB)"},
    {"take", (PyCFunction)rows_take, METH_NOARGS, "take(): the rows end to end, as bytes"},
    {"append_int", (PyCFunction)rows_append_int, METH_O,
     "append_int(x): appends a Python int within int64 or a numpy integer of at most 32 bits\n"
     "or int64 as an int64 (8-byte rows); False (nothing appended) for anything else"},
    {"take_small_ints", (PyCFunction)rows_take_small_ints, METH_NOARGS,
     "take_small_ints(): int64 rows as one byte each if all lie in [0, 128), else None"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods rows_as_sequence = {
    .sq_length = (lenfunc)rows_length,
};

static PyTypeObject RowBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlds_writer.record._step_kernel.RowBuffer",
    .tp_basicsize = sizeof(RowBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RowBuffer(row): rows of `row` bytes end to end in one growing buffer.",
    .tp_new = rows_new,
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_methods = rows_methods,
    .tp_as_sequence = &rows_as_sequence,
};

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

static PyObject *s_num_steps, *s_owner, *s_refuse, *s_tobytes, *s_rollback, *s_action;

/* 1: the value is appended as it is (a packed leaf's as *p); 0: the Python
 * step decides; -1: an error is set. */
static int
leaf_takes(const Leaf *leaf, PyObject *v, Packed *p)
{
    PyTypeObject *t = Py_TYPE(v);
    switch (leaf->kind) {
    case LEAF_NONE:
        return 1;
    case LEAF_FLOAT:
        return float_value(v, leaf->nbytes, p);
    case LEAF_INT64:
        return int_value(v, &p->i);
    case LEAF_INT:
        if (t == &PyLong_Type) {
            /* Out of range: the Python step refuses it, naming the field (or,
             * above int64 in a uint64 column, takes it). */
            long long x;
            return long_within(v, leaf->lo, leaf->hi, &x);
        }
        return PySet_Contains(leaf->types, (PyObject *)t);
    case LEAF_SCALAR:
        if (leaf->float_first && t == &PyFloat_Type) return 1;
        if (leaf->int_to_double && t == &PyLong_Type) {
            /* Too large for any float (numpy's cast raises): the Python step
             * refuses it at the step, naming the field. */
            if (PyLong_AsDouble(v) == -1.0 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
                PyErr_Clear();
                return 0;
            }
        }
        return PySet_Contains(leaf->types, (PyObject *)t);
    default: {
        if (t != &PyArray_Type) return 0; /* subclasses: the Python step */
        PyArrayObject *a = (PyArrayObject *)v;
        if ((PyObject *)PyArray_DESCR(a) != leaf->dtype || PyArray_NDIM(a) != leaf->ndim)
            return 0;
        const npy_intp *dims = PyArray_DIMS(a);
        for (int i = 0; i < leaf->ndim; i++)
            if (dims[i] != leaf->dims[i]) return 0;
        return 1;
    }
    }
}

/* What the Python step stores for the value: the value, or the array's `tobytes()`. */
static PyObject *
leaf_item(const Leaf *leaf, PyObject *v)
{
    if (leaf->kind != LEAF_ARRAY) return Py_NewRef(v);
    PyArrayObject *a = (PyArrayObject *)v;
    if (PyArray_IS_C_CONTIGUOUS(a))
        return PyBytes_FromStringAndSize(PyArray_BYTES(a), leaf->nbytes);
    return PyObject_CallMethodNoArgs(v, s_tobytes); /* C order, as the Python step */
}

/* The Python step decides; steals the reference to `ts`. */
static PyObject *
hand_over(StepKernel *k, PyObject *action, PyObject *ts)
{
    PyObject *args[2] = {action, ts};
    PyObject *result = PyObject_Vectorcall(k->after, args, 2, NULL);
    Py_DECREF(ts);
    return result;
}

/* Whether this step comes from a thread other than the one that began the
 * episode (the buffer's `owner` slot: its ident, 0 for none): two threads'
 * steps in one episode would make a mix of two. The slot's int is read once
 * per episode (it is set when an episode begins): a step compares its object
 * with the one last read, and the thread's ident with the value kept. */
static int
foreign(StepKernel *k)
{
    if (k->owner_offset < 0) return 0;
    PyObject *owner = *(PyObject **)((char *)k->buffer + k->owner_offset);
    if (owner == NULL) return 0;
    if (owner != k->owner_seen) {
        if (!PyLong_CheckExact(owner)) return 0;
        unsigned long ident = PyLong_AsUnsignedLong(owner);
        if (ident == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        Py_XSETREF(k->owner_seen, Py_NewRef(owner));
        k->owner_ident = ident;
    }
    return k->owner_ident != 0 && k->owner_ident != PyThread_get_thread_ident();
}

/* Records the env's result `ts` of `action` if every value is taken as it is,
 * else hands both to `after`; returns the result. Steals the reference to `ts`. */
static PyObject *
kernel_take(StepKernel *k, PyObject *action, PyObject *ts)
{
    if ((PyObject *)Py_TYPE(ts) != k->result_type || PyTuple_GET_SIZE(ts) != k->result_size)
        return hand_over(k, action, ts);
    for (int i = 0; i < k->n_checks; i++)
        if (PyTuple_GET_ITEM(ts, k->check_index[i]) != k->check_value[i])
            return hand_over(k, action, ts);

    PyObject **count = (PyObject **)((char *)k->buffer + k->count_offset);
    if (*count == NULL || !PyLong_CheckExact(*count)) return hand_over(k, action, ts);
    Py_ssize_t n = PyLong_AsSsize_t(*count);
    if (n == -1 && PyErr_Occurred()) goto error;
    /* Not started: the Python step says so. At PY_SSIZE_T_MAX steps, n + 1
     * would not fit: the Python step counts in Python ints. */
    if (n <= 0 || n == PY_SSIZE_T_MAX) return hand_over(k, action, ts);
    if (foreign(k)) return hand_over(k, action, ts); /* the Python step refuses it */

    PyObject *values[N_LEAVES] = {action};
    Packed packed[N_LEAVES];
    for (int i = 1; i < N_LEAVES; i++)
        values[i] = k->source_index[i - 1] >= 0 ? PyTuple_GET_ITEM(ts, k->source_index[i - 1])
                                                : k->source_value[i - 1];
    for (int i = 0; i < N_LEAVES; i++) {
        int takes = leaf_takes(&k->leaves[i], values[i], &packed[i]);
        if (takes < 0) goto error;
        if (!takes) return hand_over(k, action, ts);
    }
    /* Every item is made, and every RowBuffer has room, before any append: a
     * failed copy leaves the columns as they were. A RowBuffer's item is NULL
     * where the array's own bytes are copied in (C order already). */
    PyObject *items[N_LEAVES];
    for (int i = 0; i < N_LEAVES; i++) {
        const Leaf *leaf = &k->leaves[i];
        items[i] = NULL;
        if (leaf->kind == LEAF_NONE) continue;
        int made = 1;
        if (leaf->rows) {
            if (rows_reserve((RowBuffer *)leaf->list, leaf->nbytes) < 0)
                made = 0;
            else if (leaf->kind == LEAF_ARRAY
                     && !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)values[i])
                     && (items[i] = leaf_item(leaf, values[i])) == NULL)
                made = 0;
        } else if ((items[i] = leaf_item(leaf, values[i])) == NULL) {
            made = 0;
        }
        if (!made) {
            while (i--) Py_XDECREF(items[i]);
            goto error;
        }
    }
    int failed = 0;
    for (int i = 0; i < N_LEAVES; i++) {
        if (k->leaves[i].rows || items[i] == NULL) continue; /* RowBuffers below; LEAF_NONE */
        if (!failed && PyList_Append(k->leaves[i].list, items[i]) < 0) failed = 1;
        Py_CLEAR(items[i]);
    }
    for (int i = 0; i < N_LEAVES && !failed; i++) {
        if (!k->leaves[i].rows) continue;
        RowBuffer *b = (RowBuffer *)k->leaves[i].list;
        if (k->leaves[i].kind == LEAF_FLOAT || k->leaves[i].kind == LEAF_INT64) {
            rows_put_packed(b, &packed[i]);
            continue;
        }
        const char *src = items[i] != NULL ? PyBytes_AS_STRING(items[i])
                                           : PyArray_BYTES((PyArrayObject *)values[i]);
        memcpy(b->data + b->len, src, (size_t)b->row); /* the room was made above */
        b->len += b->row;
    }
    for (int i = 0; i < N_LEAVES; i++) Py_XDECREF(items[i]);
    if (failed) {
        /* All or none, as the Python step: roll the columns back to n steps. */
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *raised = PyErr_GetRaisedException();
#else
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
#endif
        PyObject *steps = PyLong_FromSsize_t(n);
        PyObject *done = steps ? PyObject_CallMethodOneArg(k->buffer, s_rollback, steps) : NULL;
        Py_XDECREF(steps);
        Py_XDECREF(done);
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(raised);
#else
        PyErr_Restore(type, value, tb);
#endif
        goto error;
    }
    PyObject *next = PyLong_FromSsize_t(n + 1);
    if (next == NULL) goto error;
    Py_SETREF(*count, next);
    return ts;

error:
    Py_DECREF(ts);
    return NULL;
}

static PyObject *
kernel_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    StepKernel *k = (StepKernel *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw != 1
        || (nkw == 1
            && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_action) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "step() takes one argument, the action");
        return NULL;
    }
    PyObject *action = args[0];
    if (foreign(k)) {
        /* Refused before the env is stepped: `refuse_thread` raises. */
        PyObject *none = PyObject_CallMethodNoArgs(k->buffer, s_refuse);
        if (none == NULL) return NULL;
        Py_DECREF(none);
        PyErr_SetString(PyExc_RuntimeError, "a step from another thread than the episode's");
        return NULL;
    }
    PyObject *ts;
    if (k->step_function != NULL) {
        PyObject *call[2] = {k->step_self, action};
        ts = PyObject_Vectorcall(k->step_function, call, 2, NULL);
    } else {
        PyObject *call[2] = {NULL, action}; /* room for the callee's self */
        ts = PyObject_Vectorcall(k->env_step, call + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    if (ts == NULL) return NULL;
    return kernel_take(k, action, ts);
}

/* A numpy dtype's `itemsize` (the descriptor's field moved in NumPy 2); -1: an error is set. */
static Py_ssize_t
descr_itemsize(PyObject *dtype)
{
    PyObject *size = PyObject_GetAttrString(dtype, "itemsize");
    if (size == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(size);
    Py_DECREF(size);
    return n;
}

static int
parse_leaf(Leaf *leaf, PyObject *spec)
{
    int kind, float_first;
    PyObject *list, *types, *dtype, *shape;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(spec, "iOOpOO!n;a leaf is (kind, list, types, float_first, dtype, "
                                "shape, nbytes)",
                          &kind, &list, &types, &float_first, &dtype, &PyTuple_Type, &shape,
                          &nbytes))
        return -1;
    int rows = Py_IS_TYPE(list, &RowBufferType);
    if (kind == LEAF_FLOAT || kind == LEAF_INT64 ? !rows
                           : kind != LEAF_NONE && !PyList_CheckExact(list)
                                 && !(kind == LEAF_ARRAY && rows)) {
        PyErr_SetString(PyExc_TypeError,
                        "a leaf's values go to a list (an array's or a packed scalar's to a "
                        "RowBuffer)");
        return -1;
    }
    if (rows && ((RowBuffer *)list)->row != nbytes) {
        PyErr_SetString(PyExc_ValueError, "a leaf's RowBuffer holds rows of nbytes");
        return -1;
    }
    if (kind == LEAF_NONE) {
        /* nothing to check */
    } else if (kind == LEAF_FLOAT) {
        if (nbytes != 4 && nbytes != 8) {
            PyErr_SetString(PyExc_ValueError, "a float leaf packs 4 or 8 bytes");
            return -1;
        }
    } else if (kind == LEAF_INT64) {
        if (nbytes != 8) {
            PyErr_SetString(PyExc_ValueError, "an int64 leaf packs 8 bytes");
            return -1;
        }
    } else if (kind == LEAF_ARRAY) {
        if (!PyArray_DescrCheck(dtype) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS || nbytes < 0) {
            PyErr_SetString(PyExc_ValueError, "an array leaf needs a dtype, a shape and nbytes");
            return -1;
        }
        /* A row is copied as nbytes from the array's data (kernel_take): more
         * would read past it, fewer would cut it. */
        Py_ssize_t size = descr_itemsize(dtype);
        if (size < 0) return -1;
        leaf->ndim = (int)PyTuple_GET_SIZE(shape);
        for (int i = 0; i < leaf->ndim; i++) {
            leaf->dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
            if (leaf->dims[i] == -1 && PyErr_Occurred()) return -1;
            if (leaf->dims[i] < 0) {
                PyErr_SetString(PyExc_ValueError, "an array leaf's shape has a negative size");
                return -1;
            }
            if (size && leaf->dims[i] > PY_SSIZE_T_MAX / size) {
                PyErr_SetString(PyExc_ValueError, "an array leaf's rows are too large");
                return -1;
            }
            size *= leaf->dims[i];
        }
        if (size != nbytes) {
            PyErr_Format(PyExc_ValueError,
                         "an array leaf's nbytes must be its dtype's itemsize times its shape's "
                         "size, %zd; got %zd",
                         size, nbytes);
            return -1;
        }
    } else if (kind == LEAF_INT || kind == LEAF_SCALAR) {
        if (!PyAnySet_Check(types)) {
            PyErr_SetString(PyExc_TypeError, "a scalar leaf's types must be a set");
            return -1;
        }
        leaf->int_to_double = kind == LEAF_SCALAR && PyArray_DescrCheck(dtype)
                              && PyDataType_ISFLOAT((PyArray_Descr *)dtype);
        if (kind == LEAF_INT) {
            /* The size from `dtype.itemsize`: the descriptor's field moved in NumPy 2. */
            PyArray_Descr *d = (PyArray_Descr *)dtype;
            PyObject *size = PyArray_DescrCheck(dtype) && PyDataType_ISINTEGER(d)
                                 ? PyObject_GetAttrString(dtype, "itemsize")
                                 : NULL;
            long bytes = size != NULL ? PyLong_AsLong(size) : -1;
            Py_XDECREF(size);
            if (bytes < 1 || bytes > 8) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "an int leaf needs an integer dtype");
                return -1;
            }
            int bits = 8 * (int)bytes;
            if (PyDataType_ISUNSIGNED(d)) {
                leaf->lo = 0;
                leaf->hi = bits == 64 ? LLONG_MAX : (long long)((1ULL << bits) - 1);
            } else {
                leaf->lo = bits == 64 ? LLONG_MIN : -(1LL << (bits - 1));
                leaf->hi = bits == 64 ? LLONG_MAX : (1LL << (bits - 1)) - 1;
            }
        }
    } else {
        PyErr_Format(PyExc_ValueError, "unknown leaf kind %d", kind);
        return -1;
    }
    leaf->kind = kind;
    leaf->rows = rows;
    leaf->float_first = float_first;
    leaf->nbytes = nbytes;
    leaf->list = Py_NewRef(list);
    leaf->types = Py_NewRef(types);
    leaf->dtype = Py_NewRef(dtype);
    return 0;
}

static int
kernel_traverse(StepKernel *k, visitproc visit, void *arg)
{
    Py_VISIT(k->env_step);
    Py_VISIT(k->step_function);
    Py_VISIT(k->step_self);
    Py_VISIT(k->result_type);
    for (int i = 0; i < k->n_checks; i++) Py_VISIT(k->check_value[i]);
    for (int i = 0; i < N_LEAVES - 1; i++) Py_VISIT(k->source_value[i]);
    Py_VISIT(k->after);
    Py_VISIT(k->buffer);
    for (int i = 0; i < N_LEAVES; i++) {
        Py_VISIT(k->leaves[i].list);
        Py_VISIT(k->leaves[i].types);
        Py_VISIT(k->leaves[i].dtype);
    }
    return 0;
}

static int
kernel_clear(StepKernel *k)
{
    Py_CLEAR(k->env_step);
    Py_CLEAR(k->step_function);
    Py_CLEAR(k->step_self);
    Py_CLEAR(k->result_type);
    for (int i = 0; i < k->n_checks; i++) Py_CLEAR(k->check_value[i]);
    for (int i = 0; i < N_LEAVES - 1; i++) Py_CLEAR(k->source_value[i]);
    Py_CLEAR(k->after);
    Py_CLEAR(k->buffer);
    Py_CLEAR(k->owner_seen);
    for (int i = 0; i < N_LEAVES; i++) {
        Py_CLEAR(k->leaves[i].list);
        Py_CLEAR(k->leaves[i].types);
        Py_CLEAR(k->leaves[i].dtype);
    }
    return 0;
}

static void
kernel_dealloc(StepKernel *k)
{
    PyObject_GC_UnTrack(k);
    kernel_clear(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

/* The offset of the buffer's writable slot `name`, as its member descriptor
 * reads and writes it; -1 with an error set if it has none. */
static Py_ssize_t
slot_offset(PyObject *buffer, PyObject *name)
{
    PyObject *slot = PyObject_GetAttr((PyObject *)Py_TYPE(buffer), name);
    if (slot == NULL) return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(slot, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)slot)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) offset = member->offset;
    }
    Py_DECREF(slot);
    if (offset < 0)
        PyErr_Format(PyExc_TypeError, "the buffer's %U must be a writable slot", name);
    return offset;
}

static PyObject *
kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *env_step, *result_type, *checks, *sources, *after, *buffer, *leaves;
    Py_ssize_t result_size;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "StepKernel takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOnO!O!OOO!:StepKernel", &env_step, &result_type, &result_size,
                          &PyTuple_Type, &checks, &PyTuple_Type, &sources, &after, &buffer,
                          &PyTuple_Type, &leaves))
        return NULL;
    if (!PyCallable_Check(env_step) || !PyCallable_Check(after) || !PyType_Check(result_type)
        || !PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "StepKernel(env_step, result_type, result_size, checks, sources, after, "
                        "buffer, leaves): callables and a tuple type");
        return NULL;
    }
    if (PyTuple_GET_SIZE(leaves) != N_LEAVES || PyTuple_GET_SIZE(sources) != N_LEAVES - 1
        || PyTuple_GET_SIZE(checks) > MAX_CHECKS || result_size < 1) {
        PyErr_Format(PyExc_ValueError, "StepKernel needs %d leaves, %d sources, at most %d checks",
                     N_LEAVES, N_LEAVES - 1, MAX_CHECKS);
        return NULL;
    }
    Py_ssize_t count_offset = slot_offset(buffer, s_num_steps);
    if (count_offset < 0) return NULL;
    Py_ssize_t owner_offset = slot_offset(buffer, s_owner);
    if (owner_offset < 0) PyErr_Clear(); /* a buffer that names no owner: steps not checked */
    StepKernel *k = (StepKernel *)type->tp_alloc(type, 0);
    if (k == NULL) return NULL;
    k->vectorcall = kernel_vectorcall;
    k->env_step = Py_NewRef(env_step);
    if (PyMethod_Check(env_step)) {
        k->step_function = Py_NewRef(PyMethod_GET_FUNCTION(env_step));
        k->step_self = Py_NewRef(PyMethod_GET_SELF(env_step));
    }
    k->result_type = Py_NewRef(result_type);
    k->result_size = result_size;
    k->after = Py_NewRef(after);
    k->buffer = Py_NewRef(buffer);
    k->count_offset = count_offset;
    k->owner_offset = owner_offset;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(checks); i++) {
        Py_ssize_t index;
        PyObject *value;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(checks, i), "nO;a check is (index, object)",
                              &index, &value))
            goto fail;
        if (index < 0 || index >= result_size) {
            PyErr_SetString(PyExc_ValueError, "a check's index is outside the result");
            goto fail;
        }
        k->check_index[i] = index;
        k->check_value[i] = Py_NewRef(value);
        k->n_checks = (int)i + 1;
    }
    for (int i = 0; i < N_LEAVES - 1; i++) {
        PyObject *source = PyTuple_GET_ITEM(sources, i);
        if (PyLong_Check(source)) {
            k->source_index[i] = PyLong_AsSsize_t(source);
            if (k->source_index[i] < 0 || k->source_index[i] >= result_size) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "a source's index is outside the result");
                goto fail;
            }
        } else if (PyTuple_Check(source) && PyTuple_GET_SIZE(source) == 1) {
            k->source_index[i] = -1;
            k->source_value[i] = Py_NewRef(PyTuple_GET_ITEM(source, 0));
        } else {
            PyErr_SetString(PyExc_TypeError, "a source is an index or a (constant,) tuple");
            goto fail;
        }
    }
    for (int i = 0; i < N_LEAVES; i++) {
        if (parse_leaf(&k->leaves[i], PyTuple_GET_ITEM(leaves, i)) < 0) goto fail;
    }
    return (PyObject *)k;

fail:
    Py_DECREF(k);
    return NULL;
}

static PyMemberDef kernel_members[] = {
    {"after", T_OBJECT, offsetof(StepKernel, after), READONLY,
     "after(action, result): the Python step without the env call, for what this one does not take"},
    {NULL},
};

static PyTypeObject StepKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlds_writer.record._step_kernel.StepKernel",
    .tp_basicsize = sizeof(StepKernel),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Steps the env and records the transition (see dm_env.Environment.step).",
    .tp_new = kernel_new,
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_traverse = (traverseproc)kernel_traverse,
    .tp_clear = (inquiry)kernel_clear,
    .tp_call = PyVectorcall_Call,
    .tp_members = kernel_members,
    .tp_vectorcall_offset = offsetof(StepKernel, vectorcall),
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_step_kernel",
    .m_doc = "The mid-episode step of EnvLogger and the Gymnasium wrappers in C "
             "(record/step_kernel.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__step_kernel(void)
{
    import_array();
    s_num_steps = PyUnicode_InternFromString("num_steps");
    s_owner = PyUnicode_InternFromString("owner");
    s_refuse = PyUnicode_InternFromString("refuse_thread");
    s_tobytes = PyUnicode_InternFromString("tobytes");
    s_rollback = PyUnicode_InternFromString("_rollback");
    s_action = PyUnicode_InternFromString("action");
    if (!s_num_steps || !s_owner || !s_refuse || !s_tobytes || !s_rollback || !s_action) return NULL;
    if (PyType_Ready(&StepKernelType) < 0 || PyType_Ready(&RowBufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&kernel_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "StepKernel", (PyObject *)&StepKernelType) < 0
        || PyModule_AddObjectRef(m, "RowBuffer", (PyObject *)&RowBufferType) < 0
        || PyModule_AddIntConstant(m, "LEAF_INT", LEAF_INT) < 0
        || PyModule_AddIntConstant(m, "LEAF_SCALAR", LEAF_SCALAR) < 0
        || PyModule_AddIntConstant(m, "LEAF_ARRAY", LEAF_ARRAY) < 0
        || PyModule_AddIntConstant(m, "LEAF_NONE", LEAF_NONE) < 0
        || PyModule_AddIntConstant(m, "LEAF_FLOAT", LEAF_FLOAT) < 0
        || PyModule_AddIntConstant(m, "LEAF_INT64", LEAF_INT64) < 0
        || add_packed_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
