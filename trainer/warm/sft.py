"""`sao sft`: a supervised warm start (rejection-sampling fine-tuning) on stored trajectories, with TRL's SFTTrainer.

    corpus   = the trajectories of every store in sft.traces (default <run>/traces) that sft.select keeps:
               resolved (status ok, reward == 1; the default), positive (any rewarded status, reward > 0)
               or all; a traj_id seen twice (a store listed twice) counts once
    example  = the trace's own token ids (nothing is re-rendered), one per contiguous sequence: a
               trajectory with `breaks` (the proxy restarted the token sequence) gives one per piece
    loss     = next-token NLL on the action tokens only: `is_action` is TRL's `assistant_masks` column,
               which TRL folds into labels (-100 at observation tokens and padding)
    max_len  = sft.max_length, or the longest example (nothing truncated); an example whose actions would
               all be cut off is an error, never a silent drop

Writes <run>/sft/: metrics.jsonl + tb/ (loss, grad_norm, learning_rate, mean_token_accuracy, ... per
step) and summary.json; the model directory (model + tokenizer, config.json equal to the input
model's) goes to sft.out_dir (default <run>/sft/model), replaced whole. `model.path=<that dir>` serves it.

Which path trains:
    runtime.world_size = 1   TRL's SFTTrainer in this process (build_trainer)
    runtime.world_size > 1   the same loss on that many FSDP2 data-parallel ranks, the path `sao train`'s
                             ranks run (trainer.warm.sft_dist: the policy sharded from the start, the model
                             directory streamed from the shards). Not there: TRL's example order, its padded
                             sft.batch_size rows (micro-batches are packed by trainer.max_tokens_per_microbatch;
                             sft.batch_size x sft.grad_accum examples still make a step), the token-accuracy
                             metric, and the MoE load-balancing loss: sft.router_aux_loss_coef > 0 is a UserError.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.core.files import atomic_dir
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.trainer.config import SFTConfig
from sao_harness.trainer.report.metrics import METRICS_FILE, TB_DIR, MetricsLogger
from sao_harness.trainer.warm.corpus import Corpus, read_corpus

OUT_DIR = "sft"
MODEL_DIR = "model"
SELECTS = {
    "resolved": lambda t: t.status == Status.OK and t.reward == 1.0,
    "positive": lambda t: t.reward is not None and t.reward > 0,
    "all": lambda t: True,
}


# --- the corpus ---------------------------------------------------------------------------------

def load_sft_corpus(paths: list[str | Path], select: str = "resolved") -> Corpus:
    """The trajectories of every trace store in `paths` (run dir, traces dir or shard) that `select` keeps."""
    keep = SELECTS[select]

    def skip_reason(traj: Trajectory) -> str | None:
        return "not_selected" if not keep(traj) else "no_action" if traj.num_action_tokens == 0 else None

    return read_corpus(paths, skip_reason, ("not_selected", "no_action"), key="sft.traces")


def to_examples(trajectories: list[Trajectory]) -> list[dict]:
    """Pre-tokenized SFT rows {input_ids, assistant_masks, traj_id}: one per contiguous token sequence
    (split at `breaks`); a piece with no trainable action token (none after its first token) is left out."""
    rows = []
    for traj in trajectories:
        ids, mask = traj.token_ids, [int(a) for a in traj.is_action]
        bounds = [0, *traj.breaks, len(ids)]
        for a, b in zip(bounds, bounds[1:]):
            if any(mask[a + 1:b]):
                rows.append({"input_ids": ids[a:b], "assistant_masks": mask[a:b], "traj_id": traj.traj_id})
    return rows


def fit_max_length(examples: list[dict], max_length: int | None, model_max: int | None = None) -> tuple[int, int]:
    """(max_length to train with, how many examples it truncates). None = the longest example. An example
    that keeps no trainable action token within max_length, or a length past the model's
    positions, is a UserError."""
    longest = max(len(e["input_ids"]) for e in examples)
    n = longest if max_length is None else max_length
    if model_max is not None and n > model_max:
        raise UserError(f"sft: sequences of {n} tokens exceed the model's max_position_embeddings ({model_max}); "
                        f"set sft.max_length <= {model_max}")
    truncated = 0
    for e in examples:
        if len(e["input_ids"]) <= n:
            continue
        truncated += 1
        if not any(e["assistant_masks"][1:n]):
            first = e["assistant_masks"].index(1, 1)
            raise UserError(f"sft.max_length={n} cuts every action token of trajectory {e['traj_id']} "
                            f"({len(e['input_ids'])} tokens, first action token at {first}): raise sft.max_length "
                            f"above {first} (or null: the longest example, {longest})")
    return n, truncated


# --- the trainer --------------------------------------------------------------------------------

# TRL's log names -> the metric families every run logs (`trainer.report.metrics.FAMILIES`)
SFT_METRICS = {"loss": "loss/sft_loss", "grad_norm": "policy/grad_norm", "learning_rate": "policy/lr",
               "mean_token_accuracy": "policy/token_accuracy", "entropy": "policy/entropy",
               "num_tokens": "rollout/tokens", "epoch": "time/epoch"}


class StepReport:
    """Each step's numbers (TRL's log names) into <out>/metrics.jsonl + tb/ under the metric families
    (SFT_METRICS) and, verbose, one printed line. The TRL callback and rank 0 of the distributed loop
    (trainer.warm.sft_dist) both report through it; its logger opens at the first step (it travels to a rank
    unopened)."""

    def __init__(self, out: Path, verbose: bool = True):
        self.out, self.verbose, self.logger, self.t0 = Path(out), verbose, None, time.perf_counter()

    def begin(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, step: int, max_steps: int, numbers: dict[str, float]) -> None:
        if self.logger is None:
            self.logger = MetricsLogger(self.out)
        self.logger.log(step, {SFT_METRICS.get(k, f"policy/{k}"): v for k, v in numbers.items()})
        if self.verbose:
            rate = (time.perf_counter() - self.t0) / max(step, 1)
            acc = (f" | token acc {numbers['mean_token_accuracy']:.3f}" if "mean_token_accuracy" in numbers
                   else "")
            print(f"step {step}/{max_steps} | loss {numbers['loss']:.4f}{acc} | grad norm "
                  f"{numbers.get('grad_norm', float('nan')):.3f} | lr {numbers.get('learning_rate', 0.0):.2e} | "
                  f"{rate:.2f} s/step", flush=True)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()


def _progress_callback(report: StepReport, history: list[dict]):
    """A transformers callback: every TRL log line into `history` and `report`."""
    # lazy: transformers is heavy
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            report.begin()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            history.append({"step": state.global_step, **numbers})
            report(state.global_step, state.max_steps, numbers)

    return Progress()


def build_trainer(model_path: str, examples: list[dict], sft: SFTConfig, output_dir: str | Path, seed: int = 0,
                  max_length: int | None = None, callbacks: list | None = None):
    """A TRL SFTTrainer on `examples` (to_examples), the model and tokenizer loaded from `model_path` (fp32)."""
    # lazy: torch / transformers / trl / datasets are heavy
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    except OSError as e:
        raise UserError(f"model.path: cannot load {model_path}: {str(e).splitlines()[0]}") from None
    max_length, _ = fit_max_length(examples, sft.max_length if max_length is None else max_length,
                                   getattr(model.config.get_text_config(), "max_position_embeddings", None))
    data = Dataset.from_list([{"input_ids": e["input_ids"], "assistant_masks": e["assistant_masks"]}
                              for e in examples])
    cuda = sft.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UserError("sft.device='cuda', but no CUDA device is available")
    args = TRLConfig(
        output_dir=str(output_dir), learning_rate=sft.lr, lr_scheduler_type=sft.lr_schedule,
        num_train_epochs=sft.epochs, max_steps=sft.max_steps or -1, per_device_train_batch_size=sft.batch_size,
        gradient_accumulation_steps=sft.grad_accum, max_length=max_length,
        assistant_only_loss=False,  # needs a conversational dataset; the `assistant_masks` column applies anyway
        completion_only_loss=False, packing=False, padding_free=False,
        router_aux_loss_coef=sft.router_aux_loss_coef, activation_checkpointing=sft.gradient_checkpointing,
        use_cpu=not cuda, bf16=cuda and torch.cuda.is_bf16_supported(), fp16=False, seed=seed, data_seed=seed,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=callbacks)
    if callbacks:
        trainer.remove_callback(PrinterCallback)  # the callbacks given report progress instead
    return trainer


def save_model(trainer, model_path: str, out: Path) -> Path:
    """Write the trained model + the input's tokenizer to `out` (whole or not at all), with config.json and
    generation_config.json as the input model's (TRL turns the MoE router loss / pad id on in memory)."""
    # lazy: torch / transformers are heavy
    import torch
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    model = trainer.model
    original = AutoConfig.from_pretrained(model_path)
    mine = model.config.to_dict()
    for key, value in original.to_dict().items():
        if mine.get(key) != value and key != "dtype":
            setattr(model.config, key, getattr(original, key))
    dtype = getattr(original, "dtype", None)  # trained in fp32, saved as the input was
    if dtype is not None:
        model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    try:
        model.generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:
        pass  # the input has none: keep transformers' default
    tokenizer = AutoTokenizer.from_pretrained(model_path)  # not TRL's copy, whose pad token it may have changed

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    out.parent.mkdir(parents=True, exist_ok=True)
    return atomic_dir(out, write)


# --- the stage ----------------------------------------------------------------------------------

@dataclass
class SFTResult:
    model_dir: str
    steps: int
    loss_first: float
    loss_last: float
    examples: int
    truncated: int
    max_length: int
    corpus: dict[str, int] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


def run_sft(cfg, verbose: bool = True) -> SFTResult:
    """The whole stage for a validated Config: corpus, TRL SFTTrainer from model.path, the model directory."""
    sft, run = cfg.sft, Path(cfg.run.dir)
    sources = list(sft.traces) or [str(run / "traces")]
    corpus = load_sft_corpus(sources, sft.select)
    c = corpus.counts
    examples = to_examples(corpus.trajectories)
    if not examples:
        raise UserError(f"sft: no trajectory selected (sft.select={sft.select}) in {', '.join(sources)}: {c['read']} "
                        f"read, {c['not_selected']} not selected, {c['no_action']} without action tokens "
                        "(sft.select=positive or all keeps more)")
    max_length, truncated = fit_max_length(examples, sft.max_length)  # before the model loads: fail fast
    if verbose:
        n_action = sum(sum(e["assistant_masks"]) for e in examples)
        n_tokens = sum(len(e["input_ids"]) for e in examples)
        skipped = {k: v for k, v in c.items() if k not in ("read", "used") and v}
        print(f"sft: {c['used']} of {c['read']} trajectories (sft.select={sft.select}) from {len(sources)} "
              f"store(s) -> {len(examples)} examples, {n_action} action tokens of {n_tokens}; max_length "
              f"{max_length}" + (f" ({truncated} truncated)" if truncated else "")
              + (f"; left out {skipped}" if skipped else ""), flush=True)
    model_path = resolve_model_path(cfg.model)
    out = run / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(sft.out_dir) if sft.out_dir else out / MODEL_DIR
    (out / METRICS_FILE).unlink(missing_ok=True)  # a fresh stage: the curves of this run only
    shutil.rmtree(out / TB_DIR, ignore_errors=True)
    report, history = StepReport(out, verbose), []
    try:
        if world_size(cfg) > 1:
            history = _train_on_ranks(cfg, model_path, examples, max_length, model_dir, report, verbose)
        else:
            trainer = build_trainer(model_path, examples, sft, out / "trl", seed=cfg.run.seed,
                                    max_length=max_length, callbacks=[_progress_callback(report, history)])
            trainer.train()
            if (out / "trl").is_dir() and not any((out / "trl").iterdir()):
                (out / "trl").rmdir()  # TRL's output_dir: empty unless it wrote something of its own
            if history:
                save_model(trainer, model_path, model_dir)
    finally:
        report.close()
    if not history:
        raise UserError("sft: training ran no step (sft.max_steps / sft.epochs)")
    result = SFTResult(model_dir=str(model_dir.resolve()), steps=history[-1]["step"],
                       loss_first=history[0]["loss"], loss_last=history[-1]["loss"], examples=len(examples),
                       truncated=truncated, max_length=max_length, corpus=c, history=history)
    summary = {k: v for k, v in asdict(result).items() if k != "history"}
    summary.update(model=model_path, traces=sources, config=sft.model_dump(mode="json"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if verbose:
        print(f"sft: model written to {result.model_dir} (serve or train it with model.path={result.model_dir}); "
              f"train loss {result.loss_first:.4f} -> {result.loss_last:.4f} over {result.steps} steps", flush=True)
    return result


def world_size(cfg) -> int:
    """The data-parallel ranks `sao sft` runs on (the one place this module reads it)."""
    return cfg.runtime.world_size


def _train_on_ranks(cfg, model_path: str, examples: list[dict], max_length: int, model_dir: Path,
                    report: StepReport, verbose: bool) -> list[dict]:
    """trainer.warm.sft_dist on world_size FSDP2 ranks; what it cannot do as TRL does is a UserError here."""
    from transformers import AutoConfig  # lazy: heavy

    from sao_harness.trainer.dist import distributed  # lazy: torch.distributed is heavy
    from sao_harness.trainer.warm import sft_dist

    sft, world = cfg.sft, world_size(cfg)
    if sft.router_aux_loss_coef > 0:
        raise UserError(f"sft.router_aux_loss_coef={sft.router_aux_loss_coef}: the MoE load-balancing loss runs "
                        f"only in TRL's one process (world_size 1); with world_size {world} set it to 0")
    config = AutoConfig.from_pretrained(model_path)
    fit_max_length(examples, max_length, getattr(config.get_text_config(), "max_position_embeddings", None))
    devices = distributed.rank_devices(sft.device, world, "sft.device")
    if verbose:
        print(f"sft: {world} FSDP2 ranks ({distributed.backend(devices[0])}) on {', '.join(devices)}", flush=True)
    return sft_dist.run(model_path, examples, max_length, sft, cfg.trainer, devices, model_dir, seed=cfg.run.seed,
                        offload=cfg.runtime.offload_optimizer, report=report)


def cmd_sft(args) -> int:
    """`sao sft --config ...` (args.cfg: the validated Config)."""
    run_sft(args.cfg)
    return 0
