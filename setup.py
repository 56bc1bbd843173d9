"""Package metadata for rlds_writer."""

import os
import re
from pathlib import Path

from setuptools import Extension, find_packages, setup

_HERE = Path(__file__).resolve().parent
# One version, in the package (rlds_writer.__version__); read as text so building
# does not import the package (and TensorFlow).
_VERSION = re.search(
    r'^__version__ = "([^"]+)"$',
    (_HERE / "rlds_writer" / "__init__.py").read_text(encoding="utf-8"),
    re.MULTILINE,
).group(1)

_CORE = [
    "numpy>=1.26",
    "dm-env>=1.6",
    "etils[epath]>=1.7",
    # The storage seam (store/storage/storage.py): every scheme:// path goes through fsspec.
    "fsspec>=2024.3",
    "google-crc32c>=1.5",
    "tensorflow-cpu>=2.16,<2.22",
    "tensorflow-datasets>=4.9.4,<5",
    "array-record>=0.5",
    "tqdm>=4.60",
    "pillow>=10",
]
_EXTRAS = {
    # gymnasium>=1.1 for vector autoreset modes (gymnasium.vector.AutoresetMode).
    "gymnasium": ["gymnasium>=1.1,<2"],
    # msgpack-numpy: RLlib's episode schema (offline_config(schema="episodes"), which
    # docs/reader.md's example uses); RLlib needs it there but does not require it.
    "rllib": [
        "gymnasium>=1.1,<2",
        "ray[rllib]>=2.40,<3",
        "torch>=2.2",
        "msgpack>=1.0",
        "msgpack-numpy>=0.4.8",
    ],
    # PettingZoo wrappers; the tests also use butterfly (pygame) and MPE (mpe2) envs.
    "pettingzoo": ["gymnasium>=1.1,<2", "pettingzoo>=1.24", "pygame-ce>=2.4", "mpe2>=1.0"],
    "torch": ["torch>=2.2"],
    # Batched envs (record/batch/): EnvPool's envs (Linux wheels only) and JAX rollouts;
    # TorchRL is the peer benchmarks/batched_envs.py measures against.
    "batched": [
        "gymnasium>=1.1,<2",
        'envpool>=1.2; platform_system == "Linux"',
        "jax>=0.4.30",
        "torch>=2.2",
        "torchrl>=0.6",
    ],
    "reader": ["simplejpeg>=1.7"],
    "plot": ["matplotlib>=3.7"],
    "convert": [
        "h5py>=3.8",
        "minari[create]>=0.5",
        "msgpack>=1.0",
        "msgpack-numpy>=0.4.8",
        "pyarrow>=14",
    ],
    # `rlds-writer export --to hf` (datasets.List needs datasets 4).
    "hf": ["datasets>=4"],
    # `rlds-writer export --to lerobot` / `convert --from lerobot` (Parquet, tasks frame;
    # PyAV encodes the MP4 cameras of `--video`).
    "lerobot": ["pyarrow>=14", "pandas>=2", "av>=12"],
    "beam": ["apache-beam>=2.60"],
    # `tfds build` imports mlcroissant; code-based builders need importlib_resources.
    "builders": ["apache-beam>=2.60", "mlcroissant>=1.0", "importlib_resources>=6"],
    # The rlds library (google-research/rlds). 0.1.7+ import dm-reverb at `import rlds`
    # (for pattern_map only) and no dm-reverb release loads beside TF 2.16+; 0.1.6 is
    # the same transformations without that import. Its own deps: absl-py, numpy.
    "rlds": ["rlds==0.1.6"],
    # Datasets on object storage (store/storage/storage.py): s3:// and gs:// through fsspec.
    "s3": ["s3fs>=2024.3"],
    "gcs": ["gcsfs>=2024.3"],
}
_EXTRAS["all"] = sorted({dep for deps in _EXTRAS.values() for dep in deps})
_EXTRAS["test"] = [
    "pytest>=8",
    "hypothesis>=6.100",
    "ruff>=0.5",
    "psutil>=5.9",
    # tests/docs/test_colabs.py executes the notebooks
    "nbclient>=0.10",
    "nbformat>=5.9",
    "ipykernel>=6.29",
    # tests/release/test_wheel_install.py builds the sdist and wheel as a release does
    "build>=1.2",
    "twine>=5",
    "setuptools>=77",
    # tests/object_stores.py: S3 and GCS servers on loopback.
    "moto[server]>=5",
    "gcp-storage-emulator>=2024.8",
    # tests/view/test_view_browser.py drives Debian's chromium (never a downloaded browser).
    "selenium>=4.20",
]


def _extensions() -> list[Extension]:
    """The recorders' C step (rlds_writer/record/step_kernel.py), the SSE4.2
    CRC-32C (rlds_writer/store/formats/tfrecord/tfrecord.py), the thread that writes zeros
    ahead of a shard's records (rlds_writer/store/formats/tfrecord/write_ahead.py), the
    batch recorder's gather and record encoding (rlds_writer/store/writing/batch_records.py),
    the float32 columns' NaN scan (rlds_writer/store/features/field_encoding.py) and a
    vector step's ring bookkeeping (rlds_writer/record/batch/vector_step.py) and raw-bytes
    frames copied into their sub-envs' chunks (rlds_writer/record/batch/frame_chunks.py),
    all optional.

    Without a C compiler the build warns and goes on: the package records with
    its Python step, google_crc32c, zeros written on the recording thread, and
    numpy's NaN test.
    RLDS_WRITER_PURE_PYTHON=1 builds none (a pure wheel).
    """
    if os.environ.get("RLDS_WRITER_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        import numpy  # a build requirement (pyproject.toml): the array struct's headers
    except ImportError:
        return []
    return [
        Extension(
            "rlds_writer.record._step_kernel",
            [
                "rlds_writer/record/_step_kernel.c",
                "rlds_writer/record/_step_kernel_new.c",
                "rlds_writer/record/_row_buffer.c",
            ],
            include_dirs=[numpy.get_include()],
            depends=["rlds_writer/record/_step_kernel.h", "rlds_writer/record/_packed_values.h"],
            optional=True,
        ),
        Extension(
            "rlds_writer.store.formats.tfrecord._crc32c",
            ["rlds_writer/store/formats/tfrecord/_crc32c.c"],
            depends=["rlds_writer/store/formats/tfrecord/_crc32c.h"],
            optional=True,
        ),
        Extension(
            "rlds_writer.store.formats.tfrecord._zero_ahead",
            ["rlds_writer/store/formats/tfrecord/_zero_ahead.c"],
            optional=True,
        ),
        Extension(
            "rlds_writer.store.writing._batch_records",
            [
                "rlds_writer/store/writing/_batch_records.c",
                "rlds_writer/store/writing/_ring_records.c",
                "rlds_writer/store/writing/_ring_gather.c",
                "rlds_writer/store/writing/_ring_args.c",
                "rlds_writer/store/writing/_shard_files.c",
            ],
            depends=[
                "rlds_writer/store/writing/_batch_records.h",
                "rlds_writer/store/writing/_ring_records.h",
                "rlds_writer/store/formats/tfrecord/_crc32c.h",
            ],
            optional=True,
        ),
        Extension(
            "rlds_writer.store.features._float_bits",
            ["rlds_writer/store/features/_float_bits.c"],
            optional=True,
        ),
        Extension(
            "rlds_writer.record.batch._vector_step",
            [
                "rlds_writer/record/batch/_vector_step.c",
                "rlds_writer/record/batch/_vector_rows.c",
            ],
            include_dirs=[numpy.get_include()],
            depends=["rlds_writer/record/batch/_vector_step.h"],
            optional=True,
        ),
        Extension(
            "rlds_writer.record.batch._frame_rows",
            ["rlds_writer/record/batch/_frame_rows.c"],
            optional=True,
        ),
    ]


setup(
    name="rlds_writer",
    version=_VERSION,
    description="Record reinforcement-learning rollouts as RLDS episodes in TFDS datasets.",
    long_description=(_HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license_expression="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["rlds_writer", "rlds_writer.*"]),
    # The viewer's page (rlds_writer/view/static): served from the package, nothing from outside.
    package_data={"rlds_writer.view": ["static/*"]},
    ext_modules=_extensions(),
    install_requires=_CORE,
    extras_require=_EXTRAS,
    entry_points={"console_scripts": ["rlds-writer=rlds_writer.cli:main"]},
    keywords=["reinforcement learning", "RLDS", "TFDS", "datasets", "offline RL", "RLlib"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Software Development :: Libraries :: Python Modules",
    ],
)
