"""A real headless browser for the tests (the distribution's Chromium): a page's DOM (--dump-dom) and a screenshot
(--screenshot), with a fresh profile each time and nothing reached over the network; the DOM parsed into elements
with their attributes, text and parents; a PNG's size and how many colours it shows."""

import html.parser
import shutil
import struct
import subprocess
import zlib

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def chromium(*args, tmp_path):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        pytest.skip("chromium is not installed (system-packages.txt: make deps)")
    profile = tmp_path / "profile"
    proc = subprocess.run(
        [binary, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class Dom(html.parser.HTMLParser):
    """The rendered DOM: elements with their attributes and the text inside each (nesting kept by a stack)."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr"})

    def __init__(self, text):
        super().__init__()
        self.elements, self.stack = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.stack)}
        self.elements.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, cls=None, **attrs):
        return [e for e in self.elements if (cls is None or cls in e["attrs"].get("class", "").split())
                and all(e["attrs"].get(k) == v for k, v in attrs.items())]  # fmt: skip


def png(path):
    """(width, height, number of distinct colours in the first rows) of an RGB(A) 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, _depth, kind = struct.unpack(">IIBB", data[16:26])
    pos, idat = 8, b""
    while pos < len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        if ctype == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    channels = {2: 3, 6: 4}[kind]
    stride = width * channels + 1
    colours = set()
    for row in range(
        0, min(height, 400), 7
    ):  # unfiltered bytes are enough to tell a blank page from a drawn one
        line = raw[row * stride + 1 : (row + 1) * stride]
        colours.update(line[i : i + 3] for i in range(0, len(line), channels * 5))
    return width, height, len(colours)
