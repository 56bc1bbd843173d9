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
 *
 * The step is here (`kernel_take`, with the leaves' tests it inlines) and
 * the module; the other sources are listed in _step_kernel.h.
 */
#include "_step_kernel.h"

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly. */
#define RLDS_ABI 1

PyObject *s_num_steps, *s_owner, *s_refuse, *s_tobytes, *s_rollback, *s_action;

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

PyObject *
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
        || PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0 || add_packed_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
