/* The ring's cuts for the batch recorder (store/writing/batch_records.py,
 * record/batch/ring.py): `gather` and `plan`, described with the module in
 * _batch_records.c. Part of the `_batch_records` extension (_batch_records.h).
 */
#include "_batch_records.h"

#if HAVE_SSE42

/* ------------------------------------------------------------------ gather */

/* Episode j: its first row (head) or not, its ring rows from start[j] (mod size), the
 * zero row after them (not head); `width` a constant where the switch gives one. */
#define GATHER_ROWS(width)                                                                  \
    for (Py_ssize_t j = 0; j < count; j++) {                                                \
        char *o = dst + at[j] * (width);                                                    \
        if (head) {                                                                         \
            memcpy(o, firsts + (head == 1 ? env[j] : j) * (width), (width));                \
            o += (width);                                                                   \
        }                                                                                   \
        int64_t r = start[j] % size;                                                        \
        const char *column = src + env[j] * (width);                                        \
        for (int64_t k = 0; k < n[j]; k++) {                                                \
            memcpy(o, column + r * num_envs * (width), (width));                            \
            o += (width);                                                                   \
            if (++r == size) {                                                              \
                r = 0;                                                                      \
            }                                                                               \
        }                                                                                   \
        if (!head) {                                                                        \
            memcpy(o, firsts, (width));                                                     \
        }                                                                                   \
    }

PyObject *
gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "gather(out, ring, first, envs, starts, counts, offsets, head)");
        return NULL;
    }
    long head = PyLong_AsLong(args[7]);
    if (head == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (head < 0 || head > 2) {
        PyErr_SetString(PyExc_ValueError, "gather: head is 0, 1 or 2");
        return NULL;
    }
    Py_buffer out, ring, first, envs, starts, counts, offsets;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) <
        0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &ring, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &first, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&ring);
        return NULL;
    }
    PyObject *result = NULL;
    int have = 0;
    Py_ssize_t count = 0, size = 0, num_envs = 0, row = 0, out_rows = 0;
    /* Object references are not bytes to copy (their counts would be wrong). */
    if ((out.format && strchr(out.format, 'O')) || (ring.format && strchr(ring.format, 'O')) ||
        (first.format && strchr(first.format, 'O'))) {
        PyErr_SetString(PyExc_TypeError, "gather: object arrays are not copied as bytes");
        goto done;
    }
    if (ring.ndim < 2 || out.ndim < 1 || first.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "gather: ring [L, N, ...], first and out are arrays");
        goto done;
    }
    size = ring.shape[0];
    num_envs = ring.shape[1];
    row = size && num_envs ? ring.len / (size * num_envs) : 0;
    out_rows = out.shape[0];
    if ((out_rows && out.len / out_rows != row) ||
        (first.shape[0] && first.len / first.shape[0] != row)) {
        PyErr_SetString(PyExc_ValueError, "gather: out, ring and first rows differ in size");
        goto done;
    }
    count = PyObject_Length(args[3]);
    if (count < 0) {
        goto done;
    }
    if (get_index(args[3], &envs, count, "envs") < 0) {
        goto done;
    }
    have = 1;
    if (get_index(args[4], &starts, count, "starts") < 0) {
        goto done;
    }
    have = 2;
    if (get_index(args[5], &counts, count, "counts") < 0) {
        goto done;
    }
    have = 3;
    if (get_index(args[6], &offsets, count, "offsets") < 0) {
        goto done;
    }
    have = 4;
    const int64_t *env = envs.buf, *start = starts.buf, *n = counts.buf, *at = offsets.buf;
    /* Every index is checked before anything is copied. */
    for (Py_ssize_t j = 0; j < count; j++) {
        int64_t f = head == 1 ? env[j] : head == 2 ? j : 0;
        if (env[j] < 0 || env[j] >= num_envs || n[j] < 0 || start[j] < 0 || at[j] < 0 ||
            at[j] + n[j] + 1 > out_rows || f >= first.shape[0]) {
            PyErr_Format(PyExc_IndexError, "gather: episode %zd is out of bounds", j);
            goto done;
        }
    }
    char *dst = out.buf;
    const char *src = ring.buf, *firsts = first.buf;
    Py_BEGIN_ALLOW_THREADS
    switch (row) { /* fixed sizes copy inline: many short rows, each its own cache line */
    case 1: GATHER_ROWS(1); break;
    case 2: GATHER_ROWS(2); break;
    case 4: GATHER_ROWS(4); break;
    case 8: GATHER_ROWS(8); break;
    case 16: GATHER_ROWS(16); break;
    case 32: GATHER_ROWS(32); break;
    default: GATHER_ROWS(row); break;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    if (have >= 4) {
        PyBuffer_Release(&offsets);
    }
    if (have >= 3) {
        PyBuffer_Release(&counts);
    }
    if (have >= 2) {
        PyBuffer_Release(&starts);
    }
    if (have >= 1) {
        PyBuffer_Release(&envs);
    }
    PyBuffer_Release(&first);
    PyBuffer_Release(&ring);
    PyBuffer_Release(&out);
    return result;
}

/* -------------------------------------------------------------------- plan */

static int
get_flags(PyObject *obj, Py_buffer *view, Py_ssize_t count, int writable, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) <
        0) {
        return -1;
    }
    if (view->len != count || view->itemsize != 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bool values", name, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyObject *
plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "plan(out, mask, open, start, terminated, t)");
        return NULL;
    }
    long long t = PyLong_AsLongLong(args[5]);
    if (t == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer out, mask, open, start, term;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    Py_ssize_t n = out.len / (6 * (Py_ssize_t)sizeof(int64_t));
    if (out.len != n * 6 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "plan: out is int64 [6, N]");
        PyBuffer_Release(&out);
        return NULL;
    }
    if (get_flags(args[1], &mask, n, 0, "mask") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (get_flags(args[2], &open, n, 1, "open") < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&mask);
        return NULL;
    }
    if (get_index(args[3], &start, n, "start") < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&mask);
        PyBuffer_Release(&open);
        return NULL;
    }
    int cut = args[4] == Py_None;
    if (!cut && get_flags(args[4], &term, n, 0, "terminated") < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&mask);
        PyBuffer_Release(&open);
        PyBuffer_Release(&start);
        return NULL;
    }
    int64_t *env = out.buf, *first = env + n, *moves = first + n, *at = moves + n;
    int64_t *steps = at + n, *reason = steps + n;
    const unsigned char *m = mask.buf, *ended = cut ? NULL : term.buf;
    unsigned char *o = open.buf;
    const int64_t *s = start.buf;
    Py_ssize_t count = 0;
    int64_t total = 0, oldest = t;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!(m[i] && o[i])) {
            continue;
        }
        o[i] = 0;
        env[count] = i;
        first[count] = s[i];
        moves[count] = t - s[i];
        at[count] = total;
        steps[count] = t - s[i] + 1;
        reason[count] = cut ? 2 : (ended[i] ? 0 : 1);
        total += steps[count];
        if (s[i] < oldest) {
            oldest = s[i];
        }
        count++;
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&open);
    PyBuffer_Release(&start);
    if (!cut) {
        PyBuffer_Release(&term);
    }
    return Py_BuildValue("nLL", count, (long long)total, (long long)oldest);
}

#endif /* HAVE_SSE42 */
