"""The TORCH_LOGS stages stored beside each output_code.py (compare/stages.py): the traced graph, the post-grad
graph, the fusion decisions, recompile reasons and graph breaks, in-process, and kept for the warm runs whose
compile does not log them."""

import pytest
import torch

from compare import stages


@pytest.fixture
def stage_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_CACHE_DIR", str(tmp_path / "tk-cache"))
    return tmp_path / "tk-cache" / "inductor-stages"


def _compiled(fn, *args):
    """A fresh compile of ``fn`` (no cache may answer: every stage is logged) under inductor_logs()."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True), stages.inductor_logs() as collector:
        torch.compile(fn, dynamic=False)(*args)
    return collector


def test_a_cold_compile_logs_every_stage_and_keeps_the_lowered_ones(stage_cache, capsys):
    collector = _compiled(lambda x: torch.nn.functional.gelu(x) * 2 + x.sum(), torch.randn(64))
    texts, how = stages.stage_texts(collector)
    assert "class GraphModule" in texts["graph_code"] and "AFTER POST GRAD" in texts["post_grad_graphs"]
    assert "fusion" in texts["fusion"] and all(how[s] == "log" for s in ("graph_code", "post_grad_graphs", "fusion"))
    assert "none" in how["recompiles"] and "none" in how["graph_breaks"]
    assert collector.codes and collector.paths  # the output code, as before
    assert list(stage_cache.glob("*.json"))  # kept for the warm runs
    assert "TRACED GRAPH" not in capsys.readouterr().err  # nothing reached stderr


def test_a_warm_run_reads_the_kept_stages_back(stage_cache):
    cold = stages.Collector()
    cold.paths = ["/cache/ab/cabc123.py"]
    cold.stages["post_grad_graphs"] = ["AFTER POST GRAD\nmul = ..."]
    cold.stages["fusion"] = ["found 1 possible fusions"]
    stages.stage_texts(cold)
    warm = stages.Collector()  # a cache hit: the same module, its lowering not logged
    warm.paths = ["/cache/ab/cabc123.py"]
    warm.stages["graph_code"] = ["TRACED GRAPH"]
    texts, how = stages.stage_texts(warm)
    assert texts["post_grad_graphs"].startswith("AFTER POST GRAD") and texts["fusion"].startswith("found 1")
    assert how["post_grad_graphs"].startswith("kept from the compile") and how["graph_code"] == "log"
    other = stages.Collector()  # a module compiled before stages were kept: said so, with the way to see them
    other.paths = ["/cache/cd/cdef456.py"]
    texts, how = stages.stage_texts(other)
    assert "post_grad_graphs" not in texts and "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1" in how["fusion"]


def test_recompiles_and_graph_breaks_are_caught(stage_cache):
    def f(x):
        y = x * 2
        print("a graph break")
        return y + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, dynamic=False)
    with stages.inductor_logs() as collector:
        compiled(torch.randn(8))
        compiled(torch.randn(9))  # another size: a recompile
    texts, _ = stages.stage_texts(collector)
    assert "size mismatch" in texts["recompiles"] and "print" in texts["graph_breaks"]


def test_the_loggers_are_left_as_they_were():
    from torch._logging._internal import log_state

    loggers = stages.artifact_loggers()
    assert {lg.name.rpartition(".__")[2] for lg in loggers} >= set(stages.ARTIFACTS)
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers], set(log_state.artifact_names)
    with stages.inductor_logs():
        assert "recompiles" in log_state.artifact_names  # Dynamo asks for it before it logs
    assert ([(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers], set(log_state.artifact_names)) == before
