"""Push benchmark: how the time of a YAML edit grows with the file, beside ruamel.yaml's own
read and write of the same text (the floor: an edit reads the file once and writes it twice,
the round-trip check and the result).

Run: ``python benchmarks/push_edit.py --json`` (one JSON object; ``--smoke``: small files, to
check it runs).

Two shapes of a vLLM serve config, each at four sizes up to the size limit push reads
(``CONFIG_LIMIT_BYTES``, 1 MiB), pushed with ``plan`` (everything but the write: read,
edit, shape check, diff):

* ``flat``: many top-level keys with comments (the edit sets ``kv-transfer-config``);
* ``extra``: many keys inside ``kv_connector_extra_config`` (the mapping the edit syncs key
  by key; its key comparisons were quadratic in it).

Figures: ``{shape}_plan_s`` and ``{shape}_floor_s`` (one ruamel load and dump) per size,
``{shape}_growth``: the time at the largest size over the time at half of it (2.0 is
linear), and ``{shape}_over_floor``: plan over floor at the largest size. And
``alias_bomb_s`` / ``oversize_s``: the time to refuse a 500-byte alias bomb and a 20 MiB file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtier.policy.writers.inputs import CONFIG_LIMIT_BYTES  # noqa: E402
from kvtier.policy.writers.push import PushRefused, plan  # noqa: E402
from kvtier.policy.writers.settings import EngineSettings, Guardrails  # noqa: E402

SHAPES = ("flat", "extra")
FIGURES = ("flat_sizes_bytes", "flat_plan_s", "flat_floor_s", "flat_growth", "flat_over_floor",
           "extra_sizes_bytes", "extra_plan_s", "extra_floor_s", "extra_growth",
           "extra_over_floor", "alias_bomb_s", "oversize_s")
HEAD = ("# serve config\nmodel: m\nkv-transfer-config:\n  kv_connector: OffloadingConnector\n"
        "  kv_role: kv_both\n  kv_connector_extra_config:\n    cpu_bytes_to_use: 1073741824\n")


def text(shape: str, size_bytes: int) -> str:
    lines, total, i = [], len(HEAD), 0
    while total < size_bytes - 64:
        line = (f"key-{i}: value-{i}  # comment {i}\n" if shape == "flat"
                else f"    site_key_{i}: {i}\n")
        lines.append(line)
        total += len(line)
        i += 1
    return HEAD + "".join(lines)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def floor_s(body: str) -> float:
    import io

    from ruamel.yaml import YAML

    def load_and_dump():
        yaml = YAML(typ="rt")
        yaml.width = 1 << 16
        yaml.dump(yaml.load(body), io.StringIO())
    return timed(load_and_dump)


def measure(shape: str, sizes: list[int], folder: Path) -> dict:
    out = {"sizes_bytes": [], "plan_s": [], "floor_s": []}
    for size in sizes:
        body = text(shape, size)
        path = folder / f"{shape}-{size}.yaml"
        path.write_text(body)
        settings = EngineSettings(cpu_tier_bytes=4 << 30, eviction_policy="lru")
        out["sizes_bytes"].append(len(body.encode()))
        out["plan_s"].append(round(timed(lambda: plan(settings, Guardrails(), "vllm", path)), 3))
        out["floor_s"].append(round(floor_s(body), 3))
    out["growth"] = round(out["plan_s"][-1] / out["plan_s"][-2], 2)
    out["over_floor"] = round(out["plan_s"][-1] / out["floor_s"][-1], 2)
    return {f"{shape}_{k}": v for k, v in out.items()}


def refusal_s(path: Path) -> float:
    def refused():
        try:
            plan(EngineSettings(cpu_tier_bytes=1 << 30), Guardrails(), "vllm", path)
        except PushRefused:
            return
        raise AssertionError(f"{path} was not refused")
    return round(timed(refused), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="small files, to check it runs")
    args = parser.parse_args()
    top = CONFIG_LIMIT_BYTES // (16 if args.smoke else 1)
    sizes = [top // 8, top // 4, top // 2, top - 1024]
    figures: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for shape in SHAPES:
            figures.update(measure(shape, sizes, folder))
        bomb = folder / "bomb.yaml"
        bomb.write_text("model: m\na0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)))
        figures["alias_bomb_s"] = refusal_s(bomb)
        big = folder / "big.yaml"
        with open(big, "wb") as handle:
            handle.truncate(20 << 20)
        figures["oversize_s"] = refusal_s(big)
    if args.json:
        print(json.dumps(figures))
        return
    for shape in SHAPES:
        print(f"{shape}: {'size':>9} {'plan s':>8} {'floor s':>8}")
        for size, plan_s, base in zip(figures[f"{shape}_sizes_bytes"], figures[f"{shape}_plan_s"],
                                      figures[f"{shape}_floor_s"]):
            print(f"{'':7}{size:>9} {plan_s:>8.3f} {base:>8.3f}")
        print(f"  growth at the largest doubling {figures[f'{shape}_growth']} (2.0 is linear), "
              f"{figures[f'{shape}_over_floor']}x ruamel's load and dump")
    print(f"refused: 500-byte alias bomb in {figures['alias_bomb_s']} s, "
          f"20 MiB file in {figures['oversize_s']} s")


if __name__ == "__main__":
    main()
