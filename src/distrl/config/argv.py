"""Reading and rewriting a command line's flags before tyro parses it (the CLI's pre-pass), and the parse
itself, whose mistakes are one line like every other ConfigError."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from typing import Any

import tyro

from distrl.config import ConfigError


def flag_value(argv: list[str], flag: str) -> str | None:
    """``flag``'s value in ``argv`` (``--flag V`` or ``--flag=V``), or None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced, or the flag left out when ``value`` is empty."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == flag and i + 1 < len(argv):
            out += [flag, value] if value else []
            skip = True
        elif arg.startswith(flag + "="):
            out += [f"{flag}={value}"] if value else []
        else:
            out.append(arg)
    return out


TIME_UNITS = {"s": 1, "min": 60, "h": 3600}


def checkpoint_every_time(argv: list[str]) -> list[str]:
    """``--checkpoint-every 10min`` (or 90s, 2h) as ``--checkpoint-every-s 600``; a step count stays as it is."""
    value = flag_value(argv, "--checkpoint-every")
    if value is None or re.fullmatch(r"[0-9_]+", value):
        return argv
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(s|min|h)", value)
    if match is None:
        raise ConfigError(
            f"checkpoint_every={value!r} is not allowed: must be a step count (50000) or a time (90s, 10min, 2h)"
        )
    seconds = float(match[1]) * TIME_UNITS[match[2]]
    return [*set_flag(argv, "--checkpoint-every", ""), "--checkpoint-every-s", f"{seconds:g}"]


def no_action_mask(argv: list[str]) -> list[str]:
    """``--no-action-mask`` as ``--action-mask off``."""
    out: list[str] = []
    for arg in argv:
        out += ["--action-mask", "off"] if arg == "--no-action-mask" else [arg]
    return out


def merge_repeated(argv: list[str], flag: str, into: str) -> list[str]:
    """``--wrapper A --wrapper B`` as ``--wrappers A B`` (tyro keeps only the last of a repeated flag)."""
    values: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
        elif arg == flag and flag != into and i + 1 < len(argv):
            values.append(argv[i + 1])
            i += 1
        elif arg == into:  # --wrappers A B: its values up to the next flag
            while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                values.append(argv[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return [*rest, into, *values] if values else rest


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RULE = set("─-═=+╭╮╰╯│| ")


def parse_flags(cls: Any, argv: list[str], prog: str, **kwargs: Any) -> Any:
    """``tyro.cli(cls, args=argv, prog=prog, **kwargs)``; a flag it cannot parse is a ConfigError of one line.

    tyro draws such a mistake as a box of several lines on stderr and exits with status 2. Drawn as wide as
    its lines need (none wraps), the box is read back as one message: what is wrong, the form the flag
    takes or the flags meant, and where the full help is. ``--help`` is left as tyro draws it.
    """
    if "--help" in argv or "-h" in argv:
        return tyro.cli(cls, args=argv, prog=prog, **kwargs)
    held, columns, failed = io.StringIO(), os.environ.get("COLUMNS"), False
    os.environ["COLUMNS"] = "100000"
    try:
        with contextlib.redirect_stderr(held):
            return tyro.cli(cls, args=argv, prog=prog, **kwargs)
    except SystemExit as exc:
        failed = exc.code == 2
        if not failed:
            raise
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
        if not failed:  # warnings of a parse that went through
            sys.stderr.write(held.getvalue())
    raise ConfigError(one_line(held.getvalue(), prog))


def one_line(box: str, prog: str) -> str:
    """tyro's error box as one line: what it says is wrong, then the usage line of an "Argument helptext"
    section or those of a "Perhaps you meant" one. Drawn in ASCII the box has its title as the first section."""
    sections: list[list[str]] = [[]]
    for raw in _ANSI.sub("", box).splitlines():
        line = raw.strip().strip("│|").strip()
        if raw.lstrip().startswith(("╭", "╰")) or not line:
            continue
        if set(line) <= _RULE:
            sections.append([])
        else:
            sections[-1].append(line)
    sections = [s for s in sections if s][0 if "│" in box else 1 :]
    parts = []
    for head, *body in sections:
        usages = [line for line in body if line.startswith("-")]
        if head.startswith("Argument helptext"):
            parts += [f"the flag takes {usages[0]}"] if usages else []
        elif head.startswith("Perhaps you meant"):
            parts += [f"did you mean {' or '.join(usages)}?"] if usages else []
        elif not head.startswith("For full helptext"):
            parts.append(" ".join([head, *body]))
    message = "; ".join(parts) or "the flags could not be parsed"
    return f"{message} (flags: {prog} --help)"
