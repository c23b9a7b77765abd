"""Hostile training configs: the tiny yaml with generated values put at real and made-up keys, generated
`dotted.key=value` overrides, yaml with non-string keys, aliases, deep nesting, or bytes that are not yaml at
all. The trainer's main(argv) answers each with the invariant of tests/hostile.py, before it trains: the data
path never holds a dataset here, so a config that passes every check is refused at the data (exit 3). Nothing
outside the run folder changes, and a launch that did not start leaves at most its lock and `train.log` there."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hostile import assert_clean, digest_tree, examples, run_entry
from hypothesis import given
from hypothesis import strategies as st

from gcc import exit_codes

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "yamls" / "tiny_cpu.yaml").read_text())


def dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out += dotted_keys(v, f"{prefix}{k}.")
    return out


# every key but run_dir, whose hostile values have their own test (a generated one would leave the case's folder)
KEYS = sorted(
    {
        *(k for k in dotted_keys(TINY) if k != "run_dir"),
        *("model.overrides.num_layers", "model.overrides.dim", "model.overrides.num_heads", "model.overrides.ffn_dim"),
        *("loggers.mlflow.tracking_uri", "loggers.wandb.api_key", "save_folder", "init_ckpt", "data.cache_dir"),
        *("data.cache_limit", "sample_steps", "val_n", "data.num_workers", "stall_timeout_s", "unknown", "a.b.c"),
        *("algorithms", "algorithms.ema", "algorithms.ema.half_life", "algorithms.ema.ema_start"),
        *("loggers.tensorboard.flush_interval", "loggers.mlflow.logging_buffer_seconds"),
        *("callbacks.speed_monitor.window_size", "callbacks.memory_monitor.dist_aggregate_batch_interval"),
    }
)
HOSTILE_STRINGS = [
    "",
    "\x00",
    "x" * 300,
    "../../etc",
    "/dev/zero",
    "s3://AKIDKEY:SeCrEt@bucket/p",
    "http://alice:PW@127.0.0.1:9",
    "https://host/p?sig=SeCrEt&auth=SeCrEt",
    "!!python/object/apply:os.system ['true']",
    "\x1b[2J",
    "1e309",
    ".nan",
]
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**8]),
    st.integers(39, 6000).map(lambda n: int("9" * min(n, 4000))),  # past 40 digits (yaml writes at most 4300)
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=20),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "preset"]), st.integers(-5, 5), max_size=2),
)


def set_dotted(tree: dict, key: str, value) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


@st.composite
def yaml_texts(draw) -> str:
    """The tiny yaml with some keys set to generated values, or one of the shapes yaml can take that a config
    must not: a non-string key, an alias bomb, deep nesting, not text at all."""
    shape = draw(st.sampled_from(["values", "values", "values", "nonstring_key", "aliases", "deep", "bytes"]))
    tree = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in draw(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=4)):
        set_dotted(tree, key, value)
    text = yaml.safe_dump(tree)
    if shape == "nonstring_key":
        text += f"{draw(st.sampled_from(['1', 'true', 'null', '[1, 2]', '2.5']))}: x\n"
    elif shape == "aliases":
        n = draw(st.integers(2, 12))
        lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, n)]
        text += "loggers:\n  mlflow:\n    tags:\n" + "".join(f"      {ln}\n" for ln in lines)
    elif shape == "deep":
        depth = draw(st.sampled_from([50, 70, 200, 5000]))
        text += "model:\n  overrides:\n    x: " + "[" * depth + "]" * depth + "\n"
    elif shape == "bytes":
        return draw(st.binary(max_size=200)).decode("latin-1")
    return text


OVERRIDES = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(KEYS), VALUES).map(lambda kv: f"{kv[0]}={yaml.safe_dump(kv[1]).strip()}"),
        st.tuples(st.sampled_from(KEYS), st.sampled_from(HOSTILE_STRINGS)).map(lambda kv: f"{kv[0]}={kv[1]}"),
        # an integer past Python's 4300 digits (no yaml writer makes one), or in digits of another script
        st.tuples(st.sampled_from(KEYS), st.integers(4290, 6000)).map(lambda kv: f"{kv[0]}={'9' * kv[1]}"),
        st.tuples(st.sampled_from(KEYS), st.sampled_from(["٣", "²", "१२", "٣ba"])).map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.text(max_size=30),
    ),
    max_size=3,
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The cases' folder; the trainer's modules imported once, outside any case's time limit. Object storage
    points at a closed port with one attempt, so that a URL that reaches a client fails at once."""
    import gcc.training.trainer  # noqa: F401

    saved = {k: os.environ.get(k) for k in ("S3_ENDPOINT_URL", "AWS_MAX_ATTEMPTS", "MLFLOW_TRACKING_URI")}
    os.environ.update(S3_ENDPOINT_URL="http://127.0.0.1:9", AWS_MAX_ATTEMPTS="1")
    yield tmp_path_factory.mktemp("fuzz_config")
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def check_launch(case: Path, argv: list[str], run: Path | None) -> None:
    """The invariant, and nothing in `case` changed but the run folder `run` itself, its lock and train.log."""
    before = digest_tree(case)
    o = run_entry("gcc.train", argv, cwd=case)
    assert_clean(o)
    assert o.code != exit_codes.OK, o  # no dataset: nothing can train
    after = digest_tree(case)
    allowed = set()
    if run is not None and (run == case or case in run.parents):
        allowed = {str(q.relative_to(case)) for q in (run, run / "train.log", run / ".lock")}
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - allowed
    assert not changed, (sorted(changed)[:10], str(o))
    for secret in ("SeCrEt", "PW@"):
        assert secret not in o.out + o.err, o


def run_args(case: Path) -> list[str]:
    return [f"run_dir={case / 'run'}", f"data.path={case / 'nodata'}", f"data.cache_dir={case / 'run' / 'cache'}"]


@examples(60)
@given(text=yaml_texts())
def test_the_trainer_answers_any_yaml(scratch, text):
    case = Path(tempfile.mkdtemp(dir=scratch))
    (case / "config.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    check_launch(case, [str(case / "config.yaml"), *run_args(case)], case / "run")


@examples(60)
@given(overrides=OVERRIDES)
def test_the_trainer_answers_any_overrides(scratch, overrides):
    case = Path(tempfile.mkdtemp(dir=scratch))
    # the overrides come after run_dir and data.path, so that a generated run_dir or data.path is what is used
    check_launch(case, [str(ROOT / "yamls" / "tiny_cpu.yaml"), *run_args(case), *overrides], case / "run")


@examples(30)
@given(
    run_dir=st.sampled_from(
        [
            "",
            "\x00",
            "a\x00b",
            "x" * 300,
            "a/" + "y" * 256,
            "/dev/zero",
            "/proc/self",
            "a_file",
            "a_file/run",
            "to_nowhere",
            "run_with_checkpoints_file",
            "run_with_dangling_export",
        ]
    )
)
def test_the_trainer_answers_any_run_dir(scratch, run_dir):
    case = Path(tempfile.mkdtemp(dir=scratch))
    (case / "a_file").write_text("not a folder")
    (case / "to_nowhere").symlink_to(case / "nowhere")
    (case / "run_with_checkpoints_file").mkdir()
    (case / "run_with_checkpoints_file" / "checkpoints").write_text("not a folder")
    (case / "run_with_dangling_export" / "exports").mkdir(parents=True)
    (case / "run_with_dangling_export" / "exports" / "step-4.safetensors").symlink_to(case / "nowhere")
    argv = [str(ROOT / "yamls" / "tiny_cpu.yaml"), f"run_dir={run_dir}", f"data.path={case / 'nodata'}"]
    relative = "\x00" not in run_dir and not run_dir.startswith("/")
    check_launch(case, argv, (case / run_dir) if relative else None)
