"""gc25d export / import (docs/design.md §9.4, §9.9) and `python -m gcc.tools.inspect_ckpt`."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _gc_helpers import export_metadata, make_batch, null_embedding, randomize_cond, tiny_dit
from _launch import run_ranks
from safetensors import safe_open
from safetensors.torch import save_file

import gcc
import gcc.model.export as export
from gcc.model.dit import wan_keys
from gcc.model.export import (
    META_KEYS,
    GcCkptError,
    check_gc_ckpt,
    gc_key_set,
    load_gc_weights,
    load_state_dict_gc,
    save_gc,
)
from gcc.model.objective import GcTrainModel
from gcc.tools.inspect_ckpt import main as inspect_main

ROOT = Path(__file__).resolve().parents[2]


def _meta(vocab="parts", step=1000):
    return export_metadata(
        vocab=vocab, data="v10", data_root="/data/gc25d_v10", step=step, model_dir="/models/Wan2.2-TI2V-5B"
    )


def _trained_state(vocab="parts", seed=0):
    dit = tiny_dit(vocab=vocab, seed=seed)
    randomize_cond(dit, seed=seed + 1)
    return GcTrainModel(dit, seed=0, null_context=null_embedding()).state_dict(), dit


def test_export_keys_dtypes_metadata(tmp_path):
    sd, dit = _trained_state()
    assert all(k.startswith("dit.") for k in sd)
    path = save_gc(sd, tmp_path / "step-1000.safetensors", _meta())
    assert sorted(os.listdir(tmp_path)) == ["step-1000.safetensors"]  # no .tmp left behind
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with safe_open(str(path), "pt") as fh:
        keys, meta = set(fh.keys()), fh.metadata()
        assert {fh.get_slice(k).get_dtype() for k in keys} == {"BF16"}
        torch.testing.assert_close(
            fh.get_tensor("gc_sem_cond.proj_out.weight"), dit.gc_sem_cond.proj_out.weight.detach().to(torch.bfloat16)
        )
    assert keys == set(dit.state_dict()) == set(gc_key_set(2))
    assert set(meta) == set(META_KEYS)
    # docs/design.md §9.9 (docs/design.md): the fixed values, the defaults, and _meta()'s inputs as strings
    assert meta == {
        "arm": "gc25d",
        "format": "gc25d",
        "sem_cond": "gc_sem_cond",
        "mask_channel": "False",
        "vocab": "parts",
        "data": "v10",
        "data_root": "/data/gc25d_v10",
        "step": "1000",
        "stage": "sft_bidirectional",
        "cond_type": "ids",
        "cond_key": "ids",
        "text_dropout": "0.1",
        "cond_dropout": "0.05",
        "mask_p": "0.5",
        "lr": "1e-05",
        "cond_lr": "0.0001",
        "weight_decay": "0.01",
        "warmup_steps": "500",
        "first_frame_cond": "True",
        "seed": "0",
        "init_ckpt": "",
        "model_dir": "/models/Wan2.2-TI2V-5B",
        "trainer": f"gcc {gcc.__version__}",
        "resumed_from": "",
        "resumed_step": "",
        "weights": "raw",
        "data_limit": "",
        "git_revision": "",
        "git_dirty": "",
        "preset": "",
    }
    info = check_gc_ckpt(path, vocab="parts")
    assert info["n_keys"] == len(keys) and info["num_layers"] == 2


def test_the_trainers_data_field_is_the_manifests_name():
    """`data` in the trainer's export metadata: the dataset's name from its manifest (convert_data --name); a manifest
    of an earlier convert_data has none, and the conversion folder's name stands in. (An export the trainer wrote
    in a real launch: tests/training/test_train_e2e.py, test_reference_run_outputs.)"""
    from dataclasses import replace

    from gcc.training.builders import export_metadata
    from gcc.training.config import load_config
    from gcc.training.run_start import RunStart

    cfg = load_config(ROOT / "yamls" / "tiny_cpu.yaml", ["data.path=s3://b/gc25d_v10_mds/"])
    run = RunStart({"name": "v10"}, {"init_ckpt": ""}, "", None, "", None)
    assert (export_metadata(cfg, run, 7)["data"], export_metadata(cfg, run, 7)["data_root"]) == (
        "v10",
        "s3://b/gc25d_v10_mds/",
    )
    run = replace(run, manifest={})
    assert export_metadata(cfg, run, 7)["data"] == "gc25d_v10_mds"


def test_5b_export_key_set_has_831_keys():
    assert len(gc_key_set(30)) == 831


def test_metadata_must_be_exactly_spec(tmp_path):
    sd, _ = _trained_state()
    bad = dict(_meta(), extra="x")
    with pytest.raises(GcCkptError, match="extra"):
        save_gc(sd, tmp_path / "step-1.safetensors", bad)
    missing = {k: v for k, v in _meta().items() if k != "resumed_from"}
    with pytest.raises(GcCkptError, match="resumed_from"):
        save_gc(sd, tmp_path / "step-1.safetensors", missing)
    assert os.listdir(tmp_path) == []
    with pytest.raises(GcCkptError, match="null_context"):  # not a GcDiT state dict
        save_gc({**sd, "null_context": torch.zeros(2)}, tmp_path / "step-1.safetensors", _meta())
    assert os.listdir(tmp_path) == []


def test_weights_says_raw_or_ema_and_an_export_written_before_it_reads_as_raw(tmp_path):
    """`weights` (algorithms.ema: step-N.ema.safetensors holds the EMA); an export of an earlier gcc lacks the key
    and reads as the raw weights, for gcc-inspect, gcc-sample and a warm start alike; any other value is refused."""
    sd, _ = _trained_state()
    ema = save_gc(sd, tmp_path / "step-1.ema.safetensors", {**_meta(), "weights": "ema"})
    assert check_gc_ckpt(ema)["metadata"]["weights"] == "ema"
    older = tmp_path / "older.safetensors"
    tensors = {k[4:]: v.to(torch.bfloat16) for k, v in sd.items()}
    save_file(tensors, str(older), metadata={k: v for k, v in _meta().items() if k != "weights"})
    assert check_gc_ckpt(older)["metadata"]["weights"] == "raw"
    assert load_gc_weights(tiny_dit(), older)["kind"] == "gc25d"
    save_file(tensors, str(tmp_path / "odd.safetensors"), metadata={**_meta(), "weights": "swa"})
    with pytest.raises(GcCkptError, match="metadata weights='swa' is not one of \\('raw', 'ema'\\)"):
        check_gc_ckpt(tmp_path / "odd.safetensors")


def test_crash_mid_write_leaves_no_export(tmp_path, monkeypatch):
    sd, _ = _trained_state()
    target = tmp_path / "step-2000.safetensors"

    at_crash = {}

    def crashing_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\x00" * 100)  # a partial file, then the process dies
        # a SIGKILL here would run no cleanup: what is on disk now is what a relaunch finds
        at_crash["files"] = sorted(os.listdir(tmp_path))
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(export, "save_file", crashing_save_file)
    with pytest.raises(KeyboardInterrupt):
        save_gc(sd, target, _meta(step=2000))
    assert target.name not in at_crash["files"] and [f.startswith(target.name + ".tmp") for f in at_crash["files"]] == [
        True
    ]
    assert not list(tmp_path.glob("step-*.safetensors"))
    assert os.listdir(tmp_path) == []  # an ordinary exception also removes the .tmp


def test_failed_check_leaves_no_export(tmp_path, monkeypatch):
    sd, _ = _trained_state()
    target = tmp_path / "step-3000.safetensors"
    real = export.save_file
    monkeypatch.setattr(
        export,
        "save_file",  # write a file whose key set is short of the state dict
        lambda t, f, metadata=None: real(dict(list(t.items())[1:]), f, metadata=metadata),
    )
    with pytest.raises(GcCkptError, match="missing"):
        save_gc(sd, target, _meta(step=3000))
    assert os.listdir(tmp_path) == []


def test_round_trip(tmp_path):
    sd, dit = _trained_state(seed=0)
    path = save_gc(sd, tmp_path / "step-5.safetensors", _meta(step=5))
    fresh = tiny_dit(seed=9)
    info = load_gc_weights(fresh, path)
    assert info["kind"] == "gc25d"
    want = {k: v.to(torch.bfloat16).float() for k, v in dit.state_dict().items()}
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)
    b = make_batch(B=1)
    args = (b["input_latents"].float(), torch.tensor([300.0]), b["context"].float(), b["context_index"], b["sem_ids"])
    dit.load_state_dict(want)
    with torch.no_grad():
        torch.testing.assert_close(fresh.gc_forward(*args), dit.gc_forward(*args))


def test_vocab_mismatch_refused(tmp_path):
    sd, _ = _trained_state(vocab="parts")
    path = save_gc(sd, tmp_path / "step-1.safetensors", _meta(vocab="parts"))
    with pytest.raises(GcCkptError, match="vocab 'parts' differs"):
        load_gc_weights(tiny_dit(vocab="ids"), path)
    with pytest.raises(GcCkptError, match="vocab"):
        check_gc_ckpt(path, vocab="ids")
    # metadata claims ids but the cond was built for parts: the input width betrays it
    with pytest.raises(GcCkptError, match="input classes"):
        save_gc(sd, tmp_path / "step-2.safetensors", _meta(vocab="ids"))
    assert sorted(os.listdir(tmp_path)) == ["step-1.safetensors"]


def test_plain_wan_export_starts_cond_at_zero(tmp_path):
    _, src = _trained_state(seed=2)
    wan_only = {k: v for k, v in src.state_dict().items() if not k.startswith("gc_sem_cond.")}
    path = tmp_path / "wan.safetensors"
    save_file(wan_only, str(path))
    dst = tiny_dit(seed=4)
    randomize_cond(dst, seed=5)  # a non-zero cond must be reset
    assert load_gc_weights(dst, path)["kind"] == "wan"
    for k in wan_keys(dst):
        torch.testing.assert_close(dst.state_dict()[k], wan_only[k], rtol=0, atol=0)
    b = make_batch(B=1)
    _, aux = dst.gc_forward(
        b["input_latents"].float(),
        torch.tensor([300.0]),
        b["context"].float(),
        b["context_index"],
        b["sem_ids"],
        aux=True,
    )
    assert aux["sem_rms"].item() == 0.0


def test_bad_files_are_refused_by_name(tmp_path):
    sd, _ = _trained_state()
    good = save_gc(sd, tmp_path / "step-1.safetensors", _meta())
    with safe_open(str(good), "pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = fh.metadata()
    # missing key
    p = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in tensors.items() if k != "head.head.weight"}, str(p), metadata=meta)
    with pytest.raises(GcCkptError, match="head.head.weight"):
        load_gc_weights(tiny_dit(), p)
    with pytest.raises(GcCkptError, match="head.head.weight"):
        check_gc_ckpt(p)
    # wrong shape
    p = tmp_path / "shape.safetensors"
    save_file({**tensors, "patch_embedding.bias": torch.zeros(7, dtype=torch.bfloat16)}, str(p), metadata=meta)
    with pytest.raises(GcCkptError, match="patch_embedding.bias has shape"):
        load_gc_weights(tiny_dit(), p)
    # cond keys without gc25d metadata
    p = tmp_path / "nometa.safetensors"
    save_file(tensors, str(p))
    with pytest.raises(GcCkptError, match="not a gc25d export"):
        load_gc_weights(tiny_dit(), p)
    with pytest.raises(GcCkptError, match="not a gc25d export"):
        check_gc_ckpt(p)
    # a gc25d-labelled file without the cond keys
    p = tmp_path / "nocond.safetensors"
    save_file({k: v for k, v in tensors.items() if not k.startswith("gc_sem_cond.")}, str(p), metadata=meta)
    with pytest.raises(GcCkptError, match="gc_sem_cond.proj_in.weight"):
        load_gc_weights(tiny_dit(), p)
    # some other model entirely
    p = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(3)}, str(p))
    with pytest.raises(GcCkptError, match="encoder.weight"):
        load_gc_weights(tiny_dit(), p)
    p = tmp_path / "junk.safetensors"
    p.write_bytes(b"not a safetensors file")
    with pytest.raises(GcCkptError, match="junk.safetensors"):
        load_gc_weights(tiny_dit(), p)
    # a failed load changes nothing
    dit = tiny_dit(seed=6)
    before = {k: v.clone() for k, v in dit.state_dict().items()}
    with pytest.raises(GcCkptError):
        load_gc_weights(dit, tmp_path / "shape.safetensors")
    assert all(torch.equal(before[k], v) for k, v in dit.state_dict().items())


def test_state_dict_import_strips_wrapper_prefixes():
    sd, dit = _trained_state(seed=3)
    wrapped = {"module." + k: v for k, v in sd.items()}  # accelerate/DeepSpeed style "module.dit.*"
    fresh = tiny_dit(seed=8)
    assert load_state_dict_gc(fresh, wrapped, "legacy")["kind"] == "gc25d"
    for k, v in dit.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)


def test_legacy_zero_import_needs_deepspeed(tmp_path, monkeypatch):
    # as on an install without the `legacy` extra (make test installs it): the import fails
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    monkeypatch.setitem(sys.modules, "deepspeed.utils.zero_to_fp32", None)
    with pytest.raises(RuntimeError, match="legacy"):
        export.load_legacy_zero(tiny_dit(), tmp_path)


def test_inspect_cli(tmp_path, capsys):
    sd, _ = _trained_state()
    good = save_gc(sd, tmp_path / "step-1.safetensors", _meta())
    assert inspect_main([str(good)]) == 0
    out = capsys.readouterr().out
    assert f"keys       {len(sd)}" in out and "BF16" in out and "check_gc_ckpt OK" in out and "vocab = 'parts'" in out
    assert "vocab parts, shaped as" in out and "; raw weights" in out
    ema = save_gc(sd, tmp_path / "step-1.ema.safetensors", {**_meta(), "weights": "ema"})  # algorithms.ema's
    assert inspect_main([str(ema)]) == 0
    out = capsys.readouterr().out
    assert "weights = 'ema'" in out and "; ema weights" in out
    bad = tmp_path / "bad.safetensors"
    with safe_open(str(good), "pt") as fh:
        save_file({k: fh.get_tensor(k) for k in fh.keys()}, str(bad))  # metadata dropped
    assert inspect_main([str(bad)]) == 2
    assert "not a gc25d export" in capsys.readouterr().err
    assert inspect_main(["--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "keys       " in out and "Wan + 6 cond" in out
    assert inspect_main(["--model", "ti2v-5b"]) == 0
    out = capsys.readouterr().out
    assert "keys       831 (825 Wan + 6 cond)" in out and "(5.01" in out


_WRITE_ZERO2 = textwrap.dedent("""
    import os, sys, torch, deepspeed, deepspeed.ops
    from gcc.model.dit import build_gc_dit

    class Module(torch.nn.Module):  # the legacy trainer's module: the DiT under `dit.`
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.dit = build_gc_dit("tiny")
            torch.nn.init.normal_(self.dit.gc_sem_cond.proj_out.weight)

        def forward(self, x):
            return self.dit.patch_embedding(x).square().mean() + sum(p.sum() for p in self.parameters()) * 0

    # no DeepSpeed op is needed by this ZeRO-2 step (torch's AdamW, gloo): none is probed or compiled (DeepSpeed
    # would compile its CPU shared-memory op on first use, about 100 s on a fresh machine)
    deepspeed.ops.__compatible_ops__ = {}
    deepspeed.init_distributed(dist_backend="gloo")
    m = Module()
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
           "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters(), lr=1e-2), config=cfg)
    loss = engine(torch.randn(1, 48, 3, 4, 4))
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(sys.argv[1], tag="pytorch_model")  # what accelerate's save_state does
    torch.save({k: v.detach().clone() for k, v in m.state_dict().items()}, sys.argv[2])
""")


@pytest.mark.slow
def test_legacy_zero2_checkpoint_import(tmp_path):
    """A real ZeRO-2 checkpoint written by deepspeed on CPU (in a subprocess: it initialises a process group),
    imported through deepspeed's own zero_to_fp32."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        pytest.skip("deepspeed (optional extra `legacy`) is not installed")
    ck, ref = tmp_path / "state", tmp_path / "ref.pt"
    code, outs = run_ranks(
        tmp_path / "rank",
        _WRITE_ZERO2,
        str(ck),
        str(ref),
        n=1,
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        timeout=300,
    )
    assert code == 0, outs[0][-4000:]
    dit = tiny_dit(seed=5)
    assert export.load_legacy_zero(dit, ck)["kind"] == "gc25d"
    want = torch.load(ref)
    for k, v in dit.state_dict().items():
        torch.testing.assert_close(v, want["dit." + k], rtol=0, atol=0, msg=k)
    with pytest.raises(GcCkptError, match="missing"):
        export.load_legacy_zero(tiny_dit(num_layers=3), ck)
