"""What the docs' tests read in a Markdown page: its headings and their anchors (as
GitHub makes them), its links, and its fenced code blocks with the HTML comment marker
before each (``<!-- snippet: skip -->``). Plain text parsing, no Markdown library."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
# [text](target) and ![alt](target); the target may hold one level of parentheses.
LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target>(?:[^()\s]|\([^()]*\))+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<value>[\w-]+)\s*-->\s*$")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (code spans without their
    backticks, links as their text, no emphasis marks), lowercased; letters, digits,
    ``-``, ``_`` and spaces kept, every other character dropped; each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    kept = []
    for char in text.lower():
        kind = unicodedata.category(char)
        if char in " -_" or kind[0] in "LMN" or kind == "Pc":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def closes(found: re.Match[str] | None, fence: str) -> bool:
    """Whether a fence line closes the block ``fence`` opened: the same character, at
    least as many, no info string."""
    return bool(
        found
        and found["fence"][0] == fence[0]
        and len(found["fence"]) >= len(fence)
        and not found["info"].strip()
    )


@dataclass
class Block:
    """A fenced code block: its info string (``python``, ``""``…), its lines without
    the block's indentation, the line it starts on (1-based), and the value of the
    ``<!-- snippet: … -->`` marker on the line before it (or the last non-blank line
    before it), if any."""

    info: str
    lines: list[str]
    line: int
    marker: str | None

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class Page:
    path: Path
    lines: list[str]

    @classmethod
    def read(cls, path: Path) -> Page:
        return cls(path, path.read_text(encoding="utf-8").splitlines())

    def prose(self) -> list[tuple[int, str]]:
        """(line number, line) of every line outside fenced blocks, code spans blanked."""
        out, fence = [], None
        for number, line in enumerate(self.lines, 1):
            found = FENCE.match(line)
            if fence is None and found:
                fence = found["fence"]
                continue
            if fence is not None:
                if closes(found, fence):
                    fence = None
                continue
            out.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group()), line)))
        return out

    def anchors(self) -> set[str]:
        """The anchors of the page's headings, with GitHub's ``-1``, ``-2``… suffixes
        for repeated ones, and of ``<a id=…>``/``<a name=…>`` tags."""
        seen: dict[str, int] = {}
        found = set()
        for _, line in self.prose_with_code():
            heading = HEADING.match(line)
            if heading:
                base = slug(heading[2])
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
            for tag in re.finditer(r"<a\s+(?:id|name)=\"([^\"]+)\"", line):
                found.add(tag[1])
        return found

    def prose_with_code(self) -> list[tuple[int, str]]:
        """Like ``prose()`` but with code spans kept (headings render them)."""
        wanted = {number for number, _ in self.prose()}
        return [(n, line) for n, line in enumerate(self.lines, 1) if n in wanted]

    def links(self) -> list[tuple[int, str]]:
        """(line number, target) of every inline link and image outside code."""
        found = []
        for number, line in self.prose():
            for link in LINK.finditer(line):
                target = link["target"].strip("<>")
                found.append((number, target))
        return found

    def blocks(self) -> list[Block]:
        """The fenced code blocks, in order."""
        blocks: list[Block] = []
        fence = None
        marker: str | None = None
        for number, line in enumerate(self.lines, 1):
            found = FENCE.match(line)
            if fence is None:
                if found:
                    fence, indent = found["fence"], len(found["indent"])
                    current = Block(found["info"].strip(), [], number + 1, marker)
                    marker = None
                    continue
                said = MARKER.match(line)
                if said:
                    marker = said["value"]
                elif line.strip():
                    marker = None
                continue
            if closes(found, fence):
                blocks.append(current)
                fence = None
                continue
            current.lines.append(line[indent:] if line[:indent].strip() == "" else line)
        return blocks


#: Links to this address are never right: the project is not published there.
NOT_PUBLISHED = "github.com/django-dbworker"


def broken_links(pages: list[Path], root: Path) -> list[str]:
    """``path:line: target: why`` for each link of ``pages`` that does not resolve: a
    relative link to a missing file, an ``#anchor`` no heading of its page makes, and
    any link to (or command naming) the unpublished repository's address. Other
    absolute links are not followed (no network)."""
    found = []
    anchors: dict[Path, set[str]] = {}
    for path in pages:
        page = Page.read(path)
        linked = set()
        for number, target in page.links():
            linked.add(number)
            where = f"{path.relative_to(root)}:{number}: {target}"
            if NOT_PUBLISHED in target:
                found.append(f"{where}: the project is not published there: link relatively")
                continue
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / unquote(file)).resolve() if file else path.resolve()
            if not dest.exists():
                found.append(f"{where}: no such file")
                continue
            if not anchor:
                continue
            if dest.suffix != ".md":
                found.append(f"{where}: an anchor into a file that is not Markdown")
                continue
            if dest not in anchors:
                anchors[dest] = Page.read(dest).anchors()
            if unquote(anchor) not in anchors[dest]:
                found.append(f"{where}: no heading of {dest.name} has this anchor")
        for number, line in enumerate(page.lines, 1):
            if NOT_PUBLISHED in line and number not in linked:
                found.append(
                    f"{path.relative_to(root)}:{number}: {line.strip()}: "
                    "the project is not published there"
                )
    return found
