"""A report as a list of blocks, rendered to markdown and to one self-contained HTML file.

The same blocks give both: headings, paragraphs, tables, code and figures. The markdown links
the figure files beside it; the HTML embeds them (base64 PNG), so it can be mailed or opened
from a copied folder with nothing else.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Paragraph:
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Code:
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    path: Path  # the PNG file
    caption: str


Block = Heading | Paragraph | Bullets | Table | Code | Figure


def render_markdown(blocks: Sequence[Block], *, folder: Path) -> str:
    """Markdown, with figure links relative to ``folder`` (where the file is written)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(block.text)
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(block.header) + " |", "|" + "---|" * len(block.header)]
            lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in block.rows]
            out.append("\n".join(lines))
        elif isinstance(block, Code):
            out.append("```\n" + block.text + "\n```")
        else:
            out.append(f"![{block.caption}]({block.path.relative_to(folder).as_posix()})")
    return "\n\n".join(out) + "\n"


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;"
    "text-align:left}th{background:#f3f3f3}pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
    "img{max-width:100%}figcaption{color:#555;font-size:13px}"
)


def render_html(blocks: Sequence[Block], *, title: str) -> str:
    """One HTML page with its figures embedded."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_STYLE}</style></head><body>"]  # fmt: skip
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{html.escape(block.text)}</p>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{html.escape(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{html.escape(cell)}</th>" for cell in block.header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, Code):
            out.append(f"<pre>{html.escape(block.text)}</pre>")
        else:
            data = base64.b64encode(block.path.read_bytes()).decode("ascii")
            out.append(
                f"<figure><img alt='{html.escape(block.caption)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{html.escape(block.caption)}</figcaption></figure>"
            )
    out.append("</body></html>")
    return "\n".join(out) + "\n"
