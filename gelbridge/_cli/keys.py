"""``gelbridge keys``: create and list the keys of a keyring file; make, show and retire the
bridge key apps grant conversation keys to (PROTOCOL.md §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gelbridge._cli._app import app, print_error
from gelbridge._errors import KEYRING_ENV

keys_app = typer.Typer(help="Manage the keyring (named 32-byte keys that seal records) and the bridge key "
                        "(apps grant conversation keys to it).", no_args_is_help=True)
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


# --- the bridge key (PROTOCOL.md §6: apps grant conversation keys to it) ----------------------

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML configuration file "
                                                   "(or $GELBRIDGE_CONFIG): [keyring] bridge_key, the accounts.")]


@keys_app.command("bridge-new")
def keys_bridge_new(
    out: Annotated[Path, typer.Option("--out", help="Where to write the new private key file (mode 0600; "
                                      "never overwritten).", show_default=False)],
    kid: Annotated[str | None, typer.Option("--kid", help="The key's id, also its bridge record's key "
                                            "(1-64 of A-Za-z0-9._:-). Default: from its fingerprint.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Your label for this bridge, shown by apps "
                                             "(at most 64 bytes).")] = None,
) -> None:
    """Make a new bridge key (X25519) for key grants; print its kid and fingerprint.

    Set it as [keyring] bridge_key = "PATH" (every worker of a fleet uses the same file);
    'gelbridge run' then publishes it in each account's repo, and apps grant conversation
    keys to it. Give users the fingerprint: their app shows it when it pairs.
    """
    from gelbridge._grants import BridgeKey

    key = BridgeKey.generate(kid, name)
    key.save(out)
    typer.echo(f"kid          {key.kid}")
    typer.echo(f"fingerprint  {key.fingerprint}")
    typer.echo(f"wrote {out} (mode 0600); set [keyring] bridge_key = \"{out}\"", err=True)


@keys_app.command("bridge-show")
def keys_bridge_show(
    config: ConfigOpt = None,
    key: Annotated[Path | None, typer.Option("--key", help="Show this key file instead of the configured "
                                             "ones.")] = None,
) -> None:
    """Print the kid, fingerprint and name of the configured bridge keys (never the key).

    The first is the current one (published, granted to); any others are older keys
    still honoured until retired.
    """
    import os

    from gelbridge._config import load_config
    from gelbridge._grants import BRIDGE_KEY_ENV, BridgeKey, load_bridge_keys
    from gelbridge._terminal import safe_line

    if key is not None:
        keys = [BridgeKey.load(key)]
    else:
        keys = list(load_bridge_keys(load_config(config).keyring.bridge_key, os.environ))
        if not keys:
            print_error(f"no bridge key: set [keyring] bridge_key (or ${BRIDGE_KEY_ENV}); "
                        "make one with 'gelbridge keys bridge-new --out FILE'")
            raise typer.Exit(1)
    for i, k in enumerate(keys):
        role = "current" if i == 0 else "older (still honoured)"
        label = f"  name {k.name}" if k.name else ""
        typer.echo(safe_line(f"{k.kid}  fingerprint {k.fingerprint}  {role}{label}"))


@keys_app.command("bridge-retire")
def keys_bridge_retire(
    kid: Annotated[str, typer.Argument(help="The kid of the bridge key to retire.", show_default=False)],
    config: ConfigOpt = None,
) -> None:
    """Delete the bridge record KID from every configured account's repo.

    Apps stop granting to it; grants already made to it stay in the repos (each app
    grants its keys again to the current bridge key). Then remove that key's file from
    [keyring] bridge_key. The current key cannot be retired: configure its successor first.
    """
    import asyncio
    import os

    from gelbridge._config import load_config
    from gelbridge._grants import check_kid, load_bridge_keys

    check_kid(kid)
    settings = load_config(config)
    current = load_bridge_keys(settings.keyring.bridge_key, os.environ).current
    if current is not None and current.kid == kid:
        print_error(f"{kid} is the current bridge key: make a new one ('gelbridge keys bridge-new'), put it first "
                    "in [keyring] bridge_key, restart 'gelbridge run', then retire this one")
        raise typer.Exit(1)
    for line in asyncio.run(_retire(settings, kid, os.environ)):
        typer.echo(line)


async def _retire(settings: Any, kid: str, environ: Any) -> list[str]:
    from gelbridge._errors import ConfigError
    from gelbridge._identity import check_session_did, pds_url_of
    from gelbridge._pds import PdsClient
    from gelbridge._records import BRIDGE_COLLECTION

    out = []
    for entry in settings.accounts_list():
        a = settings.for_account(entry).account
        password = environ.get(a.password_env)
        if not password:
            raise ConfigError(f"{entry.label}: no app password: set ${a.password_env}")
        url, expected = await pds_url_of(a.pds, a.identifier, settings.identity)
        async with PdsClient(url) as pds:
            session = await pds.login(a.identifier, password)
            check_session_did(session.did, expected, a.identifier, url)
            had = await pds.get_record(BRIDGE_COLLECTION, kid) is not None
            if had:
                await pds.delete_record(BRIDGE_COLLECTION, kid)
        out.append(f"{entry.label}: {'deleted' if had else 'had no'} bridge record {kid}")
    return out
