"""report.html: one self-contained page per op, tk's kernels beside Inductor's for each case; opened in a real
headless browser (Debian's chromium, where installed)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compare import cli, formats, highlight, record

FAST = ["--device", "cpu", "--rep-ms", "2", "--rounds", "1", "--quiet"]
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def gelu(tmp_path_factory):
    """make compare OP=gelu QUICK=1 ARGS="--ir --profile" on the CPU: IR for an H100, torch.profiler traces."""
    root = tmp_path_factory.mktemp("logs")
    assert cli.main(["--op", "gelu", "--quick", "--ir", "--profile", "--out", str(root), *FAST]) == 0
    op_dir = (root / "gelu").resolve()
    return op_dir, (op_dir / "report.html").read_text()


def test_the_page_opens_offline(gelu):
    _, page = gelu
    assert page.startswith("<!doctype html>") and "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)  # nothing fetched from elsewhere
    (plot,) = re.findall(r'<img class="plot"[^>]*src="([^"]+)"', page)
    assert plot.startswith("data:image/png;base64,") and len(plot) > 10_000


def test_every_link_is_a_file_of_the_report(gelu):
    op_dir, page = gelu
    links = set(re.findall(r'href="([^"#]+)"', page))
    assert links
    for link in links:
        assert (op_dir / link).exists(), link
        assert (op_dir / link).resolve().is_relative_to(op_dir), link
    kinds = {link.rsplit(".", 1)[-1] for link in links}
    assert {"ttir", "ttgir", "llir", "ptx", "py", "cpp", "json", "txt", "md", "csv"} <= kinds  # IR, sources, traces


def test_both_sides_of_each_case(gelu):
    op_dir, page = gelu
    doc = json.loads((op_dir / "results.json").read_text())
    pair = page[page.index('<div class="pair">') :]
    tk, generated = pair.split('<div class="side gen">', 1)
    assert "tk (hand-written)" in tk and "gelu_forward_kernel" in tk and "sm_90" in tk  # what ran, what an H100 runs
    assert "compile (Inductor)" in generated and "compile-unfused (Inductor)" in generated
    assert "cpp_fused_gelu_0" in generated and "output_code.py" in generated and "graph_code" in generated
    for r in doc["records"]:  # each variant's median as report.md gives it
        assert formats.fmt_time(r["median_ms"]) in page
    assert '<span class="k">def</span> <span class="f">gelu_forward_kernel</span>' in tk  # highlighted source
    assert '<span class="k">extern</span>' in generated  # the C++ kernel, highlighted too
    assert "trace.json" in page and "key_averages" in page  # --profile


def test_the_capture_index_knows_the_launches(gelu):
    op_dir, _ = gelu
    index = json.loads((op_dir / "kernels" / "index.json").read_text())
    (case,) = index["tk"]
    (ran,) = case["launches"]
    (planned,) = case["planned"]["launches"]
    assert ran["kernel"] == planned["kernel"] == "gelu_forward_kernel"
    assert ran["options"] == {"num_warps": 1} and planned["options"] == {"num_warps": 8}  # the CPU's plan, an H100's
    (fwd,) = [h for h in index["handwritten"] if h["name"] == "gelu_forward_kernel"]
    assert fwd["compiled"] and all((op_dir / c["folder"] / "gelu_forward_kernel.ptx").is_file() for c in fwd["compiled"])
    assert "### The launches of tk's kernels, per case" in (op_dir / "index.md").read_text()


def test_the_highlighter_gives_the_source_back():
    source = Path(highlight.__file__).read_text()
    assert "".join(text for text, _ in highlight.segments(source, "python")) == source
    html = highlight.to_html('@triton.jit\ndef k(x):  # c\n    return tl.load(x, other=1.5) + "s"\n', "python")
    for span in ('<span class="d">@</span><span class="d">triton</span><span class="d">.</span><span class="d">jit</span>',
                 '<span class="f">k</span>', '<span class="c"># c</span>', 'tl.<span class="t">load</span>',
                 '<span class="n">1.5</span>', '<span class="s">"s"</span>'):  # fmt: skip
        assert span in html, span
    assert html.count('<span class="line">') == 3


@pytest.mark.skipif(BROWSER is None, reason="no chromium here (Debian: apt-get install chromium)")
def test_a_headless_browser_renders_it(gelu, tmp_path):
    op_dir, _ = gelu
    url = (op_dir / "report.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,2400"]
    shot = tmp_path / "report.png"
    done = subprocess.run([BROWSER, *flags, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2400, 1400) and pixels.std() > 0.05  # a page was drawn, not a blank one
    dom = subprocess.run([BROWSER, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    assert "tk (hand-written)" in dom and "compile (Inductor)" in dom and "gelu_forward_kernel" in dom


def test_record_fields_reach_the_page(gelu):
    """The results table is report.md's, cell for cell (record.py declares both)."""
    op_dir, page = gelu
    doc = json.loads((op_dir / "results.json").read_text())
    view = record.TableView.of(doc["records"], doc["bound"])
    for title in record.titles(record.RESULTS, view):
        assert f"<th>{title}</th>" in page.replace("&amp;", "&"), title
