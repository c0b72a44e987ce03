"""The ``hf`` rollout's server: HF-transformers generation shaped like verl's vLLM server actor.

:class:`HFServer` holds an HF model. ``generate`` gathers the requests that arrive together into one left-padded
batch, samples with ``model.generate`` and returns the response tokens, their log-probs (when asked) and
``extra_fields["global_steps"]`` (the weight version). Each request samples from a generator of its own, seeded by the
run's seed, the weight version, the prompt and how many requests with that prompt came before it at that version (or
by the request's own ``seed``, as vLLM takes one): the tokens do not depend on which requests share its batch, so two
runs with one seed sample alike. Lifecycle calls (wake_up, sleep, ...) are no-ops. The model
loads on the host; on a GPU machine it moves, at the first weight hand-off, to the GPU of the worker that feeds it
(found by the GPU's UUID, as verl's vLLM server takes its workers' devices). Ray runs it behind the shell of
:mod:`recipes.verl_ext.hf_server_actor`; the replica and the worker-side adapter are in :mod:`.hf_rollout`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.replica import TokenOutput

from recipes.verl_ext.plugin.packed_weights import PackedWeights, unpack

__all__ = ["HFServer", "cuda_index_of"]

logger = logging.getLogger(__name__)

# A batch starts once no request arrived for _BATCH_QUIET_S, or _BATCH_MAX_WAIT_S after its first request.
_BATCH_QUIET_S = 0.01
_BATCH_MAX_WAIT_S = 0.05


class HFServer:
    """Token-in/token-out generation with an HF model, shaped like verl's vLLM server actor."""

    def __init__(self, config, model_config, replica_rank: int = 0) -> None:
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.weight_version = 0  # how many weight hand-offs this server has loaded
        torch.manual_seed(self.config.seed + replica_rank)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        tokenizer = self.model_config.tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids = sorted(set(eos) | {tokenizer.eos_token_id})
        self._lock = threading.Lock()  # generation threads vs weight loads
        self._pending: list[tuple[list[int], dict, asyncio.Future, int]] = []
        self._seen: dict[bytes, int] = {}  # requests per prompt at the weight version self._seen_version
        self._seen_version = 0
        self._batcher: asyncio.Task | None = None
        self.device = torch.device("cpu")
        self._placed = False  # whether a hand-off has named the feeding worker's GPU yet

    # ---- placement --------------------------------------------------------------------------------------------

    def _place(self, device_uuid: str | None) -> None:
        """Move the model to the GPU of that UUID, once, at the first hand-off that names one; stay on the host
        where this process cannot see it."""
        if device_uuid is None or self._placed:
            return
        self._placed = True
        index = cuda_index_of(device_uuid)
        if index is None:
            logger.warning("hf rollout: the feeding worker's GPU %s is not visible here; generating on the host",
                           device_uuid)
            return
        with self._lock:
            self.device = torch.device("cuda", index)
            self.model.to(self.device)
        print(f"hf rollout: server {self.replica_rank} generates on {self.device} ({device_uuid})", flush=True)

    # ---- generation -------------------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        audio_data=None,
        mm_processor_kwargs=None,
        priority: int = 0,
        **kwargs,
    ) -> TokenOutput:
        if image_data or video_data or audio_data:
            raise NotImplementedError("the hf rollout is text-only")
        future = asyncio.get_running_loop().create_future()
        prompt_ids = list(prompt_ids)
        seed = self._request_seed(prompt_ids, sampling_params)
        self._pending.append((prompt_ids, dict(sampling_params), future, seed))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        token_ids, log_probs, weight_steps = await future
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": weight_steps},
        )

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            started = loop.time()
            while True:
                seen = len(self._pending)
                await asyncio.sleep(_BATCH_QUIET_S)
                if len(self._pending) == seen or loop.time() - started >= _BATCH_MAX_WAIT_S:
                    break
            pending, self._pending = self._pending, []
            groups: dict[tuple, list] = {}
            for item in pending:
                groups.setdefault(self._sampling_key(item[0], item[1]), []).append(item)
            for key, items in groups.items():
                try:
                    results = await asyncio.to_thread(
                        self._generate_batch, [item[0] for item in items], key, [item[3] for item in items]
                    )
                except Exception as error:  # hand the error to every waiting request
                    for _, _, future, _ in items:
                        future.set_exception(error)
                    continue
                for (_, _, future, _), result in zip(items, results, strict=True):
                    future.set_result(result)

    def _request_seed(self, prompt_ids: list[int], params: dict) -> int:
        """The request's ``seed`` where it names one; else one drawn from the run's seed, the weight version, the
        prompt and the count of earlier requests with that prompt at that version (the n samples of a prompt are
        alike until then, so the order in which they arrive does not matter)."""
        if params.get("seed") is not None:
            return int(params["seed"])
        if self._seen_version != self.weight_version:
            self._seen, self._seen_version = {}, self.weight_version
        prompt = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).digest()
        count = self._seen.get(prompt, 0)
        self._seen[prompt] = count + 1
        key = f"{self.config.seed}/{self.weight_version}/{count}/".encode() + prompt
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)

    def _sampling_key(self, prompt_ids: list[int], params: dict) -> tuple:
        """(max_new_tokens, temperature, top_p, top_k, want_logprobs): requests batch together when these agree."""
        if "max_tokens" in params:
            max_tokens = params["max_tokens"]
        elif "max_new_tokens" in params:
            max_tokens = params["max_new_tokens"]
        else:
            max_tokens = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - len(prompt_ids),
            )
        temperature = float(params.get("temperature", self.config.temperature))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        return max(1, int(max_tokens)), temperature, top_p, top_k, bool(params.get("logprobs", False))

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], key: tuple, seeds: list[int]
    ) -> list[tuple[list[int], list[float] | None, Any]]:
        """Left-pad, generate, cut each row after its first eos: ``(token_ids, log_probs, weight version)`` per row.
        ``seeds``: one per row (:meth:`_request_seed`)."""
        max_new_tokens, temperature, top_p, top_k, want_logprobs = key
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        # Decoding is greedy over the processed scores; when sampling, the last processor adds each row's own Gumbel
        # noise to them, which makes the argmax a draw from their softmax (vLLM's processed distribution). Every knob
        # is set here: transformers' own sampling would default top_k to 50 where verl's actor scores the full one.
        generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_scores=want_logprobs and temperature <= 0,
        )
        with self._lock:  # the model's device and weights hold still while it generates
            weight_steps = self.global_steps
            input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
            draws = (_RowDraws(seeds, self.device, temperature, top_p, top_k, keep_scores=want_logprobs)
                     if temperature > 0 else None)
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                logits_processor=LogitsProcessorList([draws] if draws is not None else []),
            )
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # generate's cache back to the GPU, for the training side that follows
        responses = out.sequences[:, width:]
        log_probs = None
        if want_logprobs:
            # the scores each token was drawn from (after temperature, top-k, top-p): vLLM's "processed" log-probs
            scores = torch.stack(draws.scores if draws is not None else out.scores, dim=1).float()
            log_probs = torch.log_softmax(scores, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        results = []
        eos = set(self.eos_token_ids)
        for row in range(len(prompts)):
            tokens = responses[row].tolist()
            length = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
            row_log_probs = log_probs[row, :length].tolist() if log_probs is not None else None
            results.append((tokens[:length], row_log_probs, weight_steps))
        return results

    # ---- weights ----------------------------------------------------------------------------------------------

    async def update_weights(self, state_dict: PackedWeights | dict[str, torch.Tensor], global_steps: int | None = None,
                             device_uuid: str | None = None) -> dict[str, tuple[int, int, int]]:
        """Load a full state dict (HF names; packed, as the adapter sends it, or a dict); returns the checksums of the
        loaded tensors, read back from the model (hybrid_engine.reshard.checksum), for the sync check.
        ``device_uuid``: the feeding worker's GPU."""
        if isinstance(state_dict, PackedWeights):
            state_dict = unpack(state_dict)
        await asyncio.to_thread(self._place, device_uuid)
        await asyncio.to_thread(self._load_state_dict, state_dict)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        sent = {name: tensor.dtype for name, tensor in state_dict.items()}
        return await asyncio.to_thread(self._loaded_checksums, sent)

    def _loaded_checksums(self, sent: dict[str, torch.dtype]) -> dict[str, tuple[int, int, int]]:
        """The checksums of the model's tensors named in ``sent``, read back in the dtype each was sent in: the
        server's model is float32, and Megatron's export sends bfloat16 (bf16 -> fp32 -> bf16 gives back the sent
        bits; a tensor changed on the way does not)."""
        # lazy: ~50 ms, only a weight sync's check needs it
        from hybrid_engine.reshard.checksum import checksums

        with self._lock:
            model = self.model.state_dict()
            found, sums = checksums({name: model[name].to(dtype) for name, dtype in sent.items() if name in model})
        return {name: tuple(row) for name, row in zip(found, sums.tolist(), strict=True)}

    def _load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        with self._lock:
            result = self.model.load_state_dict(state_dict, strict=False)
        missing = [name for name in result.missing_keys if not self._is_tied(name)]
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"hf rollout: weight hand-off does not match the model: missing {missing[:5]}, "
                f"unexpected {result.unexpected_keys[:5]}"
            )

    def _is_tied(self, name: str) -> bool:
        return name == "lm_head.weight" and bool(getattr(self.model.config, "tie_word_embeddings", False))

    async def set_global_steps(self, global_steps: int, device_uuid: str | None = None) -> None:
        await asyncio.to_thread(self._place, device_uuid)
        self.global_steps = global_steps

    async def get_state(self) -> dict[str, Any]:
        """For tests and debugging: the weight version and a checksum of the weights."""
        with self._lock:
            checksum = float(sum(p.detach().double().sum() for p in self.model.parameters()))
        return {"global_steps": self.global_steps, "weight_version": self.weight_version, "checksum": checksum,
                "device": str(self.device)}

    # ---- lifecycle: nothing to free or restore on the CPU -----------------------------------------------------

    async def wake_up(self, *args, **kwargs) -> None:
        return None

    async def sleep(self, *args, **kwargs) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def cuda_index_of(device_uuid: str) -> int | None:
    """This process's CUDA index of the GPU with that UUID, or None where it sees no such GPU (or none at all)."""
    if not torch.cuda.is_available():
        return None
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == device_uuid:
            return index
    return None


class _RowDraws(LogitsProcessor):
    """Temperature, top-k and top-p, then Gumbel noise from each row's own generator: under greedy decoding the
    argmax is then a draw from the processed distribution, and row r's t-th token uses the t-th draw of its own
    generator whatever else shares the batch. Keeps the processed scores (before the noise) for the log-probs, when
    asked."""

    def __init__(self, seeds: list[int], device: torch.device, temperature: float, top_p: float, top_k: int,
                 keep_scores: bool) -> None:
        self.warpers = LogitsProcessorList()
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k))
        if 0.0 < top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.keep_scores = keep_scores  # [rows, vocab] a token: only when log-probs are asked for
        self.scores: list[torch.Tensor] = []
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = self.warpers(input_ids, scores)
        if self.keep_scores:
            self.scores.append(scores)
        uniform = torch.stack([
            torch.rand(scores.shape[-1], generator=generator, device=scores.device) for generator in self.generators
        ])
        gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))
        return scores + gumbel.to(scores.dtype)
