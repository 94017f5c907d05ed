"""The live curves page through Streamlit's AppTest: one line per instance with the file's
values, the reach sizes and the headroom in the table, the sidebar's filters applied, and an
explanation instead of a blank when no collector has written curves."""

from __future__ import annotations

import pytest

from kvtier.dashboard.sources import ENV_LIVE_CURVES
from kvtier.policy.livecurve.curve_values import read_live_curves
from tests.dashboard.curve_files import LADDER, write_live_curves
from tests.dashboard.test_app import charts, open_page

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def curve_folder(tmp_path):
    return write_live_curves(tmp_path / "segments")


def test_the_page_draws_each_instances_curve_from_the_file(monkeypatch, full_segments, curve_folder):
    monkeypatch.setenv(ENV_LIVE_CURVES, str(curve_folder))
    at = open_page(monkeypatch, full_segments, "live")
    ((spec, rows),) = charts(at)
    assert spec["encoding"]["y"]["field"] == "hit_ratio" and spec["encoding"]["color"]["field"] == "instance"
    expected = {(f"{c.engine}/{c.instance}", p.size_tokens): p.hit_ratio
                for c in read_live_curves(curve_folder) for p in c.window("all").points}
    drawn = dict(zip(zip(rows.column("instance").to_pylist(), rows.column("size_tokens").to_pylist()),
                     rows.column("hit_ratio").to_pylist()))
    assert drawn == pytest.approx(expected) and len(drawn) == 2 * len(LADDER)
    table = at.dataframe[0].value
    assert list(table["instance"]) == ["reference/node-b", "vllm/node-a"]
    assert {"80% (GiB)", "99% (GiB)", "load factor", "without offload"} <= set(table.columns)
    assert set(table["costs"]) == {"calibrated"}
    at.radio(key="live_window").set_value("300s").run()  # another window: the same instances
    assert not at.exception and len(charts(at)) == 1


def test_the_engine_filter_keeps_its_instances(monkeypatch, full_segments, curve_folder):
    monkeypatch.setenv(ENV_LIVE_CURVES, str(curve_folder))
    at = open_page(monkeypatch, full_segments, "live")
    at.sidebar.multiselect[0].set_value(["vllm"]).run()  # "Engine"
    ((_, rows),) = charts(at)
    assert set(rows.column("instance").to_pylist()) == {"vllm/node-a"}


def test_without_curves_the_page_says_how_to_get_them(monkeypatch, full_segments, tmp_path):
    monkeypatch.setenv(ENV_LIVE_CURVES, str(tmp_path / "none"))
    at = open_page(monkeypatch, full_segments, "live")
    assert not charts(at) and "kvtier collect --live-curves" in at.info[0].value
