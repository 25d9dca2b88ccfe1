"""Settings read from the environment: timeouts and world sizes.

Every value is validated where it is read, and a bad one raises
:class:`ConfigError` naming the value and where it came from, as
pytest-timeout does (``Invalid timeout {value} from {where}``).

``TIMEOUT_DEFAULT`` is read lazily (module ``__getattr__``) so that a bad
``DISTTEST_TIMEOUT`` fails the first test that needs a timeout, with a clear
message, rather than ``import disttest``.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__unittest = True

__all__ = [
    "DEFAULT_WORLD_SIZE",
    "MAX_FAKE_WORLD_SIZE",
    "MAX_WORLD_SIZE",
    "TIMEOUT_ENV_VARS",
    "TIMEOUT_FALLBACK",
    "TIMEOUT_OVERRIDE",
    "UNMARKED",
    "ConfigError",
    "as_number",
    "default_timeout",
    "get_timeout",
    "mark_world_size",
    "marked_world_size",
    "parse_flag",
    "parse_timeout",
    "parse_world_size",
]

N = TypeVar("N")

#: Most tests run with this many ranks, 4 (upstream's value on non-ROCm hosts).
DEFAULT_WORLD_SIZE = 4

#: Where the default per-test timeout comes from, first match wins.
TIMEOUT_ENV_VARS = ("DISTTEST_TIMEOUT", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT")
#: The default per-test timeout in seconds when no variable is set.
TIMEOUT_FALLBACK = 300

#: Per-test timeouts (seconds) by test method name, as upstream.
TIMEOUT_OVERRIDE: dict[str, float] = {
    "test_ddp_uneven_inputs": 400,
    "test_DistributedDataParallel": 500,
}

INVALID_VALUE = "Invalid {what} {value!r} from {where} (disttest): {why}"


class ConfigError(ValueError):
    """A setting has a value disttest cannot use.

    Fields: ``what`` (the kind of setting), ``value`` (as given), ``where``
    (the variable, attribute or argument it came from) and ``why``.
    """

    def __init__(self, what: str, value: object, where: str, why: str) -> None:
        self.what = what
        self.value = value
        self.where = where
        self.why = why
        super().__init__(
            INVALID_VALUE.format(what=what, value=value, where=where, why=why)
        )


def as_number(kind: Callable[[Any], N], value: object, bad: ConfigError) -> N:
    """``kind(value)`` (``int``, ``float``), or raise ``bad`` when ``value``
    is a bool or ``kind`` cannot read it: the number check of every setting."""
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str) and not (value.isascii() and "_" not in value):
        raise bad  # (int() and float() also read "1_0" as 10 and other scripts' digits)
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float(10**400)
        raise bad from None


#: The words a yes/no setting may take (case and surrounding blanks do not count).
FLAG_WORDS = {"": False, "0": False, "false": False, "no": False, "off": False,
              "1": True, "true": True, "yes": True, "on": True}


def parse_flag(raw: str | None, where: str) -> bool:
    """A yes/no setting's text (unset or blank: no); anything else raises
    :class:`ConfigError` naming ``raw`` and ``where``."""
    value = FLAG_WORDS.get((raw or "").strip().lower())
    if value is None:
        raise ConfigError("flag", raw, where, "expected 1/0, true/false, yes/no or on/off")
    return value


def parse_timeout(value: object, where: str, text: bool = False) -> float:
    """Return ``value`` as a positive, finite number of seconds.

    Integral values come back as ``int`` so that messages read ``30s``.
    ``text``: the value comes from text (an environment variable, a command
    line), so a string is read as a number; elsewhere a string is an error
    (``timeout = "30"`` in a class), as for :func:`parse_world_size`.
    Raises :class:`ConfigError` naming ``value`` and ``where`` otherwise.
    """
    bad = ConfigError("timeout", value, where, "expected a positive number of seconds")
    if isinstance(value, str) and not text:
        raise bad
    seconds = as_number(float, value, bad)
    if not math.isfinite(seconds) or seconds <= 0:
        raise bad
    return int(seconds) if seconds.is_integer() else seconds


#: The largest world disttest starts (65536 ranks; a simulated world too):
#: beyond it sizes overflowed deep inside (a socket's backlog, the progress
#: board) instead of being refused.
MAX_WORLD_SIZE = 1 << 16
#: The largest fake world (``with_fake_comms``, ``mock_init_dist``): it
#: starts no ranks, so only c10d's own limit (a rank is a 32-bit int) applies.
MAX_FAKE_WORLD_SIZE = (1 << 31) - 1


#: A class's own ``{method name: size}`` of the pytest ``world_size`` markers
#: of its collected tests (kept on the class, not on the function, which
#: classes that share a method through a mixin share too).
MARKED_SIZES = "__disttest_marked_world_sizes__"


#: Recorded for a test collected without a marker: a marker of a class it
#: derives from (on the test it overrides) is not its own.
UNMARKED = 0


def mark_world_size(cls: type, method_name: str, size: int | None) -> None:
    """Record (None: forget; :data:`UNMARKED`: collected without one) the
    marker's ``size`` of ``cls``'s test ``method_name``."""
    marked = cls.__dict__.get(MARKED_SIZES)
    if marked is None:
        if size is None:
            return
        marked = {}
        setattr(cls, MARKED_SIZES, marked)
    if size is None:
        marked.pop(method_name, None)
    else:
        marked[method_name] = size


def marked_world_size(cls: type, method_name: str | None) -> int | None:
    """The size a pytest marker gave ``cls``'s test ``method_name`` (also
    one given to a class it derives from: disttest runs a test in a copy of
    its class), else None; the nearest class's record decides (a subclass's
    test collected without a marker has none, whatever its base's had)."""
    if method_name is None:
        return None
    for klass in cls.__mro__:
        size = klass.__dict__.get(MARKED_SIZES, {}).get(method_name)
        if size is not None:
            return int(size) if size != UNMARKED else None
    return None


def parse_world_size(value: object, where: str, text: bool = False, most: int = MAX_WORLD_SIZE) -> int:
    """Return ``value`` as a world size (an integer from 1 to ``most``,
    :data:`MAX_WORLD_SIZE` unless given).

    ``text``: the value comes from text (an environment variable, a command
    line), so a string of digits is read as a number; elsewhere a string is
    an error (``world_size = "2"`` in a class). Raises :class:`ConfigError`
    naming ``value`` and ``where`` otherwise.
    """
    why = f"expected an integer from 1 to {most}"
    if isinstance(value, bool) or (isinstance(value, str) and not text):
        raise ConfigError("world size", value, where, why)
    if isinstance(value, str):
        digits = value.strip()
        # (digits only: int() also reads "1_0" as 10 and other scripts' digits)
        if not (digits.isascii() and digits.isdigit()):
            raise ConfigError("world size", value, where, why)
        value = int(digits)
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # an int, or numpy's int64
    except TypeError:
        raise ConfigError("world size", value, where, why) from None
    if not 1 <= number <= most:
        raise ConfigError("world size", value, where, why)
    return number


def default_timeout(environ: Mapping[str, str] | None = None) -> float:
    """The default per-test timeout: ``DISTTEST_TIMEOUT``, else upstream's
    ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``, else 300 seconds."""
    env = os.environ if environ is None else environ
    # Each one set is read (a bad upstream variable under a good DISTTEST_TIMEOUT
    # went unnoticed); the first wins.
    given = [parse_timeout(env[name], f"environment variable {name}", text=True)
             for name in TIMEOUT_ENV_VARS if (env.get(name) or "").strip()]
    return given[0] if given else TIMEOUT_FALLBACK


def get_timeout(test_id: str, environ: Mapping[str, str] | None = None) -> float:
    """The timeout in seconds for the test with unittest id ``test_id``.

    ``TIMEOUT_OVERRIDE`` (keyed by method name) wins over the default, as
    upstream's, but not over ``DISTTEST_TIMEOUT`` (``--disttest-timeout``):
    a limit asked for every test is not lifted for some without a word.
    """
    env = os.environ if environ is None else environ
    name = test_id.rsplit(".", 1)[-1]
    if name in TIMEOUT_OVERRIDE and not env.get(TIMEOUT_ENV_VARS[0], "").strip():
        return parse_timeout(TIMEOUT_OVERRIDE[name], f"TIMEOUT_OVERRIDE[{name!r}]")
    return default_timeout(environ)


def __getattr__(name: str) -> object:
    if name == "TIMEOUT_DEFAULT":
        return default_timeout()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
