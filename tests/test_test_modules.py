"""Every module of gcc with logic (a function or a class) has its tests in a known place: the mirrored test module
(`tests/<same path>/test_<name>.py`; a callback's `tests/training/callbacks/test_cb_<name>.py`), or, for a module whose
contract is proven together with others, the test modules listed in `TESTED_IN` (docs/design.md §13: "a module").
A new module without either fails here; so does an entry of `TESTED_IN` whose test module no longer uses it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module (path under gcc/) -> the test modules (paths under tests/) that prove it, where no mirrored module exists
TESTED_IN = {
    "compat/__init__.py": ["compat/test_imports.py"],  # the stand-ins, on both sides of a library's load
    "compat/deepspeed.py": ["compat/test_imports.py"],
    "compat/loggers.py": ["compat/test_wandb_mlflow_contract.py"],
    "data/batch.py": ["data/test_data.py", "data/test_loader_paths.py", "model/test_flops.py"],
    "data/config.py": ["data/test_data.py"],
    "data/dataset.py": ["data/test_data.py", "data/test_loader_paths.py"],
    "data/shards.py": ["data/test_data.py", "data/test_trust_data.py", "data/test_layout.py"],
    "launch_command.py": ["test_launcher.py"],
    "model/config.py": ["model/test_optim.py", "sampling/test_sampler.py"],
    "model/dit.py": ["model/test_model.py"],
    "model/fsdp.py": ["model/test_model_fsdp.py"],  # two ranks under FSDP2
    "stats.py": ["training/test_columns.py"],
    "yaml_reader.py": ["training/test_config_names.py"],
    "storage.py": ["test_storage_writes.py", "data/test_bounded_reads.py", "training/test_checkpoint_store.py"],
    "synth/decode.py": ["synth/test_synth.py", "sampling/test_decoders.py"],
    "synth/render.py": ["synth/test_synth.py"],
    "synth/scene.py": ["synth/test_synth.py"],
    "synth/world.py": ["synth/test_synth.py"],
    "tools/demo.py": ["tools/test_plot.py", "tools/test_sample.py"],
    "tools/inspect_ckpt.py": ["model/test_export.py", "test_provenance.py"],
    "tools/sample/cli.py": ["tools/test_sample.py"],
    "tools/sample/dit.py": ["tools/test_sample.py"],
    "tools/sample/errors.py": ["tools/test_sample.py"],
    "tools/sample/sources.py": ["tools/test_sample.py"],
    "training/batch_change.py": ["training/test_config_runfolder.py", "training/test_train_e2e.py"],
    "training/callbacks/__init__.py": ["training/callbacks/test_every_callback.py"],
    "training/composer_options.py": ["training/test_composer_callbacks.py", "training/test_loggers.py"],
    "training/signature.py": ["training/test_config_roles.py"],
    "training/checkpoint/background.py": ["training/test_async_checkpoint.py"],
    "training/checkpoint/files.py": ["training/test_async_checkpoint.py", "training/test_checkpoint_store.py"],
    "training/checkpoint/rotation.py": ["training/callbacks/test_cb_checkpoint_rotation.py"],
    "training/checkpoint/store.py": ["training/test_checkpoint_store.py"],
    "training/checkpoint/upload.py": ["training/callbacks/test_cb_checkpoint_upload.py"],
    "training/config.py": [
        "training/test_config_roles.py",
        "training/test_config_bounds.py",
        "training/test_config_names.py",
    ],
    "training/console.py": ["training/test_run_log.py"],
    "training/csv_logger.py": ["training/test_config_runfolder.py"],
    "training/input_checks.py": ["training/test_config_bounds.py"],
    "training/output_capture.py": ["training/test_run_log.py"],
    "training/entry.py": ["training/test_launch_writes.py", "tools/test_bad_input.py", "training/test_config_names.py"],
    "training/print_config.py": ["training/test_config_names.py"],
    "training/peer_fault.py": ["training/test_ending.py", "training/test_faults.py"],
    "training/run_folder.py": ["training/test_checkpoint_store.py", "training/test_config_runfolder.py"],
    "training/sections.py": ["training/test_schedule.py"],
    "training/trainer.py": ["training/test_train_e2e.py", "test_errors.py"],
    "training/watchdog.py": ["training/callbacks/test_cb_step_deadline.py", "test_workers.py"],
    "vocab.py": ["data/test_convert.py", "data/test_mask.py"],
}


def _has_logic(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


def _mirrors(rel: Path) -> list[Path]:
    if rel.stem == "__init__":
        return [ROOT / "tests" / rel.parent / f"test_{rel.parent.name}.py"]
    found = [ROOT / "tests" / rel.parent / f"test_{rel.stem}.py"]
    if rel.parts[:2] == ("training", "callbacks"):
        found.append(ROOT / "tests" / rel.parent / f"test_cb_{rel.stem}.py")
    return found


def _uses(test_module: Path, rel: Path) -> bool:
    """Whether the test module imports the module (also inside the scripts it gives a launched rank), or, for a
    module of the trainer, launches the trainer (tests/_launch.py, tests/hostile.py run_entry, gcc/train.py),
    which runs it."""
    dotted = ".".join(("gcc", *rel.with_suffix("").parts)).removesuffix(".__init__")
    package, _, name = dotted.rpartition(".")
    text = test_module.read_text()
    if rel.parts[0] == "training" and re.search(r"^from _launch import|run_entry|gcc/train\.py", text, re.M):
        return True
    return dotted in text or re.search(rf"from {re.escape(package)} import [^\n]*\b{name}\b", text) is not None


def modules_with_logic() -> list[Path]:
    return sorted(p.relative_to(ROOT / "gcc") for p in (ROOT / "gcc").rglob("*.py") if _has_logic(p))


def test_every_module_with_logic_has_its_tests_in_a_known_place():
    homeless = [
        str(rel)
        for rel in modules_with_logic()
        if str(rel) not in TESTED_IN and not any(map(Path.exists, _mirrors(rel)))
    ]
    assert not homeless, f"no test module for {homeless}: add tests/<same path>/test_<name>.py"


def test_each_listed_test_module_exists_and_uses_its_module():
    modules = {str(rel) for rel in modules_with_logic()}
    wrong = []
    for module, tests in TESTED_IN.items():
        if module not in modules:
            wrong.append(f"{module}: not a module of gcc with logic")
            continue
        if any(map(Path.exists, _mirrors(Path(module)))):
            wrong.append(f"{module}: has a mirrored test module now; drop its TESTED_IN entry")
        for t in tests:
            path = ROOT / "tests" / t
            if not path.exists() or not _uses(path, Path(module)):
                wrong.append(f"{module}: tests/{t} {'does not use it' if path.exists() else 'does not exist'}")
    assert not wrong, wrong


def test_the_mutation_table_names_modules_and_tests_that_exist():
    """tests/mutants.py `MODULES` (`make mutants`, docs/mutation.md): each module and each test file it runs exists,
    and the mutants docs/mutation.md judges are of modules in the table."""
    from mutants import MODULES, judged

    for module, target in MODULES.items():
        assert (ROOT / module).is_file(), module
        missing = [t for t in target.tests if t.startswith("tests/") and not (ROOT / t.split("::")[0]).exists()]
        assert not missing, (module, missing)
    listed = re.findall(r"^- `([^`]+)`: ", (ROOT / "docs" / "mutation.md").read_text(), re.M)
    assert sum(len(judged(m)) for m in MODULES) == len(listed), "a judged mutant of a module not in MODULES"
