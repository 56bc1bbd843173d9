"""Subcommands of the `rlds-writer` tool, one module each."""
