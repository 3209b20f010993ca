"""A small Markdown-to-HTML converter for this project's own docs (no dependency).

It covers what ``docs/`` uses: ATX headings, paragraphs, fenced code, pipe tables,
nested ``-``/``1.`` lists, block quotes, rules, and inline code, links, bold and
italics. Everything is escaped; link targets go through a caller's ``link`` function,
which maps them (``sdk.md#x`` -> ``sdk.html#x``) or drops them (``None``: text only).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

__all__ = ["slug", "to_html"]

LinkMap = Callable[[str], "str | None"]

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+(.*)$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_INLINE = re.compile(r"(`+)(.+?)\1|\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def slug(text: str) -> str:
    """The anchor of a heading, as GitHub forms it (lowercase, punctuation dropped, spaces to ``-``)."""
    text = re.sub(r"[`*_\[\]()]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def to_html(text: str, link: LinkMap) -> str:
    return "\n".join(_blocks(text.replace("\r\n", "\n").split("\n"), link))


def _inline(text: str, link: LinkMap) -> str:
    out: list[str] = []
    position = 0
    for match in _INLINE.finditer(text):
        out.append(_emphasis(html.escape(text[position : match.start()], quote=False)))
        if match.group(1):
            out.append(f"<code>{html.escape(match.group(2).strip(), quote=False)}</code>")
        else:
            label = _inline(match.group(3), link)
            target = link(match.group(4))
            out.append(label if target is None else f'<a href="{html.escape(target)}">{label}</a>')
        position = match.end()
    out.append(_emphasis(html.escape(text[position:], quote=False)))
    return "".join(out)


def _emphasis(escaped: str) -> str:
    return _ITALIC.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", escaped))


def _cells(line: str) -> list[str]:
    line = line.strip().removeprefix("|")
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)]


def _starts_block(line: str, following: str) -> bool:
    return bool(
        _HEADING.match(line) or _FENCE.match(line) or _ITEM.match(line) or line.lstrip().startswith(">")
        or (line.lstrip().startswith("|") and _TABLE_RULE.match(following))
    )


def _blocks(lines: list[str], link: LinkMap) -> list[str]:
    out: list[str] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        following = lines[i + 1] if i + 1 < n else ""
        if not line.strip():
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            marker = fence.group(2)
            body: list[str] = []
            i += 1
            while i < n and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or the end of the text)
            language = f' class="language-{fence.group(3)}"' if fence.group(3) else ""
            out.append(f"<pre><code{language}>{html.escape(chr(10).join(body), quote=False)}</code></pre>")
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            title = heading.group(2)
            out.append(f'<h{level} id="{slug(title)}">{_inline(title, link)}</h{level}>')
            i += 1
            continue
        if line.lstrip().startswith("|") and _TABLE_RULE.match(following):
            header = _cells(line)
            rows: list[list[str]] = []
            i += 2
            while i < n and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head = "".join(f"<th>{_inline(cell, link)}</th>" for cell in header)
            body_rows = "".join(
                "<tr>" + "".join(f"<td>{_inline(cell, link)}</td>" for cell in row) + "</tr>" for row in rows
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body_rows}</tbody></table>")
            continue
        if _RULE.match(line):
            out.append("<hr>")
            i += 1
            continue
        if line.lstrip().startswith(">"):
            quoted: list[str] = []
            while i < n and lines[i].lstrip().startswith(">"):
                quoted.append(re.sub(r"^\s*>\s?", "", lines[i]))
                i += 1
            out.append("<blockquote>" + "\n".join(_blocks(quoted, link)) + "</blockquote>")
            continue
        item = _ITEM.match(line)
        if item:
            i = _list(lines, i, link, out)
            continue
        paragraph = [line.strip()]
        i += 1
        while i < n and lines[i].strip() and not _starts_block(lines[i], lines[i + 1] if i + 1 < n else ""):
            paragraph.append(lines[i].strip())
            i += 1
        out.append(f"<p>{_inline(' '.join(paragraph), link)}</p>")
    return out


def _list(lines: list[str], i: int, link: LinkMap, out: list[str]) -> int:
    """A list starting at ``lines[i]``; returns the index after it."""
    first = _ITEM.match(lines[i])
    assert first is not None
    indent = len(first.group(1))
    ordered = first.group(2)[0].isdigit()
    items: list[list[str]] = []
    n = len(lines)
    while i < n:
        line = lines[i]
        item = _ITEM.match(line)
        if item and len(item.group(1)) == indent and item.group(2)[0].isdigit() == ordered:
            items.append([item.group(3)])
            i += 1
            continue
        if not line.strip():
            # a blank line continues the list only if an indented line follows
            if i + 1 < n and lines[i + 1].strip() and _indent(lines[i + 1]) > indent:
                items[-1].append("")
                i += 1
                continue
            break
        if _indent(line) > indent:
            items[-1].append(line[min(_indent(line), indent + 2) :] if _ITEM.match(line) else line.strip())
            i += 1
            continue
        break
    tag = "ol" if ordered else "ul"
    rendered = []
    for content in items:
        blocks = _blocks(content, link)
        if len(blocks) >= 1 and blocks[0].startswith("<p>"):
            blocks[0] = blocks[0][3:-4]  # a tight item: its first paragraph inline
        rendered.append("<li>" + "\n".join(blocks) + "</li>")
    out.append(f"<{tag}>" + "".join(rendered) + f"</{tag}>")
    return i


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))
