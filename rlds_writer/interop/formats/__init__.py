"""The interop formats, one subpackage each (importer, exporter and their declaration).

Each subpackage's `__init__` sets `FORMATS` to its `plugin.Importer`s and
`plugin.Exporter`s and imports nothing heavy; its code lives in its own
modules (`importer.py`, `exporter.py`, ...), imported when it runs.
`interop.registry` finds the subpackages here by themselves: a new format is
a new subpackage (and its tests), nothing else.
"""
