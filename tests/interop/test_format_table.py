"""The docs' format table and synopses are the registry's: a format cannot be added without them."""

from __future__ import annotations

import re
from pathlib import Path

from rlds_writer.cli.commands import _formats
from rlds_writer.interop import EXPORT_FORMATS, FORMATS

SHARING = Path(__file__).resolve().parents[2] / "docs" / "sharing.md"


def test_the_format_table_of_the_docs_is_made_from_the_registry():
    text = SHARING.read_text()
    match = re.search(r"<!-- formats: [^\n]*-->\n(.*?)\n<!-- /formats -->", text, re.S)
    assert match, "docs/sharing.md has no <!-- formats --> table"
    expected = _formats.markdown_table()
    assert match.group(1) == expected, (
        "docs/sharing.md's format table differs from the registry; paste this:\n" + expected
    )
    for name in [*FORMATS, *EXPORT_FORMATS]:
        assert f"| `{name}` |" in match.group(1)


def test_the_synopses_list_every_format_in_the_registrys_order():
    text = SHARING.read_text()
    (convert,) = re.findall(r"^rlds-writer convert --from (\S+) SRC DEST$", text, re.M)
    (export,) = re.findall(r"^rlds-writer export --to (\S+) SRC DEST$", text, re.M)
    assert convert.split("|") == list(FORMATS)
    assert export.split("|") == list(EXPORT_FORMATS)
