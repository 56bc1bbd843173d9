"""Environments shipped with rlds_writer (no extra dependency)."""

from rlds_writer.envs.catch import Catch

__all__ = ["Catch"]
