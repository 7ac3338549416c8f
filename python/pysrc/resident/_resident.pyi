"""Type stubs of the native module (PyO3); the public API is ``resident`` itself."""

from typing import Callable, Iterator, Optional

class NativeCluster:
    def url(self) -> str: ...
    def close(self) -> int: ...
    def embed_stream(
        self,
        model: str,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: int = 256,
        dtype: Optional[str] = None,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        skip_model_normalize: bool = False,
        split: Optional[str] = None,
        max_seq_length: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
    ) -> NativeEmbedStream: ...
    def embed_job(
        self,
        input: str,
        model: str,
        output: str,
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
        on_progress: Optional[Callable[[int, int, int], None]] = None,
        embedding_json: str = "{}",
        limit: Optional[tuple[str, Optional[str]]] = None,
    ) -> str: ...
    def sweep(
        self,
        declaration: str,
        format: str,
        options_json: str,
        on_progress: Optional[Callable[[int, int], None]] = None,
    ) -> str: ...
    def generate_job(
        self,
        input: str,
        model: str,
        output: str,
        prompt: str,
        params_json: str,
        replicas: Optional[int] = None,
        gpus_per_actor: Optional[float] = None,
        vram_gib: float = 2.0,
        chunk_size: Optional[int] = None,
        on_bad_record: str = "skip",
        id_field: str = "id",
        text_field: str = "text",
        keep_pool: bool = False,
        on_progress: Optional[Callable[[int, int, int], None]] = None,
        input_format: str = "records",
        output_format: str = "generations",
        choices_json: str = "{}",
        fewshot_input: Optional[str] = None,
        fewshot: int = 5,
        fewshot_delimiter: str = "\n\n",
        fewshot_group: Optional[str] = None,
        accuracy_by: Optional[str] = None,
        description: Optional[str] = None,
        fewshot_seed: Optional[int] = None,
        answer_check_json: Optional[str] = None,
        target_delimiter: str = "",
        limit: Optional[tuple[str, Optional[str]]] = None,
        pool_key: Optional[str] = None,
        placement_json: Optional[str] = None,
        fewshot_sampler: str = "per-record",
        engine_json: Optional[str] = None,
        fewshot_as_multiturn: bool = False,
        gen_prefix: Optional[str] = None,
        fewshot_answer_field: Optional[str] = None,
        keep_columns: Optional[list[str]] = None,
        format: str = "jsonl",
    ) -> str: ...
    def generate(
        self,
        prompts_json: str,
        model: str,
        params_json: str,
        replicas: Optional[int] = None,
        gpus: Optional[float] = None,
        vram_gib: float = 2.0,
        engine_json: Optional[str] = None,
        on_progress: Optional[Callable[[int, int], None]] = None,
    ) -> str: ...
    def status(self) -> str: ...
    def pools(self) -> str: ...
    def jobs(self) -> str: ...
    def pool(
        self,
        name: str,
        kind: Optional[str] = None,
        replicas: int = 1,
        gpus: float = 0.0,
        vram_gib: float = 0.0,
        selector: Optional[dict[str, str]] = None,
        config_json: Optional[str] = None,
    ) -> NativePool: ...

class NativePool:
    def name(self) -> str: ...
    def map(self, payloads: list[bytes]) -> list[bytes]: ...
    def submit(self, job_name: str, payloads: list[bytes]) -> NativeResults: ...
    def status(self) -> str: ...
    def delete(self) -> None: ...

class NativeResults(Iterator[tuple[int, bytes]]):
    def __iter__(self) -> NativeResults: ...
    def __next__(self) -> tuple[int, bytes]: ...

class NativeEmbedStream:
    def actors(self) -> int: ...
    def send(self, texts: list[str]) -> None: ...
    def finish(self) -> None: ...
    def wait_ended(self) -> None: ...
    def cancel(self) -> None: ...
    def recv(self) -> Optional[tuple[bytes, int, int]]: ...

def local(simulate_gpus: Optional[str] = None, state_dir: Optional[str] = None) -> NativeCluster: ...
def eval_metrics(report_json: str) -> str: ...
def eval_select(names: list[str], only: list[str]) -> list[str]: ...
def eval_suite_flags(text: str) -> list[tuple[str, list[str]]]: ...
def eval_table(results_json: str) -> str: ...
def eval_write_results(
    output: str, results_json: str, suite: list[str], s3_endpoint: Optional[str] = None
) -> tuple[str, Optional[str]]: ...
def connect(url: str, token: Optional[str] = None, ca: Optional[str] = None) -> NativeCluster: ...
