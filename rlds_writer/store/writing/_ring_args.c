/* encode_ring's arguments (described in _ring_records.c) parsed into their structs and
 * checked, every index before a byte is read. Part of the _batch_records extension.
 */
#include "_ring_records.h"

#if HAVE_SSE42

static Py_ssize_t
src_width(char src)
{
    switch (src) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'f': case 'i': case 'I': return 4;
    case 'd': case 'q': case 'Q': return 8;
    default: return 0;
    }
}

int
parse_field(PyObject *item, RingField *f)
{
    if (!PyTuple_Check(item)) {
        goto bad;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(item);
    if (n == 1) {
        f->kind = 0;
        f->index = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        if (f->index < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "encode_ring: a negative constant index");
            }
            return -1;
        }
        return 0;
    }
    PyObject *key, *ring, *zero;
    int tag;
    if (n == 3) {
        f->kind = 1;
        if (!PyArg_ParseTuple(item, "Sin", &key, &tag, &f->index)) {
            return -1;
        }
        if (f->index < 0 || f->index > 2) {
            PyErr_SetString(PyExc_ValueError, "encode_ring: a flag is 0, 1 or 2");
            return -1;
        }
    } else {
        const char *src;
        Py_ssize_t src_len;
        f->kind = 2;
        if (n != 7 || !PyArg_ParseTuple(item, "Sis#nOOn", &key, &tag, &src, &src_len, &f->elems,
                                        &ring, &zero, &f->slot)) {
            goto bad;
        }
        f->src = src_len == 1 ? src[0] : 0;
        f->width = src_width(f->src);
        int floats = f->src == 'f' || f->src == 'd';
        if (!f->width || f->elems < 0 || (tag == 0x12) != floats) {
            PyErr_Format(PyExc_ValueError, "encode_ring: %s values under tag %d", src, tag);
            return -1;
        }
        f->row = f->elems * f->width;
        if (PyObject_GetBuffer(ring, &f->ring, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            return -1;
        }
        f->held = 1;
        if ((f->ring.format && strchr(f->ring.format, 'O')) || f->ring.ndim < 2 ||
            f->ring.itemsize != f->width ||
            f->ring.len != f->ring.shape[0] * f->ring.shape[1] * f->row || !f->ring.shape[0]) {
            PyErr_SetString(PyExc_ValueError, "encode_ring: a ring is [L, N, elems] of src");
            return -1;
        }
        f->size = f->ring.shape[0];
        f->num_envs = f->ring.shape[1];
        if (f->slot < 0) {
            if (PyObject_GetBuffer(zero, &f->zero, PyBUF_C_CONTIGUOUS) < 0) {
                return -1;
            }
            f->held = 2;
            if (f->zero.len != f->row) {
                PyErr_SetString(PyExc_ValueError, "encode_ring: a zero is one row");
                return -1;
            }
        }
    }
    f->key = (const unsigned char *)PyBytes_AS_STRING(key);
    f->key_len = PyBytes_GET_SIZE(key);
    f->tag = (unsigned char)tag;
    return 0;
bad:
    if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "encode_ring: a field is (index,), (key, tag, flag) or "
                                         "(key, tag, src, elems, ring, zero, slot)");
    }
    return -1;
}

int
parse_batch(PyObject *item, Batch *b)
{
    static const char *names[4] = {"envs", "starts", "counts", "reasons"};
    PyObject *firsts;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5 ||
        !PyTuple_Check(firsts = PyTuple_GET_ITEM(item, 4))) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_ring: a batch is (envs, starts, counts, reasons, firsts)");
        return -1;
    }
    b->count = PyObject_Length(PyTuple_GET_ITEM(item, 0));
    if (b->count < 0) {
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (get_index(PyTuple_GET_ITEM(item, i), &b->index[i], b->count, names[i]) < 0) {
            return -1;
        }
        b->held++;
    }
    b->num_firsts = PyTuple_GET_SIZE(firsts);
    b->firsts = PyMem_Calloc(b->num_firsts ? b->num_firsts : 1, sizeof(Py_buffer));
    if (b->firsts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < b->num_firsts; s++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(firsts, s), &b->firsts[s], PyBUF_C_CONTIGUOUS) <
            0) {
            return -1;
        }
        b->held_firsts++;
    }
    return 0;
}

/* Every index checked before a byte is read. */
int
check(const RingField *fields, Py_ssize_t num_fields, const Batch *b, Py_ssize_t num_reasons)
{
    const int64_t *env = b->index[0].buf, *start = b->index[1].buf, *n = b->index[2].buf;
    const int64_t *reason = b->index[3].buf;
    for (Py_ssize_t j = 0; j < b->count; j++) {
        if (n[j] < 0 || start[j] < 0 || env[j] < 0 || reason[j] < 0 || reason[j] >= num_reasons) {
            goto bad;
        }
    }
    for (Py_ssize_t i = 0; i < num_fields; i++) {
        const RingField *f = &fields[i];
        if (f->kind != 2) {
            continue;
        }
        if (f->slot >= b->num_firsts ||
            (f->slot >= 0 && b->firsts[f->slot].len != b->count * f->row)) {
            goto bad;
        }
        for (Py_ssize_t j = 0; j < b->count; j++) {
            if (env[j] >= f->num_envs) {
                goto bad;
            }
        }
    }
    return 0;
bad:
    PyErr_SetString(PyExc_IndexError, "encode_ring: a batch's episodes are out of bounds");
    return -1;
}

#endif /* HAVE_SSE42 */
