/*
 * The C interface of the `_crc32c` extension (_crc32c.c), for other
 * extensions: TFRecord's checksum, masked as the framing stores it, has one
 * implementation. An extension that frames records takes it at its module
 * init and calls it with or without the GIL:
 *
 *     const Crc32cApi *crc = crc32c_import();   (NULL: ImportError set)
 *     uint32_t stored = crc->masked(data, n);
 *
 * Its module then fails to import where `_crc32c` does (not built, no SSE4.2),
 * and its Python caller takes its numpy path, as there.
 */
#ifndef RLDS_CRC32C_H
#define RLDS_CRC32C_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the SSE4.2 CRC instruction is there: _crc32c and the extensions
 * that take its checksum are built for it or not at all. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42 1
#include <nmmintrin.h>
#else
#define HAVE_SSE42 0
#endif

#define CRC32C_CAPSULE "rlds_writer.store.formats.tfrecord._crc32c.C_API"
/* The struct's layout, versioned: bump it whenever the struct changes. */
#define CRC32C_API_VERSION 1

typedef struct {
    int version; /* first, in every version: CRC32C_API_VERSION */
    /* The CRC-32C of the bytes hashed so far (`crc`, 0 for none) and then p[0:n]. */
    uint32_t (*extend)(uint32_t crc, const unsigned char *p, size_t n);
    /* TFRecord's masked CRC-32C of p[0:n]: ((c >> 15) | (c << 17)) + 0xa282ead8. */
    uint32_t (*masked)(const unsigned char *p, size_t n);
} Crc32cApi;

/* `_crc32c`'s interface, imported; NULL with ImportError set if the module
 * cannot be loaded (not built, no SSE4.2), or is a build of other sources (no
 * capsule, or one of another version). The module is imported by name first:
 * PyCapsule_Import alone walks attributes, which a package not yet imported
 * lacks. */
static inline const Crc32cApi *
crc32c_import(void)
{
    PyObject *module = PyImport_ImportModule("rlds_writer.store.formats.tfrecord._crc32c");
    if (module == NULL) return NULL;
    PyObject *capsule = PyObject_GetAttrString(module, "C_API");
    Py_DECREF(module);
    const Crc32cApi *api = NULL;
    if (capsule != NULL && PyCapsule_IsValid(capsule, CRC32C_CAPSULE))
        api = (const Crc32cApi *)PyCapsule_GetPointer(capsule, CRC32C_CAPSULE);
    Py_XDECREF(capsule);
    if (api != NULL && api->version == CRC32C_API_VERSION) return api;
    if (api != NULL)
        PyErr_Format(PyExc_ImportError, "%s is version %d, %d expected: rebuild the extensions",
                     CRC32C_CAPSULE, api->version, CRC32C_API_VERSION);
    else /* an older build has none */
        PyErr_Format(PyExc_ImportError, "%s is missing: rebuild the extensions", CRC32C_CAPSULE);
    return NULL;
}

#endif /* RLDS_CRC32C_H */
