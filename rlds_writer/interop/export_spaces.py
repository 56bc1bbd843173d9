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
  `max_episode_steps`; without one the export has no env spec. Only an
  `env_id` the caller passes may name a module to import (`module:Env-v0`,
  as `gym.make` reads it): that is the caller's code, not the dataset's.
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


def env_spec(reader: Any, env_id: str | None = None) -> tuple[Any, list[str]]:
    """The Gymnasium `EnvSpec` to record with an export, and notes.

    Args:
      reader: the source `DatasetReader`.
      env_id: an env id from the caller; `module:Env-v0` imports `module`
        first, as `gym.make` does. Else `metadata.json`'s `env_id` (what the
        Gymnasium recorders write), else the id in the env spec of a dataset
        converted from Minari; those are only looked up in the registry.

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
    recorded_spec: dict[str, Any] = {}
    minari_spec = (metadata.get("minari") or {}).get("env_spec")
    if not recorded and isinstance(minari_spec, str):
        try:
            parsed = json.loads(minari_spec)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            recorded_spec = parsed
            recorded = parsed.get("id")
    if not isinstance(recorded, str) or not recorded:
        return None, []
    spec = _registered(recorded)
    if spec is None:
        return None, [
            f"env {recorded[:100]!r} is not registered in this process: no env spec was "
            "exported (recover_environment() needs one); pass env_id='module:Env-v0' "
            "(--env-id) to import the package that registers it"
        ]
    changes: dict[str, Any] = {}
    if isinstance(recorded_spec.get("kwargs"), dict):
        changes["kwargs"] = {**spec.kwargs, **recorded_spec["kwargs"]}
    steps = recorded_spec.get("max_episode_steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        changes["max_episode_steps"] = steps
    return (dataclasses.replace(spec, **changes) if changes else spec), []
