/* encode_ring's arguments (_ring_records.c), parsed and checked in _ring_args.c: what
 * the two files share. Part of the _batch_records extension (_batch_records.h).
 */
#ifndef RLDS_RING_RECORDS_H
#define RLDS_RING_RECORDS_H

#include "_batch_records.h"

#if HAVE_SSE42

typedef struct {
    int kind; /* 0 constant, 1 flag, 2 from the ring */
    Py_ssize_t index; /* constant: its index; flag: which */
    const unsigned char *key;
    Py_ssize_t key_len;
    unsigned char tag;
    char src;
    Py_ssize_t width, elems, row, size, num_envs, slot;
    Py_buffer ring, zero;
    int held; /* 1: ring, 2: ring and zero */
} RingField;

typedef struct {
    Py_buffer index[4]; /* envs, starts, counts, reasons */
    int held;
    Py_ssize_t count;
    Py_buffer *firsts;
    Py_ssize_t num_firsts, held_firsts;
} Batch;

/* _ring_args.c: a field or a batch of encode_ring's arguments into its struct (what was
 * taken is counted in `held`, for the caller to let go, error or not); `check`: every
 * index of a batch within its rings and constants, before a byte is read. -1: an error is
 * set. */
__attribute__((visibility("hidden"))) int parse_field(PyObject *item, RingField *f);
__attribute__((visibility("hidden"))) int parse_batch(PyObject *item, Batch *b);
__attribute__((visibility("hidden"))) int check(const RingField *fields, Py_ssize_t num_fields,
                                                const Batch *b, Py_ssize_t num_reasons);

#endif /* HAVE_SSE42 */
#endif /* RLDS_RING_RECORDS_H */
