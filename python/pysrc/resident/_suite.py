"""A ``resident eval`` suite file's tasks as :meth:`Cluster.generate_job` keyword arguments,
so that :meth:`Cluster.eval` runs the very suite file ``resident eval --tasks`` runs.

Each task is a list of ``resident generate`` flags (the suite's, then its own). The tables
below name the keyword each flag is and how its value reads, as clap reads it in the CLI: a
flag given twice keeps its last value, a repeatable one (``--stop``, ``--filter``...) keeps
every value, a comma-separated one splits at commas. Every flag of ``resident generate
--help`` is in exactly one table (``python/tests/test_score.py`` checks it), so a flag added
to the CLI without its keyword here fails the tests rather than a user's suite.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from .errors import BadInput


def _limit(value: str) -> "int | float":
    """``--limit``: a count of records, or a share of them below 1 (``0.1``)."""
    return float(value) if any(c in value for c in ".eE") else int(value)


def _chat_template(value: str) -> str:
    """``--chat-template``: the file it names, read, or the template itself."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as file:
            return file.read()
    return value


# Flags with one value: the keyword, and how the value reads.
VALUED: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--input": ("input", str),
    "--prompt": ("prompt", str),
    "--s3-endpoint": ("s3_endpoint", str),
    "--replicas": ("replicas", int),
    "--gpus-per-actor": ("gpus_per_actor", float),
    "--vram-gib": ("vram_gib", float),
    "--limit": ("limit", _limit),
    "--limit-by": ("limit_by", str),
    "--chunk-size": ("chunk_size", int),
    "--on-bad-record": ("on_bad_record", str),
    "--id-field": ("id_field", str),
    "--text-field": ("text_field", str),
    "--system": ("system", str),
    "--chat-template": ("chat_template", _chat_template),
    "--chat-template-kwargs": ("chat_template_kwargs", json.loads),
    "--reasoning-parser": ("reasoning_parser", str),
    "--input-format": ("input_format", str),
    "--output-format": ("output_format", str),
    "--template": ("template", str),
    "--max-new-tokens": ("max_new_tokens", int),
    "--temperature": ("temperature", float),
    "--top-p": ("top_p", float),
    "--top-k": ("top_k", int),
    "--seed": ("seed", int),
    "--min-p": ("min_p", float),
    "--repetition-penalty": ("repetition_penalty", float),
    "--presence-penalty": ("presence_penalty", float),
    "--frequency-penalty": ("frequency_penalty", float),
    "--min-tokens": ("min_tokens", int),
    "--n": ("n", int),
    "-n": ("n", int),
    "--top-logprobs": ("top_logprobs", int),
    "--choices-field": ("choices_field", str),
    "--answer-field": ("answer_field", str),
    "--answer-base": ("answer_base", int),
    "--blank": ("blank", str),
    "--description": ("description", str),
    "--fewshot-input": ("fewshot_input", str),
    "--fewshot": ("fewshot", int),
    "--fewshot-group": ("fewshot_group", str),
    "--fewshot-seed": ("fewshot_seed", int),
    "--fewshot-sampler": ("fewshot_sampler", str),
    "--fewshot-answer-field": ("fewshot_answer_field", str),
    "--accuracy-by": ("accuracy_by", str),
    "--reference-field": ("reference_field", str),
    "--extract": ("extract", str),
    "--extract-match": ("extract_match", str),
    "--target-delimiter": ("target_delimiter", str),
    "--gen-prefix": ("gen_prefix", str),
    "--fewshot-delimiter": ("fewshot_delimiter", str),
    "--prompt-logprobs": ("prompt_logprobs", int),
    "--score-stride": ("score_stride", int),
    "--max-score-windows": ("max_score_windows", int),
    "--max-sequences": ("max_sequences", int),
    "--max-step-tokens": ("max_step_tokens", int),
    "--max-context": ("max_context", int),
    "--dtype": ("dtype", str),
    "--attention-kernel": ("attention_kernel", str),
    "--format": ("format", str),
}

# Flags without a value: the keyword they set to True.
SWITCHES: dict[str, str] = {
    "--keep-pool": "keep_pool",
    "--logprobs": "logprobs",
    "--score": "score",
    "--choices-as-contexts": "choices_as_contexts",
    "--ignore-case": "ignore_case",
    "--ignore-punctuation": "ignore_punctuation",
    "--rouge-stemmer": "rouge_stemmer",
    "--score-first-token": "score_first_token",
    "--ignore-eos": "ignore_eos",
    "--enforce-eager": "enforce_eager",
    "--fewshot-as-multiturn": "fewshot_as_multiturn",
}

# Flags that keep every value, in order: repeated, or (``split``) comma-separated too.
LISTS: dict[str, tuple[str, Callable[[str], Any], bool]] = {
    "--stop": ("stop", str, False),
    "--filter": ("filters", str, False),
    "--ignore-regex": ("ignore_regex", str, False),
    "--metric": ("metrics", str, True),
    "--keep-columns": ("keep_columns", str, True),
    "--choice-labels": ("choice_labels", str, True),
    "--stop-token-ids": ("stop_token_ids", int, True),
}

# ``KEY=VALUE`` flags, repeated or comma-separated: a dict.
PAIRS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--selector": ("selector", str),
    "--price": ("price", float),
}

# Flags a task run from Python cannot take, and what to do instead.
REFUSED: dict[str, str] = {
    "--model": "give it to eval(model=...): one model for the whole suite",
    "--output": "each task writes under eval(output=...), in OUTPUT/NAME",
    "--dry-run": "run resident generate with the task's flags to see its prompts",
    "--cluster": "Python runs the suite on the Cluster eval() is called on: leave the "
    "cluster out of the suite (RESIDENT_CLUSTER gives it to resident eval)",
    "--ca": "the Cluster eval() is called on was connected with its own",
    "--token": "the Cluster eval() is called on was connected with its own",
    "--insecure": "the Cluster eval() is called on was connected as it is",
    "--reconnect-timeout": "the Cluster eval() is called on keeps its own",
    "--simulate-gpus": "give it to resident.local(simulate_gpus=...)",
    "--compute-threads": "resident.local() sizes its actors' threads itself",
    "--verbose": "logging is the process's (RESIDENT_LOG)",
    "-v": "logging is the process's (RESIDENT_LOG)",
    "--log-json": "logging is the process's",
    "--idle-ttl": "generate_job has no idle TTL; keep_pool keeps the pool",
    "--no-merge": "generate_job always merges its shards into generations.jsonl",
    "--merge-max-gib": "generate_job always merges its shards into generations.jsonl",
    "--manifest-compact-min": "generate_job keeps the manifest's default",
    "--task-timeout": "generate_job keeps the default task timeout",
}


def _schema_format(path: str) -> dict:
    """``--json-schema FILE`` as OpenAI's ``response_format``, as the CLI reads it."""
    try:
        with open(path, encoding="utf-8") as file:
            schema = json.load(file)
    except OSError as error:
        raise ValueError(f"cannot read it: {error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON: {error}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError("must hold a JSON schema object")
    return {"type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _grammar_format(path: str) -> dict:
    """``--guided-grammar FILE`` (a Lark grammar) as ``response_format``."""
    try:
        with open(path, encoding="utf-8") as file:
            return {"type": "grammar", "grammar": file.read()}
    except OSError as error:
        raise ValueError(f"cannot read it: {error}") from None


# Output constraints: each flag's ``response_format``, as the CLI reads it. A task has one
# (the CLI refuses two of these flags together); ``--guided-choice`` repeated adds a choice.
CONSTRAINTS: dict[str, Callable[[str], dict]] = {
    "--json-schema": _schema_format,
    "--guided-regex": lambda value: {"type": "regex", "regex": value},
    "--guided-choice": lambda value: {"type": "choice", "choice": [value]},
    "--guided-grammar": _grammar_format,
}


def every_flag() -> set[str]:
    """Every flag the tables name (what the tests compare with ``resident generate --help``)."""
    return (set(VALUED) | set(SWITCHES) | set(LISTS) | set(PAIRS) | set(REFUSED)
            | set(CONSTRAINTS))


def task_kwargs(name: str, flags: list[str]) -> dict:
    """Task ``name``'s flags (the suite's, then its own) as ``generate_job`` keyword
    arguments, ``prompt`` ``{text}`` unless they give one (the CLI's default); refused with what to do for a flag a task from Python cannot take, a flag
    ``resident generate`` lacks, a missing or unreadable value."""
    kwargs: dict = {}
    index = 0
    while index < len(flags):
        token = flags[index]
        flag, has_inline, inline = token.partition("=")
        if not flag.startswith("-"):
            raise BadInput(f"task {name!r}: {token!r} is not a flag (each value follows its "
                           "flag, as on resident generate's command line)", "BadInput")
        if flag in REFUSED:
            raise BadInput(f"task {name!r} gives {flag}: {REFUSED[flag]}", "BadInput")
        if flag in SWITCHES:
            if has_inline:
                raise BadInput(f"task {name!r}: {flag} takes no value", "BadInput")
            kwargs[SWITCHES[flag]] = True
            index += 1
            continue
        if flag not in every_flag():
            raise BadInput(f"task {name!r}: {flag} is not a flag of resident generate "
                           "(resident generate --help lists them)", "BadInput")
        if has_inline:
            value = inline
        elif index + 1 < len(flags):
            index += 1
            value = flags[index]
        else:
            raise BadInput(f"task {name!r}: {flag} needs a value", "BadInput")
        _put(kwargs, name, flag, value)
        index += 1
    # resident generate's own default, which generate_job asks for.
    kwargs.setdefault("prompt", "{text}")
    return kwargs


# The flag that gives each ``response_format`` type (``CONSTRAINTS``' values).
_FLAG_OF_TYPE = {"json_schema": "--json-schema", "regex": "--guided-regex",
                 "choice": "--guided-choice", "grammar": "--guided-grammar"}


def _constrain(kwargs: dict, flag: str, value: str) -> None:
    """Sets ``response_format`` from constraint ``flag``: the same flag again replaces its
    value (a choice adds to the choices), another constraint flag is refused."""
    format = CONSTRAINTS[flag](value)
    earlier = kwargs.get("response_format")
    if earlier is not None:
        earlier_flag = _FLAG_OF_TYPE[earlier["type"]]
        if earlier_flag != flag:
            raise ValueError(f"cannot be used with {earlier_flag} (one output constraint a task)")
        if flag == "--guided-choice":
            format["choice"] = earlier["choice"] + format["choice"]
    kwargs["response_format"] = format


def _put(kwargs: dict, name: str, flag: str, value: str) -> None:
    """Sets ``flag``'s keyword from ``value`` as its table reads it."""
    try:
        if flag in VALUED:
            keyword, read = VALUED[flag]
            kwargs[keyword] = read(value)
        elif flag in LISTS:
            keyword, read, split = LISTS[flag]
            values = value.split(",") if split else [value]
            kwargs.setdefault(keyword, []).extend(read(v) for v in values)
        elif flag in PAIRS:
            keyword, read = PAIRS[flag]
            pairs = kwargs.setdefault(keyword, {})
            for pair in value.split(","):
                key, has_value, item = pair.partition("=")
                if not has_value or not key:
                    raise ValueError(f"{pair!r} is not KEY=VALUE")
                pairs[key] = read(item)
        else:
            _constrain(kwargs, flag, value)
    except ValueError as error:
        raise BadInput(f"task {name!r}: {flag} {value!r}: {error}", "BadInput") from None
