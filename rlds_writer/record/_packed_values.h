/*
 * What a packed scalar column (a float32, float64 or int64 scalar in a
 * RowBuffer) takes as it is, and the bytes it stores: the C step's test of a
 * value and RowBuffer's `append_number`/`append_int` (part of `_step_kernel`,
 * see _step_kernel.h). Inline: the step tests a value of every packed column
 * on every step.
 */
#ifndef RLDS_PACKED_VALUES_H
#define RLDS_PACKED_VALUES_H

/* A Python int (exactly) within [lo, hi]: 1 (*out set), 0 (outside it, or
 * past long long), -1 (an error is set). */
static SK_UNUSED int
long_within(PyObject *v, long long lo, long long hi, long long *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

/* What the packed scalar columns take as they are, listed once: `float_value`
 * and `int_value` take these, and the module hands the same lists to Python
 * (NUMBER_TYPES, INT64_TYPES, FLOAT32_EXACT_INT, FLOAT64_EXACT_INT), whose
 * compiled step tests values with them (record/scalar_columns.py). */
/* The largest Python int a float column of `row` bytes holds exactly: 2**24, 2**53. */
#define FLOAT_EXACT_INT(row) ((row) == 4 ? (1LL << 24) : (1LL << 53))
/* The scalar types a float column takes (`float_value` reads each its own way). */
#define NUMBER_SCALARS(X) X(PyFloat_Type) X(PyDoubleArrType_Type) X(PyFloatArrType_Type)
/* The numpy integer scalars an int64 column takes: each holds its values in
 * int64 (np.long is 32 bits on some platforms; np.uint, an unsigned long, is
 * not taken). X(type object, its PyArrayScalar_VAL name). */
#define INT64_SCALARS(X) \
    X(PyLongArrType_Type, Long) X(PyLongLongArrType_Type, LongLong) \
    X(PyIntArrType_Type, Int) X(PyShortArrType_Type, Short) X(PyByteArrType_Type, Byte) \
    X(PyUIntArrType_Type, UInt) X(PyUShortArrType_Type, UShort) X(PyUByteArrType_Type, UByte)

/* A packed scalar's bytes, as they go into its RowBuffer (the first 4 of a float32). */
typedef union {
    double f;
    float f32;
    long long i;
    char bytes[8];
} Packed;

/* A value of a scalar float column of `row` bytes (4: float32, 8: float64) as
 * the bytes numpy's cast gives: a Python float (np.float64 is one) or a
 * Python int the dtype holds exactly (|x| <= 2**24 or 2**53: no rounding to
 * agree on) through C's cast of a double (numpy's: overflow to inf, a NaN
 * quieted), an np.float32 as it is into float32 (numpy copies its bits: a
 * signalling NaN stays one, which a trip through a double would quiet).
 * 1: taken (*out set); 0: anything else, left to numpy (record/values.py
 * `cast_value`); -1: an error is set. */
static SK_UNUSED int
float_value(PyObject *v, Py_ssize_t row, Packed *out)
{
    PyTypeObject *t = Py_TYPE(v);
    double d;
    if (t == &PyFloat_Type || t == &PyDoubleArrType_Type) {
        d = PyFloat_AS_DOUBLE(v);
    } else if (t == &PyFloatArrType_Type) {
        if (row == 4) {
            memcpy(out->bytes, &PyArrayScalar_VAL(v, Float), 4);
            return 1;
        }
        d = (double)PyArrayScalar_VAL(v, Float);
    } else if (t == &PyLong_Type) {
        long long exact = FLOAT_EXACT_INT(row), x;
        int taken = long_within(v, -exact, exact, &x);
        if (taken != 1) return taken;
        d = (double)x;
    } else {
        return 0;
    }
    if (row == 4) out->f32 = (float)d;
    else out->f = d;
    return 1;
}

/* A value of an int64 scalar column: a Python int within int64, or a numpy
 * integer scalar of INT64_SCALARS (each holds its value exactly).
 * 1: taken (*out set); 0: anything else, left to the Python step (which
 * refuses an int out of range by name, or casts); -1: an error is set. */
static SK_UNUSED int
int_value(PyObject *v, long long *out)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type) return long_within(v, LLONG_MIN, LLONG_MAX, out);
#define TAKE_INT(type, name) \
    if (t == &type) { \
        *out = (long long)PyArrayScalar_VAL(v, name); \
        return 1; \
    }
    INT64_SCALARS(TAKE_INT)
#undef TAKE_INT
    return 0;
}

#endif /* RLDS_PACKED_VALUES_H */
