"""The one rule for names: users, servers, teams and groups, nodes, profiles, GPU models.

A name is shown to people (admin pages, the spawn form, CSV exports, the audit
log) and compared by machines (the ledger, the placement pool). Besides the
control characters no text may hold, a name may not hold the Unicode
characters that change how the text around them is shown while showing
nothing themselves: the zero-width and directional marks U+200B–U+200F, the
bidirectional embeddings and overrides U+202A–U+202E, the isolates
U+2066–U+2069 and U+FEFF. ``bob\\u202e`` followed by ``nimda`` shows as
``bobadmin``; ``ad\\u200bmin`` looks like ``admin`` and is another account.

The service states the same rule for request bodies as the ``NameCharacters``
pattern of ``service/openapi.json`` (a test keeps the two equal); path and
query arguments, and the configuration's names, are checked here. Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata

#: C0 controls, DEL and C1 controls: no text from outside may hold them
CONTROLS = "\x00-\x1f\x7f-\x9f"
#: zero-width and bidirectional controls: invisible, yet they change how a name reads
INVISIBLE_CONTROLS = "\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff"
#: what a name may not contain, as one regular expression character class
NOT_IN_NAMES = re.compile(f"[{CONTROLS}{INVISIBLE_CONTROLS}]")

#: the rule in words, for error messages
RULE = ("names may not contain control characters, nor the bidirectional or zero-width controls "
        "U+200B-U+200F, U+202A-U+202E, U+2066-U+2069 and U+FEFF")


def name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a name (the first character it may not hold,
    and the rule), or None. Length and emptiness are the caller's rules."""
    bad = NOT_IN_NAMES.search(value)
    if bad is None:
        return None
    char = bad.group()
    label = unicodedata.name(char, "a control character")
    return f"contains U+{ord(char):04X} ({label}): {RULE}"
