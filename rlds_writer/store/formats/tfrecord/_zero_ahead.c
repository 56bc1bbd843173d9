/* Zeros written ahead of a shard's records by a thread of its own, without the GIL.
 *
 * rlds_writer/store/formats/tfrecord/write_ahead.py keeps zeros ahead of an open shard's
 * records (the page cache then holds large folios ready for them). A
 * `ZeroAhead` writes them on its own thread, so the recording thread neither
 * writes nor wakes anything: the thread reads where the records end from the
 * file position the shard's `writev`s advance (it writes through a duplicate
 * of the shard's descriptor, which shares that position), and when less than
 * half of `ahead` bytes of zeros are left past it, writes more in one
 * `pwrite`, holding its mutex. Between looks it sleeps: until about halfway
 * to when more will be due at the rate the records grow, longer and longer
 * while they do not. It never writes below `floor`: a record about to be written past
 * the zeros claims its bytes first (`advance` waits for the `pwrite` in flight
 * and wakes the thread), so zeros never overwrite a record.
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
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_WRITE (1 << 20) /* the most one pwrite writes */
#define ALIGN (64 << 10)    /* zeros end on this boundary: whole large folios */
#define MIN_SLEEP_NS 50000
#define MAX_SLEEP_NS 50000000

static const char *zeros; /* MAX_WRITE zero bytes, shared by every ZeroAhead */

typedef struct {
    int fd;         /* the duplicate */
    int owners;     /* the object, the thread, and each advance() in flight */
    int stop;
    int error;      /* errno of a failed pwrite or lseek: no more zeros are written */
    int64_t ahead;  /* how far past the records the zeros reach */
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

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *run(void *arg) {
    State *s = (State *)arg;
    int64_t sleep_ns = MIN_SLEEP_NS;
    int64_t seen = -1, seen_at = 0; /* where the records ended at the last look, and when */
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->error) {
        off_t records = lseek(s->fd, 0, SEEK_CUR);
        if (records < 0) {
            s->error = errno ? errno : EIO;
            break;
        }
        int64_t start = max64(s->done, s->floor);
        /* As far ahead as the shard holds, up to `ahead`; more when half is left. */
        int64_t reach = records < s->ahead ? max64(records, ALIGN) : s->ahead;
        if (start - records < reach / 2) {
            int64_t stop = (records + reach) / ALIGN * ALIGN + ALIGN;
            int64_t n = stop - start;
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
        /* Look again halfway to when, at the rate the records grew since the
         * last look, more zeros are due; while they do not grow, ever later. */
        int64_t now = now_ns();
        if (seen >= 0 && records > seen && now > seen_at) {
            double per_ns = (double)(records - seen) / (double)(now - seen_at);
            sleep_ns = (int64_t)((double)(start - records - reach / 2) / per_ns / 2);
        } else if (records == seen) {
            sleep_ns *= 2;
        }
        if (sleep_ns < MIN_SLEEP_NS) sleep_ns = MIN_SLEEP_NS;
        if (sleep_ns > MAX_SLEEP_NS) sleep_ns = MAX_SLEEP_NS;
        seen = records;
        seen_at = now;
        struct timespec until;
        int64_t wake = now + sleep_ns;
        until.tv_sec = wake / 1000000000;
        until.tv_nsec = wake % 1000000000;
        pthread_cond_timedwait(&s->cv, &s->mu, &until);
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
    static char *kwlist[] = {"fd", "start", "ahead", NULL};
    int fd;
    long long start, ahead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iLL", kwlist, &fd, &start, &ahead)) return -1;
    if (self->state != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ZeroAhead is already running");
        return -1;
    }
    if (start < 0 || ahead < ALIGN || ahead > MAX_WRITE) {
        PyErr_Format(PyExc_ValueError, "ZeroAhead: start >= 0 and %d <= ahead <= %d expected",
                     ALIGN, MAX_WRITE);
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
    s->ahead = ahead;
    s->done = s->floor = start;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &attr);
    pthread_condattr_destroy(&attr);
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

static PyObject *ZeroAhead_advance(ZeroAhead *self, PyObject *arg) {
    long long end = PyLong_AsLongLong(arg);
    if (end == -1 && PyErr_Occurred()) return NULL;
    State *s = running(self);
    if (s == NULL) return NULL;
    int error = __atomic_load_n(&s->error, __ATOMIC_ACQUIRE);
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int64_t done = __atomic_load_n(&s->done, __ATOMIC_ACQUIRE);
    if (end > done) {
        /* The records outran the zeros: claim the bytes, and wake the thread.
         * Without the GIL another thread may close the object meanwhile: this
         * call owns the state until it is done with it. */
        __atomic_add_fetch(&s->owners, 1, __ATOMIC_ACQ_REL);
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&s->mu); /* waits for the pwrite in flight */
        if (end > s->floor) s->floor = end;
        if (end > s->done) __atomic_store_n(&s->done, (int64_t)end, __ATOMIC_RELEASE);
        done = s->done;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        release(s);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLongLong(done);
}

static PyObject *ZeroAhead_close(ZeroAhead *self, PyObject *Py_UNUSED(ignored)) {
    State *s = take_state(self); /* with the GIL: one close() takes it, others find NULL */
    Py_BEGIN_ALLOW_THREADS
    stop(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef ZeroAhead_methods[] = {
    {"advance", (PyCFunction)ZeroAhead_advance, METH_O,
     "advance(end): a record is about to be written up to `end`; no zero is written below\n"
     "it. Returns where the zeros reach (the next record ending past it calls again).\n"
     "Raises OSError once a write of zeros failed."},
    {"close", (PyCFunction)ZeroAhead_close, METH_NOARGS,
     "close(): stops the thread (after the pwrite in flight); no zero is written after."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ZeroAheadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlds_writer.store.formats.tfrecord._zero_ahead.ZeroAhead",
    .tp_doc = "ZeroAhead(fd, start, ahead): keeps zeros up to `ahead` bytes past the "
              "records of `fd` (which end at its file position, at least `start`), on a thread.",
    .tp_basicsize = sizeof(ZeroAhead),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ZeroAhead_init,
    .tp_dealloc = (destructor)ZeroAhead_dealloc,
    .tp_methods = ZeroAhead_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_zero_ahead",
    .m_doc = "Zeros written ahead of a shard's records on a thread without the GIL.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__zero_ahead(void) {
    if (zeros == NULL) {
        zeros = calloc(1, MAX_WRITE); /* untouched pages: the kernel's zero page */
        if (zeros == NULL) return PyErr_NoMemory();
    }
    if (PyType_Ready(&ZeroAheadType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ZeroAheadType);
    if (PyModule_AddObject(m, "ZeroAhead", (PyObject *)&ZeroAheadType) < 0) {
        Py_DECREF(&ZeroAheadType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
