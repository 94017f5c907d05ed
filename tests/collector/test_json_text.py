"""kvtier's JSON text is strict: what Python's json would write as NaN or Infinity is null,
numpy values are plain numbers, and a strict parser reads every result back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvtier.collector import json_text


def strict(text: str):
    """Parse as a strict parser does: NaN, Infinity and -Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_at_any_depth():
    value = {"ratio": {"itl_p50_s": math.nan, "ttft_p50_s": 1.25}, "bounds": [math.inf, -math.inf, 0.5],
             "pairs": (np.float64("nan"), np.float32(2.0)), "array": np.array([1.0, np.nan])}
    assert strict(json_text.dumps(value)) == {
        "ratio": {"itl_p50_s": None, "ttft_p50_s": 1.25}, "bounds": [None, None, 0.5],
        "pairs": [None, 2.0], "array": [1.0, None]}


def test_python_json_would_have_written_what_strict_parsers_refuse():
    with pytest.raises(ValueError, match="NaN"):
        strict(json.dumps({"x": math.nan}))  # the default this module replaces


def test_finite_values_are_written_as_json_writes_them():
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": np.int64(3)}}
    assert json_text.dumps(value, indent=2) == json.dumps({"a": [1, 2.5, "x", None, True], "b": {"c": 3}},
                                                          indent=2)


def test_a_value_json_has_no_form_for_is_named():
    with pytest.raises(TypeError, match="not JSON serialisable: set"):
        json_text.dumps({"s": {1, 2}})


def test_write_ends_the_file_with_a_newline(tmp_path):
    path = json_text.write(tmp_path / "x.json", {"v": math.nan})
    assert path.read_text() == '{\n  "v": null\n}\n'
