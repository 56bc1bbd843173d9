/* A whole vector step's ring bookkeeping in one C call (record/batch/vector_step.py;
 * the batches' checks and copies are in _vector_rows.c, shared names in _vector_step.h).
 *
 * VectorStep(columns, heads, discount, open, start, pending, spilled, plan, apart)
 *     holds the time-major ring's columns [L, N, ...] (record/batch/ring.py), the
 *     heads [N, ...] of its observation-like fields (None for a transition field),
 *     the index of the discount column written from `terminated` (-1: none), the
 *     ring's `open` (bool [N]) and `start` (int64 [N]), next-step autoreset's
 *     `pending` (bool [N], or None), the sub-envs whose open episode was spilled
 *     (bool [N]) and two reused outputs: `plan` int64 [6, N] (as
 *     _batch_records.plan writes it) and `apart` int64 [2, N].
 *
 * step(values, terminated, truncated, row, t) -> (total, oldest, apart, plan) or None
 *     records the vector step written at ring row `row` (t = that step + 1):
 *     1. every value (a numpy array per column, in the columns' order; None for
 *        the discount) is checked: shape (N, *row shape) and the column's dtype or
 *        one numpy casts to it by `same_kind`; `terminated`/`truncated` bool [N];
 *        every sub-env either pending or in an episode. Anything else returns None
 *        before a byte is written: the caller takes the general (numpy) path,
 *        which gives the same records or refuses the value by its field's name.
 *     2. writes each value into its column's row `row` (a memcpy, a strided copy,
 *        or numpy's cast), the discount as 1 - terminated;
 *     3. for each sub-env i in order: where pending[i] (next-step autoreset: this
 *        step reset it) an episode begins: heads from the row just written,
 *        start[i] = t, open[i] set; else where terminated[i] | truncated[i] and
 *        open[i], its episode ends: open[i] cleared, and a plan row as
 *        _batch_records.plan writes it (reason 0 terminated, 1 truncated), or
 *        where spilled[i] an `apart` row (sub-env, reason) instead; pending[i]
 *        then holds whether it ended.
 *     Returns the planned episodes' steps in all, their oldest first row (t if
 *     none), the count of `apart` rows, and None if no episode was planned, else
 *     (envs, starts, transitions, offsets, steps, reasons, firsts): the plan's
 *     rows as fresh int64 arrays and, per head (in the columns' order), a fresh
 *     array of the ended episodes' first rows (copied before a begin can
 *     overwrite them).
 *
 * The GIL is held throughout: a short call, and releasing it would hand the
 * env thread's time to the writer thread mid-step.
 */
#include "_vector_step.h"

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly.
 * 2: step returns (total, oldest, apart, plan); 3: a sub-env neither pending nor in
 * an episode sends the step the general way. */
#define RLDS_ABI 3

static PyArrayObject *
c_array(PyObject *obj, int type_num, npy_intp count, const char *name)
{
    /* A C-contiguous, aligned, writable array of `count` items of `type_num`. */
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "VectorStep: %s is not an ndarray", name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != type_num || PyArray_SIZE(a) != count ||
        !PyArray_ISCARRAY(a) || !PyArray_ISNOTSWAPPED(a)) {
        PyErr_Format(PyExc_ValueError, "VectorStep: %s is not a C-contiguous %zd-item array",
                     name, (Py_ssize_t)count);
        return NULL;
    }
    return a;
}

static int
vs_init(VectorStep *self, PyObject *args, PyObject *kwds)
{
    PyObject *columns, *heads, *open, *start, *pending, *spilled, *plan, *apart;
    Py_ssize_t discount;
    static char *kwlist[] = {"columns", "heads",   "discount", "open", "start",
                             "pending", "spilled", "plan",     "apart", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!nOOOOOO:VectorStep", kwlist,
                                     &PyTuple_Type, &columns, &PyTuple_Type, &heads,
                                     &discount, &open, &start, &pending, &spilled, &plan,
                                     &apart)) {
        return -1;
    }
    if (self->columns != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "VectorStep: already made");
        return -1;
    }
    Py_ssize_t nfields = PyTuple_GET_SIZE(columns);
    if (nfields < 1 || nfields > MAX_FIELDS || PyTuple_GET_SIZE(heads) != nfields ||
        discount < -1 || discount >= nfields) {
        PyErr_SetString(PyExc_ValueError, "VectorStep: columns, heads and discount disagree");
        return -1;
    }
    npy_intp size = 0, n = 0;
    for (Py_ssize_t k = 0; k < nfields; k++) {
        PyObject *c = PyTuple_GET_ITEM(columns, k), *h = PyTuple_GET_ITEM(heads, k);
        if (!PyArray_Check(c) || PyArray_NDIM((PyArrayObject *)c) < 2 ||
            !PyArray_ISCARRAY((PyArrayObject *)c) || PyArray_ISOBJECT((PyArrayObject *)c)) {
            PyErr_SetString(PyExc_ValueError,
                            "VectorStep: a column is not a C-contiguous [L, N, ...] array");
            return -1;
        }
        PyArrayObject *col = (PyArrayObject *)c;
        if (k == 0) {
            size = PyArray_DIM(col, 0);
            n = PyArray_DIM(col, 1);
        }
        if (PyArray_DIM(col, 0) != size || PyArray_DIM(col, 1) != n || size < 1 || n < 1) {
            PyErr_SetString(PyExc_ValueError, "VectorStep: the columns' [L, N] differ");
            return -1;
        }
        if (h != Py_None) {
            PyArrayObject *head = (PyArrayObject *)h;
            if (!PyArray_Check(h) || !PyArray_ISCARRAY(head) ||
                !PyArray_EquivTypes(PyArray_DESCR(head), PyArray_DESCR(col)) ||
                PyArray_NBYTES(head) != PyArray_NBYTES(col) / size) {
                PyErr_SetString(PyExc_ValueError, "VectorStep: a head is not its column's row");
                return -1;
            }
        }
        if (k == discount) {
            int type = PyArray_TYPE(col);
            if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || PyArray_NDIM(col) != 2 ||
                h != Py_None) {
                PyErr_SetString(PyExc_ValueError, "VectorStep: the discount is not float [L, N]");
                return -1;
            }
        }
    }
    PyArrayObject *a_open = c_array(open, NPY_BOOL, n, "open");
    PyArrayObject *a_start = a_open ? c_array(start, NPY_INT64, n, "start") : NULL;
    PyArrayObject *a_spilled = a_start ? c_array(spilled, NPY_BOOL, n, "spilled") : NULL;
    PyArrayObject *a_plan = a_spilled ? c_array(plan, NPY_INT64, 6 * n, "plan") : NULL;
    PyArrayObject *a_apart = a_plan ? c_array(apart, NPY_INT64, 2 * n, "apart") : NULL;
    if (a_apart == NULL) {
        return -1;
    }
    PyArrayObject *a_pending = NULL;
    if (pending != Py_None && (a_pending = c_array(pending, NPY_BOOL, n, "pending")) == NULL) {
        return -1;
    }
    self->keep = PyTuple_Pack(6, open, start, pending, spilled, plan, apart);
    if (self->keep == NULL) {
        return -1;
    }
    Py_INCREF(columns);
    Py_INCREF(heads);
    self->columns = columns;
    self->heads = heads;
    self->nfields = nfields;
    self->num_envs = n;
    self->size = size;
    self->discount = discount;
    self->open = PyArray_DATA(a_open);
    self->start = PyArray_DATA(a_start);
    self->spilled = PyArray_DATA(a_spilled);
    self->plan = PyArray_DATA(a_plan);
    self->apart = PyArray_DATA(a_apart);
    self->pending = a_pending ? PyArray_DATA(a_pending) : NULL;
    return 0;
}

static int
vs_traverse(VectorStep *self, visitproc visit, void *arg)
{
    Py_VISIT(self->columns);
    Py_VISIT(self->heads);
    Py_VISIT(self->keep);
    return 0;
}

static int
vs_clear(VectorStep *self)
{
    Py_CLEAR(self->columns);
    Py_CLEAR(self->heads);
    Py_CLEAR(self->keep);
    self->open = self->pending = self->spilled = NULL;
    self->start = self->plan = self->apart = NULL;
    return 0;
}

static void
vs_dealloc(VectorStep *self)
{
    PyObject_GC_UnTrack(self);
    vs_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}
static PyObject *
vs_step(VectorStep *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step(values, terminated, truncated, row, t)");
        return NULL;
    }
    if (self->columns == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "VectorStep: not made");
        return NULL;
    }
    PyObject *values = args[0];
    Py_ssize_t row = PyLong_AsSsize_t(args[3]);
    long long t = PyLong_AsLongLong(args[4]);
    if ((row == -1 || t == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (row < 0 || row >= self->size) {
        PyErr_SetString(PyExc_ValueError, "VectorStep.step: row outside the ring");
        return NULL;
    }
    Py_ssize_t nf = self->nfields, n = self->num_envs;
    if (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != nf) {
        Py_RETURN_NONE;
    }
    npy_intp ts = 0, rs = 0;
    const unsigned char *term = flags_of(args[1], n, &ts), *trunc = flags_of(args[2], n, &rs);
    if (term == NULL || trunc == NULL) {
        Py_RETURN_NONE;
    }
    unsigned char *open = self->open, *pending = self->pending;
    if (pending != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (pending[i] == open[i]) {
                /* Pending with an episode open (begin() would cut it short first), or
                 * neither (its own rules decide): the general path. */
                Py_RETURN_NONE;
            }
        }
    }
    int how[MAX_FIELDS];
    for (Py_ssize_t k = 0; k < nf; k++) {
        PyArrayObject *column = (PyArrayObject *)PyTuple_GET_ITEM(self->columns, k);
        how[k] = k == self->discount ? 3 : value_fits(PyTuple_GET_ITEM(values, k), column);
        if (!how[k]) {
            Py_RETURN_NONE;
        }
    }
    /* Checked: the rows. */
    char *rows[MAX_FIELDS];
    for (Py_ssize_t k = 0; k < nf; k++) {
        PyArrayObject *column = (PyArrayObject *)PyTuple_GET_ITEM(self->columns, k);
        npy_intp row_bytes = PyArray_NBYTES(column) / self->size;
        char *dst = rows[k] = PyArray_BYTES(column) + row * row_bytes;
        PyArrayObject *v = (PyArrayObject *)PyTuple_GET_ITEM(values, k);
        if (how[k] == 3) {
            if (PyArray_TYPE(column) == NPY_FLOAT32) {
                float *d = (float *)dst;
                for (Py_ssize_t i = 0; i < n; i++) {
                    d[i] = term[i * ts] ? 0.0f : 1.0f;
                }
            } else {
                double *d = (double *)dst;
                for (Py_ssize_t i = 0; i < n; i++) {
                    d[i] = term[i * ts] ? 0.0 : 1.0;
                }
            }
        } else if (how[k] == 2) {
            if (cast_into(column, dst, v) < 0) {
                return NULL;
            }
        } else if (PyArray_IS_C_CONTIGUOUS(v)) {
            memcpy(dst, PyArray_DATA(v), row_bytes);
        } else if (PyArray_NDIM(v) != 2 || !copy_2d(dst, PyArray_DATA(v), PyArray_DIMS(v),
                                                     PyArray_STRIDES(v), PyArray_ITEMSIZE(v))) {
            copy_strided(dst, PyArray_DATA(v), PyArray_NDIM(v), PyArray_DIMS(v),
                         PyArray_STRIDES(v), PyArray_ITEMSIZE(v));
        }
    }
    /* Episodes begun (pending) and ended, sub-env by sub-env. */
    const unsigned char *spilled = self->spilled;
    int64_t *start = self->start, *env = self->plan, *first = env + n, *moves = first + n;
    int64_t *at = moves + n, *steps = at + n, *reason = steps + n;
    int64_t *apart_env = self->apart, *apart_reason = apart_env + n;
    Py_ssize_t count = 0, napart = 0;
    int64_t total = 0, oldest = t;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pending != NULL && pending[i]) {
            for (Py_ssize_t k = 0; k < nf; k++) {
                PyObject *h = PyTuple_GET_ITEM(self->heads, k);
                if (h != Py_None) {
                    npy_intp b = PyArray_NBYTES((PyArrayObject *)h) / n;
                    memcpy(PyArray_BYTES((PyArrayObject *)h) + i * b, rows[k] + i * b, b);
                }
            }
            start[i] = t;
            open[i] = 1;
            pending[i] = 0;
            continue;
        }
        int ended = (term[i * ts] | trunc[i * rs]) && open[i];
        if (pending != NULL) {
            pending[i] = (unsigned char)ended;
        }
        if (!ended) {
            continue;
        }
        open[i] = 0;
        if (spilled[i]) {
            apart_env[napart] = i;
            apart_reason[napart++] = term[i * ts] ? 0 : 1;
            continue;
        }
        env[count] = i;
        first[count] = start[i];
        moves[count] = t - start[i];
        at[count] = total;
        steps[count] = t - start[i] + 1;
        reason[count] = term[i * ts] ? 0 : 1;
        total += steps[count];
        if (start[i] < oldest) {
            oldest = start[i];
        }
        count++;
    }
    if (!count) {
        return Py_BuildValue("LLnO", (long long)total, (long long)oldest, napart, Py_None);
    }
    PyObject *plan = planned(self, count);
    if (plan == NULL) {
        return NULL;
    }
    return Py_BuildValue("LLnN", (long long)total, (long long)oldest, napart, plan);
}

static PyMethodDef vs_methods[] = {
    {"step", (PyCFunction)(void (*)(void))vs_step, METH_FASTCALL,
     "step(values, terminated, truncated, row, t) -> (total, oldest, apart, plan) or None: "
     "one vector step's rows, begins and ends."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject VectorStepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rlds_writer.record.batch._vector_step.VectorStep",
    .tp_basicsize = sizeof(VectorStep),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A vector step's ring bookkeeping in one call (see _vector_step.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)vs_init,
    .tp_dealloc = (destructor)vs_dealloc,
    .tp_traverse = (traverseproc)vs_traverse,
    .tp_clear = (inquiry)vs_clear,
    .tp_methods = vs_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_vector_step",
    "A vector step's ring bookkeeping in one C call (see _vector_step.c).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__vector_step(void)
{
    import_array();
    if (PyType_Ready(&VectorStepType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "ABI", RLDS_ABI) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&VectorStepType);
    if (PyModule_AddObject(module, "VectorStep", (PyObject *)&VectorStepType) < 0) {
        Py_DECREF(&VectorStepType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
