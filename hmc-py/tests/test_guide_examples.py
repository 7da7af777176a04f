"""The user guide's Python examples run: every ```python block of ``docs/guide/*.md``, and
of the README outside its "Python" section (``test_package.py`` runs that one), each in a
process of its own, as a reader would paste it into a file.

A block right after a ``<!-- skip-reason: WHY -->`` line needs what CI lacks (a GPU, an etcd
at a made-up address, NIXL or Mooncake themselves): it is reported skipped with that
reason, never silently left out. (The mark is a comment beside the fence, not in it:
rustdoc, which reads the same pages for their Rust blocks, warns on ``=`` in a fence's
info string.) Shell, TOML and C blocks are not run here (the README's C quick start is built by ``cargo xtask test``, in
``xtask/src/capi.rs``); the Rust blocks are ``hmc-engine``'s doc tests
(``hmc-engine/src/guide_doctests.rs``), and the last test checks every page with one is
named there.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
# How long one example may run; the longest of them moves a few MiB between two engines.
TIMEOUT_S = 120

FENCE = re.compile(
    r"(?:^<!-- skip-reason: (?P<why>.+?) -->\n)?^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S,
)


def blocks(path, text):
    """``(id, code, skip reason or None)`` for each python block of ``text``."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("code"))
        out.append((f"{path.relative_to(ROOT)}:{line}", m.group("code"), m.group("why")))
    return out


def readme_outside_python_section():
    """The README with its "Python" section blanked (line numbers stay true)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Python\n.*?(?=^## |\Z)", text, re.M | re.S)
    return text if m is None else text[: m.start()] + "\n" * m.group().count("\n") + text[m.end():]


def sources():
    """``(path, text)`` of every page whose python blocks run here."""
    pages = [(p, p.read_text()) for p in sorted(GUIDE.glob("*.md"))]
    return pages + [(ROOT / "README.md", readme_outside_python_section())]


EXAMPLES = [e for path, text in sources() for e in blocks(path, text)]


def test_every_python_block_is_found():
    # A fence the pattern above misses (```py, ```python3, a mark in the info string) would
    # leave its block untested without a word.
    fences = sum(len(re.findall(r"^```py", text, re.M)) for _, text in sources())
    assert fences == len(EXAMPLES), [e[0] for e in EXAMPLES]
    assert len([e for e in EXAMPLES if e[2] is None]) >= 10, [e[0] for e in EXAMPLES]


@pytest.mark.parametrize("where,code,skip", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_a_guide_example_runs(where, code, skip, tmp_path):
    if skip:
        pytest.skip(f"{where}: {skip}")
    script = tmp_path / "example.py"
    script.write_text(code)
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, f"{where} exited {run.returncode}\n{run.stdout}\n{run.stderr}"


def test_every_page_with_rust_examples_is_a_doc_test():
    doctests = (ROOT / "hmc-engine" / "src" / "guide_doctests.rs").read_text()
    named = set(re.findall(r'include_str!\("\.\./\.\./docs/guide/([^"]+)"\)', doctests))
    with_rust = {p.name for p in GUIDE.glob("*.md") if re.search(r"^```rust", p.read_text(), re.M)}
    assert with_rust <= named, f"pages whose Rust blocks no doc test runs: {sorted(with_rust - named)}"
