"""The one redaction policy of the pack: what counts as a secret in a name, a value, a command line or a config.

A *name* (environment variable or config key) is secret by convention: it contains SECRET, PASSWORD/PASSWD,
CREDENTIAL, PRIVATE, COOKIE, or a word such as AUTH, PAT, JWT, BEARER; or its last word is TOKEN or KEY
(HF_TOKEN, WANDB_API_KEY, trainer.wandb_key, apiKey) unless the word before says it names a data field or a
tokenizer's token (verl's ``data.prompt_key``, ``pad_token``). Counts and budgets are never secret:
``ppo_max_token_len_per_gpu``, ``max_num_batched_tokens``, ``num_speculative_tokens`` and every other verl key keep
their values (tests/recipes/test_redact.py walks verl 0.9.1's whole tree).

A *value* is secret when it looks like a key whatever its name (hf_..., ghp_..., sk-..., AKIA...), and a password
inside a URL (``https://user:pw@host``) is hidden, the rest of the URL kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "***"
# a name is secret when one of its words contains one of these
_SECRET_PARTS = ("SECRET", "PASSW", "CREDENTIAL", "PRIVATE", "COOKIE", "SIGNATURE", "APIKEY")
# ... or is one of these words (SSH_AUTH_SOCK, BASIC_AUTH, NPM_PASS); AUTHOR and PWD stay visible
_SECRET_WORDS = {"AUTH", "OAUTH", "PASS", "PAT", "SAS", "JWT", "BEARER", "PASSPHRASE"}
# ... or ends in one of these words
_SECRET_LAST = {"TOKEN", "KEY"}
# the word before a final TOKEN / KEY that makes it a field name, not a secret (verl's data.prompt_key, pad_token)
_NOT_SECRET_BEFORE = {
    "PROMPT", "IMAGE", "VIDEO", "AUDIO", "RESPONSE", "REWARD", "ANSWER", "LABEL", "SORT", "INPUT", "OUTPUT", "DATA",
    "SOURCE", "MESSAGE", "MESSAGES", "TOOL", "TOOLS", "FN", "FIELD", "COLUMN", "CACHE", "EXTRA", "INFO", "GROUP",
    "METRIC", "QUERY", "CHOSEN", "REJECTED", "TEXT", "TRUTH", "UID", "ID", "INDEX", "MODALITY", "PAD", "EOS", "BOS",
    "UNK", "SEP", "CLS", "MASK", "SPECIAL", "START", "END", "STOP", "THINK", "VISION", "PARTITION", "HASH", "LOOKUP",
    "PRIMARY", "SEARCH", "DICT", "MAP", "SPLIT", "TASK", "NEXT", "FIRST", "LAST", "ROUTING", "TEACHER", "STUDENT",
    "POLICY", "SORTING", "SAMPLE", "SCORE", "JUDGE", "CRITIC", "RULE", "MODEL", "MODELS",
}
# values that are keys whatever their name (Hugging Face, GitHub, OpenAI-style, Slack, AWS access key, GitLab)
_TOKEN_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}|"
    r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,})"
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]+):(?P<password>[^/\s@]+)@")


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]


def is_secret_name(name: str) -> bool:
    """True for WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, apiKey, trainer.wandb_key; False for
    ppo_max_token_len_per_gpu, data.prompt_key, TOKENIZERS_PARALLELISM. For a dotted key, the last part decides
    (and, for a bare ``key`` or ``token``, the part before it)."""
    parts = [part for part in str(name).replace("/", ".").split(".") if part]
    if not parts:
        return False
    words = _words(parts[-1])
    if not words:
        return False
    if len(words) == 1 and len(parts) > 1:
        # a bare `key`: its parent says which (wandb.key is secret, teacher_model.key is not); under a user-named
        # entry of a map the grandparent does (distillation.teacher_models.gsm8k.key names a data source)
        if words[0] in _SECRET_LAST and len(parts) > 2 and (_words(parts[-3]) or [""])[-1] in _NOT_SECRET_BEFORE:
            return False
        words = _words(parts[-2])[-1:] + words
    if any(part in word for word in words for part in _SECRET_PARTS) or any(w in _SECRET_WORDS for w in words):
        return True
    if len(words) > 2 and words[-2:] == ["KEY", "ID"]:
        words = words[:-1]  # AWS_ACCESS_KEY_ID names the key's public half, which AWS treats as a credential too
    if words[-1] in _SECRET_LAST:
        return len(words) == 1 or words[-2] not in _NOT_SECRET_BEFORE
    return False


def redact_value(value: str) -> str:
    """A value with key-shaped substrings and URL passwords replaced."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{REDACTED}@", str(value))
    return _TOKEN_VALUE.sub(REDACTED, text)


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with every secret name's value, and key-shaped values, replaced by ***."""
    return {k: (REDACTED if is_secret_name(k) and v != "" else redact_value(v)) for k, v in sorted(environ.items())}


def redact_config(node, path: str = ""):
    """A plain container (dicts, lists, scalars) with secret keys' scalar values and key-shaped strings replaced;
    a key is judged by its dotted path (``wandb.key`` is secret, ``teacher_models.gsm8k.key`` is not)."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            child = f"{path}.{k}" if path else str(k)
            secret = is_secret_name(child) and v not in (None, "") and not isinstance(v, (dict, list, bool))
            out[k] = REDACTED if secret else redact_config(v, child)
        return out
    if isinstance(node, list):
        return [redact_config(v, path) for v in node]
    if isinstance(node, str):
        return redact_value(node)
    return node


def redact_arg(arg: str) -> str:
    """A command-line argument with a secret value hidden: ``+logger.wandb.api_key=abc`` -> ``...api_key=***``."""
    if "=" in arg and not arg.startswith("-"):
        key, value = arg.split("=", 1)
        if is_secret_name(key.lstrip("+~")) and value:
            return f"{key}={REDACTED}"
    return redact_value(arg)
