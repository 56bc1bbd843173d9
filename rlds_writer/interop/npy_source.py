"""Reading `.npy` files and `.npz` members without trusting their headers.

`np.load` believes a `.npy` header: a header declaring 2**40 floats makes
it allocate them before it finds the data missing, and an `.npz` member
deflated 1000:1 inflates in full. Here each header is parsed first and
checked against the bytes that hold it: an array must be exactly as large
as the file (or zip member) after its header, its dtype must need no
pickle, and an `.npz` member's inflated size counts against the file's
`source_limits.Budget`. Only then is the data read, straight into the
array (no second copy), and zipfile checks the member's CRC at its end.
"""

from __future__ import annotations

import ast
import os
import zipfile
from typing import Any, BinaryIO

import numpy as np

from rlds_writer.errors import SourceError
from rlds_writer.interop.source_limits import (
    Budget,
    declared_nbytes,
    describe,
    size_text,
    source_errors,
)

# numpy's own default for np.load (a header is a short dict literal).
_MAX_HEADER_SIZE = 10000
_CHUNK = 16 << 20


def _header(fp: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    from numpy.lib import format as npy

    version = npy.read_magic(fp)
    if version == (1, 0):
        return npy.read_array_header_1_0(fp, max_header_size=_MAX_HEADER_SIZE)
    if version == (2, 0):
        return npy.read_array_header_2_0(fp, max_header_size=_MAX_HEADER_SIZE)
    if version != (3, 0):
        raise ValueError(f".npy format version {version[0]}.{version[1]} (numpy writes 1.0 to 3.0)")
    # 3.0 is 2.0 with a utf-8 header (non-latin-1 field names); numpy has no public reader.
    length = int.from_bytes(fp.read(4), "little")
    if length > _MAX_HEADER_SIZE:
        raise ValueError(f"a header of {length} bytes (numpy's limit is {_MAX_HEADER_SIZE})")
    header = ast.literal_eval(fp.read(length).decode("utf-8"))
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("the header is not a dict of descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"shape is {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"fortran_order is {fortran!r}")
    return shape, fortran, npy.descr_to_dtype(header["descr"])


def read_npy(fp: BinaryIO, size: int, path: str, field: str, budget: Budget | None) -> np.ndarray:
    """Reads one `.npy` stream of `size` bytes, its header checked first.

    Args:
      fp: the stream, at the start of the `.npy` data.
      size: the bytes the stream holds (file size, or a zip member's inflated size).
      path: the file, for messages.
      field: the array's name in the file (member or file name).
      budget: counts the declared bytes (compressed members), or None.

    Raises:
      SourceError: for a header that is malformed, declares an object dtype or
        a size other than the bytes after it, or exceeds the budget.
    """
    with source_errors(path, f"{field}'s .npy header"):
        shape, fortran, dtype = _header(fp)
        offset = fp.tell()
    what = describe(str(dtype), shape)
    if dtype.hasobject:
        raise SourceError(
            f"{path}: {field} is {what}, an object array (it would need pickle); store numbers "
            "or fixed-size strings"
        )
    if dtype.itemsize == 0:
        raise SourceError(f"{path}: {field} has the empty dtype {dtype}; store numbers")
    nbytes = declared_nbytes(shape, dtype.itemsize)
    if offset + nbytes != size:
        raise SourceError(
            f"{path}: {field} declares {what} ({size_text(nbytes)}) but holds "
            f"{size_text(max(size - offset, 0))} after its header (a forged or damaged "
            "header); write it again with np.save / np.savez"
        )
    if budget is not None:
        budget.take(nbytes, field, what)
    with source_errors(path, field):
        data = np.empty(nbytes, np.uint8)
        view = memoryview(data)
        done = 0
        while done < nbytes:
            chunk = fp.read(min(_CHUNK, nbytes - done))
            if not chunk:
                raise SourceError(
                    f"{path}: {field} ends after {done} of its {nbytes} bytes (a damaged file)"
                )
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        fp.read(1)  # at the member's end: zipfile checks its CRC
        return data.view(dtype).reshape(shape, order="F" if fortran else "C")


def load_npy(path: str) -> np.ndarray:
    """A `.npy` file, its header checked against its size."""
    with source_errors(path), open(path, "rb") as fp:
        return read_npy(fp, os.fstat(fp.fileno()).st_size, path, os.path.basename(path), None)


class NpzFile:
    """The members of an `.npz` file, read on demand (each once) within a `Budget`.

    Args:
      path: the `.npz` file.
      max_inflation: see `source_limits`.
    """

    def __init__(self, path: str, max_inflation: float | None):
        self.path = path
        with source_errors(path):
            self.zip = zipfile.ZipFile(path)
            self.budget = Budget(path, max_inflation)
            self.members = {
                (i.filename[: -len(".npy")] if i.filename.endswith(".npy") else i.filename): i
                for i in self.zip.infolist()
            }
        self.cache: dict[str, np.ndarray] = {}

    def get(self, key: str) -> np.ndarray | None:
        """The array of member `key` (`key.npy`), or None if there is none."""
        if key in self.cache:
            return self.cache[key]
        info = self.members.get(key)
        if info is None:
            return None
        with source_errors(self.path, info.filename), self.zip.open(info) as fp:
            array = read_npy(fp, info.file_size, self.path, info.filename, self.budget)
        self.cache[key] = array
        return array

    def close(self) -> None:
        self.zip.close()
        self.cache = {}

    def __enter__(self) -> NpzFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
