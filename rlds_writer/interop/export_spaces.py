"""The env spec and the spaces of an export, taken from the dataset as data.

A dataset names its env (`metadata.json`'s `env_id`, or the env spec of a
dataset converted from Minari), but whoever exports it may not have that env,
and the dataset may come from someone else: nothing the dataset names is
imported, made with `gym.make` or called. So:

* the spaces come from the caller (`observation_space=`/`action_space=`, a
  `Space` or its text), else from the spaces the dataset recorded as text
  (`str(space)`, parsed by `space_text`, used when they fit the features),
  else from the features alone (`Box`es, `Dict`s);
* the env spec given to Minari (for `recover_environment()`) is the spec the
  exporting process registered under the dataset's env id, looked up in
  Gymnasium's registry (no `module:` import), with the recorded `kwargs` and
  `max_episode_steps`; for an env not registered here, the spec the dataset
  recorded (`EnvSpec.to_json()` text), rebuilt field by field as data with
  its entry points as text: the recipient's `recover_environment()` imports
  them, if the recipient calls it. Only an `env_id` the caller passes may
  name a module to import here (`module:Env-v0`, as `gym.make` reads it):
  that is the caller's code, not the dataset's.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.interop.space_text import parse_space

# The feature tree of steps/observation or steps/action: a leaf or a dict of trees.
_Tree = Any


def _feature_tree(reader: Any, name: str) -> _Tree:
    leaves = [leaf for leaf in reader.features.step_leaves if leaf.path[1] == name]
    if not leaves:
        raise SpecError(f"{reader.path}: the dataset has no steps/{name}; the export needs one")
    if len(leaves) == 1 and len(leaves[0].path) == 2:
        return leaves[0]
    tree: dict[str, Any] = {}
    for leaf in leaves:
        node = tree
        for key in leaf.path[2:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise SpecError(f"{leaf.key}: a field and a dict at once")
        node[leaf.path[-1]] = leaf
    return tree


def _leaf_space(leaf: Any) -> Any:
    import gymnasium as gym

    if leaf.dtype == np.object_ or not leaf.static:
        raise SpecError(
            f"{leaf.key}: {leaf.describe()} has no Gymnasium space; pass observation_space= / "
            "action_space= (--observation-space/--action-space) or leave the field out"
        )
    shape = tuple(int(d) for d in leaf.shape)
    if leaf.dtype == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    if leaf.dtype == np.bool_:
        return gym.spaces.MultiBinary(list(shape)) if shape else gym.spaces.Discrete(2)
    if leaf.dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, shape, leaf.dtype)
    info = np.iinfo(leaf.dtype)
    return gym.spaces.Box(info.min, info.max, shape, leaf.dtype)


def _features_space(tree: _Tree) -> Any:
    """The space the features alone describe (`Box`es, `Dict`s; bools `MultiBinary`)."""
    import gymnasium as gym

    if isinstance(tree, dict):
        return gym.spaces.Dict({k: _features_space(v) for k, v in tree.items()})
    return _leaf_space(tree)


def _misfit(space: Any, tree: _Tree, where: str) -> str | None:
    """Why `space` does not describe the stored values, or None if it does."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict | spaces.Tuple):
        keys = (
            [str(k) for k in space.spaces]
            if isinstance(space, spaces.Dict)
            else [str(i) for i in range(len(space.spaces))]
        )
        if not isinstance(tree, dict) or sorted(keys) != sorted(tree):
            got = sorted(tree) if isinstance(tree, dict) else tree.describe()
            return f"{where}: the space has keys {sorted(keys)}, the dataset {got}"
        subs = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        for key, sub in zip(keys, subs):
            problem = _misfit(sub, tree[key], f"{where}/{key}")
            if problem:
                return problem
        return None
    if isinstance(tree, dict):
        return f"{where}: the dataset has a dict (keys {sorted(tree)}), the space is {space}"
    shape = tuple(tree.shape)
    kind = tree.dtype.kind
    if isinstance(space, spaces.Discrete):
        ok = shape == () and kind in "iu"
    elif isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        ok = shape == tuple(space.shape) and kind in "iub"
    elif isinstance(space, spaces.Box):
        ok = shape == tuple(space.shape) and tree.dtype == space.dtype
    else:
        return f"{where}: {type(space).__name__} spaces are not supported"
    return None if ok else f"{where}: the space is {space}, the dataset stores {tree.describe()}"


def _dicts_for_tuples(space: Any) -> Any:
    """`Tuple` spaces as `Dict`s keyed "0", "1", ...: RLDS stores tuples that way."""
    from gymnasium import spaces

    if isinstance(space, spaces.Tuple):
        return spaces.Dict({str(i): _dicts_for_tuples(s) for i, s in enumerate(space.spaces)})
    if isinstance(space, spaces.Dict):
        return spaces.Dict({str(k): _dicts_for_tuples(s) for k, s in space.spaces.items()})
    return space


def _dm_env_discrete(metadata: Mapping[str, Any], name: str, tree: _Tree) -> Any:
    """`Discrete(n)` for a dm_env `DiscreteArray` spec `EnvLogger` recorded, else None."""
    import gymnasium as gym

    specs = metadata.get("env_specs")
    spec = specs.get(f"{name}_spec") if isinstance(specs, Mapping) else None
    if isinstance(tree, dict) or not isinstance(spec, Mapping):
        return None
    count = spec.get("num_values")
    if (
        spec.get("spec") == "DiscreteArray"
        and isinstance(count, int)
        and count > 0
        and spec.get("minimum", 0) == 0
        and tree.shape == ()
        and tree.dtype.kind in "iu"
    ):
        return gym.spaces.Discrete(count)
    return None


def _recorded_text(metadata: Mapping[str, Any], name: str) -> str | None:
    for source in (metadata, metadata.get("minari")):
        if isinstance(source, Mapping) and isinstance(source.get(f"{name}_space"), str):
            return source[f"{name}_space"]
    return None


def export_spaces(
    reader: Any, observation_space: Any = None, action_space: Any = None
) -> tuple[Any, Any, list[str]]:
    """The observation and action spaces of an export, and notes on where they came from.

    Args:
      reader: the source `DatasetReader`.
      observation_space: a `gymnasium.spaces.Space`, its text (`str(space)`),
        or None for the dataset's.
      action_space: likewise.

    Returns:
      `(observation_space, action_space, notes)`.

    Raises:
      SpecError: for a given space that does not fit the stored values, or a
        field no space describes (text, unknown shapes).
    """
    metadata = reader.metadata or {}
    notes: list[str] = []
    result = []
    for name, given in (("observation", observation_space), ("action", action_space)):
        tree = _feature_tree(reader, name)
        where = f"steps/{name}"
        if given is not None:
            try:
                space = parse_space(given) if isinstance(given, str) else given
            except SpecError as e:
                raise SpecError(f"{name}_space {given[:200]!r}: {e}") from None
            problem = _misfit(space, tree, where)
            if problem:
                raise SpecError(f"{problem}; pass a {name} space that fits the stored values")
        else:
            space = None
            text = _recorded_text(metadata, name)
            if text is not None:
                try:
                    space = parse_space(text)
                    problem = _misfit(space, tree, where)
                except SpecError as e:
                    problem = str(e)
                if problem:
                    space = None
                    notes.append(
                        f"the recorded {name} space {text[:120]!r} was not used ({problem}); "
                        "the space comes from the features"
                    )
            if space is None:
                space = _dm_env_discrete(metadata, name, tree)
            if space is None:
                space = _features_space(tree)
                if not isinstance(tree, dict) and tree.shape == () and tree.dtype.kind in "iu":
                    notes.append(
                        f"{where} is an integer scalar with no recorded space: exported as "
                        f"{space}; pass --{name}-space 'Discrete(N)' for a Discrete"
                    )
        result.append(_dicts_for_tuples(space))
    return result[0], result[1], notes


def _registered(env_id: str) -> Any:
    """The spec this process registered under `env_id` (no import), or None."""
    from gymnasium.envs.registration import registry

    return registry.get(env_id.rsplit(":", 1)[-1])


# The recorded spec text an export reads (what `EnvSpec.to_json()` gives is about 400 bytes).
MAX_SPEC_TEXT = 64 << 10
_FLAGS = ("nondeterministic", "order_enforce", "disable_env_checker")


def _text_or_none(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, str) and len(value) <= 1000):
        return value
    raise SpecError(f"{where}: expected text (at most 1000 characters) or null")


def spec_from_text(text: str) -> Any:
    """A Gymnasium `EnvSpec` built from recorded `EnvSpec.to_json()` text, as data only.

    Only the fields `EnvSpec` has are read, each checked for its type; entry
    points stay text (nothing is imported, made or called: `gym.make` on the
    result would import them, and that is the recipient's choice). A
    `module:` prefix on the id (an import instruction for `gym.make`) is
    dropped.

    Raises:
      SpecError: for text that is not such a spec (too long, not JSON, a
        field of the wrong type).
    """
    from gymnasium.envs.registration import EnvSpec, WrapperSpec

    if len(text) > MAX_SPEC_TEXT:
        raise SpecError(f"{len(text)} characters, over the {MAX_SPEC_TEXT} a spec may take")
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise SpecError(f"not JSON ({e})") from None
    if not isinstance(parsed, dict):
        raise SpecError(f"not a JSON object but {type(parsed).__name__}")
    env_id = parsed.get("id")
    if not isinstance(env_id, str) or not env_id.rsplit(":", 1)[-1]:
        raise SpecError("no id")
    fields: dict[str, Any] = {"id": _text_or_none(env_id.rsplit(":", 1)[-1], "id")}
    for key in ("entry_point", "vector_entry_point"):
        fields[key] = _text_or_none(parsed.get(key), key)
    for key in _FLAGS:
        if key in parsed:
            if not isinstance(parsed[key], bool):
                raise SpecError(f"{key}: expected true or false, got {parsed[key]!r}")
            fields[key] = parsed[key]
    steps = parsed.get("max_episode_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise SpecError(f"max_episode_steps: expected a positive integer, got {steps!r}")
    threshold = parsed.get("reward_threshold")
    if threshold is not None and (
        not isinstance(threshold, int | float) or isinstance(threshold, bool)
    ):
        raise SpecError(f"reward_threshold: expected a number, got {threshold!r}")
    kwargs = parsed.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise SpecError(f"kwargs: expected an object, got {type(kwargs).__name__}")
    wrappers = []
    for i, wrapper in enumerate(parsed.get("additional_wrappers") or []):
        if not isinstance(wrapper, dict) or not all(
            isinstance(wrapper.get(k), str) for k in ("name", "entry_point")
        ):
            raise SpecError(f"additional_wrappers[{i}]: expected a name and an entry point")
        options = wrapper.get("kwargs")
        if options is not None and not isinstance(options, dict):
            raise SpecError(f"additional_wrappers[{i}].kwargs: expected an object or null")
        wrappers.append(WrapperSpec(wrapper["name"], wrapper["entry_point"], options))
    try:
        spec = EnvSpec(**fields, max_episode_steps=steps, reward_threshold=threshold, kwargs=kwargs)
    except Exception as e:  # noqa: BLE001 - Gymnasium's id parser raises its own errors
        raise SpecError(f"not a Gymnasium env spec ({str(e)[:200]})") from None
    spec.additional_wrappers = tuple(wrappers)
    return spec


def _recorded_spec_text(metadata: Mapping[str, Any]) -> str | None:
    """The env spec text a dataset recorded: the recorders' `env_spec`, or a Minari one."""
    for source in (metadata, metadata.get("minari")):
        if isinstance(source, Mapping) and isinstance(source.get("env_spec"), str):
            return source["env_spec"]
    return None


def env_spec(reader: Any, env_id: str | None = None) -> tuple[Any, list[str]]:
    """The Gymnasium `EnvSpec` to record with an export, and notes.

    Args:
      reader: the source `DatasetReader`.
      env_id: an env id from the caller; `module:Env-v0` imports `module`
        first, as `gym.make` does: the registered spec is used.

    Without `env_id`: the env spec the dataset recorded (`metadata.json`'s
    `env_spec`, which the Gymnasium recorders write as `EnvSpec.to_json()`
    text, or the `env_spec` of a dataset converted from Minari), read as data
    (`spec_from_text`). If this process registered its id, the registered
    spec is used with the recorded `kwargs` and `max_episode_steps`; if not,
    the recorded spec goes as recorded, entry points as text, for the
    recipient to make (`recover_environment()`) or not. A dataset that
    recorded only an env id (`metadata.json`'s `env_id`) gets the spec
    registered under it, if any. Nothing the dataset names is imported or made.

    Returns:
      `(spec or None, notes)`.

    Raises:
      SpecError: for a caller's `env_id` that is not registered.
    """
    if env_id:
        module, _, _ = env_id.rpartition(":")
        if module:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise SpecError(f"env_id {env_id!r}: cannot import {module!r} ({e})") from None
        spec = _registered(env_id)
        if spec is None:
            raise SpecError(
                f"env_id {env_id!r} is not a registered Gymnasium env; pass "
                "'module:Env-v0' to import the module that registers it, or leave env_id out "
                "(the spaces come from the dataset)"
            )
        return spec, []
    metadata = reader.metadata or {}
    recorded = metadata.get("env_id")
    recorded = recorded.rsplit(":", 1)[-1] if isinstance(recorded, str) else None
    text = _recorded_spec_text(metadata)
    carried = None
    notes: list[str] = []
    if text is not None:
        try:
            carried = spec_from_text(text)
        except SpecError as e:
            notes.append(f"the recorded env spec was not used: {e}")
        if carried is not None and recorded and carried.id != recorded:
            notes.append(
                f"the recorded env spec names {carried.id[:100]!r}, the recorded env_id "
                f"{recorded[:100]!r}: the env spec was not used"
            )
            carried = None
        recorded = recorded or (carried.id if carried is not None else None)
    if not recorded:
        return None, notes
    spec = _registered(recorded)
    if spec is None and carried is not None:
        where = f"entry point {carried.entry_point!r}" if carried.entry_point else "no entry point"
        return carried, [
            *notes,
            f"env {carried.id[:100]!r} is not registered in this process: its recorded env spec "
            f"({where}) was exported as text; recover_environment() imports what it names, "
            "where the recipient chooses to call it",
        ]
    if spec is None:
        return None, [
            *notes,
            f"env {recorded[:100]!r} is not registered in this process: no env spec was "
            "exported (recover_environment() needs one); pass env_id='module:Env-v0' "
            "(--env-id) to import the package that registers it",
        ]
    changes: dict[str, Any] = {}
    if carried is not None:
        changes["kwargs"] = {**spec.kwargs, **carried.kwargs}
        if carried.max_episode_steps is not None:
            changes["max_episode_steps"] = carried.max_episode_steps
    return (dataclasses.replace(spec, **changes) if changes else spec), notes
