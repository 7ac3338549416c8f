# Type stubs of the public API: made by mypy's stubgen from __init__.py (`stubgen
# resident/__init__.py --include-docstrings`, from python/pysrc); tests/test_stubs.py checks
# they name every public function, class and method.
import numpy as np
import os
import types
from . import _resident
from .errors import BadInput as BadInput, PermissionDenied as PermissionDenied, ResidentError as ResidentError, SchedulerGone as SchedulerGone, Unauthenticated as Unauthenticated, Unplaceable as Unplaceable
from .output import Embeddings as Embeddings, read_embeddings as read_embeddings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

EMBED_WINDOW: int

__all__ = ['Embeddings', 'read_embeddings', 'BadInput', 'PermissionDenied', 'ResidentError', 'SchedulerGone', 'Unauthenticated', 'Unplaceable', 'local', 'connect', 'eval_table', 'Pool', 'Cluster']

def local(simulate_gpus: str | None = None, state_dir: str | None = None) -> Cluster:
    '''Starts a scheduler and one agent in this process, like ``ray.init()``.

    ``simulate_gpus`` (``"T4:16GiB x2"``) gives the agent simulated GPUs, so pools that ask
    for GPUs run, on CPU, anywhere. ``state_dir`` keeps pools and jobs across restarts.
    The cluster stops when the last reference to it goes.

    As ``resident local`` does, each embedding actor computes on one thread of its own (one
    actor per core is the fastest CPU setup for encoders); generation actors keep a thread
    per core of their own. Nothing in the process\'s environment changes.
    '''
def eval_table(results: Mapping[str, Any]) -> str:
    """``Cluster.eval``'s results (or ``resident eval``'s results.json) as ``resident eval``'s
    Markdown table."""
    ...

def connect(url: str | None = None, token: str | None = None, ca: str | None = None) -> Cluster:
    """Connects to a running scheduler.

    ``url``, ``token`` and ``ca`` (a PEM file) default to ``RESIDENT_CLUSTER``,
    ``RESIDENT_TOKEN`` and ``RESIDENT_CA``. ``https://`` is always TLS.
    """

class Pool:
    """A pool of resident actors: bytes in, bytes out."""
    def __init__(self, native: _resident.NativePool) -> None: ...
    @property
    def name(self) -> str:
        """The pool's name."""
    def map(self, payloads: Iterable[bytes]) -> list[bytes]:
        """Runs every payload through the pool; the outputs in input order.

        A task that failed for good raises :class:`ResidentError` (kind ``TaskFailed``).
        """
    def submit(self, payloads: Iterable[bytes], job_name: str = 'python') -> Iterator[tuple[int, bytes]]:
        """Streams the payloads as one job; yields ``(position, output)`` as each finishes."""
    def status(self) -> types.SimpleNamespace:
        """The pool as ``resident pools --json`` shows it."""
    def delete(self) -> None:
        """Deletes the pool: its actors stop and free what they hold."""

class _Closed:
    """Stands for the native cluster once :meth:`Cluster.close` ran: every call says so."""
    def __getattr__(self, name: str): ...

class Cluster:
    """A Resident cluster: from :func:`local` or :func:`connect`.

    ``with resident.local() as cluster:`` closes it at the block's end (see :meth:`close`).
    """
    def __init__(self, native: _resident.NativeCluster) -> None: ...
    def close(self) -> None:
        """Deletes the pools :meth:`embed` and :meth:`generate` made (unless a job still uses
        one) and lets go of the cluster: a local one stops once nothing else holds it. Later
        calls raise :class:`BadInput`. Closing twice is harmless."""
    def __enter__(self) -> Cluster: ...
    def __exit__(self, *_exc) -> None: ...
    @property
    def url(self) -> str:
        """The scheduler's URL."""
    def embed(self, texts: Iterable[str], model: str, *, replicas: int | None = None, gpus: float | None = None, vram_gib: float = 2.0, chunk_size: int = 256, dtype: str | None = None, progress: bool = True, prompt_name: str | None = None, prompt: str | None = None, normalize: bool | None = None, split: str | None = None, truncate_dim: int | None = None, precision: str = 'float32', max_seq_length: int | None = None, max_batch_tokens: int | None = None) -> np.ndarray:
        '''Embeds ``texts`` with ``model``; a float32 array ``(len(texts), dim)`` in input order.

        ``texts`` is a list of ``str``, a numpy array of strings, a pandas Series, a pyarrow
        Array or ChunkedArray, or any iterable: it is read as :meth:`embed_iter` reads it, a
        few chunks per actor ahead of what is done, so an iterator of millions never sits in
        memory whole and every actor stays busy. Rows are normalised when the model\'s
        sentence-transformers config says so (``all-MiniLM-L6-v2`` and ``all-mpnet-base-v2``
        do); ``normalize=True`` scales every row to unit length, ``normalize=False`` leaves
        out the model\'s Normalize module. The pool (``replicas`` actors, default one per CPU
        core or as many as the GPUs hold; ``gpus`` per actor, default one GPU each when the
        cluster has GPUs and CPU actors when it has none, ``gpus=0`` for CPU actors on a GPU
        host) is made once for these settings and stays loaded while it is used.

        ``prompt_name`` picks a prompt the model names in its
        ``config_sentence_transformers.json`` (``embed(queries, prompt_name="query")``),
        ``prompt`` gives one\'s text (``""`` for none); without either, the model\'s default
        prompt applies, as in sentence-transformers\' ``encode``. ``split`` (``"tokens:256:32"``,
        ``"sentences"``) embeds a long text as windows and returns the mean of their vectors
        (``resident embed --split ... --pool-windows mean``) instead of cutting it off.

        As in sentence-transformers\' ``encode``, ``truncate_dim`` keeps each vector\'s first
        dimensions (then ``normalize=True`` scales them), and ``precision`` (``float32``,
        ``float16``, ``int8``, ``uint8``, ``binary``, ``ubinary``) quantises the result, int8
        and uint8 with per-dimension ranges over all the rows returned.
        ``max_seq_length`` (shorter than the model\'s) and ``max_batch_tokens`` are the pool\'s.
        '''
    def embed_iter(self, texts: Iterable[str], model: str, *, replicas: int | None = None, gpus: float | None = None, vram_gib: float = 2.0, chunk_size: int = 256, dtype: str | None = None, progress: bool = True, prompt_name: str | None = None, prompt: str | None = None, normalize: bool | None = None, split: str | None = None, chunks_ahead: int | None = None, truncate_dim: int | None = None, precision: str = 'float32', max_seq_length: int | None = None, max_batch_tokens: int | None = None) -> Iterator[np.ndarray]:
        """Embeds a stream of texts as one job: yields a float32 array ``(rows, dim)`` per
        chunk of ``chunk_size`` texts, in input order, as soon as it and those before it are
        done.

        It keeps ``chunks_ahead`` chunks in flight (default two per actor of the pool), so
        every actor stays busy however many there are, and reads ``texts`` only that far
        ahead: memory stays flat over any number of texts. Breaking out of the loop cancels
        what is still running. The options are :meth:`embed`'s, except that ``int8`` and
        ``uint8``, which need ranges over all the vectors, are :meth:`embed`'s and
        :meth:`embed_job`'s only (the job calibrates them on the corpus).
        """
    def embed_frame(self, frame: Any, model: str, *, column: str = 'text', output_column: str = 'embedding', **options: Any) -> Any:
        """A copy of ``frame`` (a pandas DataFrame or a pyarrow Table) with ``output_column``
        added: each row's vector of its ``column`` text, as :meth:`embed` computes it (with
        the same keyword options). pandas gets a column of float32 numpy arrays; Arrow a
        fixed-size list column of float32.
        """
    def embed_job(self, input: str, model: str, output: str, *, replicas: int | None = None, gpus_per_actor: float | None = None, vram_gib: float = 2.0, chunk_size: int | None = None, dtype: str = 'f32', on_bad_record: str = 'skip', id_field: str = 'id', text_field: str = 'text', keep_pool: bool = False, merge: bool = True, progress: bool = True, prompt_name: str | None = None, prompt: str | None = None, precision: str | None = None, truncate_dim: int | None = None, normalize: bool | None = None, max_seq_length: int | None = None, max_batch_tokens: int | None = None, format: str = 'npy', keep_columns: Sequence[str] | None = None, split: str | None = None, pool_windows: str | None = None, selector: Mapping[str, str] | None = None, s3_endpoint: str | None = None, price: Mapping[str, float] | None = None, limit: int | float | None = None, limit_by: str | None = None) -> dict:
        '''Runs ``resident embed``: the resumable corpus job, with the same options.

        ``input`` is a JSONL, text or Parquet file, a directory of them, or ``s3://``;
        ``output`` a directory or ``s3://`` prefix that receives ``embeddings.npy``,
        ``ids.jsonl``, the shards, the manifest and ``report.json``. Run it again after a
        crash: it redoes no finished chunk. Returns ``report.json`` as a dict.

        The vector options are ``resident embed``\'s flags: ``prompt_name``/``prompt``,
        ``precision`` (``float32``, ``float16``, ``int8``, ``uint8``, ``binary``,
        ``ubinary``; int8 ranges go to ``index.json``), ``truncate_dim``, ``normalize``
        (``True``: unit length after truncating; ``False``: without the model\'s Normalize
        module), ``max_seq_length`` and ``max_batch_tokens``. ``format="parquet"`` writes
        ``embeddings.parquet`` (``id``, ``embedding``, and the input fields ``keep_columns``
        names) instead of ``embeddings.npy`` and ``ids.jsonl``. ``split`` (``"tokens:256:32"``,
        ``"sentences:200"``) cuts long texts into windows: a row per window (``id`` is
        ``<doc id>#<window>``, with ``doc_id``, ``window``, ``char_start``, ``char_end``), or
        with ``pool_windows="mean"`` a vector per document. ``selector`` (node labels),
        ``s3_endpoint`` and ``price`` (USD per GPU-hour by ``pool`` label) are
        ``--selector``, ``--s3-endpoint`` and ``--price``. Read the output with
        :func:`read_embeddings`.
        '''
    def sweep(self, config: str | os.PathLike | Mapping[str, Any], *, output: str | None = None, keep_pool: bool = False, price: Mapping[str, float] | None = None, progress: bool = True) -> dict:
        '''Runs ``resident sweep``: trials of a search space on resident embed actors.

        ``config`` is a sweep's TOML file (a path), or a dict of the same keys with
        ``search``, ``scheduler`` and ``space`` as nested dicts. Returns ``summary.json``
        as a dict; each trial is a line of ``results.jsonl`` in the output.
        '''
    def generate_job(self, input: str, model: str, output: str, prompt: str, *, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: Sequence[str] | None = None, template: str | None = None, replicas: int | None = None, gpus_per_actor: float | None = None, vram_gib: float = 2.0, chunk_size: int | None = None, on_bad_record: str = 'skip', id_field: str = 'id', text_field: str = 'text', keep_pool: bool = False, progress: bool = True, input_format: str = 'records', output_format: str = 'generations', choices_field: str = 'choices', answer_field: str = 'answer', answer_base: int = 0, blank: str | None = None, fewshot_input: str | None = None, fewshot: int = 5, fewshot_delimiter: str = '\n\n', fewshot_group: str | None = None, accuracy_by: str | None = None, description: str | None = None, choice_labels: Sequence[str] | None = None, fewshot_seed: int | None = None, fewshot_sampler: str = 'per-record', fewshot_as_multiturn: bool = False, fewshot_answer_field: str | None = None, reference_field: str | None = None, extract: str | None = None, extract_match: str = 'first', ignore_regex: Sequence[str] | None = None, ignore_case: bool = False, ignore_punctuation: bool = False, target_delimiter: str = '', gen_prefix: str | None = None, filters: Sequence[str] | None = None, metrics: str | Sequence[str] | None = None, rouge_stemmer: bool = False, limit: int | float | None = None, limit_by: str | None = None, selector: Mapping[str, str] | None = None, s3_endpoint: str | None = None, price: Mapping[str, float] | None = None, max_sequences: int | None = None, max_step_tokens: int | None = None, max_context: int | None = None, dtype: str | None = None, enforce_eager: bool = False, attention_kernel: str | None = None, chat_template: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None, keep_columns: str | Sequence[str] | None = None, format: str = 'jsonl', _pool_key: str | None = None, **sampling: Any) -> dict:
        '''Runs ``resident generate``: a completion per record of a corpus, resumably.

        ``prompt`` holds ``{text}`` (the record\'s text) and any ``{field}`` of the record;
        records with ``messages`` in place of a text are conversations.
        ``input_format="openai-batch"`` reads an OpenAI Batch JSONL file (each line\'s
        ``body`` parameters honoured), ``output_format="openai-batch"`` writes the Batch
        output format. ``sampling`` takes ``system``, ``min_p``, ``repetition_penalty``,
        ``presence_penalty``, ``frequency_penalty``, ``min_tokens``, ``stop_token_ids``,
        ``n``, ``logprobs``, ``top_logprobs``, ``ignore_eos`` (vLLM\'s meanings) and
        ``response_format`` (OpenAI\'s JSON schema constraint, or ``{"type": "regex",
        "regex": ...}``, ``{"type": "choice", "choice": [...]}``, ``{"type": "grammar",
        "grammar": LARK}`` as ``--guided-regex``, ``--guided-choice`` and
        ``--guided-grammar`` give them) and ``reasoning_parser`` (``"qwen3"`` or
        ``"deepseek_r1"``: each completion\'s thinking written apart from its answer, as
        ``--reasoning-parser``). ``reference_field`` (a
        field or path of each record\'s right answer) and ``extract`` (a regex that finds the
        answer; ``extract_match``, ``ignore_regex``, ``ignore_case``,
        ``ignore_punctuation``) check each generated answer as ``--reference-field`` and
        ``--extract`` do: lines get ``extracted`` and ``correct``, the report ``exact_match``;
        ``filters`` (``NAME=REGEX`` or ``NAME:last=REGEX`` texts, ``--filter``) judge the
        same generation by several named regexes, each under ``filters`` by name in lines
        and the report; ``metrics`` (``["rouge", "f1"]``, ``--metric``) adds each answer\'s
        ROUGE (rouge-score\'s; ``rouge_stemmer``, its ``use_stemmer``), SQuAD token F1 and
        sacrebleu\'s ``bleu`` and ``chrf`` against the reference, in the report;
        ``fewshot_input`` examples are then answered by that field, ``target_delimiter``
        between an example's prompt and its answer (``--target-delimiter``).
        ``max_sequences``, ``max_step_tokens``, ``max_context``, ``dtype``,
        ``enforce_eager`` and ``attention_kernel`` are the engine's settings, as
        ``resident generate``'s flags of the same names.
        ``output`` receives ``generations.jsonl`` (one line per record, input order), the
        shards, the manifest and ``report.json``; a rerun after a crash redoes no finished
        chunk. ``keep_columns`` (``["title", "text=article"]``, ``--keep-columns``) writes
        those input fields into each line after its ``id``, ``FIELD=NAME`` under another
        name; ``format="parquet"`` writes ``generations.parquet`` (``--format``). Returns
        ``report.json`` as a dict.
        '''
    def eval(self, tasks: Mapping[str, Mapping[str, Any]] | str | os.PathLike[str], *, model: str, output: str, only: Sequence[str] | None = None, progress: bool = True) -> dict:
        """Runs a suite of evaluation tasks on one model, as ``resident eval`` does: each
        task's ``generate_job`` keyword arguments by its name, or a suite file of
        ``resident eval --tasks`` (its flags read as the keywords of the same names), run
        with ``model`` into ``output/NAME`` (tasks with the same actors on one pool); writes
        ``output/results.json`` and returns it (see :func:`eval_table`)."""
        ...
    def generate(self, prompts: Iterable[str | Mapping[str, Any]], model: str, *, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: Sequence[str] | None = None, template: str | None = None, replicas: int | None = None, gpus: float | None = None, vram_gib: float = 2.0, max_sequences: int | None = None, dtype: str | None = None, max_step_tokens: int | None = None, max_context: int | None = None, enforce_eager: bool = False, attention_kernel: str | None = None, chat_template: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None, progress: bool = True, **sampling: Any) -> list[dict]:
        '''Completes each prompt with ``model`` (a GGUF file or a safetensors directory).

        ``template="chat"`` (the default, but with ``score=True``) wraps each prompt as the
        model\'s chat template\'s user turn (after ``system=`` when given); ``"none"`` (the
        default with ``score=True``) feeds it as is. A prompt may be a dict
        with ``prompt`` and parameters of its own by OpenAI\'s names (``{"prompt": ...,
        "temperature": 0.7, "max_tokens": 32}``). Temperature 0 is greedy; with a ``seed``
        sampling repeats per prompt. ``sampling`` takes ``system``, ``min_p``,
        ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
        ``min_tokens``, ``stop_token_ids``, ``n``, ``logprobs``, ``top_logprobs``,
        ``ignore_eos`` (as vLLM\'s ``SamplingParams`` means them) and ``response_format``
        (OpenAI\'s: ``{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}``
        makes every completion parse as JSON valid under the schema; ``{"type": "regex",
        "regex": ...}``, ``{"type": "choice", "choice": [...]}`` and ``{"type": "grammar",
        "grammar": LARK}`` make it match the expression, be one of the texts, or be a
        sentence of the grammar). ``reasoning_parser="qwen3"`` (or ``"deepseek_r1"``, vLLM\'s
        parsers) splits a reasoning model\'s thinking (``<think>...</think>``) from its
        answer: ``text`` is the answer, ``reasoning`` the thinking and ``reasoning_tokens``
        its tokens, for each of ``choices`` too.

        ``score=True`` scores each prompt\'s text, raw, under the model,
        as ``resident generate --score`` does; a dict prompt\'s ``context`` goes before it,
        unscored. A dict prompt with ``choices`` (a list of texts) and optionally ``answer``
        (an index, label or text, or a list of them for several right ones) has each choice
        scored after its text instead, nothing generated (lm-evaluation-harness\'s multiple
        choice): the dict returned has ``choice_scores`` (a ``score`` dict each), ``best``
        and ``best_normalized`` (the likeliest choice, and the likeliest per character) and,
        with ``answer``, ``correct``, ``correct_normalized`` and ``answer_probability`` (the
        right choices\' share of the choices\' probability: TruthfulQA MC2\'s figure;
        ``answers`` in ``answer``\'s place for several right ones) and, for one right
        answer, ``brier_score`` (the choices\' probabilities\' squared distance from it:
        lm-evaluation-harness\'s ``brier_score``, lower is better).

        Returns, in input order, dicts with ``text``, ``tokens`` (generated),
        ``prompt_tokens``, ``finish_reason`` (``"stop"`` or ``"length"``) and
        ``truncated``; with ``n`` above 1 also ``choices`` (each with ``text``, ``tokens``,
        ``finish_reason``), with ``logprobs`` a ``logprobs`` list per completion (OpenAI\'s
        ``token``, ``logprob``, ``bytes``, ``top_logprobs``), and ``error`` for a prompt
        whose own parameters were refused. A progress bar counts the prompts completed
        (``progress=False`` turns it off).
        '''
    def chat(self, conversations: Iterable[Sequence[Mapping[str, Any]] | Mapping[str, Any]], model: str, *, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: Sequence[str] | None = None, replicas: int | None = None, gpus: float | None = None, vram_gib: float = 2.0, max_sequences: int | None = None, dtype: str | None = None, max_step_tokens: int | None = None, max_context: int | None = None, enforce_eager: bool = False, attention_kernel: str | None = None, chat_template: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None, progress: bool = True, **sampling: Any) -> list[dict]:
        '''Answers each conversation with ``model``, as vLLM\'s ``LLM.chat`` does.

        A conversation is a list of ``{"role", "content"}`` messages (``system``, ``user``,
        ``assistant``; a last ``assistant`` message is continued), or a dict with
        ``messages`` and parameters of its own by OpenAI\'s names. The model\'s chat template
        renders it; a system message the template cannot take is refused in words.
        Parameters and the dicts returned are those of :meth:`generate`.

        ``score=True`` scores each conversation\'s last message, the assistant\'s reply, given
        the turns before it (``score["logprob"]`` is DPO\'s reference log-probability of a
        chosen or rejected reply; the reply\'s end-of-turn marker is scored with it);
        ``max_new_tokens=0`` generates nothing. A conversation that does not end with a
        reply after a user turn gets an ``error``. A dict conversation with ``choices`` (and
        ``answer``) ending with the user\'s turn has each choice scored as the assistant\'s
        reply (a preference pair: ``{"messages": [...], "choices": [chosen, rejected],
        "answer": 0}``), as :meth:`generate` does.
        '''
    def nodes(self) -> list[types.SimpleNamespace]:
        """The nodes, with the fields ``resident status --json`` shows."""
    def actors(self) -> list[types.SimpleNamespace]:
        """The actors, with the fields ``resident status --json`` shows."""
    def pools(self) -> list[types.SimpleNamespace]:
        """The pools, with the fields ``resident pools --json`` shows."""
    def jobs(self) -> list[types.SimpleNamespace]:
        """The jobs, with the fields ``resident jobs --json`` shows."""
    def pool(self, name: str, kind: str | None = None, *, replicas: int = 1, gpus: float = 0.0, vram_gib: float = 0.0, selector: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> Pool:
        """Creates the pool ``name`` of actor ``kind`` and waits until it is ready, or, with
        no ``kind``, attaches to the existing pool of that name.

        ``gpus`` per actor (0.25 shares a GPU four ways), ``vram_gib`` each reserves,
        ``selector`` node labels, ``config`` the kind's actor config: as in the Rust
        ``PoolSpec``. A pool of that name and spec but another replica count is resized.
        """
