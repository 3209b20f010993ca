"""The offline docs site: the pages generated from the code are current, the packaged
HTML matches the sources, every page is self-contained and every internal link lands."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

build_docs = pytest.importorskip("scripts.build_docs", reason="markdown-it-py is not installed (the dev extra)")

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"


def _md(text: str) -> str:
    return build_docs.to_html(text, lambda target: target.replace(".md", ".html") if target.endswith(".md") else None)


def test_blocks_and_inlines() -> None:
    out = _md("# Title `x`\n\nSome *em* and **bold** with `a<b>` and [sdk](sdk.md).\n\n"
              "| a | b |\n|---|:-:|\n| 1 | `x \\| y` |\n\n```python\nif a < b:\n    pass\n```\n\n> quoted\n\n---\n")
    assert '<h1 id="title-x">Title <code>x</code></h1>' in out
    assert "<p>Some <em>em</em> and <strong>bold</strong> with <code>a&lt;b&gt;</code> and " \
           '<a href="sdk.html">sdk</a>.</p>' in out
    assert "<th>a</th>" in out and "<code>x | y</code>" in out
    assert '<pre><code class="language-python">if a &lt; b:\n    pass\n</code></pre>' in out
    assert "<blockquote>\n<p>quoted</p>\n</blockquote>" in out and "<hr />" in out


def test_unmapped_links_keep_their_text_and_headings_get_unique_anchors() -> None:
    out = _md("1. first\n2. second [design](../DESIGN)\n\n## Step\n\n## Step\n")
    assert "<li>second design</li>" in out  # an unmapped link keeps its text only
    assert '<h2 id="step">Step</h2>' in out and '<h2 id="step-1">Step</h2>' in out


def test_markup_in_the_source_is_escaped_and_snake_case_is_not_emphasis() -> None:
    out = _md("<script>alert(1)</script> and snake_case_name")
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "snake_case_name" in out and "<em>" not in out


def test_slugs_match_github_anchors() -> None:
    assert build_docs.slug("7. Cost") == "7-cost"
    assert build_docs.slug("`flash.submit` (`flashruntime.sdk`)") == "flashsubmit-flashruntimesdk"


@pytest.mark.parametrize("relative", sorted(build_docs.GENERATED))
def test_generated_pages_are_current(relative: str) -> None:
    pytest.importorskip("fastapi")
    text = build_docs.GENERATED[relative]()
    assert (DOCS / relative).read_text(encoding="utf-8") == text, "run python -m scripts.build_docs"


def test_the_generated_pages_say_what_the_code_says() -> None:
    from flashruntime.coordinator.access import ROUTE_ACCESS
    from flashruntime.environment import VARIABLES
    from flashruntime.protocol.v1alpha1 import FailureClass

    recovery = (DOCS / "recovery.md").read_text(encoding="utf-8")
    rows = [line for line in recovery.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 * len(FailureClass)
    assert "| `worker_crash` | `restart_group` | group | no | yes |" in recovery
    environment = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    assert all(f"| `{variable.name}` |" in environment for variable in VARIABLES)
    api = (DOCS / "reference" / "http-api.md").read_text(encoding="utf-8")
    in_schema = [key for key in ROUTE_ACCESS if key not in {("GET", "/"), ("GET", "/openapi.json")}]
    assert all(f"| `{method} {path}` |" in api for method, path in in_schema)
    cli = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "## `flashruntime worker`" in cli and "--runner {sandboxed,subprocess,trusted}" in cli


def test_packaged_pages_match_the_sources() -> None:
    pages = build_docs.render_site(DOCS, README)
    packaged = {path.name: path.read_text(encoding="utf-8") for path in build_docs.PACKAGED.glob("*.html")}
    assert packaged == pages, "the packaged docs are stale: run python -m scripts.build_docs"
    assert {"index.html", "get-started.html", "sdk.html", "torch.html", "recovery.html", "coordinator.html",
            "security.html", "benchmarks.html", "reference-http-api.html", "reference-cli.html",
            "reference-environment.html", "reference-wire-protocol.html", "reference-file-layouts.html"} <= set(pages)


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.tags: set[str] = set()
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])  # type: ignore[arg-type]
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"])  # type: ignore[arg-type]
        if values.get("src"):
            self.srcs.append(values["src"])  # type: ignore[arg-type]


def test_every_page_is_self_contained_and_every_internal_link_resolves() -> None:
    pages = build_docs.render_site(DOCS, README)
    parsed = {}
    for name, text in pages.items():
        refs = _Refs()
        refs.feed(text)
        parsed[name] = refs
        assert not refs.srcs and not {"script", "img", "iframe"} & refs.tags, name
        assert text.count("<link") == 1 and '<link rel="icon" href="data:,">' in text, name  # inline icon only
        assert not re.search(r"@import|url\(", text), name
    for name, refs in parsed.items():
        for href in refs.hrefs:
            if re.match(r"^[a-z]+:", href):
                continue  # a hyperlink to the web: followed only if the reader clicks it
            page, _, anchor = href.partition("#")
            target = parsed.get(page or name)
            assert target is not None, f"{name} links to missing page {href}"
            assert not anchor or anchor in target.ids, f"{name} links to missing anchor {href}"


def test_build_writes_the_site_and_removes_stale_pages(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "reference").mkdir(parents=True)
    (docs / "index.md").write_text("# Contents\n\n[guide](guide.md#step-1) and [api](reference/api.md)\n")
    (docs / "guide.md").write_text("# Guide\n\n## Step 1\n\nBack to [contents](index.md).\n")
    (docs / "reference" / "api.md").write_text("# API\n\nSee [the guide](../guide.md).\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nSee [the guide](docs/guide.md).\n")
    out = tmp_path / "site"
    out.mkdir()
    (out / "old.html").write_text("stale")
    written = build_docs.build(docs, readme, out, generate=False)
    assert sorted(p.name for p in written) == ["get-started.html", "guide.html", "index.html", "reference-api.html"]
    assert not (out / "old.html").exists() and not list(out.glob(".*"))
    assert 'href="guide.html#step-1"' in (out / "index.html").read_text()
    assert 'href="reference-api.html"' in (out / "index.html").read_text()
    assert 'href="guide.html"' in (out / "reference-api.html").read_text()
    assert 'href="guide.html"' in (out / "get-started.html").read_text()


def test_build_outside_a_checkout_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="docs sources not found"):
        build_docs.build(tmp_path / "nowhere", tmp_path / "README.md", tmp_path / "out")
