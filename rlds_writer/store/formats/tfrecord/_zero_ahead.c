/* Zeros written up to an offset it is told, by a thread of its own, without the GIL.
 *
 * rlds_writer/store/formats/tfrecord/write_ahead.py decides how far ahead of
 * an open shard's records zeros are written (the page cache then holds large
 * folios ready for them) and when; this module only carries it out off the
 * recording thread. `advance(end, to)`: a record is about to be written up to
 * `end`, and zeros are wanted up to `to`. The thread writes them in `pwrite`s
 * of at most 1 MiB through a duplicate of the shard's descriptor, holding its
 * mutex, and sleeps when it has reached `to`; `advance` wakes it only when it
 * sleeps (a store and a load otherwise). It never writes below `floor`: the
 * records written before it started (`ZeroAhead(fd, floor)`: its thread may
 * see a `to` before the first `advance` claims anything), and any record
 * ending past the zeros, which claims its bytes first (`advance` waits for
 * the `pwrite` in flight), so zeros never overwrite a record.
 *
 * `close` only stops the thread (after the `pwrite` in flight): no zero is
 * written once it returns. The thread then exits by itself and the last
 * owner of their shared state (the object, the thread, and each `advance`
 * while it runs without the GIL) frees it and closes the duplicate. The
 * object is safe to misuse from Python: the GIL guards `self->state`, taken
 * by exactly one `close` and referenced by an `advance` before it lets the
 * GIL go, so threads calling `advance` and `close` at once neither read the
 * state after it is freed nor release it twice.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

/* What Python calls and reads of this module, versioned: bump it, and
 * rlds_writer/_native.py's ABI with it, whenever that changes (a function's
 * arguments, a method, a constant). A build of other sources is then refused
 * at import (its Python path runs instead) rather than called wrongly. */
#define RLDS_ABI 3

#define MAX_WRITE (1 << 20) /* the most one pwrite writes */

static const char *zeros; /* MAX_WRITE zero bytes, shared by every ZeroAhead */

typedef struct {
    int fd;         /* the duplicate */
    int owners;     /* the object, the thread, and each advance() in flight */
    int stop;
    int error;      /* errno of a failed pwrite: no more zeros are written */
    int waiting;    /* the thread sleeps on `cv` (or is about to) */
    int64_t to;     /* zeros are wanted up to here */
    int64_t done;   /* zeros (or claimed records) reach here; read without the mutex */
    int64_t floor;  /* nothing is written below here */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} State;

typedef struct {
    PyObject_HEAD
    State *state;   /* NULL once closed */
    pid_t pid;      /* the thread exists in this process only */
} ZeroAhead;

static void release(State *s) {
    if (__atomic_sub_fetch(&s->owners, 1, __ATOMIC_ACQ_REL) == 0) {
        close(s->fd);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void *run(void *arg) {
    State *s = (State *)arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->error) {
        int64_t start = max64(s->done, s->floor);
        int64_t to = __atomic_load_n(&s->to, __ATOMIC_SEQ_CST);
        if (to > start) {
            int64_t n = to - start;
            if (n > MAX_WRITE) n = MAX_WRITE;
            ssize_t written = pwrite(s->fd, zeros, (size_t)n, (off_t)start);
            if (written < 0) {
                if (errno == EINTR) continue;
                s->error = errno ? errno : EIO;
                break;
            }
            __atomic_store_n(&s->done, start + written, __ATOMIC_RELEASE);
            continue;
        }
        /* Asleep until told more: `advance` stores `to`, then reads `waiting`;
         * this stores `waiting`, then reads `to` once more, so one of the two
         * sees the other's store and no request is slept through. */
        __atomic_store_n(&s->waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->to, __ATOMIC_SEQ_CST) <= start && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        __atomic_store_n(&s->waiting, 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->mu);
    release(s);
    return NULL;
}

/* Takes the object's state away (with the GIL held): the caller stops it.
 * NULL if it was closed, or in a forked child, where the thread and its
 * mutex's owner do not exist: the state is left as it is (its descriptor is
 * the child's to lose). */
static State *take_state(ZeroAhead *self) {
    State *s = self->state;
    self->state = NULL;
    return s != NULL && self->pid == getpid() ? s : NULL;
}

/* Stops the thread of a state taken from its object: once this returns, no
 * zero is written. Needs no GIL. */
static void stop(State *s) {
    if (s == NULL) return;
    pthread_mutex_lock(&s->mu); /* waits for the pwrite in flight */
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    release(s);
}

static int ZeroAhead_init(ZeroAhead *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fd", "floor", NULL};
    int fd;
    long long floor;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iL", kwlist, &fd, &floor)) return -1;
    if (floor < 0) {
        PyErr_SetString(PyExc_ValueError, "ZeroAhead: floor must be >= 0");
        return -1;
    }
    if (self->state != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ZeroAhead is already running");
        return -1;
    }
    State *s = calloc(1, sizeof(State));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->fd = dup(fd);
    if (s->fd < 0) {
        free(s);
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    s->owners = 2;
    /* Set before the thread starts: it may see a `to` before any claim. */
    s->floor = s->done = (int64_t)floor;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_attr_t thread_attr;
    pthread_attr_init(&thread_attr);
    pthread_attr_setdetachstate(&thread_attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&thread_attr, 64 << 10);
    pthread_t thread;
    int failed = pthread_create(&thread, &thread_attr, run, s);
    pthread_attr_destroy(&thread_attr);
    if (failed) {
        s->owners = 1;
        release(s);
        errno = failed;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->state = s;
    self->pid = getpid();
    return 0;
}

static void ZeroAhead_dealloc(ZeroAhead *self) {
    stop(take_state(self));
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Running, and in the process that made it (a forked child cannot take the mutex). */
static State *running(ZeroAhead *self) {
    if (self->state == NULL || self->pid != getpid()) {
        PyErr_SetString(PyExc_ValueError, "ZeroAhead is closed or belongs to another process");
        return NULL;
    }
    return self->state;
}

/* Takes the state's mutex (the thread holds it while it writes zeros): at once
 * when free, keeping the GIL (no hand-over to another thread for a lock taken
 * in nanoseconds); else without the GIL, waiting for the pwrite in flight.
 * Returns whether the GIL was let go (then `*save` holds the thread state and
 * the caller owns a reference to `s`, released by `unlock_state`). */
static int lock_state(State *s, PyThreadState **save) {
    if (pthread_mutex_trylock(&s->mu) == 0) return 0;
    __atomic_add_fetch(&s->owners, 1, __ATOMIC_ACQ_REL); /* a close() may come meanwhile */
    *save = PyEval_SaveThread();
    pthread_mutex_lock(&s->mu);
    return 1;
}

static void unlock_state(State *s, int released, PyThreadState *save, int wake) {
    pthread_mutex_unlock(&s->mu);
    if (wake) pthread_cond_signal(&s->cv); /* after the unlock: it wakes to a free mutex */
    if (released) {
        release(s);
        PyEval_RestoreThread(save);
    }
}

static PyObject *ZeroAhead_advance(ZeroAhead *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "advance(end, to) takes 2 arguments");
        return NULL;
    }
    long long end = PyLong_AsLongLong(args[0]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    long long to = PyLong_AsLongLong(args[1]);
    if (to == -1 && PyErr_Occurred()) return NULL;
    State *s = running(self);
    if (s == NULL) return NULL;
    int error = __atomic_load_n(&s->error, __ATOMIC_ACQUIRE);
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int wake = 0;
    int64_t wanted = __atomic_load_n(&s->to, __ATOMIC_RELAXED);
    while (to > wanted) { /* `to` only grows */
        if (__atomic_compare_exchange_n(&s->to, &wanted, (int64_t)to, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
            wake = __atomic_load_n(&s->waiting, __ATOMIC_SEQ_CST);
            break;
        }
    }
    int64_t done = __atomic_load_n(&s->done, __ATOMIC_ACQUIRE);
    if (end > done || wake) {
        /* A record outran the zeros (it claims its bytes: the mutex waits for
         * the pwrite in flight), or the thread sleeps (it is woken). */
        PyThreadState *save = NULL;
        int released = lock_state(s, &save);
        if (end > s->floor) s->floor = end;
        if (end > s->done) __atomic_store_n(&s->done, (int64_t)end, __ATOMIC_RELEASE);
        done = s->done;
        unlock_state(s, released, save, wake);
    }
    return PyLong_FromLongLong(done);
}

#define WRITE_PARTS 64
#define KEEP_GIL_BYTES (256 << 10) /* a write this small keeps the GIL */
#define WRITE_MOST (1 << 20)      /* larger: the caller's writev_all (1 MiB calls) */

/* Writes iov[0..n) whole (resuming after short writes); 0, or errno. */
static int write_fully(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        ssize_t written = writev(fd, iov, n);
        if (written < 0) {
            if (errno == EINTR) continue;
            return errno ? errno : EIO;
        }
        while (n > 0 && (size_t)written >= iov->iov_len) {
            written -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + written;
            iov->iov_len -= (size_t)written;
        }
    }
    return 0;
}

static PyObject *ZeroAhead_write(ZeroAhead *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(parts, end) takes 2 arguments");
        return NULL;
    }
    long long end = PyLong_AsLongLong(args[1]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    State *s = self->state;
    if (s == NULL || self->pid != getpid()) Py_RETURN_FALSE; /* the caller writes it */
    PyObject *seq = PySequence_Fast(args[0], "write(parts, end) takes a list of bytes-like parts");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > WRITE_PARTS) {
        Py_DECREF(seq);
        Py_RETURN_FALSE;
    }
    Py_buffer views[WRITE_PARTS];
    struct iovec iov[WRITE_PARTS];
    Py_ssize_t got = 0, total = 0;
    PyObject *result = NULL;
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        iov[got].iov_base = views[got].buf;
        iov[got].iov_len = (size_t)views[got].len;
        total += views[got].len;
    }
    if (total > WRITE_MOST) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    /* With the mutex held the thread writes no zeros meanwhile: the record's
     * write never waits on the file's lock behind a pwrite of zeros. */
    PyThreadState *save = NULL;
    int released;
    if (total > KEEP_GIL_BYTES) {
        __atomic_add_fetch(&s->owners, 1, __ATOMIC_ACQ_REL);
        save = PyEval_SaveThread();
        pthread_mutex_lock(&s->mu);
        released = 1;
    } else {
        released = lock_state(s, &save);
    }
    /* The record claims its bytes (no zero is written below `end` after),
     * whether or not the zeros reach it yet: no `advance` needed first. */
    if (end > s->floor) s->floor = end;
    if (end > s->done) __atomic_store_n(&s->done, (int64_t)end, __ATOMIC_RELEASE);
    int error = write_fully(s->fd, iov, (int)n);
    unlock_state(s, released, save, 0);
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_NewRef(Py_True);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    Py_DECREF(seq);
    return result;
}

#define IOV_BATCH 1024 /* IOV_MAX on Linux */

/* write_all(fd, parts): storage.writev_all without Python per part (a record
 * of camera frames is two parts per frame): `writev`s of at most 1 MiB and
 * IOV_BATCH parts, resumed after short writes; the GIL kept up to
 * KEEP_GIL_BYTES in all. */
static PyObject *write_all(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write_all(fd, parts) takes 2 arguments");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "write_all: not a file descriptor");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "write_all(fd, parts) takes a list of parts");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc(IOV_BATCH, sizeof(struct iovec));
    Py_ssize_t got = 0, total = 0;
    PyObject *result = NULL;
    if (views == NULL || iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        total += views[got].len;
    }
    int error = 0;
    PyThreadState *save = total > KEEP_GIL_BYTES ? PyEval_SaveThread() : NULL;
    Py_ssize_t i = 0, off = 0; /* the next byte: part i, at off */
    while (i < n && !error) {
        int k = 0;
        size_t size = 0;
        while (i < n && k < IOV_BATCH && size < WRITE_MOST) {
            size_t left = (size_t)(views[i].len - off);
            size_t take = left < WRITE_MOST - size ? left : WRITE_MOST - size;
            if (take) {
                iov[k].iov_base = (char *)views[i].buf + off;
                iov[k].iov_len = take;
                k++;
                size += take;
            }
            off += (Py_ssize_t)take;
            if (off == views[i].len) {
                i++;
                off = 0;
            }
        }
        if (k) error = write_fully((int)fd, iov, k);
    }
    if (save != NULL) PyEval_RestoreThread(save);
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t j = 0; j < got; j++) PyBuffer_Release(&views[j]);
    PyMem_Free(views);
    PyMem_Free(iov);
    Py_DECREF(seq);
    return result;
}

static PyObject *ZeroAhead_close(ZeroAhead *self, PyObject *Py_UNUSED(ignored)) {
    State *s = take_state(self); /* with the GIL: one close() takes it, others find NULL */
    Py_BEGIN_ALLOW_THREADS
    stop(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef ZeroAhead_methods[] = {
    {"advance", (PyCFunction)(void (*)(void))ZeroAhead_advance, METH_FASTCALL,
     "advance(end, to): a record is about to be written up to `end` (no zero is written\n"
     "below it), and zeros are wanted up to `to`. Returns where the zeros written so far\n"
     "(or claimed records) reach. Raises OSError once a write of zeros failed."},
    {"write", (PyCFunction)(void (*)(void))ZeroAhead_write, METH_FASTCALL,
     "write(parts, end): writes the bytes-like parts whole at the shard's position (they\n"
     "end at `end`, which they claim: no zero is written below it), through the duplicate\n"
     "descriptor (one file position), while the thread writes no zeros; up to 256 KiB\n"
     "keeping the GIL. Returns False, writing and claiming nothing, where it does not take\n"
     "them (closed, another process, over 64 parts or 1 MiB). Raises OSError."},
    {"close", (PyCFunction)ZeroAhead_close, METH_NOARGS,
     "close(): stops the thread (after the pwrite in flight); no zero is written after."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ZeroAheadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlds_writer.store.formats.tfrecord._zero_ahead.ZeroAhead",
    .tp_doc = "ZeroAhead(fd, floor): writes zeros into `fd` up to where `advance` asks, on a\n"
              "thread, never below `floor` (where the records written so far end).",
    .tp_basicsize = sizeof(ZeroAhead),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ZeroAhead_init,
    .tp_dealloc = (destructor)ZeroAhead_dealloc,
    .tp_methods = ZeroAhead_methods,
};

static PyMethodDef module_methods[] = {
    {"write_all", (PyCFunction)(void (*)(void))write_all, METH_FASTCALL,
     "write_all(fd, parts): writes the bytes-like parts whole, in writev calls of at most\n"
     "1 MiB (storage.writev_all's), keeping the GIL up to 256 KiB. Raises OSError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_zero_ahead",
    .m_doc = "Zeros written up to an offset it is told, on a thread without the GIL;\n"
             "a shard's record parts written in writev calls (write_all).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__zero_ahead(void) {
    if (zeros == NULL) {
        zeros = calloc(1, MAX_WRITE); /* untouched pages: the kernel's zero page */
        if (zeros == NULL) return PyErr_NoMemory();
    }
    if (PyType_Ready(&ZeroAheadType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", RLDS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ZeroAheadType);
    if (PyModule_AddObject(m, "ZeroAhead", (PyObject *)&ZeroAheadType) < 0) {
        Py_DECREF(&ZeroAheadType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
