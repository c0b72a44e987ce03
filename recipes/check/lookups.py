"""What verl 0.9.1 looks up or combines only once a run is going, checked in the driver before Ray (issue 49, 2-3).

- Names verl resolves at run time, read from verl's own registries (imported, never copied): the rollout engine
  (``RolloutReplicaRegistry`` and the worker's ``_ROLLOUT_REGISTRY``), the reward manager (the reward loop's
  ``REWARD_MANAGER``), ``trainer.device`` (``PlatformRegistry``). :func:`registry_problems`, in the validator's verl
  phase (it imports verl).
- Files and names verl opens at run time: the custom reward function's file and function, a reward manager loaded
  by ``importlib``, data files by their format (verl's RLHFDataset reads ``.parquet``, ``.json`` and ``.jsonl``) and
  a parquet file that is empty or not parquet, ``trainer.resume_mode=resume_path`` without a checkpoint folder, LoRA
  target modules against the model's module names (peft's own matching). :func:`lookup_problems`.
- Combinations that cannot run: GAE without a critic, vLLM or SGLang on ``cluster=cpu``, Ulysses sequence
  parallelism (``layout.train.cp``) that does not divide the attention heads under FSDP, a critic whose vocabulary
  is smaller than the actor tokenizer's. :func:`lookup_problems`. A learning rate orders of magnitude off is a
  warning (:func:`lookup_warnings`).

A file that is not on this machine is a note (it may be on the cluster), as a missing data file is at validation.
Everything reads the resolved config (a plain dict).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import math
from pathlib import Path

from hybrid_engine.model_spec import MODEL_CONFIG_DIR, ModelArch, ModelSpecError, load_arch, shipped_name_of_hub_id
from hybrid_engine.plan.settings import FSDP_FAMILY
from recipes.verl_ext.registries import device_names, reward_manager_names, rollout_names
from recipes.verl_ext.types import _at, _inside

# verl/utils/dataset/rl_dataset.py RLHFDataset._read_files_and_tokenize: the endings it reads, else ValueError
DATA_FORMATS = (".parquet", ".json", ".jsonl")
# verl/utils/import_utils.py load_module
PKG_PREFIX, FILE_PREFIX = "pkg://", "file://"
# verl/trainer/ppo/reward.py resolve_reward_manager_cls
REWARD_SOURCES = ("register", "importlib")
# a learning rate outside this band is orders of magnitude off for fine-tuning with Adam (verl's default is 1e-6)
LR_BAND = (1e-9, 1e-1)
_ROLLOUT = "actor_rollout_ref.rollout.name"


def did_you_mean(value: str, choices) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _name_line(key: str, value, what: str, choices: tuple[str, ...]) -> str:
    hint = did_you_mean(value, choices) if isinstance(value, str) else ""
    return f"{key}: {value!r} is not one of verl 0.9.1's {what}: {', '.join(choices)}{hint}"


def registry_problems(container: dict, inactive: frozenset[str] = frozenset()) -> dict[str, str]:
    """Full key -> problem for the rollout engine, the registered reward manager and ``trainer.device``."""
    out = {}
    name = _at(container, _ROLLOUT)
    if name is not None and name not in (choices := rollout_names()):
        out[_ROLLOUT] = _name_line(_ROLLOUT, name, "rollout engines", choices)
    key, manager, source = _reward_manager(container)
    if source == "register" and manager is not None and manager not in (choices := reward_manager_names()):
        out[key] = _name_line(key, manager, "reward managers", choices)
    device = _at(container, "trainer.device")
    if device is not None and device not in (choices := device_names()):
        out["trainer.device"] = _name_line("trainer.device", device, "devices", choices)
    return {k: v for k, v in out.items() if not _inside(k, inactive)}


# ---- files verl opens at run time -------------------------------------------------------------------------------


def _reward_manager(container: dict) -> tuple[str, object, object]:
    """(the key that names it, the name, the source) as verl's reward loop migrates them: the legacy
    ``reward_model.reward_manager`` / ``reward_loop_source`` win where set."""
    legacy = _at(container, "reward_model.reward_manager")
    key = "reward_model.reward_manager" if legacy is not None else "reward.reward_manager.name"
    source = _at(container, "reward_model.reward_loop_source") or _at(container, "reward.reward_manager.source")
    return key, legacy if legacy is not None else _at(container, key), source


def reward_function(container: dict) -> tuple[str, dict]:
    """(the section, its node) of the custom reward function verl loads: the legacy top-level
    ``custom_reward_function`` replaces ``reward.custom_reward_function`` where any of its values is set."""
    legacy = _at(container, "custom_reward_function")
    if isinstance(legacy, dict) and any(v is not None for v in legacy.values()):
        return "custom_reward_function", legacy
    node = _at(container, "reward.custom_reward_function")
    return "reward.custom_reward_function", node if isinstance(node, dict) else {}


def top_level_names(source: str) -> set[str] | None:
    """The names a module binds at its top level (defs, classes, assignments, imports, also inside top-level
    if/try/with blocks), read without running it; None where they cannot be known so (``import *``, a module
    ``__getattr__``, ``globals()``)."""
    tree = ast.parse(source)
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__":
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                stack.extend(getattr(node, field, []))
            stack.extend(stmt for handler in getattr(node, "handlers", []) for stmt in handler.body)
    if "__getattr__" in names or any(isinstance(n, ast.Name) and n.id == "globals" for n in ast.walk(tree)):
        return None
    return names


def module_file(path: str) -> tuple[Path | None, str]:
    """The source file of a verl module path (``pkg://a.b``, ``file://x.py``, a path) and how it was found; None
    with the reason where it is not on this machine (or, for ``pkg://``, not importable)."""
    if path.startswith(PKG_PREFIX):
        module = path[len(PKG_PREFIX):].replace("/", ".")
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None, f"module {module} is not importable here"
        return Path(spec.origin), ""
    local = Path(path[len(FILE_PREFIX):] if path.startswith(FILE_PREFIX) else path).expanduser()
    return (local, "") if local.is_file() else (None, "is not a file on this machine")


def extern_object_problem(path_key: str, path, name_key: str, name, what: str) -> tuple[str | None, str | None]:
    """(problem, note) for the object verl's ``load_extern_object(path, name)`` loads: the file is read (not run)
    and must bind ``name`` at its top level. A file not here: a note (it may be on the cluster, as a data file)."""
    if not name:
        return f"{name_key}: not set, but {path_key}={path} names a file: verl 0.9.1 loads the {what} by name", None
    file, why = module_file(str(path))
    if file is None:
        return None, f"{path_key}: {path} {why}; the {what} {name!r} is not checked"
    try:
        names = top_level_names(file.read_text())
    except (SyntaxError, UnicodeDecodeError, ValueError) as error:
        return f"{path_key}: {file} does not parse as Python ({error.__class__.__name__}: {error})", None
    if names is None or name in names:
        return None, None
    public = sorted(n for n in names if not n.startswith("_"))
    return (f"{name_key}: {file} defines no {name!r}{did_you_mean(str(name), public)} (verl 0.9.1 loads the {what} "
            f"with getattr(module, {name!r}); its top-level names: {', '.join(public) or 'none'})"), None


def reward_problems(container: dict) -> tuple[list[str], list[str]]:
    """(problems, notes) of the custom reward function and of a reward manager loaded by ``importlib``."""
    problems, notes = [], []
    section, node = reward_function(container)
    if node.get("path"):
        problem, note = extern_object_problem(f"{section}.path", node["path"], f"{section}.name", node.get("name"),
                                              "reward function")
        problems += [problem] if problem else []
        notes += [note] if note else []
    key, manager, source = _reward_manager(container)
    source_key = "reward.reward_manager.source"
    if source not in REWARD_SOURCES and source is not None:
        problems.append(f"{source_key}: {source!r} is not one of verl 0.9.1's reward manager sources: "
                        f"{', '.join(REWARD_SOURCES)}{did_you_mean(str(source), REWARD_SOURCES)}")
    elif source == "importlib":
        path = _at(container, "reward.reward_manager.module.path")
        if not path:
            problems.append("reward.reward_manager.module.path: not set, but reward.reward_manager.source=importlib "
                            "loads the reward manager class from it")
        else:
            problem, note = extern_object_problem("reward.reward_manager.module.path", path, key, manager,
                                                  "reward manager class")
            problems += [problem] if problem else []
            notes += [note] if note else []
    return problems, notes


def _paths(value) -> list[str]:
    return [str(p) for p in (value if isinstance(value, (list, tuple)) else [value]) if p is not None]


def data_file_problems(container: dict) -> list[str]:
    """Data files verl's RLHFDataset cannot read: by their ending (wherever they are, a remote one too) and, for a
    local file, an empty one or a parquet file pyarrow cannot read. None with a custom dataset class (it reads them)."""
    if _at(container, "data.custom_cls.path"):
        return []
    out = []
    for key in ("data.train_files", "data.val_files"):
        for path in _paths(_at(container, key)):
            problem = _data_file_problem(key, path)
            if problem:
                out.append(problem)
                break
    return out


def _data_file_problem(key: str, path: str) -> str | None:
    if not path.endswith(DATA_FORMATS):
        return (f"{key}: {path} is not a format verl 0.9.1 reads: its RLHFDataset reads {', '.join(DATA_FORMATS)} "
                f"files (by the name's ending; data.custom_cls names a dataset class for others)")
    local = Path(path).expanduser()
    if "://" in path or not local.is_file():
        return None  # not here: machine_notes says so at validate, train_problems stops a training run here
    if local.stat().st_size == 0:
        return f"{key}: {path} is empty (0 bytes): verl 0.9.1's dataset would have no rows"
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # lazy: only for a local parquet file

        try:
            pq.read_schema(local)
        except Exception as error:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError with its own text
            return f"{key}: {path} is not a parquet file pyarrow can read ({str(error).splitlines()[0]})"
    return None


def resume_problems(container: dict) -> list[str]:
    """``trainer.resume_mode=resume_path`` needs the checkpoint folder: verl 0.9.1 asserts a string holding
    ``global_step_`` and reads the step from it."""
    if _at(container, "trainer.resume_mode") != "resume_path":
        return []
    path = _at(container, "trainer.resume_from_path")
    key = "trainer.resume_from_path"
    if not isinstance(path, str) or not path:
        shown = "null" if path is None else repr(path)
        return [f"{key}: {shown}, but trainer.resume_mode=resume_path resumes from it: name a checkpoint folder "
                "(<trainer.default_local_dir>/global_step_<n>), or use trainer.resume_mode=auto (the latest one) or "
                "run.resume=<run folder>"]
    if "global_step_" not in path:
        return [f"{key}: {path} is not a global_step_<n> folder: verl 0.9.1 reads the step to resume from that name "
                "(trainer.resume_mode=resume_path)"]
    return []


# ---- the model: LoRA target modules, Ulysses heads, the critic's vocabulary ----------------------------------------


def _config_dir(container: dict, section: str, arch: ModelArch | None) -> Path | None:
    """The folder whose config.json describes ``section``'s model here: the local folder at its path (or
    ``hf_config_path``), else the shipped config of its hub id or of ``arch``."""
    for key in ("hf_config_path", "path"):
        where = _at(container, f"{section}.{key}")
        if where and (Path(str(where)).expanduser() / "config.json").is_file():
            return Path(str(where)).expanduser()
    where = _at(container, f"{section}.path")
    name = shipped_name_of_hub_id(str(where)) if where else None
    name = name or (arch.name if arch is not None else None)
    shipped = MODEL_CONFIG_DIR / str(name) if name else None
    return shipped if shipped is not None and (shipped / "config.json").is_file() else None


def module_names(config_dir: Path) -> tuple[list[str], set[str]]:
    """(every module's dotted name, the names of its Linear layers' last parts) of the causal LM at
    ``config_dir``, built on the meta device (no weights, no memory)."""
    import torch  # lazy: only with LoRA on
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = [name for name, _ in model.named_modules() if name]
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return names, linear


def _matches(target, names: list[str]) -> bool:
    from types import SimpleNamespace  # lazy: with peft below, only where LoRA targets are checked

    # lazy: peft imports torch and transformers' internals; peft's own matching, as get_peft_model uses
    from peft.tuners.tuners_utils import check_target_module_exists

    config = SimpleNamespace(target_modules=target, exclude_modules=None, target_parameters=None)
    return any(check_target_module_exists(config, name) for name in names)


def lora_problems(container: dict, arch: ModelArch | None) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the actor's LoRA target modules under FSDP (``lora_rank`` > 0): none of them names a
    module of the model (peft refuses it), or some do not (peft leaves them out silently)."""
    section = "actor_rollout_ref.model"
    key = f"{section}.target_modules"
    target = _at(container, key)
    rank = _at(container, f"{section}.lora_rank")
    if (not isinstance(rank, int) or rank <= 0 or _at(container, "strategy.name") not in FSDP_FAMILY
            or target in (None, "all-linear") or _at(container, f"{section}.lora_adapter_path")):
        return [], []
    folder = _config_dir(container, section, arch)
    if folder is None:
        return [], []
    try:
        names, linear = module_names(folder)
    except Exception:  # noqa: BLE001 - a model transformers cannot build here: verl's own load says why
        return [], []
    model = arch.name if arch is not None else folder.name
    shown = ", ".join(sorted(linear))
    targets = [target] if isinstance(target, str) else list(target)
    missing = [t for t in targets if not _matches(t if isinstance(target, str) else [t], names)]
    if not missing:
        return [], []
    hints = "".join(did_you_mean(str(t), linear).replace(" (did", f" ({t}: did") for t in missing)
    if len(missing) == len(targets):
        return [f"{key}: {target!r} names no module of {model}{hints}: peft refuses the model (its Linear "
                f"modules: {shown}; or all-linear)"], []
    return [], [f"{key}: {', '.join(map(str, missing))} names no module of {model}{hints}: peft adapts the "
                f"others only (its Linear modules: {shown})"]


def ulysses_problems(container: dict, arch: ModelArch | None, cp: int | None) -> list[str]:
    """Ulysses sequence parallelism under FSDP (``layout.train.cp`` > 1) splits the attention heads over the cp
    ranks: verl 0.9.1 asserts heads % cp == 0 and kv heads % cp == 0 or cp % kv heads == 0."""
    if arch is None or not isinstance(cp, int) or cp <= 1 or _at(container, "strategy.name") not in FSDP_FAMILY:
        return []
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if heads % cp:
        return [f"layout.train.cp: Ulysses sequence parallelism splits {arch.name}'s {heads} attention heads over "
                f"cp({cp}) ranks: {heads} % {cp} = {heads % cp}"]
    if kv % cp and cp % kv:
        return [f"layout.train.cp: Ulysses sequence parallelism needs cp({cp}) to divide {arch.name}'s {kv} kv heads "
                f"or be a multiple of them: {kv} % {cp} = {kv % cp}, {cp} % {kv} = {cp % kv}"]
    return []


SGLANG_KWARGS = "actor_rollout_ref.rollout.engine_kwargs.sglang"
SGLANG_ATTENTION = f"{SGLANG_KWARGS}.attention_backend"
FLASHINFER_HEAD_DIMS = (64, 128, 256)
"""The head widths flashinfer's attention kernels are compiled for (its DISPATCH_HEAD_DIM). verl 0.9.1 starts SGLang
0.5.12 and later on flashinfer where ``engine_kwargs.sglang.attention_backend`` names none (its
async_sglang_server.py: SGLang's FA3 default breaks CUDA-graph capture there). On one H100 (2026-12-07,
scripts/gpu/results/2026-12-07-h100-sglang/) the tiny model's head_dim 16 stopped SGLang's start with
"Unsupported head_dim: 16"; its triton backend ran it."""


def sglang_attention_problems(container: dict, arch: ModelArch | None) -> list[str]:
    """rollout=sglang on flashinfer (verl's choice when none is named) with a head width flashinfer has no kernel
    for: SGLang's server dies capturing its CUDA graphs, after Ray and the training workers have started."""
    if arch is None or arch.kv_lora_rank or _at(container, _ROLLOUT) != "sglang":
        return []  # MLA models: SGLang's MLA kernels, another head-width rule
    sglang_kwargs = _at(container, SGLANG_KWARGS) or {}
    if sglang_kwargs.get("attention_backend") is not None or arch.head_dim in FLASHINFER_HEAD_DIMS:
        return []
    widths = ", ".join(map(str, FLASHINFER_HEAD_DIMS))
    typed = "attention_backend" in sglang_kwargs  # set to null: the key is there, so no '+'
    return [f"{_ROLLOUT}: sglang, on flashinfer (verl 0.9.1's choice where {SGLANG_ATTENTION} is unset), has "
            f"attention kernels for head_dim {widths}; {arch.name} has head_dim {arch.head_dim}: add "
            f"{'' if typed else '+'}{SGLANG_ATTENTION}=triton"]


def tokenizer_size(folder: Path) -> int | None:
    """The number of ids of the tokenizer in a local model folder (None where there is none)."""
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    try:
        from transformers import AutoTokenizer  # lazy: only with a critic of another model

        return len(AutoTokenizer.from_pretrained(folder))
    except Exception:  # noqa: BLE001 - a tokenizer transformers cannot read here: verl's own load says why
        return None


def critic_vocab_problems(container: dict, arch: ModelArch | None,
                          use_critic: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings): the critic embeds the actor's token ids, so its vocabulary must hold every id of the
    actor's tokenizer. With the tokenizer here: a problem; with only the actor's config.json: a warning."""
    actor, critic = _at(container, "actor_rollout_ref.model.path"), _at(container, "critic.model.path")
    if not use_critic or not critic or critic == actor:
        return [], []
    folder = _config_dir(container, "critic.model", None)
    if folder is None:
        return [], []
    try:
        critic_vocab = load_arch(folder).vocab_size
    except (ModelSpecError, OSError, KeyError, ValueError):
        return [], []
    tokenizer = _at(container, "actor_rollout_ref.model.tokenizer_path") or actor
    local = Path(str(tokenizer)).expanduser() if tokenizer else None
    ids = tokenizer_size(local) if local is not None and local.is_dir() else None
    if ids is not None and ids > critic_vocab:
        return [f"critic.model.path: {critic}'s vocabulary holds {critic_vocab:,} ids, the actor's tokenizer "
                f"({tokenizer}) {ids:,}: ids {critic_vocab:,} to {ids - 1:,} fall outside the critic's embedding; "
                "use a critic of the actor's family"], []
    if ids is None and arch is not None and arch.vocab_size > critic_vocab:
        return [], [f"critic.model.path: {critic}'s vocabulary holds {critic_vocab:,} ids, the actor's config "
                    f"{arch.vocab_size:,} (its tokenizer is not here to count): an id past {critic_vocab - 1:,} "
                    "falls outside the critic's embedding"]
    return [], []


# ---- combinations -----------------------------------------------------------------------------------------------


def combination_problems(container: dict, use_critic: bool) -> list[str]:
    """GAE without a critic; a GPU-only rollout engine on the CPU cluster."""
    out = []
    if _at(container, "algorithm.adv_estimator") == "gae" and not use_critic:
        out.append("critic.enable: false, but algorithm.adv_estimator=gae computes advantages from the critic's "
                   "values: enable the critic, or choose an estimator without one (algorithm.adv_estimator=grpo)")
    engine = _at(container, _ROLLOUT)
    if engine in ("vllm", "sglang") and _at(container, "cluster.gpu.name") == "cpu":
        out.append(f"{_ROLLOUT}: {engine} generates on GPUs and cluster=cpu has none: rollout=hf generates on the "
                   "CPU, or choose a GPU cluster (cluster=h100_80g, ...)")
    return out


def lookup_problems(container: dict, arch: ModelArch | None, cp: int | None,
                    use_critic: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) of everything here but verl's registries; reads files, imports no verl."""
    reward, notes = reward_problems(container)
    lora, lora_warnings = lora_problems(container, arch)
    vocab, vocab_warnings = critic_vocab_problems(container, arch, use_critic)
    problems = [*combination_problems(container, use_critic), *data_file_problems(container),
                *resume_problems(container), *reward, *lora, *ulysses_problems(container, arch, cp), *vocab,
                *sglang_attention_problems(container, arch)]
    return problems, [f"note: {n}" for n in notes] + lora_warnings + vocab_warnings


def lookup_warnings(container: dict, use_critic: bool) -> list[str]:
    """A learning rate orders of magnitude off (verl runs it): the value, and the one it may have meant."""
    out = []
    sections = ["actor_rollout_ref.actor"] + (["critic"] if use_critic else [])
    low, high = LR_BAND
    for section in sections:
        lr = _at(container, f"{section}.optim.lr")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0 or low <= lr <= high:
            continue
        meant = _flipped_exponent(float(lr))
        side = "above" if lr > high else "below"
        out.append(f"{section}.optim.lr: {lr:g} is orders of magnitude {side} a fine-tuning learning rate "
                   f"({low:g} to {high:g}; verl's default 1e-06)" + (f": did you mean {meant:g}?" if meant else ""))
    return out


def _flipped_exponent(lr: float) -> float | None:
    """``5e7`` -> ``5e-07``: the value with its exponent's sign flipped, where that lies in the band."""
    exponent = math.floor(math.log10(lr))
    flipped = lr / 10 ** (2 * exponent)
    return flipped if exponent and LR_BAND[0] <= flipped <= LR_BAND[1] else None
