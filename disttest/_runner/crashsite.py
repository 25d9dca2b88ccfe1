"""Where a rank process crashed: faulthandler's fatal-error dump, taken out
of the rank's output and put in order for the report.

A rank that dies of a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL)
leaves faulthandler's dump at the end of its log: every thread's stack, the
current (crashing) one not necessarily first, each going on into the
frames that made the rank (a forked rank's stack continues into its
parent's test runner), then a long "Extension modules: ..." line. The report
wants the crashing thread first and no list of extension modules; the
report's stack filter (``report.user_stack``) then cuts the launcher's
frames.
"""

from __future__ import annotations

__unittest = True

__all__ = ["FATAL", "split_fatal_dump"]

FATAL = "Fatal Python error: "
_CURRENT = "Current thread "
_THREAD = "Thread "
_EXTENSIONS = "Extension modules: "


def split_fatal_dump(text: str) -> tuple[str, str]:
    """``(crash site, output)``: the last fatal-error dump in ``text`` with
    the crashing thread first and without the extension modules line, and
    the rest of ``text`` with the dump replaced by a one-line note. Without
    a dump: ``("", text)``."""
    start = text.rfind(FATAL)
    if start < 0:
        return "", text
    head, dump = text[:start], text[start:]
    lines = dump.splitlines()
    title = lines[0]
    blocks: list[list[str]] = []
    rest: list[str] = []
    block: list[str] | None = None
    for line in lines[1:]:
        if line.startswith((_CURRENT, _THREAD)) and line.rstrip().endswith(":"):
            block = [line]
            blocks.append(block)
        elif block is not None and line.startswith("  "):
            block.append(line)
        elif line.startswith(_EXTENSIONS) or not line.strip():
            block = None
        elif line.startswith("Stack (most recent call first):"):  # a dump without threads
            block = [line]
            blocks.append(block)
        else:
            block = None
            rest.append(line)
    blocks.sort(key=lambda b: not b[0].startswith(_CURRENT))  # the crashing thread first
    site = "\n\n".join([title, *("\n".join(b) for b in blocks)])
    if not head.strip() and not rest:
        return site, ""
    note = f"[{title.strip()}: the crash site is above]"
    return site, head + note + ("\n" + "\n".join(rest) if rest else "") + "\n"
