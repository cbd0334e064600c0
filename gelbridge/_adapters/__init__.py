"""Lua adapter host: runs adapter scripts written to ADAPTER.md in a sandbox.

Public API: ``AdapterRegistry`` (load a directory set, ``get(name)``), ``Adapter``
(the string-in/string-out transforms), ``SandboxLimits``, ``builtin_adapters_dir``.

Globals a script sees: the Lua base library without loaders (no ``load``,
``loadstring``, ``dofile``, ``loadfile``, ``require``, ``package``), ``string``
(without ``dump``; ``find``/``match``/``gmatch``/``gsub``/``rep`` guarded),
``table``, ``math``, ``utf8`` (Lua 5.4), ``bit`` (LuaJIT), ``coroutine``,
``os.time``/``os.clock``/``os.date`` only, ``collectgarbage("count")`` only,
``print`` (→ debug log), ``rawset`` (refuses host tables), and the host globals
``json``, ``luxkit``, ``log``, ``http_get``, ``http_post``. No ``io``, ``debug``, ``jit``,
``python``, ``getfenv``/``setfenv``.

``luxkit`` (``lua/luxkit.lua``) is the helper library the built-in adapters are made
of (Lux responses and errors, stream output, tool definitions and arguments, the
OpenAI Chat family as ``luxkit.openai_family(flavor)``); any script may use it. Host code,
versioned with gelbridge, one copy per runtime, read-only (a frozen proxy: writes,
``rawset``, ``setmetatable`` and LuaJIT's raw ``table.insert``/``table.move`` raise).
It runs under the script's limits: guarded string patterns, JIT off (instruction
hook fires). Documented in ``docs/adapters.md``.

JSON rules (``lua/json.lua``):

- ``json.decode(s)`` returns the value, or ``nil, message`` on bad input (it does
  not raise, as in the Go host). JSON ``null`` → ``nil``; in an array it leaves a
  hole that re-encodes as ``null``, except trailing nulls, which are dropped.
- Integers stay integers (Lua 5.4 integer subtype; LuaJIT: exact up to 2^53).
  Numbers beyond the double range decode to ±huge and encode as ``null`` (as do NaN).
- Decoded arrays carry the marker metatable ``"json.array"``, so ``[]`` stays ``[]``
  and ``{}`` stays ``{}`` through decode → encode (e.g. ``"required": []``).
- ``json.encode``: a table is an array if it carries the marker or all its keys are
  positive integers (holes → null); otherwise an object with sorted keys (number
  keys become strings). An empty table built by a script encodes as ``{}``: use
  ``json.array()`` (or ``json.empty_array``, read-only) for an empty array, and
  ``json.object(t)`` to force an object. Functions, cycles and nesting deeper than
  128 raise an error. Strings are emitted as UTF-8 with JSON escapes; invalid UTF-8
  reaching the host is replaced with U+FFFD.
"""

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits, available_engines

__all__ = ["Adapter", "SandboxLimits", "available_engines", "load_adapter"]
