/*
 * A `StepKernel` made from its spec (`StepKernel(env_step, result_type,
 * result_size, checks, sources, after, buffer, leaves)`, built by
 * record/step_kernel.py), each leaf checked as it is parsed, and let go.
 * Part of the `_step_kernel` extension (_step_kernel.h).
 */
#define NO_IMPORT_ARRAY
#include "_step_kernel.h"

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

int
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

int
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

void
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

PyObject *
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
