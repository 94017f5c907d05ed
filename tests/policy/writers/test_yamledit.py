"""The YAML editor keeps what kvtier does not own (comments, order, quoting, layout) and
refuses what it cannot edit without surprise."""

from __future__ import annotations

import pytest

from kvtier.policy.writers.yamledit import ConfigFileError, yaml_get, yaml_set

TRT = """\
# hand-tuned
backend: pytorch   # keep
kv_cache_config:
  # GPU share
  free_gpu_memory_fraction: 0.85
  host_cache_size: 1000  # bytes

max_batch_size: 64
"""


def test_set_replaces_in_place_appends_missing_and_keeps_comments_and_blank_lines():
    out = yaml_set(TRT, {("kv_cache_config", "host_cache_size"): 2048,
                         ("kv_cache_config", "tokens_per_block"): 32,
                         ("backend",): "pytorch", ("enable_iter_perf_stats",): True})
    assert out.splitlines() == [
        "# hand-tuned", "backend: pytorch   # keep", "kv_cache_config:", "  # GPU share",
        "  free_gpu_memory_fraction: 0.85", "  host_cache_size: 2048  # bytes",
        "  tokens_per_block: 32", "", "max_batch_size: 64", "enable_iter_perf_stats: true"]
    assert yaml_get(out, ("kv_cache_config", "tokens_per_block")) == 32
    assert yaml_get(out, ("kv_cache_config", "missing")) is None


def test_set_creates_sections_and_keeps_the_files_indent():
    assert yaml_set("", {("a", "b"): 1}) == "a:\n  b: 1\n"
    assert yaml_set("a:\n    x: 1\n", {("a", "y"): "z"}) == "a:\n    x: 1\n    y: z\n"
    assert yaml_set("a:\n    - 1\nb:\n    c: 1\n", {("b", "d"): 2}) == "a:\n    - 1\nb:\n    c: 1\n    d: 2\n"
    assert yaml_set("top: 1\n\n# tail\n", {("new", "k"): 1}) == "top: 1\nnew:\n  k: 1\n\n# tail\n"


def test_flow_style_and_nested_mappings_are_edited_in_their_own_style():
    assert yaml_set("{model: a, port: 8000}\n", {("k",): "v"}) == "{model: a, port: 8000, k: v}\n"
    text = "kv-transfer-config:\n  kv_connector: X  # mine\n  old: 1\n"
    out = yaml_set(text, {("kv-transfer-config",): {"kv_connector": "Y", "kv_role": "kv_both"}})
    assert out == "kv-transfer-config:\n  kv_connector: Y  # mine\n  kv_role: kv_both\n"


def test_spellings_find_the_key_the_file_wrote_and_keep_its_spelling():
    text = "kv_transfer_config: '{}'  # by hand\n"
    out = yaml_set(text, {("kv-transfer-config",): '{"a": 1}'}, spellings=True)
    assert out.startswith("kv_transfer_config: '{\"a\": 1}'") and out.rstrip().endswith("# by hand")
    assert yaml_get(out, ("kv-transfer-config",), spellings=True) == '{"a": 1}'
    with pytest.raises(ConfigFileError, match="line 1 spells max-local-cpu-size, but the engine "
                                              "reads max_local_cpu_size: rename it"):
        yaml_set("max-local-cpu-size: 5\n", {("max_local_cpu_size",): 4.0})


@pytest.mark.parametrize("text, says", [
    ("port: 1\nport: 2\n", "line 2: a key is written twice"),
    ("kv-transfer-config: '{}'\nkv_transfer_config: '{}'\n",
     r"kv-transfer-config \(line 1\) and kv_transfer_config \(line 2\) are two spellings of one key"),
    ("a:\n  b: 1\n  b_c: 1\n  b-c: 2\n", r"a\.b_c \(line 3\) and b-c \(line 4\)"),
    ("- a\n- b\n", "the top of the file is a list"),
    ("model: [unclosed\n", "not valid YAML \\(line 2"),
    ("model: a\n\tport: 8000\n", "not valid YAML \\(line 2: found character '\\\\t'"),
    ("a:\n  b: 1\nc:\n    d: 1\n", "would rewrite line 4 of it"),
    ("a: 1\n", "a \\(line 1\\) is a value; kvtier needs a mapping"),
])
def test_what_it_cannot_edit_safely_is_refused_and_says_where(text, says):
    with pytest.raises(ConfigFileError, match=says):
        yaml_set(text, {("a", "x"): 1})


@pytest.mark.parametrize("value", [
    "plain", "file:///mnt/kv/", "true", "yes", "123", "1e3", "", "a: b", "#x", '{"k": 1}',
    "it's", None, True, 7, 2.5, 20669530112])
def test_values_read_back_as_written(value):
    assert yaml_get(yaml_set("k: 1\n", {("k",): value}), ("k",)) == value
