"""The README's pictures (docs/img/): every one linked exists and is described with the
command that made it; the loop diagram is self-contained SVG that reads in GitHub's light
and dark mode; the screenshots are PNGs of the browser window (the demo's) or of the page's
whole length at its width (the on-call page's at 1280 and 390 px)."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PICTURES = REPO / "docs" / "img"
SVG_NS = "http://www.w3.org/2000/svg"
# a Markdown link or image target, or an HTML src/href
LINK = re.compile(r"\]\(([^)\s]+)|(?:src|href)=\"([^\"]+)\"")


def linked_pictures(markdown: Path) -> list[Path]:
    """The files under docs/img/ that `markdown` links to (its links resolved from it)."""
    targets = [a or b for a, b in LINK.findall(markdown.read_text())]
    paths = [(markdown.parent / t.split("#")[0]).resolve() for t in targets if "://" not in t]
    return [p for p in paths if p.is_relative_to(PICTURES)]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("markdown", ["README.md", "docs/img/README.md"])
def test_every_picture_a_readme_links_exists(markdown: str) -> None:
    for picture in linked_pictures(REPO / markdown):
        assert picture.is_file(), f"{markdown} links {picture.relative_to(REPO)}, which is missing"


def test_every_picture_is_described_with_the_command_that_made_it() -> None:
    described = {p.name for p in linked_pictures(PICTURES / "README.md")}
    pictures = {p.name for p in PICTURES.iterdir() if p.name != "README.md"}
    assert pictures <= described, f"not in docs/img/README.md: {pictures - described}"
    text = (PICTURES / "README.md").read_text()
    assert "--screenshot-dir" in text, "the screenshots' demo command is not given"


def test_the_loop_diagram_is_small_self_contained_svg_on_an_opaque_white_background() -> None:
    svg = PICTURES / "loop.svg"
    assert svg.stat().st_size < 15_000
    root = ET.parse(svg).getroot()
    assert root.tag == f"{{{SVG_NS}}}svg"
    assert root.get("viewBox") and root.get("width"), "no size for GitHub to scale from"
    first = next(iter(root.iter(f"{{{SVG_NS}}}rect")))
    assert (first.get("width"), first.get("height")) == (root.get("width"), root.get("height"))
    assert first.get("fill") in ("#fff", "#ffffff", "white"), "dark mode would show through"
    for element in root.iter():
        tag = element.tag.rpartition("}")[2]
        assert tag not in ("image", "script", "foreignObject", "use"), f"<{tag}> in the SVG"
        for name, value in element.attrib.items():
            if name.endswith("href"):
                assert value.startswith("#"), f"external reference {value!r}"
    text = svg.read_text()
    assert re.findall(r"https?://[^\s\"')]+", text) == [SVG_NS], "a URL besides the namespace"
    assert "@import" not in text and "url(http" not in text


@pytest.mark.parametrize("name", ["oncall-page.png", "prometheus-orphans.png"])
def test_the_screenshots_are_pngs_of_the_browser_window_under_300_kb(name: str) -> None:
    picture = PICTURES / name
    assert png_size(picture) == (1280, 900)
    assert picture.stat().st_size < 300_000


@pytest.mark.parametrize(("name", "width"), [("oncall-1280.png", 1280), ("oncall-390.png", 390)])
def test_the_whole_page_screenshots_are_pngs_as_wide_as_their_viewport_under_600_kb(
    name: str, width: int
) -> None:
    picture = PICTURES / name
    assert png_size(picture)[0] == width
    assert picture.stat().st_size < 600_000  # the page whole: five runs, their re-checks and links


def test_the_page_pictures_refuse_a_directory_that_is_not_one_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.oncall_pictures import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "missing")])
    assert stopped.value.code == 2
    assert f"{tmp_path / 'missing'}: not a directory" in capsys.readouterr().err


def test_the_demo_refuses_a_screenshot_dir_it_cannot_make_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.demo import main

    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(SystemExit) as stopped:
        main(["--short", "--screenshot-dir", str(taken / "pictures")])
    assert stopped.value.code == 2
    assert f"--screenshot-dir {taken / 'pictures'}: Not a directory" in capsys.readouterr().err
