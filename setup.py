"""Package metadata for rlds_writer."""

from setuptools import find_packages, setup

_CORE = [
    "numpy>=1.26",
    "dm-env>=1.6",
    "etils[epath]>=1.7",
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
    "rllib": ["gymnasium>=1.1,<2", "ray[rllib]>=2.40,<3", "torch>=2.2"],
    # PettingZoo wrappers; the tests also use butterfly (pygame) and MPE (mpe2) envs.
    "pettingzoo": ["gymnasium>=1.1,<2", "pettingzoo>=1.24", "pygame-ce>=2.4", "mpe2>=1.0"],
    "torch": ["torch>=2.2"],
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
}
_EXTRAS["all"] = sorted({dep for deps in _EXTRAS.values() for dep in deps})
_EXTRAS["test"] = [
    "pytest>=8",
    "hypothesis>=6.100",
    "ruff>=0.5",
    "psutil>=5.9",
    # tests/test_colabs.py executes the notebooks
    "nbclient>=0.10",
    "nbformat>=5.9",
    "ipykernel>=6.29",
]

setup(
    name="rlds_writer",
    version="0.1.0",
    description="Record reinforcement-learning rollouts as RLDS episodes in TFDS datasets.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["rlds_writer", "rlds_writer.*"]),
    install_requires=_CORE,
    extras_require=_EXTRAS,
    entry_points={"console_scripts": ["rlds-writer=rlds_writer.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
