/* Whole shard files written in one call without the GIL, part of the _batch_records
 * extension (store/writing/batch_lane.py):
 *
 * write_files(paths, buffer, bounds) -> (count, errno)
 *     for each i in order: creates paths[i] (bytes; O_CREAT | O_EXCL | O_NOFOLLOW, 0644:
 *     nothing already there, no link, is ever written through), writes
 *     buffer[bounds[2i]:bounds[2i+1]] to it whole (resuming short writes) and closes it.
 *     Stops at the first failure. Returns how many files were written and closed, and the
 *     failure's errno (0: none); a file that failed to be written whole is removed.
 *
 * The batch lane writes the records of the many shards that one wake-up of the writer
 * thread fills (a shard every `max_episodes_per_file` episodes: thousands of short
 * episodes end per second in a batched recording) with it: each open, write and close
 * made from Python lets the GIL go and takes it back, and each time the writer thread
 * takes the GIL the env thread waits for it and for a wake-up.
 */
#include "_batch_records.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#if HAVE_SSE42

/* Writes p[0:n] whole to fd; 0, or errno. */
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
write_files(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "write_files(paths: tuple of bytes, buffer, bounds)");
        return NULL;
    }
    PyObject *paths = args[0];
    Py_ssize_t count = PyTuple_GET_SIZE(paths);
    Py_buffer data, bounds;
    if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (get_index(args[2], &bounds, 2 * count, "bounds") < 0) {
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
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *path = PyTuple_GET_ITEM(paths, i);
        if (!PyBytes_Check(path) || (Py_ssize_t)strlen(PyBytes_AS_STRING(path)) !=
                                        PyBytes_GET_SIZE(path)) {
            PyErr_SetString(PyExc_TypeError, "write_files: a path is bytes without NUL");
            goto done;
        }
        if (bound[2 * i] < 0 || bound[2 * i] > bound[2 * i + 1] ||
            bound[2 * i + 1] > data.len) {
            PyErr_Format(PyExc_IndexError, "write_files: bounds of file %zd are out of range", i);
            goto done;
        }
        names[i] = PyBytes_AS_STRING(path); /* kept alive by the tuple */
    }
    Py_ssize_t written = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; written < count; written++) {
        int fd = open(names[written], O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            error = errno ? errno : EIO;
            break;
        }
        const char *p = (const char *)data.buf + bound[2 * written];
        error = write_whole(fd, p, bound[2 * written + 1] - bound[2 * written]);
        if (close(fd) < 0 && !error && errno != EINTR) {
            error = errno ? errno : EIO;
        }
        if (error) {
            unlink(names[written]); /* never a torn file left under a shard's name */
            break;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(ni)", written, error);
done:
    PyMem_Free(names);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&data);
    return result;
}

#endif /* HAVE_SSE42 */
