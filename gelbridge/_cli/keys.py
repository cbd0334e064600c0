"""``gelbridge keys``: create and list the keys of a keyring file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gelbridge._cli._app import app
from gelbridge._errors import KEYRING_ENV

keys_app = typer.Typer(help="Manage the keyring (named 32-byte keys that seal records).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

KeyringOption = Annotated[
    Path,
    typer.Option(
        "--keyring",
        envvar=KEYRING_ENV,
        help=f"Keyring file (JSON). Default: ${KEYRING_ENV}.",
        show_default=False,
    ),
]


@keys_app.command("new")
def keys_new(
    keyring: KeyringOption,
    key_id: Annotated[
        str | None,
        typer.Option("--key-id", help="Id for the new key (1-128 of A-Za-z0-9._:-); generated if absent."),
    ] = None,
) -> None:
    """Add a fresh random key (creating the file if needed) and print only its id."""
    from gelbridge._sealing import Keyring

    ring = Keyring.load(keyring) if keyring.expanduser().exists() else Keyring()
    new_id = ring.add_new(key_id)
    ring.save(keyring)
    typer.echo(new_id)


@keys_app.command("list")
def keys_list(keyring: KeyringOption) -> None:
    """Print the key ids in the keyring, one per line (never the keys)."""
    from gelbridge._sealing import Keyring

    for key_id in sorted(Keyring.load(keyring)):
        typer.echo(key_id)
