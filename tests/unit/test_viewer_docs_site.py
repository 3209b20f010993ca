"""The offline docs site: its Markdown converter, the packaged pages kept in
step with ``docs/``, self-containment, and links that all land somewhere."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flashruntime.viewer._markdown import slug, to_html
from flashruntime.viewer.docs_site import PACKAGED, build, recovery_markdown, render_site
from tests._support import REPO_ROOT

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"


def _md(text: str) -> str:
    return to_html(text, lambda target: target.replace(".md", ".html") if target.endswith(".md") else None)


def test_blocks_and_inlines() -> None:
    out = _md("# Title `x`\n\nSome *em* and **bold** with `a<b>` and [sdk](sdk.md).\n\n"
              "| a | b |\n|---|:-:|\n| 1 | `x \\| y` |\n\n```python\nif a < b:\n    pass\n```\n\n> quoted\n\n---\n")
    assert '<h1 id="title-x">Title <code>x</code></h1>' in out
    assert "<p>Some <em>em</em> and <strong>bold</strong> with <code>a&lt;b&gt;</code> and " \
           '<a href="sdk.html">sdk</a>.</p>' in out
    assert "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td><code>x | y</code></td>" in out
    assert '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>' in out
    assert "<blockquote><p>quoted</p></blockquote>" in out and "<hr>" in out


def test_nested_lists_and_dropped_links() -> None:
    out = _md("- one\n  - inner *a*\n  - inner b\n- two\n  continued\n\n1. first\n2. second [spec](../SPEC)\n")
    assert out.startswith("<ul><li>one\n<ul><li>inner <em>a</em></li><li>inner b</li></ul></li><li>two continued</li></ul>")
    assert "<ol><li>first</li><li>second spec</li></ol>" in out  # an unmapped link keeps its text only


def test_markup_in_the_source_is_escaped_and_snake_case_is_not_emphasis() -> None:
    out = _md("<script>alert(1)</script> and snake_case_name and 2*3*4")
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "snake_case_name" in out and "<em>" not in out


def test_slugs_match_github_anchors() -> None:
    assert slug("7. Cost") == "7-cost"
    assert slug("`flash.submit` (`flashruntime.sdk`)") == "flashsubmit-flashruntimesdk"


def test_recovery_page_is_generated_from_the_policy_and_is_current() -> None:
    from flashruntime.protocol.v1alpha1 import FailureClass

    text = recovery_markdown()
    assert (DOCS / "recovery.md").read_text(encoding="utf-8") == text, "run python -m flashruntime.viewer.docs_site"
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 * len(FailureClass)
    assert "| `worker_crash` | `restart_group` | group | no | yes |" in text


def test_packaged_pages_match_the_sources() -> None:
    pages = render_site(DOCS, README)
    packaged = {path.name: path.read_text(encoding="utf-8") for path in PACKAGED.glob("*.html")}
    assert packaged == pages, "the packaged docs are stale: run python -m flashruntime.viewer.docs_site"
    assert {"index.html", "get-started.html", "sdk.html", "torch.html", "recovery.html", "coordinator.html",
            "benchmarks.html", "planner-accuracy.html"} <= set(pages)


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
    pages = render_site(DOCS, README)
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


def test_build_writes_atomically_and_removes_stale_pages(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Contents\n\n[guide](guide.md#step-1)\n")
    (docs / "guide.md").write_text("# Guide\n\n## Step 1\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nSee [the guide](docs/guide.md).\n")
    out = tmp_path / "site"
    out.mkdir()
    (out / "old.html").write_text("stale")
    written = build(docs, readme, out)
    assert sorted(p.name for p in written) == ["get-started.html", "guide.html", "index.html", "recovery.html"]
    assert not (out / "old.html").exists() and not list(out.glob(".*"))
    assert 'href="guide.html#step-1"' in (out / "index.html").read_text()
    assert 'href="guide.html"' in (out / "get-started.html").read_text()
    assert (docs / "recovery.md").read_text() == recovery_markdown()


def test_build_outside_a_checkout_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="docs sources not found"):
        build(tmp_path / "nowhere", tmp_path / "README.md", tmp_path / "out")
