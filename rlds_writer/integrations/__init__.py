"""Integrations with RL frameworks (each imported only when used).

* `rlds_writer.integrations.rllib`: an `RLlibCallback` recording every
  EnvRunner's episodes (needs `ray[rllib]`).
"""
