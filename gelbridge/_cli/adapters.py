"""``gelbridge adapters list``: every adapter script, where it came from, and its status."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gelbridge._cli._app import app

adapters_app = typer.Typer(help="Inspect the Lua model adapters.", no_args_is_help=True)
app.add_typer(adapters_app, name="adapters")


@adapters_app.command("list")
def list_adapters(
    config: Annotated[Path | None, typer.Option("--config", help="gelbridge TOML config file")] = None,
) -> None:
    """List built-in and custom adapters with version, source file and load status."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gelbridge._adapters.registry import registry_from_settings
    from gelbridge._config import load_config
    from gelbridge._terminal import safe_line

    def cell(value: object, style: str = "") -> Text:  # a script's text: no markup, nothing a terminal obeys
        return Text(safe_line(str(value)), style=style)

    settings = load_config(config)
    registry = registry_from_settings(settings)
    table = Table(title="Lua adapters")
    table.add_column("name")
    table.add_column("version")
    table.add_column("source", overflow="fold")
    table.add_column("status")
    for e in registry.entries():
        if e.status == "loaded":
            status = cell("loaded", "green")
        elif e.status == "overridden":
            status = Text.assemble(cell("overridden", "yellow"), cell(f" by {e.overridden_by}"))
        else:
            status = Text.assemble(cell("failed", "red"), cell(f": {e.error}"))
        origin = " (built-in)" if e.builtin else ""
        table.add_row(cell(e.name or "-"), cell(e.version or "-"), cell(f"{e.source}{origin}"), status)
    console = Console()
    if not registry.entries():
        console.print("no adapter scripts found (built-in dir and [adapters] dirs are empty)")
        return
    console.print(table)
