"""Print one of README.md's two fresh-machine commands, so CI runs exactly what the
README says: ``python scripts/readme_commands.py a|b``.

(a) is the first ```bash block after the paragraph starting "(a)", (b) likewise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_command(label: str, text: str | None = None) -> str:
    text = README.read_text() if text is None else text
    match = re.search(rf"^\({label}\).*?```bash\n(.*?)```", text, re.S | re.M)
    if match is None:
        raise LookupError(f"README.md has no ```bash block after a paragraph starting '({label})'")
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    if len(lines) != 1:
        raise LookupError(f"README command ({label}) must be exactly one line, found {len(lines)}")
    return lines[0]


if __name__ == "__main__":
    print(readme_command(sys.argv[1]))
