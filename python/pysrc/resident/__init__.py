"""Resident from Python: resident model actors on a cluster, or on one in this process.

>>> import resident
>>> cluster = resident.local()                       # like ray.init(): a scheduler and an agent here
>>> vectors = cluster.embed(["a text", "another"], model="models/all-MiniLM-L6-v2")
>>> vectors.shape
(2, 384)

Every call releases the GIL while it waits and hears Ctrl-C (the call's job is cancelled
and ``KeyboardInterrupt`` raised); long calls show a progress bar (``progress=False`` turns
it off). Errors are :class:`ResidentError` and its subclasses.
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import os
import sys
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Optional, Union

import numpy as np

from . import _resident, _suite
from ._progress import Bar
from .output import Embeddings, read_embeddings
from .errors import (
    BadInput,
    PermissionDenied,
    ResidentError,
    SchedulerGone,
    Unauthenticated,
    Unplaceable,
)

__all__ = [
    "local",
    "read_embeddings",
    "Embeddings",
    "connect",
    "eval_table",
    "Cluster",
    "Pool",
    "ResidentError",
    "Unplaceable",
    "Unauthenticated",
    "PermissionDenied",
    "SchedulerGone",
    "BadInput",
]

#: Values of an Arrow column converted to Python strings at a time (``embed`` and
#: ``embed_iter`` read any other input a chunk at a time, as far ahead as they have chunks in
#: flight).
EMBED_WINDOW = 8192


def eval_table(results: Mapping[str, Any]) -> str:
    """The results of :meth:`Cluster.eval` (or ``resident eval``'s ``results.json``) as the
    Markdown table ``resident eval`` prints: a row per task and figure, with its standard
    error and records."""
    return _resident.eval_table(json.dumps(results))


def local(simulate_gpus: Optional[str] = None, state_dir: Optional[str] = None) -> "Cluster":
    """Starts a scheduler and one agent in this process, like ``ray.init()``.

    ``simulate_gpus`` (``"T4:16GiB x2"``) gives the agent simulated GPUs, so pools that ask
    for GPUs run, on CPU, anywhere. ``state_dir`` keeps pools and jobs across restarts.
    The cluster stops when the last reference to it goes.

    As ``resident local`` does, each embedding actor computes on one thread of its own (one
    actor per core is the fastest CPU setup for encoders); generation actors keep a thread
    per core of their own. Nothing in the process's environment changes.
    """
    return Cluster(_resident.local(simulate_gpus, state_dir))


def connect(
    url: Optional[str] = None, token: Optional[str] = None, ca: Optional[str] = None
) -> "Cluster":
    """Connects to a running scheduler.

    ``url``, ``token`` and ``ca`` (a PEM file) default to ``RESIDENT_CLUSTER``,
    ``RESIDENT_TOKEN`` and ``RESIDENT_CA``. ``https://`` is always TLS.
    """
    url = url or os.environ.get("RESIDENT_CLUSTER")
    if not url:
        raise BadInput(
            "no cluster url: pass connect(url) or set RESIDENT_CLUSTER "
            "(or use resident.local() for a cluster in this process)",
            "BadInput",
        )
    token = token or os.environ.get("RESIDENT_TOKEN") or None
    ca = ca or os.environ.get("RESIDENT_CA") or None
    return Cluster(_resident.connect(url, token, ca))


def _suite_tasks(path: Union[str, os.PathLike]) -> dict:
    """A ``resident eval`` suite file's tasks as ``generate_job`` keyword arguments by name,
    checked as ``resident eval`` checks them."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise BadInput(f"reading the suite {os.fspath(path)}: {error}", "BadInput") from None
    return {name: _suite.task_kwargs(name, flags)
            for name, flags in _resident.eval_suite_flags(text)}


def _namespace(value: Any) -> Any:
    """JSON as plain objects: dicts become namespaces with the same fields."""
    if isinstance(value, Mapping):
        return types.SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


def _is_arrow(value: Any) -> bool:
    """A pyarrow Array or ChunkedArray (without importing pyarrow)."""
    return type(value).__module__.startswith("pyarrow") and hasattr(value, "to_pylist")


def _arrow_values(array: Any) -> Iterator[Any]:
    """An Arrow column's values, converted a window at a time."""
    for start in range(0, len(array), EMBED_WINDOW):
        yield from array.slice(start, EMBED_WINDOW).to_pylist()


def _is_missing(item: Any) -> bool:
    return item is None or type(item).__name__ == "NAType" or (isinstance(item, float) and item != item)


def _texts(items: Iterable[Any]) -> Iterator[str]:
    """The strings of a list, numpy array, pandas Series, Arrow column or any iterable."""
    if _is_arrow(items):
        items = _arrow_values(items)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            if _is_missing(item):
                raise BadInput(
                    f"text {index} is missing ({item!r}): drop or fill missing texts first "
                    "(Series.dropna(), pyarrow.compute.drop_null)",
                    "BadInput",
                )
            raise BadInput(
                f"text {index} is a {type(item).__name__}, not a str: "
                "texts and prompts are strings (decode bytes first)",
                "BadInput",
            )
        yield item


PRECISIONS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise BadInput(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}", "BadInput")


def _quantize(vectors: np.ndarray, precision: str) -> np.ndarray:
    """float32 rows as sentence-transformers' ``quantize_embeddings`` stores them (int8 and
    uint8 ranges from these rows, as it does without calibration embeddings)."""
    if precision == "float32":
        return vectors
    if precision == "float16":
        return vectors.astype(np.float16)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0).reshape(vectors.shape[0], -1)
        return (packed - 128).astype(np.int8) if precision == "binary" else packed
    if len(vectors) < 2:
        raise BadInput(
            f"{precision} needs ranges from at least two vectors; embed more texts at once, or "
            "use embed_job(precision=...), which calibrates them on the corpus",
            "BadInput",
        )
    starts = vectors.min(axis=0)
    steps = (vectors.max(axis=0) - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return (buckets - 128).astype(np.int8) if precision == "int8" else buckets.astype(np.uint8)


def _names(given: Optional[Union[str, Sequence[str]]]) -> list:
    """A list of names, or one text of comma-separated names, as a list (the CLI reads a
    comma-separated flag so)."""
    if isinstance(given, str):
        given = given.split(",")
    return [name for name in (given or []) if name.strip()]


def _answer_check(
    reference_field: Optional[str],
    extract: Optional[str],
    extract_match: str,
    ignore_regex: Optional[Sequence[str]],
    ignore_case: bool,
    ignore_punctuation: bool,
    filters: Optional[Sequence[str]],
    metrics: Optional[Union[str, Sequence[str]]],
    rouge_stemmer: bool,
) -> Optional[str]:
    """The answer checks of ``generate_job`` as JSON; None when it asks for none."""
    if isinstance(filters, str):
        raise BadInput(
            "filters is a list of NAME=REGEX texts: give [filter] for one", "BadInput"
        )
    check = {
        "reference_field": reference_field,
        "extract": extract,
        "extract_match": extract_match,
        "filters": list(filters or []),
        "ignore": list(ignore_regex or []),
        "ignore_case": ignore_case,
        "ignore_punctuation": ignore_punctuation,
        "metrics": _names(metrics),
        "rouge_stemmer": rouge_stemmer,
    }
    default = {
        "extract_match": "first", "filters": [], "ignore": [], "ignore_case": False,
        "ignore_punctuation": False, "metrics": [], "rouge_stemmer": False,
    }
    asked = any(value not in (None, default.get(key)) for key, value in check.items())
    return json.dumps(check) if asked else None


def _placement(
    selector: Optional[Mapping[str, str]],
    s3_endpoint: Optional[str],
    price: Optional[Mapping[str, float]],
) -> dict:
    """A corpus job's ``selector``, ``s3_endpoint`` and ``price`` as the native side reads
    them (those given)."""
    given = {
        "selector": dict(selector) if selector is not None else None,
        "s3_endpoint": s3_endpoint,
        "price": {k: float(v) for k, v in price.items()} if price is not None else None,
    }
    return {key: value for key, value in given.items() if value is not None}


def _engine(
    max_sequences: Optional[int],
    max_step_tokens: Optional[int],
    max_context: Optional[int],
    dtype: Optional[str],
    enforce_eager: bool,
    attention_kernel: Optional[str],
    chat_template: Optional[str],
    chat_template_kwargs: Optional[Mapping[str, Any]],
) -> dict:
    """The engine's settings as the native side reads them (``EngineSettings``)."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise BadInput("chat_template_kwargs must be a dict of the template's variables, "
                       "e.g. {'enable_thinking': False}", "BadInput")
    return {
        "max_sequences": max_sequences, "max_step_tokens": max_step_tokens,
        "max_context": max_context, "dtype": dtype, "enforce_eager": bool(enforce_eager),
        "attention_kernel": attention_kernel, "chat_template": chat_template,
        "chat_template_kwargs": None if chat_template_kwargs is None else dict(chat_template_kwargs),
    }


def _limit(
    limit: Optional[Union[int, float]], limit_by: Optional[str]
) -> Optional[tuple[str, Optional[str]]]:
    """``limit=`` and ``limit_by=`` as the jobs take them (``--limit``, ``--limit-by``): a
    count of records from 1 or a share of them between 0 and 1 (``0.1``), or None for all,
    and the field whose values each get it."""
    if limit is None:
        if limit_by is not None:
            raise BadInput("limit_by names the field whose values each get the limit: "
                           "give limit too", "BadInput")
        return None
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise BadInput(
            f"limit {limit!r} is not a count of records from 1 or a share of them between "
            "0 and 1: give one, or None for all",
            "BadInput",
        )
    if isinstance(limit, numbers.Integral):  # int, numpy's integers
        return str(int(limit)), limit_by
    share = float(limit)
    if math.isfinite(share) and share.is_integer():
        return str(int(share)), limit_by
    return repr(share), limit_by


def _generate_params(
    max_new_tokens,
    temperature,
    top_p,
    top_k,
    seed,
    stop,
    template,
    sampling: Optional[Mapping[str, Any]] = None,
) -> dict:
    """The decoding parameters as the `generate` kind takes them. ``sampling`` holds the
    keyword arguments past the first seven (``system``, ``min_p``, the penalties, ``n``,
    ``logprobs``...), by the kind's names."""
    if template is None:
        # The chat template, but the raw text for a score (as resident generate's default).
        template = "none" if (sampling or {}).get("score") else "chat"
    if template not in ("chat", "none"):
        raise BadInput(f"template {template!r} is not 'chat' or 'none'", "BadInput")
    params = {
        "template": "Chat" if template == "chat" else "None",
        "max_new_tokens": int(max_new_tokens),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": int(top_k),
        "seed": int(seed),
        "stop": list(stop or []),
    }
    for name, value in (sampling or {}).items():
        if value is None:
            continue
        if name == "stop_token_ids":
            params[name] = [int(token) for token in value]
        elif name in ("logprobs", "ignore_eos", "score", "score_first_token", "choices_as_contexts"):
            params[name] = bool(value)
        elif name in ("system", "reasoning_parser"):
            params[name] = str(value)
        elif name == "response_format":
            params[name] = dict(value)
        elif name in (
            "min_tokens",
            "n",
            "top_logprobs",
            "prompt_logprobs",
            "score_stride",
            "max_score_windows",
        ):
            params[name] = int(value)
        else:
            params[name] = float(value)
    return params


_SAMPLING = (
    "system",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "stop_token_ids",
    "n",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "response_format",
    "score",
    "prompt_logprobs",
    "score_stride",
    "max_score_windows",
    "score_first_token",
    "choices_as_contexts",
    "reasoning_parser",
)


def _check_sampling(sampling: Mapping[str, Any]) -> None:
    """Refuses a keyword argument that is not a sampling parameter, naming those there are."""
    unknown = sorted(set(sampling) - set(_SAMPLING))
    if unknown:
        raise BadInput(
            f"unknown argument {unknown[0]!r}; the sampling arguments are "
            + ", ".join(_SAMPLING),
            "BadInput",
        )


def _score_dict(score: dict) -> dict:
    """A scored text's ``tokens``, ``logprob``, ``perplexity`` and ``greedy``; when all of
    the text was scored, its ``bytes`` and ``words`` and ``bits_per_byte``, as
    ``generations.jsonl`` writes them."""
    tokens = score["tokens"]
    out = {
        "tokens": tokens,
        "logprob": score["logprob"],
        "perplexity": math.exp(-score["logprob"] / tokens) if tokens else None,
        "greedy": score["greedy"],
    }
    size = score.get("size")
    if size is not None:
        out["bytes"], out["words"] = size["bytes"], size["words"]
        if size["bytes"]:
            out["bits_per_byte"] = -score["logprob"] / size["bytes"] / math.log(2)
    return out


def _choices_dict(scored: dict) -> dict:
    """A prompt's scored choices as ``generations.jsonl`` writes them: ``choice_scores``,
    ``best``, ``best_normalized`` and, with an answer, ``answer`` (``answers`` for several
    right ones), ``correct``, ``correct_normalized`` and ``answer_probability``, and with
    one answer ``brier_score`` (the picks as the native side made them)."""
    scores = scored["scores"]
    out = {"choice_scores": []}
    for score in scores:
        line = _score_dict(score)
        if score.get("token_logprobs") is not None:
            line["prompt_logprobs"] = score["token_logprobs"]
        out["choice_scores"].append(line)
    out["best"] = scored["best"]
    out["best_normalized"] = scored["best_normalized"]
    answers = scored.get("answers") or []
    if len(answers) == 1:
        out["answer"] = answers[0]
    elif answers:
        out["answers"] = answers
    if answers:
        out["correct"] = scored["correct"]
        out["correct_normalized"] = scored["correct_normalized"]
    for pick in ("answer_probability", "brier_score"):
        if scored.get(pick) is not None:
            out[pick] = scored[pick]
    return out


def _thinking(c: dict) -> dict:
    """A completion's ``reasoning`` and ``reasoning_tokens`` when ``reasoning_parser`` found
    its thinking; else nothing."""
    if c.get("reasoning") is None:
        return {}
    return {"reasoning": c["reasoning"], "reasoning_tokens": c["reasoning_tokens"]}


def _completion_dict(c: dict) -> dict:
    """A completion as ``generate`` and ``chat`` return it."""
    out = {
        "text": c["text"],
        "tokens": c["generated_tokens"],
        "prompt_tokens": c["prompt_tokens"],
        "finish_reason": c["finish_reason"].lower(),
        "truncated": c["truncated"],
        **_thinking(c),
    }
    if c.get("logprobs") is not None:
        out["logprobs"] = c["logprobs"]
    if c.get("more"):
        first = {k: out[k] for k in ("text", "tokens", "finish_reason")}
        first.update(_thinking(c))
        if "logprobs" in out:
            first["logprobs"] = out["logprobs"]
        out["choices"] = [first] + [
            {
                "text": m["text"],
                "tokens": m["generated_tokens"],
                "finish_reason": m["finish_reason"].lower(),
                **_thinking(m),
                **({"logprobs": m["logprobs"]} if m.get("logprobs") is not None else {}),
            }
            for m in c["more"]
        ]
    score = c.get("score")
    if score is not None:
        out["score"] = _score_dict(score)
        if score.get("token_logprobs") is not None:
            out["prompt_logprobs"] = score["token_logprobs"]
    scored = c.get("choice_scores")
    if scored is not None:
        out.update(_choices_dict(scored))
    if c.get("error") is not None:
        out["error"] = c["error"]
    return out


class Pool:
    """A pool of resident actors: bytes in, bytes out."""

    def __init__(self, native: "_resident.NativePool") -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The pool's name."""
        return self._native.name()

    def map(self, payloads: Iterable[bytes]) -> list[bytes]:
        """Runs every payload through the pool; the outputs in input order.

        A task that failed for good raises :class:`ResidentError` (kind ``TaskFailed``).
        """
        return self._native.map([bytes(p) for p in payloads])

    def submit(self, payloads: Iterable[bytes], job_name: str = "python") -> Iterator[tuple[int, bytes]]:
        """Streams the payloads as one job; yields ``(position, output)`` as each finishes."""
        return iter(self._native.submit(job_name, [bytes(p) for p in payloads]))

    def status(self) -> types.SimpleNamespace:
        """The pool as ``resident pools --json`` shows it."""
        return _namespace(json.loads(self._native.status()))

    def delete(self) -> None:
        """Deletes the pool: its actors stop and free what they hold."""
        self._native.delete()

    def __repr__(self) -> str:
        return f"resident.Pool({self.name!r})"


class _Closed:
    """Stands for the native cluster once :meth:`Cluster.close` ran: every call says so."""

    def __getattr__(self, name: str):
        raise BadInput("this cluster is closed; start another with resident.local() or connect()")


class Cluster:
    """A Resident cluster: from :func:`local` or :func:`connect`.

    ``with resident.local() as cluster:`` closes it at the block's end (see :meth:`close`).
    """

    def __init__(self, native: "_resident.NativeCluster") -> None:
        self._native = native

    def close(self) -> None:
        """Deletes the pools :meth:`embed` and :meth:`generate` made (unless a job still uses
        one) and lets go of the cluster: a local one stops once nothing else holds it. Later
        calls raise :class:`BadInput`. Closing twice is harmless."""
        native, self._native = self._native, _Closed()
        if not isinstance(native, _Closed):
            native.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The scheduler's URL."""
        return self._native.url()

    def embed(
        self,
        texts: Iterable[str],
        model: str,
        *,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: int = 256,
        dtype: Optional[str] = None,
        progress: bool = True,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        normalize: Optional[bool] = None,
        split: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        precision: str = "float32",
        max_seq_length: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
    ) -> np.ndarray:
        """Embeds ``texts`` with ``model``; a float32 array ``(len(texts), dim)`` in input order.

        ``texts`` is a list of ``str``, a numpy array of strings, a pandas Series, a pyarrow
        Array or ChunkedArray, or any iterable: it is read as :meth:`embed_iter` reads it, a
        few chunks per actor ahead of what is done, so an iterator of millions never sits in
        memory whole and every actor stays busy. Rows are normalised when the model's
        sentence-transformers config says so (``all-MiniLM-L6-v2`` and ``all-mpnet-base-v2``
        do); ``normalize=True`` scales every row to unit length, ``normalize=False`` leaves
        out the model's Normalize module. The pool (``replicas`` actors, default one per CPU
        core or as many as the GPUs hold; ``gpus`` per actor, default one GPU each when the
        cluster has GPUs and CPU actors when it has none, ``gpus=0`` for CPU actors on a GPU
        host) is made once for these settings and stays loaded while it is used.

        ``prompt_name`` picks a prompt the model names in its
        ``config_sentence_transformers.json`` (``embed(queries, prompt_name="query")``),
        ``prompt`` gives one's text (``""`` for none); without either, the model's default
        prompt applies, as in sentence-transformers' ``encode``. ``split`` (``"tokens:256:32"``,
        ``"sentences"``) embeds a long text as windows and returns the mean of their vectors
        (``resident embed --split ... --pool-windows mean``) instead of cutting it off.

        As in sentence-transformers' ``encode``, ``truncate_dim`` keeps each vector's first
        dimensions (then ``normalize=True`` scales them), and ``precision`` (``float32``,
        ``float16``, ``int8``, ``uint8``, ``binary``, ``ubinary``) quantises the result, int8
        and uint8 with per-dimension ranges over all the rows returned.
        ``max_seq_length`` (shorter than the model's) and ``max_batch_tokens`` are the pool's.
        """
        _check_precision(precision)
        blocks = list(
            self.embed_iter(
                texts, model, replicas=replicas, gpus=gpus, vram_gib=vram_gib,
                chunk_size=chunk_size, dtype=dtype, progress=progress,
                prompt_name=prompt_name, prompt=prompt, normalize=normalize, split=split,
                truncate_dim=truncate_dim, max_seq_length=max_seq_length,
                max_batch_tokens=max_batch_tokens,
            )
        )
        if not blocks:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        return _quantize(vectors, precision)

    def embed_iter(
        self,
        texts: Iterable[str],
        model: str,
        *,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: int = 256,
        dtype: Optional[str] = None,
        progress: bool = True,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        normalize: Optional[bool] = None,
        split: Optional[str] = None,
        chunks_ahead: Optional[int] = None,
        truncate_dim: Optional[int] = None,
        precision: str = "float32",
        max_seq_length: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
    ) -> Iterator[np.ndarray]:
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
        _check_precision(precision)
        if precision in ("int8", "uint8"):
            raise BadInput(
                f"embed_iter cannot quantise to {precision}: its ranges come from all the "
                "vectors; use embed(), or embed_job(precision=...), which calibrates them",
                "BadInput",
            )
        if truncate_dim is not None and truncate_dim < 1:
            raise BadInput("truncate_dim must be at least 1 (None keeps every dimension)", "BadInput")
        total = len(texts) if isinstance(texts, Sized) else None
        source = _texts(texts)
        stream = self._native.embed_stream(
            model, replicas, gpus, vram_gib, chunk_size, dtype, prompt_name, prompt,
            normalize is False, split, max_seq_length, max_batch_tokens,
        )
        most = max(1, int(chunks_ahead)) if chunks_ahead else max(2, 2 * stream.actors())
        bar = Bar(total, "texts", progress, "embed")
        pending, exhausted = 0, False
        try:
            while True:
                while not exhausted and pending < most:
                    chunk = list(itertools.islice(source, chunk_size))
                    if not chunk:
                        exhausted = True
                        stream.finish()
                        break
                    stream.send(chunk)
                    pending += 1
                if pending == 0:
                    # Every answer is in: the job's end is on the scheduler's record before
                    # the loop ends, so cluster.jobs() right after shows it finished.
                    stream.wait_ended()
                    return
                data, dim, rows = stream.recv()
                pending -= 1
                block = np.frombuffer(data, dtype="<f4").reshape(rows, dim)
                if truncate_dim is not None:
                    if truncate_dim > dim:
                        raise BadInput(
                            f"truncate_dim {truncate_dim} is past the model's {dim} dimensions",
                            "BadInput",
                        )
                    block = block[:, :truncate_dim]
                block = block.copy()
                if normalize:
                    norms = np.linalg.norm(block, axis=1, keepdims=True)
                    block /= np.maximum(norms, 1e-12)
                bar.add(rows)
                yield block if precision in ("float32", "int8", "uint8") else _quantize(block, precision)
        finally:
            stream.cancel()
            bar.close()

    def embed_frame(
        self,
        frame: Any,
        model: str,
        *,
        column: str = "text",
        output_column: str = "embedding",
        **options: Any,
    ) -> Any:
        """A copy of ``frame`` (a pandas DataFrame or a pyarrow Table) with ``output_column``
        added: each row's vector of its ``column`` text, as :meth:`embed` computes it (with
        the same keyword options). pandas gets a column of float32 numpy arrays; Arrow a
        fixed-size list column of float32.
        """
        names = list(frame.column_names) if hasattr(frame, "column_names") else list(frame.columns)
        if column not in names:
            raise BadInput(
                f"no column {column!r} to embed: the frame has {', '.join(map(str, names))}; "
                "pass column=",
                "BadInput",
            )
        if output_column in names:
            raise BadInput(
                f"the frame already has a column {output_column!r}; pass another output_column=",
                "BadInput",
            )
        if hasattr(frame, "column_names"):
            import pyarrow as pa

            vectors = self.embed(frame.column(column), model, **options)
            width = vectors.shape[1] if vectors.size else 0
            flat = pa.array(vectors.reshape(-1), type=pa.float32())
            return frame.append_column(output_column, pa.FixedSizeListArray.from_arrays(flat, width))
        vectors = self.embed(frame[column], model, **options)
        out = frame.copy()
        out[output_column] = list(vectors)
        return out

    def embed_job(
        self,
        input: str,
        model: str,
        output: str,
        *,
        replicas: Optional[int] = None,
        gpus_per_actor: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: Optional[int] = None,
        dtype: str = "f32",
        on_bad_record: str = "skip",
        id_field: str = "id",
        text_field: str = "text",
        keep_pool: bool = False,
        merge: bool = True,
        progress: bool = True,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        precision: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        normalize: Optional[bool] = None,
        max_seq_length: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        format: str = "npy",
        keep_columns: Optional[Sequence[str]] = None,
        split: Optional[str] = None,
        pool_windows: Optional[str] = None,
        selector: Optional[Mapping[str, str]] = None,
        s3_endpoint: Optional[str] = None,
        price: Optional[Mapping[str, float]] = None,
        limit: Optional[Union[int, float]] = None,
        limit_by: Optional[str] = None,
    ) -> dict:
        """Runs ``resident embed``: the resumable corpus job, with the same options.

        ``input`` is a JSONL, text or Parquet file, a directory of them, or ``s3://``;
        ``output`` a directory or ``s3://`` prefix that receives ``embeddings.npy``,
        ``ids.jsonl``, the shards, the manifest and ``report.json``. Run it again after a
        crash: it redoes no finished chunk. Returns ``report.json`` as a dict.

        The vector options are ``resident embed``'s flags: ``prompt_name``/``prompt``,
        ``precision`` (``float32``, ``float16``, ``int8``, ``uint8``, ``binary``,
        ``ubinary``; int8 ranges go to ``index.json``), ``truncate_dim``, ``normalize``
        (``True``: unit length after truncating; ``False``: without the model's Normalize
        module), ``max_seq_length`` and ``max_batch_tokens``. ``format="parquet"`` writes
        ``embeddings.parquet`` (``id``, ``embedding``, and the input fields ``keep_columns``
        names) instead of ``embeddings.npy`` and ``ids.jsonl``. ``split`` (``"tokens:256:32"``,
        ``"sentences:200"``) cuts long texts into windows: a row per window (``id`` is
        ``<doc id>#<window>``, with ``doc_id``, ``window``, ``char_start``, ``char_end``), or
        with ``pool_windows="mean"`` a vector per document. ``selector`` (node labels),
        ``s3_endpoint`` and ``price`` (USD per GPU-hour by ``pool`` label) are
        ``--selector``, ``--s3-endpoint`` and ``--price``; ``limit`` reads only the input's
        first records, a count or a share below 1 (``--limit``), of each value of the field
        ``limit_by`` names when given (``--limit-by``). Read the output with
        :func:`read_embeddings`.
        """
        options = {
            "prompt_name": prompt_name,
            "prompt": prompt,
            "precision": precision,
            "truncate_dim": truncate_dim,
            "normalize": normalize,
            "max_seq_length": max_seq_length,
            "max_batch_tokens": max_batch_tokens,
            "format": format,
            "keep_columns": list(keep_columns) if keep_columns is not None else None,
            "split": split,
            "pool_windows": pool_windows,
            **_placement(selector, s3_endpoint, price),
        }
        bar = Bar(None, "docs", progress, "embed")
        try:
            report = self._native.embed_job(
                input, model, output, replicas, gpus_per_actor, vram_gib, chunk_size, dtype,
                on_bad_record, id_field, text_field, keep_pool, merge,
                lambda done, total, _tokens: bar.set(done, total),
                json.dumps(options), _limit(limit, limit_by),
            )
        finally:
            bar.close()
        return json.loads(report)

    def sweep(
        self,
        config: Union[str, os.PathLike, Mapping[str, Any]],
        *,
        output: Optional[str] = None,
        keep_pool: bool = False,
        price: Optional[Mapping[str, float]] = None,
        progress: bool = True,
    ) -> dict:
        """Runs ``resident sweep``: trials of a search space on resident embed actors.

        ``config`` is a sweep's TOML file (a path), or a dict of the same keys with
        ``search``, ``scheduler`` and ``space`` as nested dicts (``{"lr": {"loguniform":
        [1e-4, 1e-1]}}``). ``search={"algorithm": "tpe"}`` draws trials by TPE after a few
        random ones; ``scheduler={"kind": "asha", ...}`` stops weak trials early. ``output``
        (the declaration's otherwise), ``keep_pool`` and ``price`` (USD per GPU-hour by
        ``pool`` label) are ``--output``, ``--keep-pool`` and ``--price``. Run it again
        after a crash: finished trials are kept. Returns ``summary.json`` as a dict; each
        trial is a line of ``results.jsonl`` in the output.
        """
        if isinstance(config, Mapping):
            declaration, form = json.dumps(dict(config)), "json"
        else:
            with open(os.fspath(config), encoding="utf-8") as file:
                declaration, form = file.read(), "toml"
        options = {
            "output": output,
            "keep_pool": keep_pool,
            "price": {k: float(v) for k, v in price.items()} if price is not None else None,
        }
        bar = Bar(None, "trials", progress, "sweep")
        try:
            summary = self._native.sweep(
                declaration, form, json.dumps(options), lambda done, total: bar.set(done, total)
            )
        finally:
            bar.close()
        return json.loads(summary)

    def generate_job(
        self,
        input: str,
        model: str,
        output: str,
        prompt: str,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Optional[Sequence[str]] = None,
        template: Optional[str] = None,
        replicas: Optional[int] = None,
        gpus_per_actor: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: Optional[int] = None,
        on_bad_record: str = "skip",
        id_field: str = "id",
        text_field: str = "text",
        keep_pool: bool = False,
        progress: bool = True,
        input_format: str = "records",
        output_format: str = "generations",
        choices_field: str = "choices",
        answer_field: str = "answer",
        answer_base: int = 0,
        blank: Optional[str] = None,
        fewshot_input: Optional[str] = None,
        fewshot: int = 5,
        fewshot_delimiter: str = "\n\n",
        fewshot_group: Optional[str] = None,
        accuracy_by: Optional[str] = None,
        description: Optional[str] = None,
        choice_labels: Optional[Sequence[str]] = None,
        fewshot_seed: Optional[int] = None,
        fewshot_sampler: str = "per-record",
        fewshot_as_multiturn: bool = False,
        fewshot_answer_field: Optional[str] = None,
        reference_field: Optional[str] = None,
        extract: Optional[str] = None,
        extract_match: str = "first",
        ignore_regex: Optional[Sequence[str]] = None,
        ignore_case: bool = False,
        ignore_punctuation: bool = False,
        target_delimiter: str = "",
        gen_prefix: Optional[str] = None,
        filters: Optional[Sequence[str]] = None,
        metrics: Optional[Union[str, Sequence[str]]] = None,
        rouge_stemmer: bool = False,
        limit: Optional[Union[int, float]] = None,
        limit_by: Optional[str] = None,
        selector: Optional[Mapping[str, str]] = None,
        s3_endpoint: Optional[str] = None,
        price: Optional[Mapping[str, float]] = None,
        max_sequences: Optional[int] = None,
        max_step_tokens: Optional[int] = None,
        max_context: Optional[int] = None,
        dtype: Optional[str] = None,
        enforce_eager: bool = False,
        attention_kernel: Optional[str] = None,
        chat_template: Optional[str] = None,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        keep_columns: Optional[Union[str, Sequence[str]]] = None,
        format: str = "jsonl",
        _pool_key: Optional[str] = None,
        **sampling: Any,
    ) -> dict:
        """Runs ``resident generate``: a completion per record of a corpus, resumably.

        ``prompt`` holds ``{text}`` (the record's text) and any ``{field}`` of the record
        (``{field:listed}``: a list, an item a line after its label, as ``--prompt``);
        records with ``messages`` in place of a text are conversations.
        ``input_format="openai-batch"`` reads an OpenAI Batch JSONL file (each line's
        ``body`` parameters honoured), ``output_format="openai-batch"`` writes the Batch
        output format. ``sampling`` takes ``system``, ``min_p``, ``repetition_penalty``,
        ``presence_penalty``, ``frequency_penalty``, ``min_tokens``, ``stop_token_ids``,
        ``n``, ``logprobs``, ``top_logprobs``, ``ignore_eos`` (vLLM's meanings) and
        ``response_format`` (OpenAI's JSON schema constraint, or ``{"type": "regex",
        "regex": ...}``, ``{"type": "choice", "choice": [...]}``, ``{"type": "grammar",
        "grammar": LARK}`` as ``--guided-regex``, ``--guided-choice`` and
        ``--guided-grammar`` give them) and ``reasoning_parser`` (``"qwen3"`` or
        ``"deepseek_r1"``: each completion's thinking written apart from its answer, as
        ``--reasoning-parser``); ``score``,
        ``prompt_logprobs``, ``score_stride``, ``max_score_windows``,
        ``score_first_token`` and ``choices_as_contexts`` score each text as ``resident
        generate --score`` does (records with ``choices`` and ``answer``, and
        preference pairs with ``prompt``, ``chosen`` and ``rejected``, too; other field names
        by ``choices_field``, several comma-separated for a text each as PIQA's
        ``"sol1,sol2"``, and ``answer_field``; ``answer_base=1`` counts number answers from
        1, Winogrande's ``"1"``; ``blank="_"`` fills Winogrande's blank with each choice,
        with ``choices_as_contexts``: ``--answer-base``, ``--blank``). With ``score``, ``fewshot_input`` (a
        dev file) puts its first ``fewshot`` answered records before every prompt, each
        written through ``prompt`` with its right choice, joined by ``fewshot_delimiter``
        (``--fewshot-input``); ``fewshot_group`` (a field, MMLU's ``subject``) gives each
        record the first examples with its own value (``--fewshot-group``);
        ``fewshot_seed`` draws each record's examples at random from every answered one (of
        its group), seeded by it and the record's id, never the record itself
        (``--fewshot-seed``, lm-evaluation-harness's default sampler);
        ``fewshot_sampler="lm-eval"`` draws the very examples lm-evaluation-harness draws
        for each record instead (``random.Random(fewshot_seed or 1234).sample`` record after
        record in input order; ``--fewshot-sampler``); ``fewshot_as_multiturn=True`` writes
        each example as a user turn (its prompt) and an assistant turn (its answer) before
        the record's prompt, the last user turn (``--fewshot-as-multiturn``,
        lm-evaluation-harness's ``--fewshot_as_multiturn``; needs ``template="chat"``);
        ``fewshot_answer_field`` (a field) answers each example with its own field in place
        of ``reference_field``, MMLU-Pro's chain of thought ``cot_content``
        (``--fewshot-answer-field``; generating jobs);
        ``accuracy_by``
        (a field) adds the report's ``accuracy_by_group`` (``--accuracy-by``);
        ``description`` goes before the examples and the prompt (``--description``; under
        the chat template it is the system message, after ``system``; with
        ``template="none"``, ``system`` is text before it, as ``--system`` is);
        ``choice_labels`` (``["A", "B", "C", "D"]``) are scored in place of each record's
        choices (``--choice-labels``). ``reference_field`` (a field or path of each record's
        right answer: a text, a number or a list of them) checks each generated answer
        against it: ``extract`` (a regex in ``re``'s syntax, look-around and backreferences
        included; ``extract_match`` ``"first"`` or ``"last"``)
        finds the answer in the text, ``ignore_regex``, ``ignore_case`` and
        ``ignore_punctuation`` say how the two are compared; each line gets ``extracted``
        and ``correct``, the report ``exact_match`` (with ``n``, ``exact_match_any`` and
        ``exact_match_majority``), and ``accuracy_by`` works with it too
        (``--reference-field``, ``--extract``). ``filters`` (``["strict-match=#### (\\d+)",
        "flexible-extract:last=(\\d+)"]``, ``--filter``) judges the same generation by
        several named regexes in place of ``extract``: each line's and the report's
        ``filters`` hold each one's answer and figures by name, the first also giving
        ``extracted`` and ``exact_match``. ``metrics`` (``["rouge", "f1"]`` or
        ``"rouge,f1"``, ``--metric``) also scores each answer by its overlap with the
        reference, the best over a list: ``rouge1``, ``rouge2``, ``rougeL``, ``rougeLsum``
        as the rouge-score package computes them (``rouge``: all four), SQuAD's token
        ``f1``, sacrebleu's ``bleu`` and ``chrf`` (0 to 100); each line has them beside
        ``correct``, the report their means and ``_stderr`` beside ``exact_match`` (BLEU
        and chrF: the corpus's); ``rouge_stemmer=True`` Porter-stems ROUGE's
        words as rouge-score's ``use_stemmer=True`` (``--rouge-stemmer``). With ``reference_field``, ``fewshot_input``
        examples are answered by that field. ``target_delimiter`` goes between each example's
        prompt and its answer and before each scored choice (``--target-delimiter``).
        ``gen_prefix`` starts every answer (``--gen-prefix``, lm-evaluation-harness's
        ``gen_prefix``): the assistant's reply under the chat template, continued; text after
        the prompt and ``target_delimiter`` with ``template="none"``; each example's answer
        after it and a space.
        ``limit`` reads only the input's first records, a count or a share below 1
        (``--limit``), of each value of the field ``limit_by`` names when given
        (``--limit-by``: MMLU's ``subject``). ``selector`` (node
        labels), ``s3_endpoint`` and ``price`` (USD per GPU-hour by ``pool`` label) are
        ``--selector``, ``--s3-endpoint`` and ``--price``, as for :meth:`embed_job`. The
        engine's settings are ``resident generate``'s flags of the same names:
        ``max_sequences`` (decoded at once; ``None``: 256 on a GPU, 32 on the CPU),
        ``max_step_tokens`` (a forward step's tokens; 4,096 on a GPU, 512 on the CPU),
        ``max_context`` (each sequence's context cap), ``dtype`` (the weights' precision:
        ``"auto"``, ``"quantised"``, ``"f32"``, ``"f16"``, ``"bf16"``), ``enforce_eager``
        (no CUDA graphs), ``attention_kernel`` (``"auto"``, ``"tensor-cores"``,
        ``"scalar"``), ``chat_template`` (a Jinja chat template's source, in place of the
        model's own: ``--chat-template``) and ``chat_template_kwargs`` (the template's
        variables, ``{"enable_thinking": False}``: ``--chat-template-kwargs``).
        ``output`` (a directory or ``s3://`` prefix) receives ``generations.jsonl`` (one
        line per record, input order), the shards, the manifest and ``report.json``; a rerun
        after a crash redoes no finished chunk. ``keep_columns`` (``["title",
        "text=article"]`` or ``"title,text=article"``, ``--keep-columns``) writes those
        input fields (or paths, ``meta.url``) into each line after its ``id``, as the input
        has them, ``FIELD=NAME`` under another name (the line's ``text`` is the
        completion). ``format="parquet"`` writes ``generations.parquet`` instead (``id``,
        the kept columns as text, then a typed column per field the job's lines may have,
        scores and checked answers included; nested values as JSON text: ``--format``).
        Returns ``report.json`` as a dict.
        """
        _check_sampling(sampling)
        params = _generate_params(
            max_new_tokens, temperature, top_p, top_k, seed, stop, template, sampling
        )
        bar = Bar(None, "records", progress, "generate")
        try:
            report = self._native.generate_job(
                input, model, output, prompt, json.dumps(params), replicas, gpus_per_actor,
                vram_gib, chunk_size, on_bad_record, id_field, text_field, keep_pool,
                lambda done, total, tokens: bar.set(done, total, f"{tokens} tokens"),
                input_format, output_format,
                json.dumps({
                    "choices": choices_field, "answer": answer_field,
                    "labels": list(choice_labels or []), "answer_base": answer_base,
                    "blank": blank,
                }),
                fewshot_input, fewshot, fewshot_delimiter, fewshot_group, accuracy_by,
                description, fewshot_seed,
                _answer_check(
                    reference_field, extract, extract_match, ignore_regex, ignore_case,
                    ignore_punctuation, filters, metrics, rouge_stemmer,
                ),
                target_delimiter, _limit(limit, limit_by), _pool_key,
                json.dumps(_placement(selector, s3_endpoint, price)),
                fewshot_sampler=fewshot_sampler,
                fewshot_as_multiturn=fewshot_as_multiturn,
                gen_prefix=gen_prefix,
                fewshot_answer_field=fewshot_answer_field,
                keep_columns=_names(keep_columns),
                format=format,
                engine_json=json.dumps(_engine(
                    max_sequences, max_step_tokens, max_context, dtype, enforce_eager,
                    attention_kernel, chat_template, chat_template_kwargs,
                )),
            )
        finally:
            bar.close()
        return json.loads(report)

    def eval(
        self,
        tasks: Union[Mapping[str, Mapping[str, Any]], str, os.PathLike],
        *,
        model: str,
        output: str,
        only: Optional[Sequence[str]] = None,
        progress: bool = True,
    ) -> dict:
        """Runs a suite of evaluation tasks on one model, as ``resident eval`` does.

        ``tasks`` maps each task's name to its ``generate_job`` keyword arguments (``input``
        and ``prompt`` among them; ``model`` and ``output`` are the suite's), or is the path
        of a suite file for ``resident eval --tasks`` (TOML: ``flags``, then ``[[task]]``s
        with a ``name`` and ``resident generate`` flags), each flag read as the keyword of
        the same name (``--max-new-tokens 0`` as ``max_new_tokens=0``, ``--filter`` as
        ``filters``, ``--json-schema FILE`` and ``--guided-*`` as ``response_format``); a flag that names the
        cluster, logging or what ``generate_job`` lacks is refused, saying why. Each task runs
        as ``generate_job(input, model, output/NAME, prompt, ...)`` would; tasks whose
        actors are the same share one pool, so the model loads once, and the pools are
        deleted at the end unless a task says ``keep_pool=True``. ``only`` runs the tasks it
        names; ``results.json`` keeps an earlier call's results of the others (of the same
        model), so a suite run a few tasks at a time has one ``results.json``. ``output`` is
        a directory or an ``s3://`` prefix (reached with the tasks' ``s3_endpoint``). Writes
        ``output/results.json`` and returns it as a dict: ``model``
        and ``tasks``, each with ``name``, ``output``, ``pool``, ``records``, ``wall_seconds``,
        ``truncated_prompts`` where some were cut to fit the context,
        and ``metrics`` (``metric``, ``value``, ``stderr``, ``records``: ``acc``,
        ``acc_norm``, ``exact_match``, ``exact_match,FILTER``, ``perplexity``,
        ``word_perplexity``, ``byte_perplexity``, ``bits_per_byte``...), as
        ``resident eval`` writes it; :func:`eval_table` prints it as its table.
        """
        if isinstance(tasks, (str, os.PathLike)):
            tasks = _suite_tasks(tasks)
        selected = _resident.eval_select(list(tasks), list(only or []))
        for name, arguments in tasks.items():
            given = [key for key in ("model", "output") if key in arguments]
            missing = [key for key in ("input", "prompt") if key not in arguments]
            if given or missing:
                raise BadInput(
                    f"task {name!r}: " + (f"{given[0]} is the suite's: give it to eval()"
                                          if given else f"give its {missing[0]}"),
                    "BadInput",
                )
        # Every task's output goes under `output`, and results.json with them.
        endpoints = {tasks[name].get("s3_endpoint") for name in selected}
        if output.startswith("s3://") and len(endpoints) > 1:
            raise BadInput(
                "the tasks name different s3_endpoint values, and their outputs all go under "
                "the suite's s3:// output: give each the same s3_endpoint",
                "BadInput",
            )
        results: dict = {"model": model, "tasks": []}
        pools: dict = {}
        try:
            for name in selected:
                arguments = dict(tasks[name])
                keep = bool(arguments.pop("keep_pool", False))
                task_output = f"{output.rstrip('/')}/{name}"
                report = self.generate_job(
                    arguments.pop("input"), model, task_output, arguments.pop("prompt"),
                    keep_pool=keep, progress=progress, _pool_key=f"eval|{output}", **arguments,
                )
                pools.setdefault(report["pool"], keep)
                task = {
                    "name": name, "output": task_output, "pool": report["pool"],
                    "records": report["items"], "wall_seconds": report["wall_seconds"],
                    "metrics": json.loads(_resident.eval_metrics(json.dumps(report))),
                }
                if report.get("truncated_prompts"):
                    task["truncated_prompts"] = report["truncated_prompts"]
                results["tasks"].append(task)
        finally:
            for pool, keep in pools.items():
                if not keep:
                    self.pool(pool).delete()
        written, note = _resident.eval_write_results(
            output, json.dumps(results), list(tasks), endpoints.pop()
        )
        if note and progress:
            print(note, file=sys.stderr)
        return json.loads(written)

    def generate(
        self,
        prompts: Iterable[Union[str, Mapping[str, Any]]],
        model: str,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Optional[Sequence[str]] = None,
        template: Optional[str] = None,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        max_sequences: Optional[int] = None,
        dtype: Optional[str] = None,
        max_step_tokens: Optional[int] = None,
        max_context: Optional[int] = None,
        enforce_eager: bool = False,
        attention_kernel: Optional[str] = None,
        chat_template: Optional[str] = None,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        progress: bool = True,
        **sampling: Any,
    ) -> list[dict]:
        """Completes each prompt with ``model`` (a GGUF file or a safetensors directory).

        ``template="chat"`` (the default, but with ``score=True``) wraps each prompt as the
        model's chat template's user turn (after ``system=`` when given); ``"none"`` (the
        default with ``score=True``) feeds it as is (``system=`` then text directly before
        it, lm-evaluation-harness's system instruction without the chat template). A prompt may be a dict
        with ``prompt`` and parameters of its own by OpenAI's names (``{"prompt": ...,
        "temperature": 0.7, "max_tokens": 32}``). Temperature 0 is greedy; with a ``seed``
        sampling repeats per prompt. ``sampling`` takes ``system``, ``min_p``,
        ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
        ``min_tokens``, ``stop_token_ids``, ``n``, ``logprobs``, ``top_logprobs``,
        ``ignore_eos`` (as vLLM's ``SamplingParams`` means them) and ``response_format``
        (OpenAI's: ``{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}``
        makes every completion parse as JSON valid under the schema; ``{"type": "regex",
        "regex": ...}``, ``{"type": "choice", "choice": [...]}`` and ``{"type": "grammar",
        "grammar": LARK}`` make it match the expression, be one of the texts, or be a
        sentence of the grammar). ``reasoning_parser="qwen3"`` (or ``"deepseek_r1"``, vLLM's
        parsers) splits a reasoning model's thinking (``<think>...</think>``) from its
        answer: ``text`` is the answer, ``reasoning`` the thinking and ``reasoning_tokens``
        its tokens, for each of ``choices`` too.

        ``score=True`` scores each prompt's text, raw, under the model,
        as ``resident generate --score`` does: a dict prompt's ``context`` goes before it,
        unscored (``{"prompt": " Paris.", "context": "The capital of France is"}``:
        lm-evaluation-harness's ``loglikelihood``); ``max_new_tokens=0`` generates nothing;
        ``prompt_logprobs=K`` lists each scored token with the K likeliest at its place. A
        text longer than the model's window is scored whole in windows (each after the last,
        one token of context; ``score_stride=N`` scores N tokens a window with the rest as
        context); ``max_score_windows=1`` scores each text's head alone;
        ``score_first_token=True`` scores a text with nothing before it from its first token,
        after the model's BOS (or end-of-text) token, as lm-evaluation-harness's
        ``loglikelihood_rolling`` does. A dict prompt with
        ``choices`` (a list of texts) and optionally ``answer`` (an index, label or text,
        or a list of them for several right ones) has each choice scored after its text instead, nothing generated
        (``{"prompt": "The capital of France is", "choices": [" Paris", " Rome"], "answer":
        0}``: lm-evaluation-harness's multiple choice); with ``choices_as_contexts=True``
        each choice is a context instead and the text is scored after each (Winogrande's
        ``{"prompt": " is too large.", "choices": ["... because the trophy", "... because
        the suitcase"], "answer": 0}``).

        Returns, in input order, dicts with ``text``, ``tokens`` (generated),
        ``prompt_tokens``, ``finish_reason`` (``"stop"`` or ``"length"``) and
        ``truncated``; with ``n`` above 1 also ``choices`` (each with ``text``, ``tokens``,
        ``finish_reason``), with ``logprobs`` a ``logprobs`` list per completion (OpenAI's
        ``token``, ``logprob``, ``bytes``, ``top_logprobs``), and ``error`` for a prompt
        whose own parameters were refused; with ``score`` a ``score`` dict (``tokens``,
        ``logprob``, ``perplexity``, ``greedy``; ``bytes``, ``words`` and ``bits_per_byte``
        when all of the text was scored) and with ``prompt_logprobs`` a
        ``prompt_logprobs`` list; with ``choices`` a ``choice_scores`` list (a ``score`` dict
        each), ``best`` and ``best_normalized`` (the likeliest choice, and the likeliest per
        character) and with ``answer`` ``correct``, ``correct_normalized`` and
        ``answer_probability`` (the right choices' share of the choices' probability:
        TruthfulQA MC2's figure; ``answers`` in ``answer``'s place for several right ones)
        and, for one right answer, ``brier_score`` (the choices' probabilities' squared
        distance from it: lm-evaluation-harness's ``brier_score``, lower is better).
        A progress bar counts the prompts completed
        (``progress=False`` turns it off). ``max_sequences`` is how many prompts each actor
        decodes at once (``None``: 256 on a GPU, 32 on the CPU); ``dtype``,
        ``max_step_tokens``, ``max_context``, ``enforce_eager``, ``attention_kernel`` and
        ``chat_template`` (a Jinja template's source, in place of the model's own) and
        ``chat_template_kwargs`` (its variables besides the conversation: vLLM's,
        ``{"enable_thinking": False}`` turns a Qwen3 model's thinking off) are the
        engine's other settings, as ``resident generate``'s flags of the same names.
        """
        items = []
        for prompt in prompts:
            if isinstance(prompt, str):
                items.append(prompt)
            elif isinstance(prompt, Mapping) and "prompt" in prompt:
                items.append(dict(prompt))
            else:
                raise BadInput(
                    f"a prompt must be a str or a dict with 'prompt', not {type(prompt).__name__}",
                    "BadInput",
                )
        return self._complete(
            items, model, max_new_tokens, temperature, top_p, top_k, seed, stop, template,
            replicas, gpus, vram_gib, progress, sampling,
            _engine(max_sequences, max_step_tokens, max_context, dtype, enforce_eager,
                    attention_kernel, chat_template, chat_template_kwargs),
        )

    def chat(
        self,
        conversations: Iterable[Union[Sequence[Mapping[str, Any]], Mapping[str, Any]]],
        model: str,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Optional[Sequence[str]] = None,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        max_sequences: Optional[int] = None,
        dtype: Optional[str] = None,
        max_step_tokens: Optional[int] = None,
        max_context: Optional[int] = None,
        enforce_eager: bool = False,
        attention_kernel: Optional[str] = None,
        chat_template: Optional[str] = None,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        progress: bool = True,
        **sampling: Any,
    ) -> list[dict]:
        """Answers each conversation with ``model``, as vLLM's ``LLM.chat`` does.

        A conversation is a list of ``{"role", "content"}`` messages (``system``, ``user``,
        ``assistant``; a last ``assistant`` message is continued), or a dict with
        ``messages`` and parameters of its own by OpenAI's names. The model's chat template
        renders it; a system message the template cannot take is refused in words.
        Parameters and the dicts returned are those of :meth:`generate`.

        ``score=True`` scores each conversation's last message, the assistant's reply, given
        the turns before it (``score["logprob"]`` is DPO's reference log-probability of a
        chosen or rejected reply; the reply's end-of-turn marker is scored with it);
        ``max_new_tokens=0`` generates nothing. A conversation that does not end with a
        reply after a user turn gets an ``error``. A dict conversation with ``choices`` (and
        ``answer``) ending with the user's turn has each choice scored as the assistant's
        reply (a preference pair: ``{"messages": [...], "choices": [chosen, rejected],
        "answer": 0}``), as :meth:`generate` does.
        """
        items = []
        for conversation in conversations:
            if isinstance(conversation, Mapping):
                items.append(dict(conversation))
            elif isinstance(conversation, Sequence) and not isinstance(conversation, str):
                items.append({"messages": [dict(m) for m in conversation]})
            else:
                raise BadInput(
                    "a conversation must be a list of {'role', 'content'} dicts or a dict "
                    f"with 'messages', not {type(conversation).__name__}",
                    "BadInput",
                )
        if sampling.get("system") is not None:
            raise BadInput(
                "chat takes the system message as the conversation's first message "
                "({'role': 'system', 'content': ...}), not system=",
                "BadInput",
            )
        # A conversation is always read through the chat template; a score asks for
        # template "none", which only a text prompt would be read with.
        template = "none" if sampling.get("score") else "chat"
        return self._complete(
            items, model, max_new_tokens, temperature, top_p, top_k, seed, stop, template,
            replicas, gpus, vram_gib, progress, sampling,
            _engine(max_sequences, max_step_tokens, max_context, dtype, enforce_eager,
                    attention_kernel, chat_template, chat_template_kwargs),
        )

    def _complete(
        self, items, model, max_new_tokens, temperature, top_p, top_k, seed, stop, template,
        replicas, gpus, vram_gib, progress, sampling, engine,
    ) -> list[dict]:
        _check_sampling(sampling)
        params = _generate_params(
            max_new_tokens, temperature, top_p, top_k, seed, stop, template, sampling
        )
        bar = Bar(len(items), "prompts", progress, "generate")
        try:
            completions = json.loads(
                self._native.generate(
                    json.dumps(items), model, json.dumps(params), replicas, gpus, vram_gib,
                    json.dumps(engine), lambda done, total: bar.set(done, total),
                )
            )
        finally:
            bar.close()
        return [_completion_dict(c) for c in completions]

    def nodes(self) -> list[types.SimpleNamespace]:
        """The nodes, with the fields ``resident status --json`` shows."""
        return _namespace(json.loads(self._native.status())["nodes"])

    def actors(self) -> list[types.SimpleNamespace]:
        """The actors, with the fields ``resident status --json`` shows."""
        return _namespace(json.loads(self._native.status())["actors"])

    def pools(self) -> list[types.SimpleNamespace]:
        """The pools, with the fields ``resident pools --json`` shows."""
        return _namespace(json.loads(self._native.pools()))

    def jobs(self) -> list[types.SimpleNamespace]:
        """The jobs, with the fields ``resident jobs --json`` shows."""
        return _namespace(json.loads(self._native.jobs()))

    def pool(
        self,
        name: str,
        kind: Optional[str] = None,
        *,
        replicas: int = 1,
        gpus: float = 0.0,
        vram_gib: float = 0.0,
        selector: Optional[Mapping[str, str]] = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> Pool:
        """Creates the pool ``name`` of actor ``kind`` and waits until it is ready, or, with
        no ``kind``, attaches to the existing pool of that name.

        ``gpus`` per actor (0.25 shares a GPU four ways), ``vram_gib`` each reserves,
        ``selector`` node labels, ``config`` the kind's actor config: as in the Rust
        ``PoolSpec``. A pool of that name and spec but another replica count is resized.
        """
        config_json = json.dumps(config) if config is not None else None
        selector_map = dict(selector) if selector is not None else None
        return Pool(
            self._native.pool(name, kind, replicas, gpus, vram_gib, selector_map, config_json)
        )

    def __repr__(self) -> str:
        return f"resident.Cluster({self.url!r})"

