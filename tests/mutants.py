"""Mutation testing of the core (`make mutants MODULE=gcc/data/mask.py`, docs/mutation.md): mutmut (pinned in the
`dev` extra) changes one module a mutant at a time (an operator, a constant, a comparison, an argument dropped) and
runs the tests that cover it; a mutant no test fails on "survived": a bug the suite would let through.

`MODULES` is the one table: each core module, the tests that prove it (a fast selection: mutmut runs, for every
mutant, the ones of them that reach the mutated function) and, where only part of a module is in scope, the
functions mutated. The run happens in a scratch copy of the repository (`runs/mutants/<module>/`, its own mutmut
configuration, nothing in the checkout changes), one mutant at a time (the machine is shared), and ends with the
count per outcome and the surviving mutants that docs/mutation.md does not list as equivalent; mutmut's own `mutmut
show NAME` (run in that folder) prints a mutant's diff. Not part of `make test`: a module takes minutes to an hour.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mutation.md"
# what the copy holds besides gcc/ (which mutmut copies, mutated) and tests/: what the selected tests read
ALSO_COPY = ["convert_data", "yamls", "docs", "bench", "examples", "README.md", "CHANGELOG.md", "Makefile"]


@dataclass(frozen=True)
class Target:
    tests: tuple[str, ...]  # pytest arguments: files, node ids, `-m` expressions
    functions: tuple[str, ...] = ()  # mutmut's names of the functions in scope (globs); empty: the whole module
    was: str = ""  # the module's path at an older commit (`--rev`) where it had another


MODULES: dict[str, Target] = {
    "gcc/data/sample_rng.py": Target(("tests/data/test_mask.py", "tests/data/test_sample_rng.py")),
    # the sample path: the draws applied, the dropped text and condition, the mask, the seeded subset
    "gcc/data/dataset.py": Target(
        ("tests/data/test_data.py", "tests/data/test_sample_rng.py", "tests/data/test_trust_data.py", "-m", "not slow"),
        ("*make_sample*", "*get_item*", "*subset_ids*", "*round_robin_by_run*"),
    ),
    "gcc/data/mask.py": Target(("tests/data/test_mask.py", "tests/data/test_mask_grid.py")),
    "gcc/training/builders.py": Target(
        (
            "tests/training/test_builders.py",
            "tests/training/callbacks/test_every_callback.py",
            "tests/training/callbacks/test_cb_validation.py",
            "tests/training/test_config_roles.py",
            "tests/training/callbacks/test_cb_run_files.py",
        ),
        (
            "*dropouts*",
            "*build_train_loader*",
            "*select_val_ids*",
            "*ValClips*",
            "*build_val_loader*",
            "*export_metadata*",
            "*samples_in*",
            "*build_evaluators*",
            "*parallelism_config*",
            "*resolved_config*",
        ),
    ),
    # the run's identity and the launch's verdict; prepare_run, which strings them together, runs in launches (whose
    # processes mutmut does not see)
    "gcc/training/run_start.py": Target(
        (
            "tests/training/test_run_start.py",
            "tests/test_errors.py",
            "tests/training/test_config_roles.py",
            "tests/training/test_trust_run.py",
        ),
        (
            "*x_train_clips_*",
            "*x_steps_per_epoch_*",
            "*x_schedule_horizon_*",
            "*x_schedule_jump_*",
            "*x_data_name_*",
            "*x_run_signature_*",
            "*x_validates_*",
            "*x_cache_dir_*",
            "*x_missing_init_ckpt_*",
            "*x_check_fresh_start_*",
            "*x_agree_on_start_*",
        ),
        was="gcc/training/launch.py",
    ),
    "gcc/training/callbacks/step_sync.py": Target(("tests/training/callbacks/test_cb_step_sync.py",)),
    "gcc/training/callbacks/preemption.py": Target(("tests/training/callbacks/test_cb_preemption.py",)),
    # the host staging and the background writes; Composer's saver around them (`_save_checkpoint`) and the sharded
    # (DCP) write run in launches
    "gcc/training/checkpoint/background.py": Target(
        ("tests/training/test_async_checkpoint.py",),
        ("*HostStaging*", "*x__tensor_*", "*xǁWriteǁ*", "*CheckpointWritesǁ[!w]*", "*write_file*", "*_commit*"),
        was="gcc/training/async_checkpoint.py",
    ),
    "gcc/model/objective.py": Target(
        ("tests/model/test_objective.py", "tests/model/test_flow.py", "tests/model/test_flops.py")
    ),
    "gcc/model/flow.py": Target(("tests/model/test_flow.py", "tests/model/test_objective.py")),
    "gcc/redact.py": Target(
        (
            "tests/test_redact.py",
            "tests/fuzz/test_fuzz_secrets.py",
            "tests/training/test_trust_run.py::test_a_credential_in_the_config_is_named_in_a_warning",
        )
    ),
    "gcc/inputs.py": Target(
        (
            "tests/test_inputs.py",
            "tests/fuzz/test_fuzz_numbers.py::test_parse_int_reads_an_ascii_integer_in_its_range_and_names_anything_else",
        )
    ),
    # the fields' roles and ranges (gcc/settings.py since issue 52; before, in training/config.py) and the run
    # signature they make
    "gcc/settings.py": Target(
        ("tests/test_settings.py", "tests/training/test_config_roles.py", "tests/training/test_config_bounds.py"),
        ("*Range*", "*Role*", "*x_role_*", "*x_setting_*", "*x_roles_*"),
        was="gcc/training/config.py",
    ),
    "gcc/training/config.py": Target(
        ("tests/training/test_config_roles.py", "tests/training/test_config_bounds.py"),
        ("*signature_key_name*", "*signed_values*", "*x__default_*", "*x_default_of_*", "*exported_values*"),
    ),
}


def at(rev: str | None) -> str:
    """The suffix of a run's folder and record at an older commit."""
    return f".at-{rev}" if rev else ""


def mutant_prefix(module: str) -> str:
    """mutmut's names of a module's mutants start with its dotted path: gcc.data.mask.x_fn__mutmut_3."""
    return module.removesuffix(".py").replace("/", ".") + "."


def judged(module: str) -> dict[str, str]:
    """docs/mutation.md's judgement of a module's surviving mutants (a line `- \\`NAME\\`: reason` each): equivalent
    to the code, or, where the reason begins "killed by", killed by a test in a process mutmut's switch does not
    reach (a loader worker), shown there by planting the change by hand."""
    found = re.findall(r"^- `([^`]+)`: (.+)$", DOC.read_text(), re.M) if DOC.is_file() else []
    return {name: why for name, why in found if name.startswith(mutant_prefix(module))}


# the outcomes where the tests failed: a mutant that crashes their process (mutmut's "segfault") fails them as
# surely as an assertion
KILLED = ("killed", "segfault")


def scored(module: str, outcomes: dict[str, str]) -> tuple[int, int, int]:
    """(killed, live, equivalent): a mutant killed outside mutmut's reach counts as killed, an equivalent one not at
    all."""
    alive = {k: why for k, why in judged(module).items() if outcomes.get(k, "killed") not in KILLED}
    out = [k for k, why in alive.items() if why.startswith("killed by")]
    killed = sum(v in KILLED for v in outcomes.values()) + len(out)
    return killed, len(outcomes) - (len(alive) - len(out)), len(alive) - len(out)


def config(module: str, target: Target) -> str:
    """The copy's [tool.mutmut] section (appended to its pyproject.toml)."""

    def toml_list(xs) -> str:
        return "[" + ", ".join(f'"{x}"' for x in xs) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["gcc"]\n'
        f"only_mutate = {toml_list([module])}\n"
        f"also_copy = {toml_list(ALSO_COPY)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}\n"
        # one process (no `-n`: xdist stays loaded for its `worker_id`), no cache; warnings are not failures
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore"]\n'
        # torch in the tests: each mutant's process is forked from a server that has not run them (fork-safe)
        'process_isolation = "forkserver"\n'
    )


def copy_checkout(work: Path, rev: str | None = None) -> None:
    """`work`, anew: the checkout's gcc/, tests/, pyproject.toml and ALSO_COPY (with `rev`: that commit's tree)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if rev:
        tree = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=tree, check=True)
        return
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ["gcc", "tests", "pyproject.toml", *ALSO_COPY]:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, work / name)


def prepare(module: str, target: Target, work: Path, rev: str | None = None) -> tuple[str, ...]:
    """`work`: the checkout's files mutmut reads (gcc/, tests/, pyproject.toml with the section), anew each run;
    with `rev`, the repository's tree at that commit (`git archive`: the score before a change). Returns the test
    selection, less the files that tree does not have (a test module added since)."""
    copy_checkout(work, rev)
    tests = tuple(t for t in target.tests if not t.startswith("tests/") or (work / t.split("::")[0]).exists())
    selected = Target(tests, target.functions)
    with open(work / "pyproject.toml", "a") as f:
        f.write(config(module, selected))
    return tests


def results(work: Path, mutmut: str) -> dict[str, str]:
    """Each mutant's outcome, by mutmut's `results --all` (killed, survived, no tests, timeout, ...)."""
    out = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True, check=True)
    return dict(re.findall(r"^\s+(\S+): (.+)$", out.stdout, re.M))


def report(module: str, outcomes: dict[str, str]) -> None:
    counts = Counter(outcomes.values())
    killed, live, same = scored(module, outcomes)
    print(f"\n{module}: {len(outcomes)} mutants, {dict(counts)}")
    print(f"judged in docs/mutation.md: {same} equivalent; score {killed}/{live} = {killed / max(live, 1):.1%}")
    calls = judged(module)
    for k in sorted(k for k, v in outcomes.items() if v not in KILLED and k not in calls):
        print(f"  not killed: {k} ({outcomes[k]})")


def print_table(rev: str) -> None:
    """docs/mutation.md's rows: each module's mutants (those of its scope now), killed and the score before (its
    record at `rev`: killed of run) and after (its record now), the equivalent ones after; "–" where a record is
    missing; "(N drawn)" where a run was a sample (`--sample`). Both scores read today's judgements by mutant
    name (a renamed module's older names match none)."""
    for module in MODULES:
        work = ROOT / "runs" / "mutants" / module.removesuffix(".py").replace("/", ".")
        kept = {}
        for when, name in (("before", f"{work.name}{at(rev)}.json"), ("after", f"{work.name}.json")):
            path = work.with_name(name)
            kept[when] = json.loads(path.read_text()) if path.is_file() else None
        cells, scores, same = {}, {}, 0
        for when, record in kept.items():
            if record is None:
                cells[when] = scores[when] = "–"
                continue
            o = record["outcomes"]
            drawn = f" ({len(o)} drawn)" if "of" in record else ""
            if when == "after" and record["sha256"] != hashlib.sha256((ROOT / module).read_bytes()).hexdigest():
                drawn += ", stale: the module changed since"
            cells[when] = f"{sum(v in KILLED for v in o.values())} of {len(o)}{drawn}"
            killed, live, equivalent = scored(module, o)
            scores[when] = f"{killed / live:.0%}" if live else "–"
            if when == "after":
                same = equivalent
        newest = kept["after"] or kept["before"] or {}
        total = newest.get("of") or len(newest.get("outcomes", ())) or "–"
        scope = " (part)" if MODULES[module].functions else ""
        print(
            f"| `{module}`{scope} | {total} | {cells['before']} | {scores['before']} | {cells['after']} | {same} "
            f"| {scores['after']} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("module", nargs="?", choices=sorted(MODULES), help="the module, as a path under the checkout")
    p.add_argument("--table", metavar="REV", help="print docs/mutation.md's score rows from the kept records instead")
    p.add_argument("--rev", default=None, help="mutate and test the tree of this commit instead (a score before)")
    p.add_argument(
        "--again",
        action="store_true",
        help="run only the mutants that the last run did not kill, against the tests as they are now (the module "
        "itself unchanged): after tests were added",
    )
    p.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="run N of the module's mutants, drawn by a generator seeded by the module's name (the same N every "
        "time): the score of a random sample, where the whole takes hours",
    )
    args = p.parse_args(argv)
    if args.table:
        print_table(args.table)
        return 0
    if args.module is None:
        p.error("name a module (or --table REV)")
    target = MODULES[args.module]
    # the scratch copy and each mutant's outcome, kept for `--again` (with --rev: the score before, kept apart, so
    # that a run before and one after can go at once)
    work = ROOT / "runs" / "mutants" / (args.module.removesuffix(".py").replace("/", ".") + at(args.rev))
    record = work.with_name(work.name + ".json")
    path = target.was if args.rev and target.was else args.module  # the module as that commit has it
    source = (
        subprocess.run(["git", "show", f"{args.rev}:{path}"], cwd=ROOT, capture_output=True, check=True).stdout
        if args.rev
        else (ROOT / args.module).read_bytes()
    )
    digest = hashlib.sha256(source).hexdigest()
    prefix = mutant_prefix(path)
    scope = [prefix + f for f in target.functions] if target.functions else [prefix + "*"]
    before: dict[str, str] = {}
    names = scope
    total = None
    if args.again:
        kept = json.loads(record.read_text())
        total = kept.get("of")
        if kept["sha256"] != digest:
            p.error(f"{args.module} changed since its last run ({record}): run it whole")
        before = kept["outcomes"]
        names = sorted(k for k, v in before.items() if v not in KILLED)
        if not names:
            report(args.module, before)
            return 0
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    tests = prepare(path, target, work, args.rev)
    print(f"{args.module}{f' at {args.rev}' if args.rev else ''}: tests {' '.join(tests)}", flush=True)
    if args.sample and not args.again:
        # mutmut makes the mutants (and learns which tests reach each function) on a run that selects none
        subprocess.run([mutmut, "run", "--max-children", "1", prefix + "none"], cwd=work, capture_output=True)
        every = sorted(k for k in results(work, mutmut) if any(fnmatch.fnmatch(k, n) for n in names))
        total = len(every)
        names = sorted(random.Random(args.module).sample(every, min(args.sample, total)))
    run = subprocess.run([mutmut, "run", "--max-children", "1", *names], cwd=work)
    if run.returncode != 0:
        return run.returncode
    got = {k: v for k, v in results(work, mutmut).items() if any(fnmatch.fnmatch(k, n) for n in names)}
    outcomes = {**before, **got}
    kept = {"sha256": digest, "outcomes": outcomes, **({"of": total} if total else {})}
    record.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    report(args.module, outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
