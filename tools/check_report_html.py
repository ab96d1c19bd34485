"""Check that a reproduction's `report.html` renders in headless Chromium, offline.

    python tools/check_report_html.py runs/reproduce/report.html [--screenshot page.png]

1. Static: every <img> is a PNG data URI that decodes, and nothing points outside the page (no
   http(s)/file links, no script).
2. Rendered: a copy of the page with a small probe script is loaded by Chromium (headless, no sandbox,
   no network services, a fresh profile); after load the probe counts the images that decoded (width
   > 0) and the page's height, and Chromium prints the DOM, from which they are read back.
3. Optionally a screenshot of the top of the page.

Needs a Chromium binary (`chromium`, `chromium-browser` or `google-chrome`; Debian: `apt-get install
chromium`). The library itself never needs a browser; CI has none, so this is a script, not a test.
Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import base64
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  const out = document.createElement("pre");
  out.id = "render-check";
  out.textContent = `RENDER-CHECK images=${ok}/${imgs.length} height=${document.body.scrollHeight}`;
  document.body.appendChild(out);
});
</script>"""


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.scripts += tag == "script"
        if tag == "img":
            self.images.append(attrs.get("src") or "")
        for key in ("src", "href"):
            value = attrs.get(key)
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)


def static_check(page: str) -> list[str]:
    """Problems found without a browser (empty list: none)."""
    refs = _Refs()
    refs.feed(page)
    problems = [f"external reference: {r}" for r in refs.external]
    problems += ["a <script> element"] * bool(refs.scripts)
    if not refs.images:
        problems.append("no images")
    for i, src in enumerate(refs.images):
        if not src.startswith("data:image/png;base64,"):
            problems.append(f"image {i} is not a PNG data URI")
            continue
        if not base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n"):
            problems.append(f"image {i} does not decode to a PNG")
    return problems


def find_chromium(explicit: str | None) -> str:
    for name in ([explicit] if explicit else ["chromium", "chromium-browser", "google-chrome"]):
        path = shutil.which(name) if name else None
        if path:
            return path
    sys.exit("no Chromium found (Debian: apt-get install chromium; or pass --chromium PATH)")


def render(chromium: str, page: str, screenshot: Path | None, timeout: float) -> tuple[int, int, int]:
    """(images decoded, images, page height in CSS pixels) as Chromium saw them."""
    with tempfile.TemporaryDirectory() as tmp:
        probe_page = Path(tmp) / "page.html"
        probe_page.write_text(page.replace("</body>", PROBE + "\n</body>"), encoding="utf-8")
        base = [chromium, *FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}", "--virtual-time-budget=15000"]
        dom = subprocess.run([*base, "--dump-dom", probe_page.as_uri()], capture_output=True, text=True,
                             timeout=timeout).stdout
        if screenshot is not None:
            subprocess.run([*base, f"--screenshot={screenshot.resolve()}", "--window-size=1280,1600",
                            probe_page.as_uri()], capture_output=True, timeout=timeout)
    found = re.search(r"RENDER-CHECK images=(\d+)/(\d+) height=(\d+)", dom)
    if not found:
        sys.exit("Chromium did not run the page's load handler (no RENDER-CHECK line in the DOM)")
    return int(found[1]), int(found[2]), int(found[3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("--chromium", default=None, help="Chromium binary (default: found on PATH)")
    parser.add_argument("--screenshot", type=Path, default=None, help="write a PNG of the top of the page")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    page = args.html.read_text(encoding="utf-8")
    problems = static_check(page)
    decoded, images, height = render(find_chromium(args.chromium), page, args.screenshot, args.timeout)
    print(f"{args.html}: {len(page) / 1e6:.1f} MB, {images} images, {decoded} decoded by Chromium, "
          f"page height {height} px")
    if decoded != images:
        problems.append(f"Chromium decoded {decoded} of {images} images")
    if height < 1000:
        problems.append(f"page height {height} px: the report did not lay out")
    if args.screenshot is not None and not (args.screenshot.is_file() and args.screenshot.stat().st_size > 10_000):
        problems.append(f"no screenshot at {args.screenshot}")
    for problem in problems:
        print("FAIL:", problem)
    print("OK: renders offline in headless Chromium" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
