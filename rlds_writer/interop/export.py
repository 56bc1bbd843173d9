"""RLDS datasets out to offline-RL consumers: what every exporter shares.

Each target format's exporter (`interop.formats.<format>.exporter`) has an
`export(src, dest, **options)` returning an `ExportReport`; `export(src, dest,
to=FORMAT, ...)` dispatches on the name used by `rlds-writer export --to`,
through the registry (`interop.EXPORT_FORMATS`: `minari`, `rllib-episodes`,
`hf`, `d3rlpy`, `lerobot` and any format registered with `interop.register`),
and runs it staged (`interop.staging`).

Every exporter streams: it reads the source with the TF-free reader one
episode at a time (`source_episodes`), so memory is bounded by one episode.

Episodes cut short by the recorder (episode-level `end_reason == "cut_short"`)
are exported as truncated (`cut_short="truncated"`, the default) or left out
(`cut_short="drop"`). Episodes of a single RLDS step (a reset and nothing
else) have no transition; formats that cannot hold them skip them and say so
in the report.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError, counted, optional_dependencies
from rlds_writer.interop.registry import EXPORT_FORMATS
from rlds_writer.read.nest import map_tree
from rlds_writer.read.reader import open_dataset
from rlds_writer.read.transitions import CUT_SHORT_MODES, episode_end
from rlds_writer.store.dataset import Dataset

# The targets (`export --to`) are listed with the sources in `rlds_writer.interop`.
FORMATS = EXPORT_FORMATS

# The step fields every RLDS dataset may have; anything else is step metadata.
STANDARD_STEP_FIELDS = (
    "observation",
    "action",
    "reward",
    "discount",
    "is_first",
    "is_last",
    "is_terminal",
)


@dataclasses.dataclass
class ExportReport:
    """What an export wrote.

    Attributes:
      source: the RLDS dataset directory read.
      destination: what was written (path or dataset id).
      format: the target format.
      episodes: episodes written.
      transitions: transitions (env steps) written.
      terminated: episodes written that ended by termination.
      truncated: episodes written that did not (time limit, or cut short).
      cut_short: episodes cut short by the recorder (written as truncated, or
        dropped with `cut_short="drop"`).
      skipped: episodes left out (dropped cut-short ones, one-step episodes the
        format cannot hold).
      notes: remarks about the export.
    """

    source: str
    destination: str
    format: str
    episodes: int = 0
    transitions: int = 0
    terminated: int = 0
    truncated: int = 0
    cut_short: int = 0
    skipped: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        text = (
            f"{counted(self.episodes, 'episode')} ({counted(self.transitions, 'transition')}; "
            f"{self.terminated} terminated, {self.truncated} truncated) from {self.source} to "
            f"{self.format} "
            f"{self.destination}"
        )
        return "\n".join([text, *(f"note: {n}" for n in self.notes)])


def needs_libraries(to: str) -> Any:
    """Decorates format `to`'s own `export` (public as `export_<format>` in this module).

    A library of the format missing inside it becomes a `MissingDependencyError`
    naming the extra to install, as through `export(..., to=...)`.
    """
    target = FORMATS[to]
    return optional_dependencies(target.feature, target.extra)


def check_cut_short(cut_short: str) -> None:
    """Refuses an unknown `cut_short` mode with a one-line message."""
    if cut_short not in CUT_SHORT_MODES:
        raise ValueError(
            f"cut_short must be one of {CUT_SHORT_MODES}, got {cut_short!r}: 'truncated' "
            "exports episodes the recorder cut short as truncated, 'drop' leaves them out"
        )


def new_output_directory(dest: os.PathLike | str, episodes_per_file: int | None = None) -> Any:
    """Checks an exporter's output directory (new or empty) and file size; returns its Path."""
    from pathlib import Path

    if episodes_per_file is not None and episodes_per_file < 1:
        raise ValueError(f"episodes_per_file must be at least 1, got {episodes_per_file}")
    directory = Path(os.fspath(dest))
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(
            f"{directory}: exists and is not an empty directory; pass a new directory"
        )
    return directory


def open_source(src: Dataset | os.PathLike | str, split: str) -> Any:
    """Opens an RLDS dataset for export and checks that `split` exists.

    Raises:
      NotADatasetError: `src` is not a dataset.
      ValueError: for an unknown split.
    """
    reader = open_dataset(src)
    if split not in reader.splits:
        raise ValueError(
            f"{reader.path}: no split {split!r}; the dataset has {sorted(reader.splits)} "
            "(pass --split)"
        )
    return reader


def source_episodes(
    reader: Any,
    split: str,
    report: ExportReport,
    *,
    cut_short: str = "truncated",
    min_steps: int = 2,
) -> Iterator[tuple[dict[str, Any], str]]:
    """Yields `(episode, end)` for each episode to export (`numbered_episodes` without the index).

    For exporters whose format numbers its episodes itself, in the order
    written (Minari, LeRobot, d3rlpy, and plugins).
    """
    for _, episode, end in numbered_episodes(
        reader, split, report, cut_short=cut_short, min_steps=min_steps
    ):
        yield episode, end


def numbered_episodes(
    reader: Any,
    split: str,
    report: ExportReport,
    *,
    cut_short: str = "truncated",
    min_steps: int = 2,
    encoded: Sequence[str] = (),
) -> Iterator[tuple[int, dict[str, Any], str]]:
    """Yields `(index, episode, end)` for each episode to export, one at a time.

    Args:
      reader: the `DatasetReader`.
      split: the split (a TFDS split spec) to read.
      report: counts dropped and skipped episodes.
      cut_short: "truncated" or "drop".
      min_steps: episodes with fewer RLDS steps are skipped (and counted).
      encoded: keys of `Image` step fields to give as their stored PNG/JPEG
        bytes (object arrays, each value's header checked against the
        feature) instead of decoding them.

    Yields:
      `(index, episode, end)`: the episode's position in the split as read
      (counting every episode, skipped ones included, as `qlearning_dataset`'s
      `episode_ids` do, so an index names the same source episode whatever
      was left out), the decoded episode, and how it ended ("terminated",
      "truncated", "cut_short").
    """
    check_cut_short(cut_short)
    too_short = 0
    for index, episode in enumerate(_episodes(reader, split, encoded)):
        end = episode_end(episode)
        if end == "cut_short":
            report.cut_short += 1
            if cut_short == "drop":
                report.skipped += 1
                continue
        if num_steps(episode) < min_steps:
            too_short += 1
            report.skipped += 1
            continue
        yield index, episode, end
    if report.cut_short:
        verb = "left out" if cut_short == "drop" else "exported as truncated"
        episodes = counted(report.cut_short, "episode")
        were = "was" if report.cut_short == 1 else "were"
        report.notes.append(f"{episodes} cut short by the recorder {were} {verb}")
    if too_short:
        report.notes.append(
            f"{counted(too_short, 'episode')} of fewer than {min_steps} RLDS steps (no "
            f"transition) {'was' if too_short == 1 else 'were'} skipped"
        )


def _episodes(reader: Any, split: str, encoded: Sequence[str]) -> Iterator[Any]:
    """The decoded episodes of `split`, the `encoded` image fields as stored bytes."""
    if not encoded:
        yield from reader.episodes(split)
        return
    for where, data in reader.episodes(split).records():
        yield reader.decode(data, where, encoded=encoded)


def value_at(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at `path` (field names, outermost first) in a decoded episode tree."""
    for name in path:
        tree = tree[name]
    return tree


def num_steps(episode: Mapping[str, Any]) -> int:
    """The number of RLDS steps of a decoded episode."""
    return len(episode["steps"]["is_last"])


def step_metadata(steps: Mapping[str, Any]) -> dict[str, Any]:
    """The step fields that are not RLDS's standard ones."""
    return {k: v for k, v in steps.items() if k not in STANDARD_STEP_FIELDS}


def episode_metadata(episode: Mapping[str, Any]) -> dict[str, Any]:
    """The episode-level fields of a decoded episode."""
    return {k: v for k, v in episode.items() if k != "steps"}


def default_discount(n: int, terminated: bool) -> np.ndarray:
    """The discounts rlds_writer writes by default for `n` steps (dm_env's convention)."""
    discount = np.ones(n, dtype=np.float32)
    discount[-1] = 0.0
    if terminated and n > 1:
        discount[-2] = 0.0
    return discount


def text(value: Any) -> Any:
    """Decodes bytes (and object arrays of bytes) to str; other values unchanged."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [text(v) for v in value.tolist()]
    return value


def check_one_reward(reader: Any, consumer: str, scalar: bool = True) -> None:
    """Refuses rewards a single-agent consumer cannot take.

    A dict of rewards (a multi-agent joint dataset) is refused; with
    `scalar`, so is a reward of several elements, by field name, while a
    reward of one element in any shape (RWRL's `(1,)`) is that number
    (`step_rewards` squeezes it).

    Args:
      reader: the source `DatasetReader`.
      consumer: the target's name, for the message.
      scalar: the consumer takes one number per step (RLlib; Minari keeps
        vector rewards as they are).

    Raises:
      SpecError: if `steps/reward` is a dict, or holds more than one number
        and `scalar` is set.
    """
    leaves = [leaf for leaf in reader.features.step_leaves if leaf.path[1] == "reward"]
    if len(leaves) > 1 or any(len(leaf.path) > 2 for leaf in leaves):
        keys = ", ".join("/".join(leaf.path[2:]) for leaf in leaves)
        raise SpecError(
            f"steps/reward: a dict of rewards ({keys}); {consumer} takes one reward per step "
            "(a multi-agent joint-layout dataset? record single-agent consumers' data with "
            "layout='per_agent', or sum or pick one reward first)"
        )
    if scalar and leaves and leaves[0].size != 1:
        raise SpecError(
            f"steps/reward: {leaves[0].describe()}; {consumer} takes one scalar reward per "
            "step: sum or pick one reward first"
        )


def step_rewards(reward: Any, t: int) -> np.ndarray:
    """The first `t` rewards as a vector of `t` numbers (a one-element reward squeezed).

    Args:
      reward: a decoded `steps/reward` column (`check_one_reward` passed), or None.
      t: the number of transitions.

    Returns:
      `(t,)` rewards in their stored dtype (float32 zeros without a reward).
    """
    if reward is None:
        return np.zeros(t, np.float32)
    return np.asarray(reward)[:t].reshape(t)


def info_columns(steps: Mapping[str, Any], n: int, terminated: bool) -> dict[str, Any]:
    """Step metadata as the per-step info columns of formats with one info dict per step.

    The keys of a `steps/info` dict, and every other step field under its own
    name; a stored discount that differs from `default_discount` is kept as
    `discount`; text becomes `str`.

    Args:
      steps: a decoded episode's steps.
      n: the number of steps.
      terminated: whether the episode terminated.
    """
    infos: dict[str, Any] = {}
    for key, value in step_metadata(steps).items():
        if key == "info" and isinstance(value, Mapping):
            for sub, column in value.items():
                infos[str(sub)] = column
        elif key in infos:
            raise SpecError(f"steps/{key}: also a key of steps/info; Minari infos are one dict")
        else:
            infos[str(key)] = value
    discount = steps.get("discount")
    if discount is not None:
        expected = default_discount(n, terminated)
        if not np.array_equal(np.asarray(discount)[:-1], expected[:-1]):
            infos.setdefault("discount", discount)
    return map_tree(lambda v: text(v) if v.dtype == object else v, infos)


def export(
    src: os.PathLike | str, dest: os.PathLike | str, *, to: str, **options: Any
) -> ExportReport:
    """Exports an RLDS dataset to another offline-RL format, complete or not at all.

    The export is built in a hidden staging directory next to the destination
    and renamed into place only when complete (`interop.staging`): a killed
    export leaves nothing a consumer loads. A destination that is, is inside
    or contains the source is refused before anything is written.

    Args:
      src: the RLDS dataset directory.
      dest: the destination (for `minari`, a Minari dataset id; for
        `rllib-episodes`, `hf` and `lerobot`, a directory; for `d3rlpy`, an
        HDF5 file).
      to: one of `FORMATS` (`minari`, `rllib-episodes`, `hf`, `d3rlpy`, `lerobot`,
        and formats registered with `interop.register`).
      **options: the format's `export` options (split, cut_short, ...).

    Returns:
      The `ExportReport`.

    Raises:
      ValueError: for an unknown format.
      MissingDependencyError: the format's optional libraries are not installed
        (the message names the extra to install).
      UnsafePathError: for a destination overlapping the source.
      FileExistsError: for a destination that holds something.
    """
    if to not in FORMATS:
        raise ValueError(f"unknown export format {to!r}; expected one of {list(FORMATS)}")
    target = FORMATS[to]

    def run(source: Any, where: Any) -> ExportReport:
        return target.run(source, where, **options)

    # Staging itself may need the format's library (Minari's root).
    with optional_dependencies(target.feature, target.extra):
        return target.staged(run, src, dest)


# The public per-format names (`rlds_writer.interop.export.export_minari`, ...): the same
# staging and checks as `export(..., to=...)`; options as in each module.
def export_minari(src: os.PathLike | str, dest: str, **options: Any) -> ExportReport:
    """`export(src, dest, to="minari", ...)`; options: `formats.minari.exporter.export`."""
    return export(src, dest, to="minari", **options)


def export_rllib(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> ExportReport:
    """`export(src, dest, to="rllib-episodes", ...)`; options: `formats.rllib.exporter.export`."""
    return export(src, dest, to="rllib-episodes", **options)


def export_hf(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> ExportReport:
    """`export(src, dest, to="hf", ...)`; options: `formats.hf.exporter.export`."""
    return export(src, dest, to="hf", **options)


def export_d3rlpy(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> ExportReport:
    """`export(src, dest, to="d3rlpy", ...)`; options: `formats.d3rlpy.exporter.export`."""
    return export(src, dest, to="d3rlpy", **options)


def export_lerobot(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> ExportReport:
    """`export(src, dest, to="lerobot", ...)`; options: `formats.lerobot.exporter.export`."""
    return export(src, dest, to="lerobot", **options)
