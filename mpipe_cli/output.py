"""Writing a command's result to `-o FILE`: an unwritable path is one `error:` line,
checked before the work starts where the work is long."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError


def check_writable(output: str) -> None:
    """Refuse a path that cannot be written (missing folder, a folder itself, no permission)."""
    path = Path(output)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise MpipeError(f"{output}: cannot write (it is a directory)")
    if not folder.is_dir():
        raise MpipeError(f"{output}: cannot write (no directory {folder})")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise MpipeError(f"{output}: cannot write (permission denied)")


def write_output(text: str, output: str | None, what: str = "") -> None:
    """`text` to stdout (no `output`) or to the file `output`, saying so on stderr."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise MpipeError(f"{output}: cannot write ({error.strerror or error})") from None
    print(f"wrote {output}{': ' + what if what else ''}", file=sys.stderr)
