"""The data side of a training run: its tokenizer, its phases, and global batches for the jitted step.

Each process reads its own share of the data (bertjax.data) and the per-process numpy batches become global
`jax.Array`s split over the mesh's batch axes. The feed's position ({phase, iterator state}) is saved with every
checkpoint so that a resumed run continues with exactly the next batch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np

from bertjax.data import build_eval_iterator, build_pretraining_iterator, load_tokenizer, to_global_batch
from bertjax.data import reshard as reshard_lib
from bertjax.data.global_batch import batch_sharding, processes_feed_distinct_rows
from bertjax.data.pipeline import open_source, window_plan
from bertjax.data.sources import NoDocuments
from bertjax.train import mesh as mesh_lib
from bertjax.train import phases as phases_lib
from bertjax.train.checkpoints import CheckpointError
from bertjax.train.distributed import check_same_everywhere
from bertjax.train.run_config import ConfigError, RunConfig

log = logging.getLogger(__name__)

TOKENIZER_DIR = "tokenizer"


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer.

def prepare_tokenizer(config: RunConfig, workdir: Path):
    """The run's tokenizer, saved in `<workdir>/tokenizer` (where a resumed run and fill-mask find it).

    Multi-host: process 0 prepares it; the others then read it from a shared workdir or, on hosts with their own
    disk, build the same one (training is deterministic), and every process checks it holds the same tokenizer.
    """
    saved = workdir / TOKENIZER_DIR
    if jax.process_index() == 0 and not saved.exists():
        _build_tokenizer(config, saved)
    _barrier("bertjax-tokenizer")
    if not saved.exists():
        _build_tokenizer(config, saved)
    tokenizer = load_tokenizer(saved)
    check_same_everywhere({"tokenizer": tokenizer.fingerprint}, "Each host built or loaded the tokenizer in its own "
                          "workdir: give tokenizer.path, or a workdir all hosts share.")
    return tokenizer


def _build_tokenizer(config: RunConfig, out_dir: Path) -> None:
    from bertjax.data import open_documents, train_sentencepiece
    from bertjax.data.sources import prepared_directory

    tok = config.tokenizer
    if tok.path is not None:
        load_tokenizer(tok.path).save(out_dir)
        return
    # Prepared data carries the tokenizer it was made with; several prepared parts must share one.
    specs = [spec.strip() for spec in config.data.input.split(",") if spec.strip()]
    prepared = [directory for directory in map(prepared_directory, specs) if directory is not None]
    tokenizers = {}
    for directory in prepared:
        if (directory / TOKENIZER_DIR).is_dir():
            tokenizer = load_tokenizer(directory / TOKENIZER_DIR)
            tokenizers.setdefault(tokenizer.fingerprint, (directory, tokenizer))
    if len(tokenizers) > 1:
        raise ValueError(f"data.input: the prepared directories {[str(d) for d, _ in tokenizers.values()]} were "
                         "tokenized with different tokenizers; prepare them with one, or name it with tokenizer.path")
    if tokenizers:
        next(iter(tokenizers.values()))[1].save(out_dir)
        return
    documents = open_documents(config.data.input, split="train", text_format=config.data.text_format,
                               text_field=config.data.text_field, eval_fraction=config.data.eval_fraction)
    if documents.tokenized:  # prepared data whose tokenizer/ is gone: its token ids cannot train a tokenizer
        raise ValueError(f"data.input {config.data.input!r} is prepared data without its tokenizer/ directory; "
                         "name the tokenizer it was prepared with in tokenizer.path")
    log.info("training a %s tokenizer (vocab %d) on %d documents", tok.model_type, tok.vocab_size, len(documents))
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    train_sentencepiece((documents[i] for i in range(len(documents))), tmp, vocab_size=tok.vocab_size,
                        model_type=tok.model_type, max_lines=tok.max_lines, seed=config.train.seed)
    tmp.rename(out_dir)  # a run killed mid-training leaves no half-written tokenizer behind
    trained = load_tokenizer(out_dir).vocab_size
    if trained < tok.vocab_size:
        log.warning("the tokenizer holds %d pieces, fewer than tokenizer.vocab_size=%d: the most this corpus yields "
                    "(the model's vocabulary follows the tokenizer)", trained, tok.vocab_size)


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------------------------------------------
# Phases.

# The step plan lives in bertjax.train.phases; these names are the feed's public face.
Phase, plan_phases, phase_at, total_steps = phases_lib.Phase, phases_lib.plan_phases, phases_lib.phase_at, \
    phases_lib.total_steps


def check_batch_fits(phases: list[Phase], mesh, accumulation_steps: int) -> None:
    """Every global batch must split evenly over the batch shards (and then into microbatches)."""
    shards = mesh_lib.batch_shards(mesh)
    for phase in phases:
        for rows in phase.batch_sizes:
            if rows % (shards * accumulation_steps):
                key = "data.global_batch_size" if len(phases) == 1 else f"train.phases[{phase.index}].data"
                raise ConfigError(f"{key}: global batch {rows} must be divisible by the batch shards of the mesh "
                                  f"(data*fsdp = {shards}) times optimizer.accumulation_steps ({accumulation_steps})")
            if rows % jax.process_count():
                raise ConfigError(f"data.global_batch_size ({rows}) must be divisible by the number of processes "
                                  f"({jax.process_count()})")
            if not processes_feed_distinct_rows(batch_sharding(mesh, mesh_lib.BATCH_AXES), rows):
                raise ConfigError(f"mesh: the batch axes (data*fsdp = {shards}) do not split the rows over the "
                                  f"{jax.process_count()} processes, and each process feeds its own rows: make "
                                  "mesh.data*mesh.fsdp a multiple of the number of processes (tensor parallelism "
                                  "within each host)")


# ---------------------------------------------------------------------------------------------------------------
# Batches.

class DataExhausted(ValueError):
    """The training data ended before train.steps (data.num_epochs set): a config error, reported in one line."""


def _saved_phase(saved: dict, phase: Phase, step: int) -> int:
    """The phase index of a checkpoint's data position, checked against `phase`, the one of the step it resumes.
    A position of an earlier phase is one saved at its end (or train.phases moved the boundary since): `phase`'s data
    starts from its beginning. Anything else would restart the data unnoticed, so it is an error."""
    index = saved.get("phase") if isinstance(saved, dict) else None
    if not isinstance(index, int) or index > phase.index or (index == phase.index
                                                             and not isinstance(saved.get("iterator"), dict)):
        raise CheckpointError(
            f"the data position saved with step {step} (data/process_*.json in its checkpoint) is "
            f"{saved!r:.200}: not one of {phase.label} (phase {phase.index}, the phase of step {step}). The "
            "checkpoint is damaged, or train.phases changed since it was saved; restore an earlier step "
            "(checkpoint.restore_step) or give the phases it was saved with")
    if index < phase.index and step != phase.start and jax.process_index() == 0:
        log.warning("resuming at step %d, inside %s (from step %d), from a data position saved in phase %d: "
                    "train.phases changed since; %s's data starts from its beginning", step, phase.label,
                    phase.start, index, phase.label)
    return index


class TrainFeed:
    """Global training batches, phase after phase, resumable from `state()`.

    A checkpoint written by another number of processes restores as {"processes": [every old process's state]}
    (bertjax.train.checkpoints); the feed then continues from the position that loses no document
    (bertjax.data.reshard) and says what that costs in `reshard_report`.
    """

    def __init__(self, phases: list[Phase], tokenizer, mesh, seed: int):
        self.phases, self.tokenizer, self.mesh, self.seed = phases, tokenizer, mesh, seed
        self.phase: Phase | None = None
        self.iterator = None
        self.origin = (0, 0)  # where this phase's data starts (not (0, 0) after resuming on another process count)
        self.reshard_report = None

    def _open(self, phase: Phase, iterator_state: dict | None, origin: tuple[int, int] = (0, 0)) -> None:
        if self.iterator is not None:
            self.iterator.close()
        # Each phase reshuffles with its own seed, so a later phase does not replay the first one's order.
        self.iterator = build_pretraining_iterator(phase.data, self.tokenizer, seed=self.seed + phase.index,
                                                   process_index=jax.process_index(),
                                                   process_count=jax.process_count(), origin=origin)
        if iterator_state is not None:
            self.iterator.set_state(iterator_state)
        self.phase, self.origin = phase, origin

    def start(self, step: int, saved: dict | None) -> None:
        """Position the feed to produce the batch of update `step`, from a checkpoint's feed state if any."""
        phase = phase_at(self.phases, step)
        if saved is not None and "processes" in saved:
            saved = self._resharded(phase, saved["processes"])
        same_phase = saved is not None and _saved_phase(saved, phase, step) == phase.index
        self._open(phase, saved["iterator"] if same_phase else None,
                   reshard_lib.origin_of(saved) if same_phase else (0, 0))

    def _resharded(self, phase: Phase, saved: list[dict]) -> dict:
        """This process's feed state from the states of a run with another number of processes."""
        if saved[0].get("phase") != phase.index:
            return saved[0]  # saved at a phase boundary: the new phase starts from its beginning anyway
        num_documents = len(open_source(phase.data))

        def plan_of(index: int, count: int, origin: tuple[int, int]):
            return window_plan(phase.data, num_documents, seed=self.seed + phase.index, process_index=index,
                               process_count=count, origin=origin)

        self.reshard_report = reshard_lib.reshard(saved, plan_of, jax.process_count())
        batches = int(saved[0]["iterator"]["batches"])
        return {"phase": phase.index, "iterator": {"window": 0, "row": 0, "batches": batches},
                "origin": [self.reshard_report.epoch, self.reshard_report.position]}

    def next(self, step: int) -> dict[str, jax.Array]:
        if self.phase is None or not self.phase.start <= step < self.phase.end:
            self._open(phase_at(self.phases, step), None)
        finite = self.phase.data.num_epochs is not None
        before = self.iterator.get_state() if finite else None
        try:
            batch = self.iterator.take(self.phase.batch_at(step) // jax.process_count())
        except StopIteration:
            batch = None
        if finite and jax.process_count() > 1 and not all_processes_have(batch is not None):
            # Each process packs its share of the documents into its own number of rows, so with a finite epoch
            # they run out at different steps: all stop at the first step any of them lacks a batch (else the
            # others would wait in that step's collectives).
            batch = None
        if batch is None:
            if finite:
                # The data position goes back to before this step's rows (a partial batch's, or a whole one another
                # process lacked the rows to match): the checkpoint saved now keeps them, so that a rerun with more
                # epochs trains them, as the run with those epochs from the start did.
                self.iterator.set_state(before)
            key = "data" if len(self.phases) == 1 else f"train.phases[{self.phase.index}].data"
            raise DataExhausted(f"the training data ran out at step {step} of {self.phases[-1].end} ({key}.num_epochs="
                                f"{self.phase.data.num_epochs}): raise {key}.num_epochs or set it to null (repeat), "
                                "or lower train.steps") from None
        return to_global_batch(batch, self.mesh, mesh_lib.BATCH_AXES)

    def state(self) -> dict:
        return {"phase": self.phase.index, "iterator": self.iterator.get_state(), "origin": list(self.origin)}

    def close(self) -> None:
        if self.iterator is not None:
            self.iterator.close()


def all_processes_have(present: bool) -> bool:
    """Whether every process has what this one says it has (a host collective: every process must call it)."""
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(present))))


def eval_batches(data_config, tokenizer, mesh, count: int) -> list[dict[str, jax.Array]]:
    """`count` fixed held-out batches (the same each time: no shuffling, masks from a fixed seed).

    Every process yields exactly `count` batches (padded with empty rows if its share of held-out data is
    smaller), so multi-host evaluation steps stay in lockstep.
    """
    iterator = build_eval_iterator(data_config.for_evaluation().replace(eval_batches=count), tokenizer, seed=0,
                                   process_index=jax.process_index(), process_count=jax.process_count(),
                                   source=_eval_source(data_config))
    batches = [to_global_batch(b, mesh, mesh_lib.BATCH_AXES) for b in iterator]
    iterator.close()
    return batches


def _eval_source(data_config):
    """The held-out documents; none is a config error naming the key that decides the split."""
    try:
        return open_source(data_config, "eval")
    except NoDocuments as error:
        raise ConfigError(f"evaluation needs held-out documents, but {error}: raise data.eval_fraction (now "
                          f"{data_config.eval_fraction}; prepared data keeps the split of `bertjax prepare "
                          "--eval-fraction`), or turn evaluation off (eval.at_start=false eval.at_end=false "
                          "eval.every=0)") from None


def held_out_sentences(data_config, tokenizer, count: int, max_chars: int = 160) -> list[str]:
    """A few short held-out sentences, from documents spread over the held-out split (for fill-mask examples)."""
    from bertjax.data import open_documents

    documents = open_documents(data_config.input, split="eval", text_format=data_config.text_format,
                               text_field=data_config.text_field, eval_fraction=data_config.eval_fraction)
    sentences = []
    stride = max(1, len(documents) // (4 * max(count, 1)))
    for i in range(0, len(documents), stride):
        document = documents[i]
        text = document if isinstance(document, str) else tokenizer.decode(document)  # prepared data: token ids
        sentence = _first_plain_sentence(text, max_chars)
        if sentence is not None:
            sentences.append(sentence)
            if len(sentences) == count:
                break
    return sentences


def _first_plain_sentence(text: str, max_chars: int) -> str | None:
    """The first sentence of 6-20 words that reads as prose (capitalised, mostly letters), or None."""
    for line in text.splitlines():
        for sentence in line.split(". "):
            words = sentence.strip().split()
            if not 6 <= len(words) <= 20 or len(sentence) > max_chars or not words[0][0].isupper():
                continue
            if sum(w.isalpha() for w in words) >= 0.7 * len(words):
                return " ".join(words).rstrip(".") + "."
    return None


def mask_a_word(sentence: str, tokenizer, rng: np.random.Generator) -> str:
    """The sentence with one of its longer words replaced by [MASK] when that word is a single token."""
    words = sentence.split()
    candidates = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4
                  and len(tokenizer.encode(" " + w)) == 1]
    if not candidates:
        candidates = [i for i, w in enumerate(words) if w.isalpha()] or list(range(len(words)))
    i = int(rng.choice(candidates))
    return " ".join(words[:i] + ["[MASK]"] + words[i + 1:])


def tokens_per_step(phases: list[Phase]) -> list[int]:
    """Tokens per step of every constant-batch segment (see `boundaries`)."""
    return phases_lib.clock_segments(phases)[1]


def boundaries(phases: list[Phase]) -> list[int]:
    """First step of every constant-batch segment (phases, and the batch warmup's stairs)."""
    return phases_lib.clock_segments(phases)[0]
