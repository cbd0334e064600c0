"""How a configuration problem names its place: ``[section] key``, and a key that is not
a setting, with the closest valid name. Here, below both ``_config`` and
``_tools.config``, which word their tables' problems this way."""

from __future__ import annotations

from typing import Any


def key_name(loc: tuple[Any, ...]) -> str:
    """``("tools", "max_step")`` → ``[tools] max_step``; ``("wacth",)`` → ``[wacth]``."""
    keys = [str(p) for p in loc]
    if len(keys) == 1:
        return f"[{keys[0]}]"
    return f"[{'.'.join(keys[:-1])}] {keys[-1]}"


def unknown_key_problem(loc: tuple[Any, ...], known: list[str]) -> str:
    """One line for a key that is not a setting, with the closest valid name."""
    from difflib import get_close_matches

    name = str(loc[-1])
    close = get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {key_name((*loc[:-1], close[0]))}?" if close else (
        f"; known here: {', '.join(sorted(known))}" if known else "")
    what = "section" if len(loc) == 1 else "key"
    return f"{key_name(loc)}: unknown {what}{hint}"
