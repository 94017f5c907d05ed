"""Transfer and file-tier probes: shapes of the results, the fit, O_DIRECT fallback, cleanup."""

from __future__ import annotations

import pytest

from kvtier.probes.active.fs import FsConfig, direct_supported, run_fs
from kvtier.probes.active.stats import fit_latency, parse_sizes, percentiles
from kvtier.probes.active.transfer import TransferConfig, run_transfer


def test_fit_recovers_a_linear_cost():
    sizes = [1 << 10, 1 << 16, 1 << 20]
    fit = fit_latency(sizes, [20e-6 + s / 10e9 for s in sizes])
    assert fit.op_latency_s == pytest.approx(20e-6) and fit.bandwidth_bytes_per_s == pytest.approx(10e9)


def test_fit_falls_back_when_noise_makes_it_unphysical():
    fit = fit_latency([1000, 2000], [5e-6, 4e-6])  # shrinking time: negative slope
    assert fit.op_latency_s == 5e-6 and fit.bandwidth_bytes_per_s == 2000 / 4e-6


def test_percentiles_interpolate_linearly():
    assert percentiles([1, 2, 3, 4]) == {"p50": 2.5, "p95": pytest.approx(3.85), "p99": pytest.approx(3.97)}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_sizes_parse_with_units():
    assert parse_sizes("4096, 64KiB,1MiB") == (4096, 64 << 10, 1 << 20)
    with pytest.raises(ValueError, match="12parsecs"):
        parse_sizes("12parsecs")


def test_transfer_measures_every_size_on_this_machine():
    result = run_transfer(TransferConfig(sizes_bytes=(4096, 1 << 16), repeats=3, warmup=1))
    assert [r.size_bytes for r in result.rows] == [4096, 1 << 16] * (4 if result.accelerator else 1)
    assert all(r.p50_latency_s > 0 and r.bandwidth_bytes_per_s > 0 for r in result.rows)
    params = result.cost_params()
    assert set(params) == {"cpu_gpu_bandwidth_bytes_per_s", "cpu_gpu_op_latency_s"}
    assert all(v > 0 for v in params.values())


def test_fs_measures_every_point_and_cleans_up(tmp_path):
    result = run_fs(FsConfig(str(tmp_path), sizes_bytes=(4096, 16384), threads=(1, 2), blocks=3))
    assert sorted((r.op, r.size_bytes, r.threads) for r in result.rows) == sorted(
        (op, s, t) for op in ("read", "write") for s in (4096, 16384) for t in (1, 2))
    assert list(tmp_path.iterdir()) == []
    assert result.cost_params()["cold_cpu_bandwidth_bytes_per_s"] > 0


def test_fs_buffered_when_asked(tmp_path):
    result = run_fs(FsConfig(str(tmp_path), sizes_bytes=(4096,), threads=(1,), blocks=2, direct="off"))
    assert result.direct is False and "--direct off" in result.direct_note


def refuse_o_direct(monkeypatch):
    """A filesystem without O_DIRECT (tmpfs before Linux 6.6, some overlays): EINVAL on open."""
    import errno
    import os

    real_open = os.open

    def fake_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", fake_open)


def test_without_o_direct_auto_falls_back_and_says_so(tmp_path, monkeypatch):
    refuse_o_direct(monkeypatch)
    ok, note = direct_supported(tmp_path)
    assert not ok and "EINVAL" in note and "page cache" in note
    result = run_fs(FsConfig(str(tmp_path), sizes_bytes=(4096,), threads=(1,), blocks=2))
    assert result.direct is False and len(result.rows) == 2


def test_without_o_direct_on_is_an_error(tmp_path, monkeypatch):
    refuse_o_direct(monkeypatch)
    with pytest.raises(ValueError, match="--direct on"):
        run_fs(FsConfig(str(tmp_path), sizes_bytes=(4096,), threads=(1,), blocks=1, direct="on"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, fragment", [
    ({"sizes_bytes": (1000,)}, "multiples of 4096"),
    ({"direct": "maybe"}, "auto, on, off"),
    ({"threads": (0,)}, "threads"),
])
def test_fs_config_refuses_bad_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        FsConfig("/tmp", **kwargs)


def test_probe_results_feed_the_cost_model(tmp_path):
    import json

    from kvtier.policy.cost import measured_cost_params

    transfer = run_transfer(TransferConfig(sizes_bytes=(4096, 1 << 16), repeats=2, warmup=0))
    fs_file = tmp_path / "fs.json"
    fs = run_fs(FsConfig(str(tmp_path), sizes_bytes=(4096, 8192), threads=(1,), blocks=2))
    fs_file.write_text(json.dumps(fs.to_dict()))
    params = measured_cost_params(transfer, fs_file)
    assert params.sources() == {"cpu_gpu_bandwidth_bytes_per_s": "measured", "cpu_gpu_op_latency_s": "measured",
                                "cold_cpu_bandwidth_bytes_per_s": "measured", "cold_cpu_op_latency_s": "measured",
                                "prefill_tokens_per_s": "default", "attention_equal_tokens": "default"}
    assert params.cpu_gpu_op_latency_s.value == transfer.cost_params()["cpu_gpu_op_latency_s"]
