/*
 * `RowBuffer`: a column's rows of one fixed size, end to end in one growing
 * buffer (record/row_columns.py `_ArrayColumn`, and the packed scalar columns
 * of record/scalar_columns.py). Part of the `_step_kernel` extension
 * (_step_kernel.h): the C step appends to it directly.
 */
#define NO_IMPORT_ARRAY
#include "_step_kernel.h"

/* rows_reserve's slow path (_step_kernel.h). */
int
rows_grow(RowBuffer *b, Py_ssize_t extra)
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

PyTypeObject RowBufferType = {
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
