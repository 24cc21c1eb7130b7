"""`python -m palimpsest.shared.settings --docs`: writes the generated table into docs/settings.md;
`--check`: exits 1 when the committed docs/settings.md differs from what would be written."""

from __future__ import annotations

import sys
from pathlib import Path

from palimpsest.shared.settings import GROUPS
from palimpsest.shared.settings.declare import declarations, old_names_table, spliced, table
from palimpsest.shared.settings.services import DEBUG, TOKEN

DOCS = Path(__file__).resolve().parents[3] / "docs" / "settings.md"


def generated() -> str:
    """The part of docs/settings.md between its markers: a table per group, then the old names."""
    parts = []
    envs = []
    for group in GROUPS:
        entries = [env for _, env, _ in declarations(group)]
        if group is GROUPS[0]:
            entries += [TOKEN, DEBUG]
        envs += entries
        parts.append(f"### {(group.__doc__ or group.__name__).strip()}\n\n{table(entries)}")
    parts.append(
        "### Old names\n\nRead for one release, with one warning at start naming each old name set and its new "
        f"name; when both are set, the new one is used.\n\n{old_names_table(envs)}"
    )
    return "\n\n".join(parts)


def main(argv: list[str]) -> int:
    current = DOCS.read_text()
    wanted = spliced(current, generated())
    if "--check" in argv:
        if current != wanted:
            print(f"{DOCS} is not what the settings declare: run python -m palimpsest.shared.settings --docs")
            return 1
        return 0
    if "--docs" in argv:
        DOCS.write_text(wanted)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
