"""Load every adapter script from the built-in and custom directories.

Order and overrides: the built-in directory first, then each custom directory in
the order configured; inside a directory, ``*.lua`` files in sorted name order.
When two scripts declare the same ``adapter.name`` the one loaded later wins, so a
custom script overrides a built-in one and a later custom directory overrides an
earlier one. A script that fails to load is reported (file, line, message) and
never stops the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._errors import AdapterError, AdapterLoadError

if TYPE_CHECKING:
    from gelbridge._config import Settings

class AdapterStatus(StrEnum):
    """What became of one adapter script at load."""

    LOADED = "loaded"
    FAILED = "failed"
    OVERRIDDEN = "overridden"  # a later script of the same name replaced it


def builtin_adapters_dir() -> Path:
    """The built-in adapters: ``gelbridge/_builtin/adapters`` in a wheel, else the repo's ``adapters/``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_builtin" / "adapters", package.parent / "adapters"):
        if candidate.is_dir():
            return candidate
    return package / "_builtin" / "adapters"


@dataclass(frozen=True)
class AdapterEntry:
    """One script file and what became of it."""

    source: Path
    status: AdapterStatus
    name: str | None = None
    version: str = ""
    error: str | None = None
    """For ``failed``: ``file:line: message`` (or ``file: message``)."""
    overridden_by: Path | None = None
    builtin: bool = False


class AdapterRegistry:
    """Adapters by name, plus a record of every script seen."""

    def __init__(self, adapters: Mapping[str, Adapter], entries: Iterable[AdapterEntry]) -> None:
        self._adapters = dict(adapters)
        self._entries = list(entries)

    @classmethod
    def load(
        cls,
        builtin_dir: Path | None,
        extra_dirs: Iterable[Path] = (),
        *,
        limits: SandboxLimits | None = None,
        allow_hosts_by_adapter: Mapping[str, list[str]] | None = None,
    ) -> AdapterRegistry:
        """Load ``builtin_dir`` then ``extra_dirs``; missing directories are skipped."""
        limits = limits or SandboxLimits()
        hosts = dict(allow_hosts_by_adapter or {})
        loaded: dict[str, tuple[Adapter, int]] = {}
        entries: list[AdapterEntry] = []
        dirs = [(builtin_dir, True)] if builtin_dir is not None else []
        dirs += [(Path(d).expanduser(), False) for d in extra_dirs]
        for directory, builtin in dirs:
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob("*.lua")):
                if not path.is_file():
                    continue
                try:
                    adapter = load_adapter(path, limits=limits, allow_hosts=hosts)
                except AdapterError as e:  # includes AdapterLoadError and SandboxViolation
                    entries.append(AdapterEntry(path, AdapterStatus.FAILED, error=str(e), builtin=builtin))
                    continue
                previous = loaded.get(adapter.name)
                if previous is not None:
                    old = entries[previous[1]]
                    entries[previous[1]] = AdapterEntry(
                        old.source, AdapterStatus.OVERRIDDEN, old.name, old.version,
                        overridden_by=path, builtin=old.builtin,
                    )
                loaded[adapter.name] = (adapter, len(entries))
                entries.append(AdapterEntry(path, AdapterStatus.LOADED, adapter.name, adapter.version, builtin=builtin))
        return cls({name: a for name, (a, _) in loaded.items()}, entries)

    def get(self, name: str) -> Adapter:
        """The adapter called ``name``; the error lists the known names."""
        try:
            return self._adapters[name]
        except KeyError:
            known = ", ".join(sorted(self._adapters)) or "none"
            failed = [e for e in self._entries if e.status is AdapterStatus.FAILED]
            hint = f"; {len(failed)} script(s) failed to load, see 'gelbridge adapters list'" if failed else ""
            raise AdapterError(f"no adapter named {name!r} (loaded: {known}){hint}") from None

    def names(self) -> list[str]:
        return sorted(self._adapters)

    def entries(self) -> list[AdapterEntry]:
        """Every script seen, in load order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters


def limits_from_settings(settings: Settings) -> SandboxLimits:
    """``[adapters]`` → ``SandboxLimits``."""
    ad = settings.adapters
    return SandboxLimits(
        time_limit=ad.cpu_limit_seconds,
        max_memory=ad.memory_limit_mb * 1024 * 1024,
        max_instructions=ad.instruction_limit,
        pool_size=max(1, ad.pool_size),
        streams_per_runtime=ad.streams_per_runtime,
        engine=ad.engine,
    )


def allow_hosts_from_settings(settings: Settings) -> dict[str, list[str]]:
    """Union of ``allow_hosts`` over the ``[providers.*]`` sections that use each adapter."""
    hosts: dict[str, list[str]] = {}
    for provider in settings.providers.values():
        bucket = hosts.setdefault(provider.adapter, [])
        bucket.extend(h for h in provider.allow_hosts if h not in bucket)
    return hosts


def registry_from_settings(settings: Settings) -> AdapterRegistry:
    """Load the built-in adapters and ``[adapters] dirs`` with the configured limits."""
    return AdapterRegistry.load(
        builtin_adapters_dir(),
        settings.adapters.dirs,
        limits=limits_from_settings(settings),
        allow_hosts_by_adapter=allow_hosts_from_settings(settings),
    )


__all__ = [
    "AdapterEntry",
    "AdapterLoadError",
    "AdapterRegistry",
    "allow_hosts_from_settings",
    "builtin_adapters_dir",
    "limits_from_settings",
    "registry_from_settings",
]
