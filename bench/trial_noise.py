"""How often adaptive batching's size trial (pipeserve/batching/policy.py ``SizeTrial``, the rule as it runs) keeps a
smaller batch size that is truly dearer per row, when each batch's cost has Gaussian noise: a simulation, no model.

    .venv/bin/python -m bench.trial_noise [--noise 0.08] [--trials 20000]

The smaller size (1) is the candidate against batches of 2 in use; it wins ties within 2% (``TIE``). A second table
runs trials in sequence, as the batcher does, and counts how often the size in use after a trial is the dearer one:
by that trial's verdict alone (``SizeTrial.winner``, the rule before ``TrialHistory``) and by the median of the
pair's last 5 trials (``TrialHistory``, the batcher's rule).
"""

from __future__ import annotations

import argparse
import random

from pipeserve.batching.policy import SizeTrial, TrialHistory


def smaller_kept(gap: float, noise: float, trials: int, rng: random.Random, rounds: int, block: int) -> float:
    """The share of trials that pick size 1 when it costs ``1 + gap`` per row against 1.0 for size 2."""
    kept = 0
    for _ in range(trials):
        trial = SizeTrial(incumbent=2, candidate=1, rounds=rounds, block=block)
        while (size := trial.next_size) is not None:
            per_row = (1.0 + gap if size == 1 else 1.0) + rng.gauss(0.0, noise)
            trial.record(size, per_row * size)
        kept += trial.winner() == 1
    return kept / trials


def dearer_in_use(gap: float, noise: float, trials: int, rng: random.Random) -> tuple[float, float]:
    """Trials of sizes 2 and 4 in sequence, 4 cheaper per row by ``gap``: the share of trials after which size 2 is
    in use, by each trial's verdict alone and by ``TrialHistory``."""
    history = TrialHistory()
    alone = kept = 0
    size = 2
    for _ in range(trials):
        trial = SizeTrial(incumbent=size, candidate=4 if size == 2 else 2)
        while (planned := trial.next_size) is not None:
            trial.record(planned, ((1.0 - gap if planned == 4 else 1.0) + rng.gauss(0.0, noise)) * planned)
        alone += trial.winner() == 2
        size = history.add(trial)
        kept += size == 2
    return alone / trials, kept / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, default=0.08, help="per-batch noise, a fraction of the cost")
    parser.add_argument("--trials", type=int, default=20000)
    args = parser.parse_args()
    rng = random.Random(0)
    print(f"per-batch noise {args.noise:.0%}; share of trials that keep size 1 when it is dearer per row by:\n")
    print("| trial | batches counted per size | equal | 5% | 10% |")
    print("|---|---:|---:|---:|---:|")
    for rounds, block in ((4, 2), (4, 3), (8, 2)):
        shares = [smaller_kept(gap, args.noise, args.trials, rng, rounds=rounds, block=block) for gap in (0, 0.05, 0.1)]
        name = f"{rounds} blocks of {block} each" + (" (the default)" if (rounds, block) == (4, 2) else "")
        cells = " | ".join(f"{share:.0%}" for share in shares)
        print(f"| {name} | {rounds * (block - 1)} | {cells} |")
    print("\nTrials in sequence, sizes 2 and 4, 4 cheaper per row: share of trials after which 2 (dearer) is in use\n")
    print("| 4 cheaper by | one trial's verdict (tie band) | median of the last 5 trials (the batcher) |")
    print("|---:|---:|---:|")
    for gap in (0.0, 0.03, 0.05, 0.10):
        alone, history = dearer_in_use(gap, args.noise, args.trials // 10, rng)
        print(f"| {gap:.0%} | {alone:.0%} | {history:.0%} |")


if __name__ == "__main__":
    main()
