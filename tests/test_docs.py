"""The documentation site (``mkdocs.yml``, ``docs/``): it builds with ``--strict`` and no warning,
every link and anchor inside it resolves, the configuration page names every store option, and a
page renders in a headless browser. No Spark."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from tests.observe import test_report

from sparkstate.store.conf import StoreConf

REPO = Path(__file__).resolve().parents[1]

#: The report tests' fixture: the first headless browser on PATH, or a skip that says so.
browser = test_report.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        # Material's notice about MkDocs 2 is not a warning of this build.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    return out


def test_the_site_builds_strict_without_a_warning(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "api/index.html"):
        assert (site / page).is_file(), page


class Page(HTMLParser):
    """A built page's element ids and the links it makes (``href`` and ``src``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("id", "name" if tag == "a" else ""):
            if values.get(name):
                self.ids.add(str(values[name]))
        for name in ("href", "src"):
            if values.get(name) is not None:
                self.links.append(str(values[name]))


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def target_of(site: Path, page: Path, link: str) -> tuple[Path, str] | None:
    """The file inside the site and the anchor a link points at, or None for a link that leaves
    the site (another scheme or host, which a build without network cannot check)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc:
        return None
    if not parts.path:
        return page, unquote(parts.fragment)
    # 404.html links from the site's root (it is served for any missing path)
    base = site if parts.path.startswith("/") else page.parent
    path = (base / unquote(parts.path).lstrip("/")).resolve()
    if path.is_dir() or parts.path.endswith("/"):
        path = path / "index.html"
    return path, unquote(parts.fragment)


def test_every_link_inside_the_site_resolves(site: Path) -> None:
    pages = {p.resolve(): parse(p) for p in site.rglob("*.html")}
    assert len(pages) > 15
    broken: list[str] = []
    checked = 0
    for path, page in pages.items():
        for link in page.links:
            target = target_of(site, path, link)
            if target is None:
                continue
            file, anchor = target
            checked += 1
            where = f"{path.relative_to(site.resolve())}: {link}"
            if not file.is_relative_to(site.resolve()) or not file.is_file():
                broken.append(f"{where} (no file {file})")
            elif anchor and anchor not in pages[file].ids:
                broken.append(f"{where} (no anchor #{anchor})")
    assert checked > 500, checked
    assert not broken, "\n".join(broken)


def test_the_benchmark_plot_is_on_its_page(site: Path) -> None:
    page = parse(site / "benchmarks" / "index.html")
    assert "../bench-scale.png" in page.links
    assert (site / "bench-scale.png").stat().st_size > 10_000


def test_the_configuration_page_names_every_store_option(site: Path) -> None:
    html = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    fields = {f.name for f in dataclasses.fields(StoreConf)}
    named = set(re.findall(r"<code>stateStore\.(\w+)</code>", html))
    assert fields - named == set(), "StoreConf fields the page does not name"
    # and no option the store does not have (the maintenance interval is the engine's)
    assert named - fields == {"maintenanceIntervalSeconds"}


def test_a_browser_renders_the_getting_started_page(
    site: Path, browser: str, tmp_path: Path
) -> None:
    image = pytest.importorskip("PIL.Image")
    shot = tmp_path / "getting-started.png"
    page = site / "getting-started" / "index.html"
    test_report.headless(browser, tmp_path / "profile", "--window-size=1280,1600",
                         f"--screenshot={shot}", page.as_uri())  # fmt: skip
    with image.open(shot) as png:
        assert png.size == (1280, 1600)
        rgb = png.convert("RGB")
        colors = rgb.getcolors(1 << 20) or []
    white = sum(n for n, c in colors if min(c) >= 250)
    # a page of text, a header bar and code: many colors, far from blank
    assert len(colors) > 50, len(colors)
    assert white < 0.95 * 1280 * 1600, white
    # the theme's header (indigo) is drawn: its stylesheet loaded from the built site
    indigo = sum(n for n, (r, g, b) in colors if b > 150 and r < 100 and g < 120)
    assert indigo > 20_000, indigo
