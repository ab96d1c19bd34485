"""The report as blocks, rendered twice: Markdown (`report.md`) and one self-contained HTML page (`report.html`).

A block is a tuple: ("h", level, text), ("p", text), ("ul", [text, ...]), ("table", header, rows),
("img", alt, file name), ("code", text). Text may hold `code`, **bold** and *italic* spans. The HTML
page embeds every figure as a base64 data URI and has no script and no external resource, so a
browser shows it offline.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

__all__ = ["to_html", "to_markdown"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1em; line-height: 1.45; color: #1a1a1a; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.55em; vertical-align: top; text-align: left; }
th { background: #f0f0f0; }
td.yes { background: #e6f4ea; } td.no { background: #fde8e8; } td.partly { background: #fff4d6; }
code { background: #f4f4f4; padding: 0 0.2em; border-radius: 3px; }
pre { background: #f4f4f4; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #ddd; }
"""


def to_markdown(blocks: list[tuple]) -> str:
    out: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            out += ["#" * block[1] + " " + block[2], ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "ul":
            out += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            header, rows = block[1], block[2]
            out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows] + [""]
        elif kind == "img":
            out += [f"![{block[1]}]({block[2]})", ""]
        elif kind == "code":
            out += ["```", block[1], "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _inline(text: str) -> str:
    """Escape, then `code`, **bold**, *italic* (code spans are not formatted further)."""
    parts = re.split(r"(`[^`]*`)", str(text))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) >= 2:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        s = html.escape(part)
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
        s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", s)
        out.append(s)
    return "".join(out)


def _cell_class(text: str) -> str:
    """Colour of a verdict cell: "yes", "no", or "partly" for a qualified answer ("yes, but …")."""
    word = str(text).split(" ")[0].strip("*,").lower()
    if word in ("yes", "no") and ", but " in str(text):
        return "partly"
    return {"yes": "yes", "no": "no", "partly": "partly"}.get(word, "")


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def to_html(blocks: list[tuple], title: str, image_dir: Path) -> str:
    """One page; images are read from `image_dir` and embedded (a missing one is named in its place)."""
    body: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            body.append(f"<h{block[1]}>{_inline(block[2])}</h{block[1]}>")
        elif kind == "p":
            body.append(f"<p>{_inline(block[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(
                f'<td class="{_cell_class(c)}">{_inline(c)}</td>' if _cell_class(c) else f"<td>{_inline(c)}</td>"
                for c in row) + "</tr>" for row in block[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            path = Path(image_dir) / block[2]
            src = _data_uri(path) if path.is_file() else ""
            body.append(f'<figure><img alt="{html.escape(block[1])}" src="{src}"></figure>' if src
                        else f"<p><em>({html.escape(block[2])} is missing)</em></p>")
        elif kind == "code":
            body.append(f"<pre>{html.escape(block[1])}</pre>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
