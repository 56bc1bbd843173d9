/* Shard files written in one call without the GIL, part of the _batch_records
 * extension (store/writing/batch_lane.py, split_shards.py `write_run`):
 *
 * write_shards(head_fd, head_end, close_head, paths, buffer, bounds, keep_last)
 *         -> (head, files, errno, tail_fd)
 *     In order, stopping at the first failure:
 *     1. where head_fd >= 0 (the split's open shard): writes buffer[bounds[0]:bounds[1]]
 *        whole to it at head_end (where its records end), then closes it if close_head
 *        (it is full). head: -1 no head; 0 its write failed (the fd is left open);
 *        1 written (and closed if asked); 2 written, its close failed (the fd is gone).
 *     2. for each paths[i] (bytes): creates it (O_CREAT | O_EXCL | O_NOFOLLOW, 0644:
 *        nothing already there, no link, is ever written through), writes
 *        buffer[bounds[2i+2]:bounds[2i+3]] to it whole (resuming short writes) and
 *        closes it; the last one is left open if keep_last (the next open shard): its fd
 *        is tail_fd (-1 otherwise). A file that failed to be written whole is removed.
 *     files: how many paths were written (and closed, or left open as the tail);
 *     errno: the failure's (0: none).
 *
 * The batch lane writes the records of the many shards that one wake-up of the writer
 * thread fills (a shard every `max_episodes_per_file` episodes: thousands of short
 * episodes end per second in a batched recording) with it: the open shard's last
 * records and its close, the whole shards, the next shard's open and first records. Each
 * of these made from Python lets the GIL go and takes it back, and each time the writer
 * thread takes the GIL the env thread waits for it and for a wake-up (50-100 us on a VM):
 * seven such hand-overs per wake-up before, one now.
 */
#include "_batch_records.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#if HAVE_SSE42

/* Writes p[0:n] whole to fd at its position; 0, or errno. */
static int
write_whole(int fd, const char *p, int64_t n)
{
    while (n > 0) {
        ssize_t written = write(fd, p, n > (1 << 30) ? (1 << 30) : (size_t)n);
        if (written < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno ? errno : EIO;
        }
        p += written;
        n -= written;
    }
    return 0;
}

__attribute__((visibility("hidden"))) PyObject *
write_shards(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7 || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "write_shards(head_fd, head_end, close_head, paths: tuple of bytes, "
                        "buffer, bounds, keep_last)");
        return NULL;
    }
    long head_fd = PyLong_AsLong(args[0]);
    if (head_fd == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long head_end = PyLong_AsLongLong(args[1]);
    if (head_end == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int close_head = PyObject_IsTrue(args[2]);
    int keep_last = PyObject_IsTrue(args[6]);
    if (close_head < 0 || keep_last < 0) {
        return NULL;
    }
    if (head_fd < -1 || head_fd > INT_MAX || head_end < 0) {
        PyErr_SetString(PyExc_ValueError, "write_shards: head_fd or head_end out of range");
        return NULL;
    }
    PyObject *paths = args[3];
    Py_ssize_t count = PyTuple_GET_SIZE(paths);
    Py_buffer data, bounds;
    if (PyObject_GetBuffer(args[4], &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (get_index(args[5], &bounds, 2 * count + 2, "bounds") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    const char **names = PyMem_Calloc(count ? count : 1, sizeof(char *));
    if (names == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *bound = bounds.buf;
    for (Py_ssize_t i = 0; i <= count; i++) {
        if (i < count) {
            PyObject *path = PyTuple_GET_ITEM(paths, i);
            if (!PyBytes_Check(path) || (Py_ssize_t)strlen(PyBytes_AS_STRING(path)) !=
                                            PyBytes_GET_SIZE(path)) {
                PyErr_SetString(PyExc_TypeError, "write_shards: a path is bytes without NUL");
                goto done;
            }
            names[i] = PyBytes_AS_STRING(path); /* kept alive by the tuple */
        }
        if (bound[2 * i] < 0 || bound[2 * i] > bound[2 * i + 1] ||
            bound[2 * i + 1] > data.len) {
            PyErr_Format(PyExc_IndexError, "write_shards: bounds %zd are out of range", i);
            goto done;
        }
    }
    int head = -1, error = 0, tail_fd = -1;
    Py_ssize_t files = 0;
    Py_BEGIN_ALLOW_THREADS
    if (head_fd >= 0) {
        int fd = (int)head_fd;
        head = 0;
        if (lseek(fd, (off_t)head_end, SEEK_SET) < 0) {
            error = errno ? errno : EIO;
        } else {
            error = write_whole(fd, (const char *)data.buf + bound[0], bound[1] - bound[0]);
        }
        if (!error) {
            head = 1;
            if (close_head && close(fd) < 0 && errno != EINTR) {
                error = errno ? errno : EIO;
                head = 2;
            }
        }
    }
    for (; !error && files < count; files++) {
        const char *name = names[files];
        int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            error = errno ? errno : EIO;
            break;
        }
        const int64_t *b = bound + 2 * files + 2;
        error = write_whole(fd, (const char *)data.buf + b[0], b[1] - b[0]);
        if (!error && keep_last && files == count - 1) {
            tail_fd = fd; /* the next open shard */
            continue;
        }
        if (close(fd) < 0 && !error && errno != EINTR) {
            error = errno ? errno : EIO;
        }
        if (error) {
            unlink(name); /* never a torn file left under a shard's name */
            break;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(inii)", head, files, error, tail_fd);
done:
    PyMem_Free(names);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&data);
    return result;
}

#endif /* HAVE_SSE42 */
