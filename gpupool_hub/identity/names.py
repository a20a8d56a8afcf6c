"""The one rule for names: users, servers, teams and groups, nodes, profiles, GPU models.

A name is shown to people (admin pages, the spawn form, CSV exports, the audit
log) and compared by machines (the ledger, the placement pool). Besides the
control characters no text may hold, a name may not hold the Unicode
characters that show nothing themselves yet change how the text around them
reads, or make two names that read alike differ: every format character
(general category Cf: the zero-width and directional marks, the
bidirectional embeddings, overrides and isolates, U+FEFF, the soft hyphen,
the word joiner and invisible operators U+2060-U+2064, U+206A-U+206F, the
Arabic letter mark U+061C, the Mongolian vowel separator, the interlinear
annotation characters U+FFF9-U+FFFB, the tags U+E0000-U+E007F), the line and
paragraph separators U+2028/U+2029, the variation selectors (U+FE00-U+FE0F,
U+E0100-U+E01EF, the Mongolian ones U+180B-U+180F), the combining grapheme
joiner U+034F and the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0).
``bob\\u202e`` followed by ``nimda`` shows as ``bobadmin``; ``ad\\u2060min`` looks
like ``admin`` and is another account.

The ranges are written out (:data:`INVISIBLE`) rather than read from
``unicodedata``, so the rule is the same on every Python; a test checks that
they hold every Cf, Zl and Zp character of the running Python's Unicode
version. The service states the same rule for request bodies as the
``NameCharacters`` pattern of ``service/openapi.json`` (a test keeps the two
equal on every code point); path and query arguments, and the
configuration's names, are checked here. Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata

#: C0 controls, DEL and C1 controls: no text from outside may hold them
CONTROLS = ((0x00, 0x1F), (0x7F, 0x9F))

#: invisible characters that change how a name reads (inclusive code point ranges), issue 37.5 and 48.6
INVISIBLE = (
    (0x00AD, 0x00AD),  # soft hyphen
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),  # Arabic/Syriac format marks
    (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160),  # Hangul choseong and jungseong fillers
    (0x180B, 0x180F),  # Mongolian variation selectors and vowel separator
    (0x200B, 0x200F),  # zero-width space, joiners, directional marks
    (0x2028, 0x202E),  # line and paragraph separators, bidirectional embeddings and overrides
    (0x2060, 0x206F),  # word joiner, invisible operators, isolates, deprecated format characters
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFEFF, 0xFEFF),  # zero-width no-break space (byte order mark)
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xFFF9, 0xFFFB),  # interlinear annotation
    (0x110BD, 0x110BD), (0x110CD, 0x110CD),  # Kaithi number signs
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    (0xE0000, 0xE007F),  # tags
    (0xE0100, 0xE01EF),  # variation selectors supplement
)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


#: what a name may not contain, as one regular expression character class
NOT_IN_NAMES = re.compile(f"[{_char_class(CONTROLS + INVISIBLE)}]")

#: the rule in words, for error messages
RULE = ("names may not contain control characters, nor invisible characters: the bidirectional or zero-width "
        "controls and every other Unicode format character, the line and paragraph separators, variation "
        "selectors, tag characters, the combining grapheme joiner and the Hangul fillers")


def name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a name (the first character it may not hold,
    and the rule), or None. Length and emptiness are the caller's rules."""
    bad = NOT_IN_NAMES.search(value)
    if bad is None:
        return None
    char = bad.group()
    label = unicodedata.name(char, "a control character")
    return f"contains U+{ord(char):04X} ({label}): {RULE}"
