"""Where a training step and an evaluation spend their time, and how close they run to the machine's
measured matmul peak.

1. The peak: square matmuls (1024^2, 2048^2 and 4096^2 by default) in bf16 and fp32 on this machine's
   threads, the best of several runs, in GFLOP/s; and a matmul of the model's feed-forward shape (the
   denominator of the fractions), the best of 20 runs, measured before and after each timing.
2. One `finetune` epoch's steps at the model's full depth (`--model minilm`: all-MiniLM-L6-v2, k=6;
   `--model mpnet`: all-mpnet-base-v2, k=12; STS-B train batches of 32 pairs in our length-grouped
   order, bf16 autocast where fast): the FLOPs of a step counted by torch's FlopCounterMode
   (forward and backward, on the eager model), the measured step time, so the achieved GFLOP/s and
   the fraction of the peak; and torch.profiler's split of the step (batching, forward, backward,
   optimizer) with the top operators; the step's time is the best of `--repeats` passes over the same
   steps (3 by default). `--compile` times the step with the encoder under
   `torch.compile(dynamic=True)` (inductor), the compile time printed apart (the evaluation in part 3
   stays eager, as the evaluator runs it: inductor cannot lower its packed linear layers).
3. The same for the evaluator's encoding of STS-B test (no gradients, chunks as the evaluator cuts
   them, linear layers on packed weights as the evaluator runs them; `--evaluation-only` skips the
   training step), under bf16 autocast and in fp32 (what dev and test are scored in by default): sentences/s
   with evaluation's unfused attention and with SDPA's fused kernel, the fraction of that dtype's
   model-shaped matmul, the top operators.
4. For both: the matmuls' own share. One more pass (of the steps; of the encoding) with every matmul call
   (mm, addmm, bmm, matmul, oneDNN's packed linear) timed where it runs, and run again at once twice more,
   its best kept (operands hot in cache): their FLOPs over their summed time is the rate the matmuls
   themselves reach, so the fraction the whole would reach were everything but its matmuls free (the
   ceiling no other lever can lift).
5. For the step, a floor: its counted FLOPs at the model-shaped rate, plus the fused AdamW step over every
   parameter and (bf16) autocast's casts of the linear weights and their gradients, each timed alone at
   its best. Mixed precision with fp32 weights and AdamW pay those two every step, whatever runs the rest,
   so their sum bounds the fraction a step can reach on this machine; with the matmuls' own best (part 4)
   in place of the model-shaped rate, the tighter bound.

    python benchmarks/profile_step.py --data-dir ../shared/data [--model mpnet] [--compile]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import get_linear_schedule_with_warmup

from trainables.data.tasks import load_task
from trainables.models.batching import EVAL_TOKENS_PER_CHUNK, TokenCache, encode_tokens
from trainables.models.encoder import build_sentence_encoder, encoder_depth, load_config, load_tokenizer
from trainables.models.packed import packed_linears
from trainables.objectives.sts import CosineMSELoss
from trainables.runtime import autocast, clip_gradients, resolve_precision
from trainables.training.bi_encoder import build_optimizer, epoch_batches, pair_lengths, train_step

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}


def best_of(work, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `work`, after one untimed call."""
    work()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def matmul_peak(dtype: torch.dtype, m: int, k: int | None = None, n: int | None = None, repeats: int = 5) -> float:
    """GFLOP/s of the best of `repeats` (m x k) @ (k x n) matmuls (square when k, n are not given)."""
    k, n = k or m, n or m
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / best_of(lambda: torch.matmul(a, b), repeats) / 1e9


def shaped_peak(dtype: torch.dtype, hidden: int, inner: int) -> float:
    """GFLOP/s of a matmul of the model's feed-forward shape (~1,000 tokens, hidden <-> inner), the
    best of 20 runs each way: the denominator of every fraction, so a short slow spell of a shared
    machine must not lower it (with 5 runs one read 216 GFLOP/s where the same run's square bf16 peak was
    402 and its evaluation's read of this shape 385)."""
    return max(matmul_peak(dtype, 1024, hidden, inner, repeats=20), matmul_peak(dtype, 1024, inner, hidden, repeats=20))


def cast_by_autocast(model: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters bf16 autocast converts in a forward: every linear layer's weight and bias (embeddings
    and layer norms run in fp32)."""
    return [t for m in model.modules() if isinstance(m, torch.nn.Linear) for t in (m.weight, m.bias) if t is not None]


def step_floor(model: torch.nn.Module, dtype: torch.dtype, repeats: int = 5) -> SimpleNamespace:
    """Two parts of a mixed-precision AdamW step that no kernel choice takes out, each timed alone at its
    best (so a floor: in a step their operands come cold from memory): `adamw`, the fused AdamW step over
    every parameter (on copies, each with a gradient: the model and its optimizer are left as they were),
    and `casts`, under bf16 autocast, each linear layer's weight and bias converted to bf16 and a gradient
    of each converted back to fp32, as autocast does once a step."""
    params = [(name, p.detach().clone().requires_grad_()) for name, p in model.named_parameters()
              if p.requires_grad]
    for _, p in params:
        p.grad = torch.randn_like(p).mul_(1e-3)
    optimizer = build_optimizer(params, 2e-5, 0.01)
    optimizer.step()  # the moments are allocated on the first step
    adamw = best_of(optimizer.step, repeats)
    casts = 0.0
    if dtype != torch.float32:
        weights = [t.detach() for t in cast_by_autocast(model)]
        gradients = [t.to(dtype) for t in weights]

        def cast() -> None:
            for t in weights:
                t.to(dtype)
            for g in gradients:
                g.to(torch.float32)

        casts = best_of(cast, repeats)
    return SimpleNamespace(adamw=adamw, casts=casts)


class MatmulTimer(TorchDispatchMode):
    """Times every matmul-class call where it runs (`seconds`) and, with `again` > 0, the best of it and
    `again` immediate reruns on the same operands (`best`); their FLOPs (2 x output elements x the
    contracted size) and count. Other operators pass through untimed."""

    OPS = {"aten.mm.default": 0, "aten.addmm.default": 1, "aten.bmm.default": 0, "aten.baddbmm.default": 1,
           "aten.matmul.default": 0, "mkldnn._linear_pointwise.default": 0,  # the left operand's position
           "aten.linear.default": 0}  # a packed bf16 linear on a CPU without AVX512-BF16 reaches us as this

    def __init__(self, again: int = 2):
        super().__init__()
        self.again, self.seconds, self.best, self.flops, self.calls = again, 0.0, 0.0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        left = self.OPS.get(str(func))
        if left is None:
            return func(*args, **kwargs)
        started = time.perf_counter()
        out = func(*args, **kwargs)
        took = time.perf_counter() - started
        best = took
        for _ in range(self.again):
            started = time.perf_counter()
            func(*args, **kwargs)
            best = min(best, time.perf_counter() - started)
        self.seconds, self.best, self.calls = self.seconds + took, self.best + best, self.calls + 1
        self.flops += 2 * out.numel() * args[left].shape[-1]
        return out

    def report(self, whole: float, shaped: float, count: int, unit: str) -> str:
        """The matmuls' share of `whole` seconds (over `count` `unit`s) and the rates they reach, as
        fractions of the model-shaped matmul `shaped` (GFLOP/s)."""
        def rate(seconds: float) -> str:
            return f"{self.flops / seconds / 1e9:.0f} GFLOP/s = {100 * self.flops / seconds / 1e9 / shaped:.0f} %"

        return (f"its matmuls ({self.calls / count:.0f} calls a {unit}, {self.flops / count / 1e9:.2f} GFLOP): "
                f"{1000 * self.seconds / count:.1f} ms a {unit} where they run ({100 * self.seconds / whole:.0f} % "
                f"of it) -> {rate(self.seconds)} of the model-shaped matmul; each the best of it and "
                f"{self.again} reruns at once: {1000 * self.best / count:.1f} ms -> {rate(self.best)}: the "
                f"ceiling were all but the matmuls free")


def stsb_steps(name: str, data_dir: str, model: torch.nn.Module, steps: int) -> SimpleNamespace:
    """What the step benchmarks train on: STS-B (`data`), its train sentences in a token cache, the
    first `steps` + 2 batches of 32 pairs in our length-grouped order (seed 0; two to warm up), the
    cosine-MSE loss, fused AdamW at 2e-5 and a linear schedule; `batch(rows)` gives a batch's token
    lists (first sentences, then second) and targets."""
    data = load_task("stsb", None, data_dir)
    tokens = TokenCache(load_tokenizer(name), 128)
    first, second = list(data.train.sentence1), list(data.train.sentence2)
    tokens.add(first + second)
    targets = torch.as_tensor(data.train.score.to_numpy().copy(), dtype=torch.float32)
    optimizer = build_optimizer(list(model.named_parameters()), 2e-5, 0.01)

    def batch(rows):
        return [tokens[first[i]] for i in rows] + [tokens[second[i]] for i in rows], targets[rows]

    return SimpleNamespace(data=data, tokens=tokens, first=first, second=second, batch=batch,
                           batches=epoch_batches(pair_lengths(tokens, first, second), 32, 0, True)[: steps + 2],
                           loss_fn=CosineMSELoss(), optimizer=optimizer,
                           scheduler=get_linear_schedule_with_warmup(optimizer, 0, 10_000))


def turns_parser(doc: str, turns: int) -> argparse.ArgumentParser:
    """The options the benchmarks that time STS-B steps in alternating turns share (train_chunks.py,
    clip_norm.py); each adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--model", default="minilm", help="minilm, mpnet or a model folder")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--turns", type=int, default=turns)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser


def check_turns(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A count of steps or turns below 1 is one line, exit 2."""
    if args.steps < 1 or args.turns < 1:
        parser.error(f"--steps {args.steps} --turns {args.turns}: give 1 or more of each")


def turns_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SimpleNamespace:
    """The shared options checked (a count below 1 is one line, exit 2) and applied: the model's name,
    the CPU, `auto` precision and the encoder at full depth with fast dropout masks, in training mode."""
    check_turns(parser, args)
    torch.set_num_threads(args.threads)
    name = MODELS.get(args.model, args.model)
    device = torch.device("cpu")
    model = build_sentence_encoder(name, encoder_depth(load_config(name)), "mean", seed=0, dropout_masks="fast")
    return SimpleNamespace(name=name, device=device, dtype=resolve_precision("auto", device), model=model.train())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--matmul", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed passes over the steps; the best counts (a shared machine's load moves)")
    parser.add_argument("--model", default="minilm", help="minilm, mpnet or a model folder")
    parser.add_argument("--compile", action="store_true",
                        help="time the training step with torch.compile'd encoder (evaluation stays eager)")
    parser.add_argument("--evaluation-only", action="store_true", help="only the evaluation (part 3)")
    parser.add_argument("--dropout-masks", default="fast", choices=["fast", "torch"],
                        help="fast (the default, trainables.models.dropout) or torch's bernoulli_")
    parser.add_argument("--dense-embedding-grad", action="store_true",
                        help="torch's dense word-embedding gradient (a zero-fill per chunk), not the row-wise one")
    args = parser.parse_args()
    name = MODELS.get(args.model, args.model)
    config = load_config(name)
    depth, hidden, inner = encoder_depth(config), config.hidden_size, config.intermediate_size
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    dtype = resolve_precision("auto", device)

    peaks = {name: max(matmul_peak(d, n) for n in args.matmul) for name, d in (("bf16", torch.bfloat16),
                                                                               ("fp32", torch.float32))}
    peak = peaks["bf16" if dtype == torch.bfloat16 else "fp32"]
    # what a matmul of the model's own shape reaches: ~1,000 tokens through its feed-forward (e.g. 384 -> 1536)
    shaped = shaped_peak(dtype, hidden, inner)
    print(f"torch {torch.__version__}, {args.threads} threads, precision auto -> {str(dtype).split('.')[-1]}; "
          f"matmul peak (best of {', '.join(f'{n}^2' for n in args.matmul)}): bf16 {peaks['bf16']:.0f} "
          f"GFLOP/s, fp32 {peaks['fp32']:.0f} GFLOP/s; at the model's feed-forward shape (1024 tokens, {hidden} <-> "
          f"{inner}) {shaped:.0f} GFLOP/s")

    model = build_sentence_encoder(name, depth, "mean", seed=0, dropout_masks=args.dropout_masks).to(device)
    if args.dense_embedding_grad:
        model.encoder.set_input_embeddings(model.encoder.get_input_embeddings().dense())
    run = stsb_steps(name, args.data_dir, model, args.steps)
    data, tokens, first, second, batches = run.data, run.tokens, run.first, run.second, run.batches
    loss_fn, optimizer, scheduler, batch = run.loss_fn, run.optimizer, run.scheduler, run.batch

    runner = {"model": model}  # the eager encoder counts the FLOPs; the timed one may be compiled

    def step(rows):
        ids, y = batch(rows)
        return train_step(runner["model"], loss_fn, optimizer, scheduler, ids, y, tokens.pad_id, device, dtype, 1.0)

    if not args.evaluation_only:
        model.train()
        for rows in batches[:2]:  # warm-up: allocator, oneDNN kernels
            step(rows)
        steps = batches[2:]
        flops = 0
        for rows in steps:
            counter = FlopCounterMode(display=False)
            with counter:
                step(rows)
            flops += counter.get_total_flops()
        if args.compile:
            runner["model"] = torch.compile(model, dynamic=True)
            started = time.perf_counter()
            for rows in steps:  # one pass of the epoch's shapes: what a trial pays once per worker
                step(rows)
            print(f"torch.compile (inductor, dynamic shapes): {time.perf_counter() - started:.1f} s for the first "
                  f"{len(steps)} steps (compilation included)")
        seconds = float("inf")
        for _ in range(args.repeats):  # the best pass, as the matmul peak is the best of its runs
            started = time.perf_counter()
            for rows in steps:
                step(rows)
            seconds = min(seconds, time.perf_counter() - started)
        shaped = max(shaped, shaped_peak(dtype, hidden, inner))  # measured again after the step: the best of both
        n_tokens = sum(len(tokens[first[i]]) + len(tokens[second[i]]) for rows in steps for i in rows)
        achieved = flops / seconds / 1e9
        mode = (("compiled" if args.compile else "eager") + f", dropout masks {args.dropout_masks}, "
                + ("dense" if args.dense_embedding_grad else "row-wise") + " embedding gradient")
        print(f"\ntraining step ({name.split('/')[-1]}, k={depth}, {mode}, 32 pairs, "
              f"{n_tokens / len(steps):.0f} real tokens per step, best of {args.repeats} passes over "
              f"{len(steps)} steps): "
              f"{1000 * seconds / len(steps):.1f} ms, {flops / len(steps) / 1e9:.2f} GFLOP counted (fwd + bwd) -> "
              f"{achieved:.0f} GFLOP/s = {100 * achieved / peak:.0f} % of the matmul peak, "
              f"{100 * achieved / shaped:.0f} % of the model-shaped matmul")
        floor = step_floor(model, dtype)
        matmuls = flops / len(steps) / (shaped * 1e9)
        least = matmuls + floor.adamw + floor.casts
        print(f"  the least a step could take here were all else free: its matmuls at the model-shaped rate "
              f"{1000 * matmuls:.1f} ms + the fused AdamW step alone {1000 * floor.adamw:.1f} ms + autocast's casts "
              f"of the linear weights and of their gradients alone {1000 * floor.casts:.1f} ms = {1000 * least:.1f} ms "
              f"-> at most {100 * matmuls / least:.0f} % of the model-shaped matmul")

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for rows in steps:
                with record_function("1 batching (lookup, pad)"):
                    ids, y = batch(rows)
                    half = len(ids) // 2
                with record_function("2 forward (padding per chunk included)"), autocast(device, dtype):
                    vectors = encode_tokens(runner["model"], ids, tokens.pad_id, device).float()
                    loss = loss_fn(vectors[:half], vectors[half:], y)
                with record_function("3 backward"):
                    loss.backward()
                with record_function("4 optimizer (clip, AdamW, schedule)"):
                    clip_gradients(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
        events = {e.key: e.cpu_time_total for e in prof.key_averages() if e.key[:2] in ("1 ", "2 ", "3 ", "4 ")}
        whole = sum(events.values())
        print("  split of a step: " + ", ".join(f"{k[2:]} {100 * v / whole:.0f} %" for k, v in sorted(events.items())))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=40)
        print("  top operators by self time:\n" + "\n".join("    " + line for line in table.splitlines()[:12]))
        if not args.compile:  # a compiled step's kernels are not torch's matmuls one by one
            timer = MatmulTimer()
            with timer:
                for rows in steps:
                    step(rows)
            print("  " + timer.report(seconds, shaped, len(steps), "step"))
            least = timer.best / len(steps) + floor.adamw + floor.casts
            print(f"  the matmuls' best with the AdamW step and the casts alone added: {1000 * least:.1f} ms "
                  f"-> at most {100 * matmuls / least:.0f} % of the model-shaped matmul")

    model.eval()
    test = list(dict.fromkeys(list(data.test.sentence1) + list(data.test.sentence2)))
    tokens.add(test)
    ids = [tokens[s] for s in test]
    for eval_dtype in [dtype, torch.float32] if dtype != torch.float32 else [dtype]:
        profile_evaluation(model, ids, tokens.pad_id, eval_dtype, peaks, hidden, inner)


def timed_encoding(model, ids, pad_id: int, dtype: torch.dtype, repeats: int = 3) -> float:
    """Seconds of the best of `repeats` encodings of `ids` (after one that warms up and compiles)."""
    device = torch.device("cpu")
    best = float("inf")
    with torch.inference_mode(), autocast(device, dtype):
        for turn in range(repeats + 1):
            started = time.perf_counter()
            with packed_linears(model, device):  # weights packed once per encoding, as the evaluator does
                encode_tokens(model, ids, pad_id, device, EVAL_TOKENS_PER_CHUNK, max_chunk=256, fewest_padded=True)
            best = min(best, time.perf_counter() - started) if turn else best
    return best


def profile_evaluation(model, ids, pad_id: int, dtype: torch.dtype, peaks: dict, hidden: int, inner: int) -> None:
    """The evaluator's encoding in `dtype` (bf16 autocast or fp32, what scoring uses by default): its
    FLOPs, its speed with evaluation's unfused attention and with SDPA's fused kernel, the fraction of
    this dtype's model-shaped matmul, and the top operators."""
    device = torch.device("cpu")
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    shaped = shaped_peak(dtype, hidden, inner)
    with torch.inference_mode(), autocast(device, dtype):
        counter = FlopCounterMode(display=False)
        with counter:  # the same chunks on plain linear layers (the counter does not see oneDNN's packed ones)
            encode_tokens(model, ids, pad_id, device, EVAL_TOKENS_PER_CHUNK, max_chunk=256, fewest_padded=True)
    flops = counter.get_total_flops()
    seconds = timed_encoding(model, ids, pad_id, dtype)
    implementation = model.encoder.config._attn_implementation
    model.encoder.set_attn_implementation("sdpa")
    fused = timed_encoding(model, ids, pad_id, dtype)
    shaped = max(shaped, shaped_peak(dtype, hidden, inner))  # before and after the encodings: the best of both
    model.encoder.set_attn_implementation(implementation)
    achieved = flops / seconds / 1e9
    print(f"\nevaluation in {name} (STS-B test, {len(ids)} distinct sentences, {flops / 1e9:.1f} GFLOP; the "
          f"{name} matmul at the model's feed-forward shape: {shaped:.0f} GFLOP/s, square peak {peaks[name]:.0f}): "
          f"{len(ids) / seconds:.0f} sentences/s -> {achieved:.0f} GFLOP/s = {100 * achieved / shaped:.0f} % of the "
          f"model-shaped matmul ({100 * achieved / peaks[name]:.0f} % of the square peak); with SDPA's fused "
          f"attention {len(ids) / fused:.0f} sentences/s = {100 * flops / fused / 1e9 / shaped:.0f} %")
    with (profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode(), autocast(device, dtype),
          packed_linears(model, device)):
        encode_tokens(model, ids, pad_id, device, EVAL_TOKENS_PER_CHUNK, max_chunk=256, fewest_padded=True)
    events = prof.key_averages()
    whole = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    print("  top operators by self time: " + ", ".join(f"{e.key} {100 * e.self_cpu_time_total / whole:.0f} %"
                                                       for e in top))
    timer = MatmulTimer()
    with torch.inference_mode(), autocast(device, dtype), packed_linears(model, device), timer:
        encode_tokens(model, ids, pad_id, device, EVAL_TOKENS_PER_CHUNK, max_chunk=256, fewest_padded=True)
    print("  " + timer.report(seconds, shaped, 1, "pass over STS-B test"))

if __name__ == "__main__":
    main()
