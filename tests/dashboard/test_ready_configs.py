"""The engine configs the recommendation page offers to copy are what ``kvtier push`` writes:
each engine's into a new file, vLLM's into a config that loads kvtier's recording connector
(which push keeps), so a copy made by hand records as a pushed file does."""

from __future__ import annotations

from kvtier.dashboard.ready_configs import RENDERED_INTO, ready_configs
from kvtier.policy.writers.push import plan
from tests.dashboard.fixtures import _recommendation


def test_each_engines_copy_is_what_push_writes(tmp_path):
    rec = _recommendation()
    configs = ready_configs(rec)
    assert [c.engine for c in configs] == [e for e, _ in rec.engine_settings]
    for config in configs:
        path = tmp_path / config.engine / config.name
        path.parent.mkdir()
        if config.engine in RENDERED_INTO:
            path.write_text(RENDERED_INTO[config.engine])
        pushed = plan(rec.for_engine(config.engine), rec.guardrails, config.engine, path)
        assert pushed.new_text == config.text, config.engine
        assert pushed.notes == config.notes
    (vllm,) = [c for c in configs if c.engine == "vllm"]
    assert '"kv_connector": "KvtierOffloadingConnector"' in vllm.text
