"""Reading and rewriting a command line's flags before tyro parses it (the CLI's pre-pass)."""

from __future__ import annotations


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
