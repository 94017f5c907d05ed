"""The one registry of engine writers: every writer module is in it, each keeps its module
contract, and the command line, the report and the recommendation read it."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from kvtier.cli import build_parser
from kvtier.policy import writers
from kvtier.policy.recommend.report import CONFIG_FILES
from kvtier.policy.writers import ENGINES, WRITERS, writer
from kvtier.policy.writers.choices import Choices
from kvtier.policy.writers.settings import EngineSettings


def test_every_module_that_names_an_engine_is_registered():
    modules = [importlib.import_module(f"kvtier.policy.writers.{info.name}")
               for info in pkgutil.iter_modules(writers.__path__)]
    found = {m.ENGINE: m for m in modules if hasattr(m, "ENGINE")}
    assert found == WRITERS


@pytest.mark.parametrize("engine", ENGINES)
def test_each_writer_keeps_the_module_contract(engine):
    module = writer(engine)
    assert module.ENGINE == engine
    assert Path(module.DEFAULT_FILE).suffix in module.FORMATS
    rendered = module.render(EngineSettings(cpu_tier_bytes=1 << 30), None,
                             Path(module.DEFAULT_FILE).suffix)
    assert rendered.text
    value, notes = module.recommended(Choices(1 << 30, 30, (), True))
    module.validate(value)  # what it recommends, it can write
    assert value.cpu_tier_bytes == 1 << 30 and all(isinstance(n, str) and n for n in notes)
    assert module.OFF is None or module.OFF.cpu_tier_bytes == 0


def test_an_unknown_engine_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown engine 'tgi'; known: vllm, trtllm"):
        writer("tgi")


def engine_flag(verb: str):
    parser = build_parser()
    verbs = next(a for a in parser._actions if a.choices and verb in a.choices).choices
    return next(a for a in verbs[verb]._actions if "--engine" in a.option_strings)


def test_the_command_line_and_the_report_read_the_registry():
    assert tuple(engine_flag("push").choices) == ENGINES
    assert tuple(engine_flag("recommend").choices) == (*ENGINES, "all")
    assert CONFIG_FILES == {e: writer(e).DEFAULT_FILE for e in ENGINES}
    for engine in ENGINES:
        assert engine in engine_flag("recommend").help


def test_the_recommendation_has_settings_for_every_registered_engine():
    from kvtier.policy.recommend.engines import settings

    written, notes = settings(Choices(1 << 30, 30, (), True))
    assert sorted(engine for engine, _ in written) == sorted(ENGINES), notes
