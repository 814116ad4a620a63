"""What stepping only a word table's touched rows saves AdamW (trainables.training.optimizer.RowAdamW):
the same STS-B training steps on two copies of one model, `rows` (RowAdamW, what build_optimizer gives)
against `torch` (torch.optim.AdamW, fused, with the same groups), in one process.

First, the word table alone: torch's fused step over the whole table against the row step when a given
share of its rows has been touched (the best of five steps each), which is what RowAdamW's ROW_SHARE
(up to which share it takes the row step) rests on. Then the two sides take turns (rows, torch on even
turns; torch, rows on odd ones), each turn timing `--steps` steps after two warm-up steps, every step
seeded by its number so that both sides draw the same dropout masks; per side it prints the ms per step
of every turn, the best and its ratio to torch's; then the share of the table's rows touched, and whether
the two models' weights are the same to the bit after every step of every turn.

`--vocabulary N` gives the model a word table of N rows (its blocks as they are, random weights for all,
as speed does not depend on them): the size of a multilingual model's table (paraphrase-multilingual-
MiniLM-L12-v2 is all-MiniLM-L12-v2's shape with 250,037 rows; `--layers 12` on MiniLM). The model's own
tokenizer still cuts the sentences; its ids are spread over the N rows by a fixed permutation, so the rows
a step touches lie across the whole table as a large vocabulary's do.

    python benchmarks/row_adamw.py --data-dir ../shared/data [--model mpnet] [--vocabulary 250037 --layers 12]
"""

from __future__ import annotations

import tempfile
import time

import torch
from profile_step import MODELS, best_of, check_turns, stsb_steps, turns_parser  # benchmarks/, this folder

import trainables.training.optimizer as row_optimizer
from trainables.models.embedding_grad import RowGradEmbedding
from trainables.models.encoder import build_sentence_encoder, encoder_depth, load_config, load_tokenizer
from trainables.runtime import resolve_precision
from trainables.training.bi_encoder import build_optimizer, train_step

SIDES = ("rows", "torch")
SHARES = (0.05, 0.1, 0.2, 0.3, 0.4)
LR, DECAY = 2e-5, 0.01


def resized(name: str, vocabulary: int | None, layers: int | None, folder: str) -> str:
    """`name` as it is, or a random model of its shape with `vocabulary` rows and `layers` blocks, saved
    to `folder` with the model's own tokenizer."""
    if vocabulary is None and layers is None:
        return name
    from transformers import AutoModel

    config = load_config(name)
    if vocabulary is not None:
        config.vocab_size = vocabulary
    if layers is not None:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    load_tokenizer(name).save_pretrained(folder)
    return folder


def spread(vocabulary: int, rows: int, pad_id: int) -> torch.Tensor:
    """A fixed map of the tokenizer's ids onto `rows` table rows: the padding id kept, every other id on a
    row of its own drawn across the table."""
    others = torch.tensor([row for row in range(rows) if row != pad_id])
    picked = others[torch.randperm(len(others), generator=torch.Generator().manual_seed(0))]
    mapping = torch.empty(vocabulary, dtype=torch.long)
    mapping[torch.arange(vocabulary) != pad_id] = picked[: vocabulary - 1]
    mapping[pad_id] = pad_id
    return mapping


def table_alone(rows: int, hidden: int, repeats: int = 5) -> tuple[float, dict[float, float]]:
    """ms of torch's fused AdamW step over a `rows` x `hidden` table, and of RowAdamW's row step at each
    share of SHARES touched (the best of `repeats` steps; the row step taken whatever the share)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(rows, hidden, generator=generator)
    saved, row_optimizer.ROW_SHARE = row_optimizer.ROW_SHARE, 1.0
    try:
        table = RowGradEmbedding.replacing(torch.nn.Embedding(rows, hidden))
        table.weight = torch.nn.Parameter(weight.clone())
        plain = torch.nn.Parameter(weight.clone())
        theirs = torch.optim.AdamW([plain], lr=LR, weight_decay=DECAY, fused=True)
        plain.grad = torch.zeros_like(plain)
        best_torch = best_of(lambda: theirs.step(), repeats)
        ours_by_share = {}
        for share in SHARES:
            touched = torch.randperm(rows, generator=generator)[: int(share * rows)]
            ours = row_optimizer.RowAdamW([table.weight], lr=LR, weight_decay=DECAY, fused=True)

            def step(ours=ours, touched=touched):
                table.weight.grad = None
                table(touched).sum().backward()
                started = time.perf_counter()
                ours.step()
                return time.perf_counter() - started

            step()  # torch's step makes the state; the row step from here
            ours_by_share[share] = 1000 * min(step() for _ in range(repeats))
    finally:
        row_optimizer.ROW_SHARE = saved
    return 1000 * best_torch, ours_by_share


def main() -> None:
    parser = turns_parser(__doc__, 3)
    parser.add_argument("--vocabulary", type=int, help="a word table of this many rows (random weights)")
    parser.add_argument("--layers", type=int, help="this many blocks (random weights)")
    args = parser.parse_args()
    check_turns(parser, args)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers {args.layers}: give 1 or more")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    dtype = resolve_precision("auto", device)
    name = MODELS.get(args.model, args.model)
    vocabulary = len(load_tokenizer(name))
    if args.vocabulary is not None and args.vocabulary < vocabulary:
        parser.error(f"--vocabulary {args.vocabulary}: give at least the tokenizer's {vocabulary} "
                     "rows, so that every token id has a row")
    with tempfile.TemporaryDirectory() as folder:
        path = resized(name, args.vocabulary, args.layers, folder)
        models = {side: build_sentence_encoder(path, encoder_depth(load_config(path)), "mean", seed=0,
                                               dropout_masks="fast").train() for side in SIDES}
    run = stsb_steps(name, args.data_dir, models["rows"], args.steps)
    table = models["rows"].encoder.get_input_embeddings().weight
    mapping = (torch.arange(vocabulary) if args.vocabulary is None
               else spread(vocabulary, table.shape[0], run.tokens.pad_id))
    optimizers = {"rows": build_optimizer(list(models["rows"].named_parameters()), LR, DECAY)}
    groups = build_optimizer(list(models["torch"].named_parameters()), LR, DECAY).param_groups
    optimizers["torch"] = torch.optim.AdamW(groups, lr=LR, fused=True)
    schedules = {side: torch.optim.lr_scheduler.LambdaLR(optimizers[side], lambda step: 1.0) for side in SIDES}

    def batch(rows):
        token_lists, targets = run.batch(rows)
        return [mapping[torch.tensor(ids)].tolist() for ids in token_lists], targets

    steps = [batch(rows) for rows in run.batches]
    done = dict.fromkeys(SIDES, 0)

    def train(side: str, chosen) -> None:
        for token_lists, targets in chosen:
            torch.manual_seed(done[side])  # the same masks on both sides for the same step
            done[side] += 1
            train_step(models[side], run.loss_fn, optimizers[side], schedules[side], token_lists, targets,
                       run.tokens.pad_id, device, dtype, 1.0)

    print(f"torch {torch.__version__}, {args.threads} threads, precision auto -> {str(dtype).split('.')[-1]}; "
          f"{name.split('/')[-1]}" + (f" with {args.layers} blocks" if args.layers else "")
          + f", a word table of {table.shape[0]:,} x {table.shape[1]} "
          f"({table.numel() / sum(p.numel() for p in models['rows'].parameters()):.0%} of its parameters), "
          f"weight decay {DECAY}; RowAdamW takes the row step up to {row_optimizer.ROW_SHARE:.0%} of the rows touched")
    whole, by_share = table_alone(*table.shape)
    print(f"the table alone: torch's fused step {whole:.2f} ms; the row step with "
          + ", ".join(f"{share:.0%} touched {ms:.2f} ms ({whole / ms:.2f}x)" for share, ms in by_share.items()))
    for side in SIDES:
        train(side, steps[:2])  # warm-up
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for turn in range(args.turns):
        for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
            started = time.perf_counter()
            train(side, steps[2:])
            times[side].append(1000 * (time.perf_counter() - started) / len(steps[2:]))
    for side in SIDES:
        print(f"{side:>6}: " + " ".join(f"{t:.1f}" for t in times[side]) + f" ms/step, best {min(times[side]):.1f} "
              f"({min(times['torch']) / min(times[side]):.2f}x torch's)")
    seen = optimizers["rows"]._seen.get(table)
    share = f"{float(seen.float().mean()):.1%}" if seen is not None else "not noted (torch's step throughout)"
    differences = [float((a.detach() - b.detach()).abs().max())
                   for a, b in zip(models["rows"].parameters(), models["torch"].parameters(), strict=True)]
    same = all(d == 0 for d in differences)
    print(f"rows of the table touched after {done['rows']} steps: {share}; the two sides' weights after them: "
          + ("the same to the bit" if same else f"differ, by at most {max(differences):.3g}"))


if __name__ == "__main__":
    main()
