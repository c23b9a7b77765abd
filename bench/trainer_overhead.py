"""What Composer + our callbacks + logging cost per step: gcc/train.py vs a bare PyTorch loop, same run.

    .venv/bin/python bench/trainer_overhead.py [--steps 100] [--rounds 2] [--turn 10] [--shards DIR]

Both sides use the same tiny model, the same shards, the same loader (GcStreamingDataset, 1 worker), the same
batch split (global 8 = micro 2 × accumulation 4, one process) and the same optimizer; validation, exports and
checkpoints are off so only the per-step machinery differs. Two figures, measured the same way on both sides over
the steps after the first 10: the period (wall time between the ends of consecutive steps: everything Composer
does between steps included; the ratio of these is the target) and the in-step time (from asking the loader for
a batch to the end of the optimizer step), with its data-wait share. Target: period gcc/train.py / bare <= 1.10.

The two sides take turns of `--turn` steps (about a second each): gcc/train.py runs in a child process that
waits at the end of every turn (a callback blocks on a pipe) while the bare loop runs its turn in this process,
and the other way round. The machine's speed drifts by more than 10 % over seconds on a shared host, so whole
runs one after the other compare different moments; turns this short put both sides in the same ones. The
period of the first step after each wait is left out on both sides. `--rounds` repeats the whole with a fresh
gcc/train.py process (a process's own layout varies it by a few %).

Where the difference goes: gcc/train.py's callbacks, logger calls, Composer event dispatch and per-batch
bookkeeping, model forward/loss, backward and optimizer step are wrapped with timers (exclusive time: a
callback's logger calls count as the logger's), so the bench prints each component in ms per step beside the
same compute measured in the bare loop. The timers add a few microseconds per call to gcc's side.
"""

from __future__ import annotations

import argparse
import collections
import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WARM = 10
COMPUTE = ("model forward + loss", "backward", "grad clip", "optimizer step")
OVERRIDES = [
    "global_train_batch_size=8",
    "device_train_microbatch_size=2",
    "eval_interval=0",
    "export_every=0",
    "save_interval=100000",
    "progress_bar=false",
    "data.num_workers=1",
]
PACER = "callback Pacer"


def waits_after(steps: int, turn: int) -> list[int]:
    """The steps after which a side waits for the other: WARM, then every `turn` steps, the last one included."""
    return list(range(WARM, steps, turn)) + [steps]


class Turns:
    """This process's end of the two pipes: `hand_over()` lets the other side run its turn and returns when that
    turn is over."""

    def __init__(self, read_fd: int, write_fd: int):
        self.r, self.w = read_fd, write_fd

    def wait(self) -> None:
        if os.read(self.r, 1) != b"g":
            raise SystemExit("trainer_overhead: the other side is gone")

    def go(self) -> None:
        os.write(self.w, b"g")

    def hand_over(self) -> None:
        self.go()
        self.wait()


def bare_loop(cfg, steps: int, turns: Turns, turn: int):
    """The bare side: it starts when gcc/train.py first waits (after its warm-up) and runs its turn before
    each of gcc/train.py's."""
    import torch

    from gcc.data.dataset import fetch_text_table
    from gcc.data.text_table import TextTable
    from gcc.training.builders import build_model, build_optimization, build_train_loader, cache_dir

    torch.set_num_threads(os.cpu_count() or 1)
    text = TextTable(fetch_text_table(cfg.data.path, cache_dir(cfg)))
    model = build_model(cfg, text, fsdp=False)
    opt, schedule = build_optimization(cfg, model)
    sched = schedule["schedulers"]
    loader = build_train_loader(cfg, cfg.per_rank_batch(1))
    waits = set(waits_after(steps, turn))
    step_t, data_t, end_t = [], [], []
    parts = collections.defaultdict(float)  # COMPUTE labels, summed over the steps after WARM
    turns.wait()  # gcc/train.py has done its warm-up
    while len(step_t) < steps:
        it = iter(loader)
        while len(step_t) < steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t_data = time.perf_counter() - t0
            n = len(batch["clip_id"])
            t = {c: 0.0 for c in COMPUTE}
            for i in range(0, n, cfg.device_train_microbatch_size):
                mb = {k: v[i : i + cfg.device_train_microbatch_size] for k, v in batch.items()}
                t1 = time.perf_counter()
                loss = model.loss(model(mb), mb) * (len(mb["clip_id"]) / n)
                t2 = time.perf_counter()
                loss.backward()
                t[COMPUTE[0]] += t2 - t1
                t[COMPUTE[1]] += time.perf_counter() - t2
            t1 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.algorithms.gradient_clipping.clipping_threshold)
            t2 = time.perf_counter()
            opt.step()
            t[COMPUTE[2]] += t2 - t1
            t[COMPUTE[3]] += time.perf_counter() - t2
            sched.step()
            opt.zero_grad(set_to_none=True)
            if len(step_t) >= WARM:
                for c, v in t.items():
                    parts[c] += v
            step_t.append(time.perf_counter() - t0)
            data_t.append(t_data)
            end_t.append(time.time())
            if len(step_t) in waits and len(step_t) > WARM:  # our turn is over: gcc/train.py runs its next
                turns.hand_over()
    turns.go()  # gcc/train.py finishes (its final save) alone
    return step_t, data_t, end_t, dict(parts)


def profiled_train(out: str, read_fd: int, write_fd: int, turn: int, argv: list[str]) -> int:
    """gcc/train.py's main in this process, with exclusive wall time summed per component into `out` (JSON), over
    the same steps as the periods (from step WARM's BATCH_END to the last step's), taking turns with the bare
    loop (a callback waits at BATCH_END after each turn)."""
    import torch
    from composer.core import Callback, Engine, Event
    from composer.loggers import Logger
    from composer.trainer import Trainer

    from gcc.compat.composer import LeanEngine
    from gcc.model.objective import GcTrainModel
    from gcc.training import builders
    from gcc.training.callbacks.grad_clip import GradClip
    from gcc.training.entry import main

    totals: dict[str, float] = collections.defaultdict(float)
    marks: dict[str, dict[str, float]] = {}  # totals as BATCH_END begins: at step WARM, and at the latest step
    stack: list[list] = []  # [label, start, time spent in nested timed calls]
    turns = Turns(read_fd, write_fd)

    class Pacer(Callback):
        def __init__(self, steps: int):
            self.waits = set(waits_after(steps, turn))

        def batch_end(self, state, logger) -> None:
            if int(state.timestamp.batch) in self.waits:
                turns.hand_over()

    def timed(fn, label):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            name = label(*a) if callable(label) else label
            stack.append([name, time.perf_counter(), 0.0])
            try:
                return fn(*a, **k)
            finally:
                name, t0, inner = stack.pop()
                dt = time.perf_counter() - t0
                totals[name] += dt - inner
                if stack:
                    stack[-1][2] += dt

        return wrapper

    def callback_label(cb, event, state, logger):
        return COMPUTE[2] if isinstance(cb, GradClip) else f"callback {type(cb).__name__}"

    def marking(run_event):
        @functools.wraps(run_event)
        def wrapper(engine, event):
            if event == Event.BATCH_END and not stack:  # the outer dispatch (LeanEngine may defer to Engine's)
                marks["warm" if int(engine.state.timestamp.batch) == WARM else "last"] = dict(totals)
            return run_event(engine, event)

        return wrapper

    def with_pacer(build_callbacks):
        @functools.wraps(build_callbacks)
        def wrapper(cfg, *a, **k):
            built = build_callbacks(cfg, *a, **k)
            built.callbacks.append(Pacer(cfg.max_steps))
            return built

        return wrapper

    builders.build_callbacks = with_pacer(builders.build_callbacks)
    Callback.run_event = timed(Callback.run_event, callback_label)
    # Engine's: INIT, when LeanEngine defers, or every event with lean_engine=false
    Engine.run_event = marking(timed(Engine.run_event, "Composer event dispatch"))
    LeanEngine.run_event = marking(timed(LeanEngine.run_event, "Composer event dispatch"))
    Logger.log_table = timed(Logger.log_table, "log_table (CSV + TensorBoard)")
    Logger.log_metrics = timed(Logger.log_metrics, "log_metrics (TensorBoard)")
    Trainer._accumulate_time_across_ranks = timed(Trainer._accumulate_time_across_ranks, "Composer time accounting")
    # in fp32 Composer runs the micro-batches as the optimizer's closure: inside AdamW.step, so time it apart
    Trainer._train_microbatches = timed(Trainer._train_microbatches, "Composer micro-batch loop")
    GcTrainModel.forward = timed(GcTrainModel.forward, COMPUTE[0])
    GcTrainModel.loss = timed(GcTrainModel.loss, COMPUTE[0])
    torch.Tensor.backward = timed(torch.Tensor.backward, COMPUTE[1])
    torch.optim.AdamW.step = timed(torch.optim.AdamW.step, COMPUTE[3])
    code = main(argv)
    # steps WARM+1 .. last, as the periods: the final checkpoint and export come after the last step's row
    Path(out).write_text(json.dumps({k: v - marks["warm"].get(k, 0.0) for k, v in marks["last"].items()}))
    return code


def paced_round(cfg, run_dir: Path, common: list[str], steps: int, turn: int):
    """One round: gcc/train.py (child) and the bare loop (here) in turns. Returns each side's
    (periods, in-step times, data waits, component seconds)."""
    to_child_r, to_child_w = os.pipe()
    to_us_r, to_us_w = os.pipe()
    split = run_dir.with_suffix(".split.json")
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--profile_into",
            str(split),
            str(to_child_r),
            str(to_us_w),
            str(turn),
            str(ROOT / "yamls" / "tiny_cpu.yaml"),
            f"run_dir={run_dir}",
            *common,
        ],
        pass_fds=(to_child_r, to_us_w),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(to_child_r)
    os.close(to_us_w)
    try:
        bare = bare_loop(cfg, steps, Turns(to_us_r, to_child_w), turn)
    except SystemExit:
        bare = None
    err = child.communicate()[1]
    if child.returncode or bare is None:
        sys.exit(f"gcc/train.py failed:\n{err[-3000:]}")
    os.close(to_us_r)
    os.close(to_child_w)
    with open(run_dir / "train_log.csv", newline="") as f:
        log = list(csv.DictReader(f))
    ours = (
        [float(x["step_time"]) for x in log],
        [float(x["data_time"]) for x in log],
        [float(x["time"]) for x in log],
        json.loads(split.read_text()),
    )
    waits = set(waits_after(steps, turn))
    out = {}
    for side, (step_t, data_t, end_t, parts) in (("bare PyTorch", bare), ("gcc/train.py", ours)):
        # step i (1-based) ends at end_t[i - 1]; leave out the first step after each wait
        period = [end_t[i - 1] - end_t[i - 2] for i in range(WARM + 1, steps + 1) if i - 1 not in waits]
        out[side] = (period, step_t[WARM:], data_t[WARM:], parts)
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--profile_into":  # the gcc side's child process (paced_round)
        out, r, w, turn, *argv = sys.argv[2:]
        sys.exit(profiled_train(out, int(r), int(w), int(turn), argv))
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2, help="fresh gcc/train.py processes, one after the other")
    ap.add_argument("--turn", type=int, default=10, help="steps each side runs before the other takes its turn")
    ap.add_argument("--shards", default="", help="a converted dataset (default: synthesize 48 tiny clips)")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides, e.g. lean_engine=false (Composer's engine)")
    args = ap.parse_args()

    from gcc.training.config import load_config

    sides = ("bare PyTorch", "gcc/train.py")
    times = {side: {"period": [], "step": [], "data": []} for side in sides}
    split = {side: collections.defaultdict(float) for side in sides}  # seconds summed over rounds
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = args.shards
        if not shards:
            from gcc.data.convert import convert
            from gcc.synth import world as synth

            src = synth.write_prepared(tmp / "prepared", clips=48, geometry="tiny", seed=0)
            shards = str(tmp / "shards")
            convert(src, shards, progress=False)
        common = [f"data.path={shards}", f"max_duration={args.steps}", *OVERRIDES, *args.overrides]
        for r in range(args.rounds):
            cfg = load_config(ROOT / "yamls" / "tiny_cpu.yaml", [f"run_dir={tmp / f'bare{r}'}", *common])
            periods = {}
            for side, (period, step_t, data_t, parts) in paced_round(
                cfg, tmp / f"train{r}", common, args.steps, args.turn
            ).items():
                times[side]["period"] += period
                times[side]["step"] += step_t
                times[side]["data"] += data_t
                split[side]["data wait"] += sum(data_t)
                for k, v in parts.items():
                    if k != PACER:
                        split[side][k] += v
                periods[side] = statistics.mean(period)
            ratios.append(periods["gcc/train.py"] / periods["bare PyTorch"])
            print(
                f"round {r + 1}: bare {periods['bare PyTorch']:.4f} s/step, gcc/train.py "
                f"{periods['gcc/train.py']:.4f} s/step, ratio {ratios[-1]:.3f}",
                flush=True,
            )

    n_steps = args.rounds * (args.steps - WARM)
    print(
        f"tiny model, global batch 8 (micro 2 × accumulation 4), 1 process, steps {WARM + 1}..{args.steps} in "
        f"turns of {args.turn}, {args.rounds} round(s); periods over {len(times[sides[0]]['period'])} steps a side"
    )
    print(f"{'':16}{'period s/step':>15}{'steps/s':>10}{'in-step s':>12}{'data_time/step_time':>22}")
    mean = {}
    for side, t in times.items():
        mean[side] = statistics.mean(t["period"])
        step = statistics.mean(t["step"])
        print(
            f"{side:16}{mean[side]:>15.4f}{1 / mean[side]:>10.2f}{step:>12.4f}"
            f"{statistics.mean(t['data']) / step:>22.3f}"
        )

    print(f"\nwhere the time goes, ms per step ({'gcc: exclusive time of each wrapped call'})")
    print(f"{'component':40}{'bare':>9}{'gcc':>9}{'gcc - bare':>12}")
    ms = {side: {k: 1e3 * v / n_steps for k, v in split[side].items()} for side in sides}
    for side in sides:
        ms[side]["period"] = 1e3 * mean[side]
    labels = ["data wait", *COMPUTE] + sorted(
        k for k in ms["gcc/train.py"] if k not in ("period", "data wait", *COMPUTE)
    )
    for k in labels:
        b, g = ms["bare PyTorch"].get(k, 0.0), ms["gcc/train.py"].get(k, 0.0)
        print(f"{k:40}{b:>9.2f}{g:>9.2f}{g - b:>+12.2f}")
    rest = {side: ms[side]["period"] - sum(v for k, v in ms[side].items() if k != "period") for side in sides}
    print(
        f"{'not in any of the above (loop, loader)':40}{rest[sides[0]]:>9.2f}{rest[sides[1]]:>9.2f}"
        f"{rest[sides[1]] - rest[sides[0]]:>+12.2f}"
    )
    print(
        f"{'period':40}{ms[sides[0]]['period']:>9.2f}{ms[sides[1]]['period']:>9.2f}"
        f"{ms[sides[1]]['period'] - ms[sides[0]]['period']:>+12.2f}"
    )
    print(
        f"ratio gcc/train.py / bare (period): {mean['gcc/train.py'] / mean['bare PyTorch']:.3f} "
        f"(rounds {', '.join(f'{x:.3f}' for x in ratios)}; target <= 1.10)"
    )


if __name__ == "__main__":
    main()
