"""How much a source file may declare, and its read errors as one line.

The importers read whole episodes into memory, so what a file *declares*
(array shapes in npy headers and HDF5 dataspaces, zip members' inflated
sizes) decides how much memory a conversion takes. An honest file declares
about what it holds; a forged header (2**40 floats in a 100-byte member), an
unallocated HDF5 dataset of 2**36 rows or a deflate bomb declares far more.

The rule, for every source file: the arrays read from it may declare at most
`max_inflation` times the file's size in bytes, or `INFLATION_ALLOWANCE`,
whichever is larger. The default ratio, 100, is Apache POI's zip-bomb ratio:
real data rarely compresses further (an all-zero camera does; pass a larger
`max_inflation`, or `--max-inflation`, for such a file; `inf` turns the
check off). Peak memory is then bounded by a small multiple of the bytes on
disk.

`source_errors` turns what the libraries raise on malformed bytes (h5py's
`OSError`, numpy's `ValueError`, zipfile's `BadZipFile`, pyarrow's
`ArrowInvalid`, ...) into one-line `SourceError`s naming the file.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator

from rlds_writer.errors import RLDSWriterError, SourceError

DEFAULT_MAX_INFLATION = 100.0
# Declared bytes below this are always accepted (small files of zeros are common).
INFLATION_ALLOWANCE = 64 << 20

# What numpy, zipfile, h5py and pyarrow raise on bytes they cannot parse.
_READ_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    RuntimeError,
    EOFError,
    OverflowError,
    NotImplementedError,
    zipfile.BadZipFile,
    struct.error,
    zlib.error,
    SyntaxError,  # numpy's header parser (ast.literal_eval)
)


def size_text(n: int) -> str:
    """Bytes as a short human-readable text: `12.0 MiB`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def check_max_inflation(max_inflation: float | None) -> float:
    """The ratio to use; None means the default. Raises SourceError for a bad one."""
    if max_inflation is None:
        return DEFAULT_MAX_INFLATION
    if isinstance(max_inflation, bool) or not isinstance(max_inflation, int | float):
        raise SourceError(f"max_inflation must be a number, got {max_inflation!r}")
    if not max_inflation > 0 or max_inflation != max_inflation:
        raise SourceError(f"max_inflation must be a positive ratio, got {max_inflation!r}")
    return float(max_inflation)


class Budget:
    """The bytes the arrays of one source file may declare (see the module doc).

    Args:
      path: the file, for messages.
      max_inflation: the ratio of declared bytes to the file's size.
      file_size: the file's size (default: read from disk).
    """

    def __init__(
        self, path: os.PathLike | str, max_inflation: float | None, file_size: int | None = None
    ):
        self.path = os.fspath(path)
        self.ratio = check_max_inflation(max_inflation)
        self.file_size = os.path.getsize(self.path) if file_size is None else file_size
        self.limit = max(INFLATION_ALLOWANCE, self.ratio * self.file_size)  # inf: no limit
        self.declared = 0

    def take(self, nbytes: int, field: str, what: str) -> None:
        """Counts `nbytes` declared by `field` (described by `what`); refuses past the limit."""
        self.declared += int(nbytes)
        if self.declared > self.limit:
            total = (
                ""
                if self.declared == nbytes
                else f"; with the arrays read before it that is {size_text(self.declared)}"
            )
            raise SourceError(
                f"{self.path}: {field} declares {what} ({size_text(nbytes)}){total}, more than "
                f"{self.ratio:g}x the file's {size_text(self.file_size)} (a forged size or a "
                "decompression bomb); if the file is genuine and this compressible, pass a "
                "larger max_inflation (--max-inflation)"
            )


def declared_nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of an array of `shape` (Python ints: no overflow)."""
    total = int(itemsize)
    for dim in shape:
        total *= int(dim)
    return total


def describe(dtype_name: str, shape: tuple[int, ...]) -> str:
    return f"{dtype_name}[{','.join(str(int(d)) for d in shape)}]"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= 300 else line[:300] + "..."


@contextlib.contextmanager
def source_errors(path: os.PathLike | str, what: str = "") -> Iterator[None]:
    """Turns the read errors of malformed bytes into a one-line `SourceError` naming `path`.

    Our own errors (`RLDSWriterError`) pass unchanged.
    """
    try:
        yield
    except RLDSWriterError:
        raise
    except MemoryError:
        raise SourceError(
            f"{os.fspath(path)}: {what or 'its data'} does not fit in memory"
        ) from None
    except _READ_ERRORS as e:
        where = f"{os.fspath(path)}: {what}: " if what else f"{os.fspath(path)}: "
        raise SourceError(f"{where}cannot be read ({type(e).__name__}: {_first_line(e)})") from e


# Bits per value of Parquet's physical types once decoded into Arrow (byte
# arrays: their 32-bit offset); FIXED_LEN_BYTE_ARRAY uses its length.
_PARQUET_BITS = {
    "BOOLEAN": 1,
    "INT32": 32,
    "INT64": 64,
    "INT96": 96,
    "FLOAT": 32,
    "DOUBLE": 64,
    "BYTE_ARRAY": 32,
}


def check_parquet(path: os.PathLike | str, max_inflation: float | None = None) -> None:
    """Refuses a Parquet file whose footer declares more decoded data than the budget allows.

    Each column chunk counts its uncompressed size, or its value count times
    the width of a decoded value if that is larger (run-length and
    dictionary encoding make 10**9 equal values a few bytes on disk).
    """
    import pyarrow.parquet as pq

    path = os.fspath(path)
    with source_errors(path, "Parquet footer"):
        meta = pq.ParquetFile(path).metadata
        budget = Budget(path, max_inflation)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                kind = column.physical_type
                bits = _PARQUET_BITS.get(kind, 8)
                if kind == "FIXED_LEN_BYTE_ARRAY":
                    length = meta.schema.column(c).length or 1
                    bits = 8 * max(int(length), 1)
                values = max(int(column.num_values), int(group.num_rows))
                decoded = max(int(column.total_uncompressed_size), values * bits // 8)
                budget.take(
                    decoded,
                    f"row group {g} column {column.path_in_schema!r}",
                    f"{values} values",
                )
