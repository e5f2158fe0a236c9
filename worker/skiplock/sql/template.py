"""Renders the variants of one templated statement (the idea of River's sqlctemplate, over SQL comments).

A statement that has variants declares them under its description, one line each::

    -- variant: job_complete_and_claim_one (one)

and marks the parts that vary with comment markers, which may nest: ``/*[one*/ ... /*one]*/`` is kept only in the
variants with the flag ``one``, ``/*[!one*/ ... /*!one]*/`` only in those without it. The statement itself is the
variant without any flag. Every variant is plain SQL once rendered (``queries_for(schema).<variant name>`` is the text
that runs), and ``tests/integration/test_sql_variants.py`` prepares every one against PostgreSQL.
"""

from __future__ import annotations

import re

_MARK = re.compile(r"/\*\[(?P<open>!?\w+)\*/|/\*(?P<close>!?\w+)\]\*/")
_VARIANT = re.compile(r"^-- variant: (?P<name>\w+) \((?P<flags>[\w ]*)\)$")


def variants(lines: list[str]) -> dict[str, frozenset[str]]:
    """The ``-- variant: name (flag ...)`` lines, as name -> flags (a line that is not one raises)."""
    out: dict[str, frozenset[str]] = {}
    for line in lines:
        m = _VARIANT.match(line)
        if m is None:
            raise ValueError(f"not a variant line: {line!r} (expected '-- variant: <name> (<flag> ...)')")
        out[m["name"]] = frozenset(m["flags"].split())
    return out


def flags_of(text: str) -> frozenset[str]:
    """The flags a template's markers name."""
    return frozenset(m["open"].lstrip("!") for m in _MARK.finditer(text) if m["open"])


def render(text: str, flags: frozenset[str]) -> str:
    """The variant of ``text`` with ``flags`` set: marked parts kept or dropped, markers and the lines they emptied
    removed. Unbalanced or crossed markers raise ValueError."""
    out: list[str] = []
    stack: list[str] = []
    dropped = 0  # how many open markers on the stack drop their part
    pos = 0
    for m in _MARK.finditer(text):
        if not dropped:
            out.append(text[pos : m.start()])
        pos = m.end()
        if m["open"]:
            stack.append(m["open"])
            negated, flag = m["open"].startswith("!"), m["open"].lstrip("!")
            dropped += (flag in flags) == negated
        else:
            if not stack or stack[-1] != m["close"]:
                raise ValueError(f"marker {m['close']}]*/ closes {stack[-1] if stack else 'nothing'}")
            opened = stack.pop()
            dropped -= (opened.lstrip("!") in flags) == opened.startswith("!")
    if stack:
        raise ValueError(f"marker /*[{stack[-1]}*/ is never closed")
    out.append(text[pos:])
    rendered = "".join(out)
    if pos:  # a template: drop the lines its markers emptied
        rendered = "\n".join(line for line in rendered.splitlines() if line.strip())
    return rendered.strip()
