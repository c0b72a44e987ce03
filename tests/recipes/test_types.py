"""verl's types from its source, the pack's typed schema, and the range table: unit tests, the CLI, a property.

* the type checker reads verl's dataclasses (each annotation kind, nested dataclasses, a field verl adds later);
* the schema (recipes/check/schema.py) types the pack's own keys, with ranges, units and one line per problem;
* the range table (RANGES) holds the constraints verl fails on at run time;
* a wrong value on the command line exits 2 with one ``config error`` line naming the key, no traceback, no run folder;
* any typed leaf given a wrong-typed (or out-of-range) value is a problem naming that key, never an exception.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict

from recipes.check import schema as S
from recipes.check.validate import check
from recipes.compose.compose import compose_recipe
from recipes.compose.layout_keys import REPEATED_KEYS
from recipes.verl_ext import api
from recipes.verl_ext import types as T

# -- annotations -------------------------------------------------------------------------------------------------


@dataclass
class Inner:
    depth: int = 1
    name: str = "x"


@dataclass
class Base:
    ratio: float = 0.2
    flags: list[str] = field(default_factory=list)


@dataclass
class Child(Base):
    count: int = 1
    maybe: Optional[int] = None  # noqa: UP045 - verl writes Optional
    either: int | str = 0
    mode: Literal["a", "b"] = "a"
    pair: tuple[float, float] = (0.9, 0.99)
    many: tuple[int, ...] = ()
    table: dict[str, int] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    anything: typing.Any = None
    handle: types.SimpleNamespace | None = None


@pytest.mark.parametrize(
    ("annotation", "kind"),
    [(int, "int"), (float, "float"), (bool, "bool"), (str, "str"), (Optional[int], "union"), (int | None, "union"),  # noqa: UP045 - verl writes Optional
     (Literal["a", "b"], "literal"), (list[int], "list"), (list, "list"), (tuple[float, float], "tuple"),
     (tuple[int, ...], "list"), (dict[str, int], "dict"), (dict, "dict"), (Inner, "dataclass")],
)
def test_expectation_of_each_annotation_kind(annotation, kind):
    assert T.expectation(annotation).kind == kind


@pytest.mark.parametrize("annotation", [typing.Any, object, types.SimpleNamespace, Optional[types.SimpleNamespace],  # noqa: UP045 - verl writes Optional
                                        typing.Callable[[int], int]])
def test_annotations_not_understood_are_skipped(annotation):
    assert T.expectation(annotation) is None


@pytest.mark.parametrize(
    ("annotation", "good", "bad"),
    [
        (int, [0, -3, 10**12], [1.0, True, "1", [1]]),
        (float, [0.5, 2, -1e-6], [True, "0.5", None.__class__]),
        (bool, [True, False], [0, 1, "true"]),
        (str, ["", "vllm"], [1, 0.5, True, ["a"]]),
        (Optional[int], [3], [3.5, "x"]),  # noqa: UP045 - verl writes Optional
        (int | str, [3, "x"], [3.5, [1]]),
        (Literal["a", "b"], ["a", "b"], ["c", 1, True]),
        (list[int], [[], [1, 2], (1,)], [[1, "x"], "12", {"a": 1}]),
        (tuple[float, float], [[0.9, 0.99], (1, 2)], [[0.9], [0.9, "x"], 0.9]),
        (dict[str, int], [{}, {"a": 1}], [{"a": "x"}, [1], "a"]),
        (Inner, [{}, {"depth": "anything: checked leaf by leaf"}], ["x", 1, [1]]),
    ],
)
def test_conforms(annotation, good, bad):
    expect = T.expectation(annotation)
    assert all(T.conforms(value, expect) for value in good), good
    assert not any(T.conforms(value, expect) for value in bad), bad
    assert T.conforms(None, expect)  # unset: verl's YAML writes null also for fields that are not Optional


@pytest.mark.parametrize(
    ("annotation", "text"),
    [(float, "a float"), (int, "an integer"), (bool, "a boolean"), (Optional[str], "a string"),  # noqa: UP045 - verl writes Optional
     (int | str, "an integer or a string"), (Literal["a", "b"], "one of 'a', 'b'"),
     (list[int], "a list of integers"), (list[Literal["x"]], "a list of values among 'x'"),
     (tuple[float, float], "a list of 2 floats"), (dict[str, int], "a mapping to integers"), (Inner, "a mapping")],
)
def test_describe(annotation, text):
    assert T.describe(T.expectation(annotation)) == text


def test_class_fields_name_the_declaring_class_and_skip_the_unknown():
    table = T.class_fields(Child)
    assert table["ratio"].owner == "Base.ratio" and table["count"].owner == "Child.count"
    assert table["inner"].expect.kind == "dataclass"
    assert "anything" not in table and "handle" not in table


# -- the type check on verl's own classes -------------------------------------------------------------------------


def _kl_node(**values):
    node = {"_target_": "verl.trainer.config.KLControlConfig", "type": "fixed", "kl_coef": 0.001, "horizon": 10000,
            "target_kl": 0.1}
    node.update(values)
    return {"algorithm": {"_target_": "verl.trainer.config.AlgoConfig", "kl_ctrl": node}}


def test_a_verl_node_is_checked_against_its_class():
    assert T.type_problems(_kl_node()) == {}
    assert T.type_problems(_kl_node(horizon=10)) == {}
    assert T.type_problems(_kl_node(kl_coef=1)) == {}  # an int is fine for a float
    assert T.type_problems(_kl_node(target_kl="high")) == {
        "algorithm.kl_ctrl.target_kl": "algorithm.kl_ctrl.target_kl: expected a float (verl's "
                                       "KLControlConfig.target_kl), got 'high'"}
    assert set(T.type_problems(_kl_node(horizon=1.5, type=3))) == {"algorithm.kl_ctrl.horizon",
                                                                    "algorithm.kl_ctrl.type"}
    # a key that is no field of the class, a missing value, None: left to the checks that need them
    assert T.type_problems(_kl_node(extra="x", kl_coef="???", target_kl=None)) == {}


def test_a_nested_dataclass_without_its_own_target_is_checked_by_the_annotation():
    container = {"actor": {"_target_": "verl.workers.config.FSDPActorConfig",
                           "policy_loss": {"clip_cov_ratio": "x"}}}
    assert T.type_problems(container) == {
        "actor.policy_loss.clip_cov_ratio": "actor.policy_loss.clip_cov_ratio: expected a float (verl's "
                                            "PolicyLossConfig.clip_cov_ratio), got 'x'"}


def test_a_field_verl_adds_later_is_checked_with_no_new_code(monkeypatch):
    module = types.ModuleType("verl.pack_test_later")

    @dataclass
    class LaterConfig:
        old: int = 1
        added_in_a_later_release: float = 0.5

    LaterConfig.__module__ = module.__name__
    module.LaterConfig = LaterConfig
    monkeypatch.setitem(sys.modules, module.__name__, module)
    node = {"x": {"_target_": "verl.pack_test_later.LaterConfig", "added_in_a_later_release": "soon"}}
    assert T.type_problems(node) == {
        "x.added_in_a_later_release": "x.added_in_a_later_release: expected a float (verl's "
                                      "LaterConfig.added_in_a_later_release), got 'soon'"}


def test_sections_verl_does_not_build_are_not_checked():
    container = {"critic": {"_target_": "verl.workers.config.FSDPCriticConfig", "ppo_epochs": "x"}}
    assert T.type_problems(container, T.inactive_sections(container, use_critic=False, use_ref=True)) == {}
    assert "critic.ppo_epochs" in T.type_problems(container, T.inactive_sections(container, use_critic=True,
                                                                                    use_ref=True))


@functools.cache
def _composed():
    """recipe -> (composed config, resolved container, inactive sections)."""
    out = {}
    for recipe in ("grpo", "kl_ppo"):
        cfg = compose_recipe(recipe, [])
        container = OmegaConf.to_container(cfg, resolve=True)
        use_critic, use_ref = api.roles(cfg)
        out[recipe] = (cfg, container, T.inactive_sections(container, use_critic=use_critic, use_ref=use_ref))
    return out


@pytest.fixture(scope="module")
def composed():
    return _composed()


def test_the_composed_tree_is_typed_and_clean(composed):
    for recipe, (_, container, inactive) in composed.items():
        leaves = {key: typed for key, _, typed in T.typed_leaves(container, inactive)}
        assert len(leaves) > 300, recipe
        assert leaves["actor_rollout_ref.actor.clip_ratio"].owner == "ActorConfig.clip_ratio"
        assert leaves["actor_rollout_ref.rollout.gpu_memory_utilization"].expect == T.FLOAT
        assert leaves["algorithm.kl_ctrl.horizon"].expect == T.INT
        assert ("critic.ppo_epochs" in leaves) == (recipe == "kl_ppo")
        assert T.type_problems(container, inactive) == {}
        assert T.range_problems(container, inactive) == {}


# -- the range table ----------------------------------------------------------------------------------------------


def test_every_range_names_a_key_of_verls_tree(composed):
    megatron = OmegaConf.to_container(compose_recipe("kl_ppo", ["strategy=megatron", "parallel=tp8"]), resolve=True)
    for entry in T.RANGES:
        assert entry.reason, entry.key
        assert any(T._at(c, entry.key, T._ABSENT) is not T._ABSENT
                   for c in (composed["kl_ppo"][1], composed["grpo"][1], megatron)), entry.key


def test_ranges_under_a_verl_class_agree_with_its_annotation(composed):
    container = composed["kl_ppo"][1]
    leaves = {key: typed for key, _, typed in T.typed_leaves(container)}
    for entry in T.RANGES:
        if entry.key in leaves:
            expect = leaves[entry.key].expect
            kinds = {m.kind for m in (expect.args if expect.kind == "union" else (expect,))} - {"none"}
            assert kinds == {"int"} if entry.integer else kinds <= {"int", "float"}, entry.key


@pytest.mark.parametrize(
    ("entry", "value", "line"),
    [
        (T._count("critic.ppo_epochs"), 0, "critic.ppo_epochs: must be >= 1 (a count), got 0"),
        (T._count("critic.ppo_epochs"), 1.0, "critic.ppo_epochs: must be an integer >= 1 (a count), got 1.0"),
        (T._count("critic.ppo_epochs"), None, "critic.ppo_epochs: must be an integer >= 1 (a count), got None"),
        (T._count("x", optional=True), None, None),
        (T.Range("f", "a fraction", low=0, high=1, low_open=True), 1.5, "f: must be in (0, 1] (a fraction), got 1.5"),
        (T.Range("f", "a fraction", low=0, high=1, low_open=True), 0, "f: must be in (0, 1] (a fraction), got 0"),
        (T.Range("f", "a fraction", low=0, high=1, low_open=True), 1, None),
        (T.Range("c", "a coefficient", low=0), -0.5, "c: must be >= 0 (a coefficient), got -0.5"),
        (T.Range("c", "a coefficient", low=0), "x", "c: must be a number >= 0 (a coefficient), got 'x'"),
        (T.Range("r", "a ratio", low=0, low_open=True), 0.0, "r: must be > 0 (a ratio), got 0.0"),
    ],
)
def test_range_lines(entry, value, line):
    assert entry.problem(value) == line


def test_a_wrong_kind_under_a_verl_class_is_left_to_the_type_check():
    container = {"critic": {"_target_": "verl.workers.config.FSDPCriticConfig", "ppo_epochs": "x"},
                 "data": {"max_prompt_length": "x"}}
    deferred = {}
    assert list(T.range_problems(container, deferred=deferred)) == ["data.max_prompt_length"]
    assert deferred == {"critic.ppo_epochs": "critic.ppo_epochs: must be an integer >= 1 (a count), got 'x'"}
    assert sorted(T.range_problems(container)) == ["critic.ppo_epochs", "data.max_prompt_length"]


def test_a_wrong_kind_of_a_key_verl_does_not_type_still_gets_its_range_line():
    # actor_rollout_ref.ref.log_prob_micro_batch_size is no field of verl's ActorConfig: the range line names it
    cfg = compose_recipe("grpo", ["batching=fixed", "actor_rollout_ref.ref.log_prob_micro_batch_size=x",
                                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"])
    assert list(check(cfg).problems) == [
        "actor_rollout_ref.ref.log_prob_micro_batch_size: must be an integer >= 1 (a micro-batch size: sequences "
        "per forward), got 'x'"]


def test_ranges_apply_only_where_verl_reads_the_key():
    dynamic = {"actor_rollout_ref": {"actor": {"use_dynamic_bsz": True, "ppo_micro_batch_size_per_gpu": 0}}}
    assert T.range_problems(dynamic) == {}
    dynamic["actor_rollout_ref"]["actor"]["use_dynamic_bsz"] = False
    assert list(T.range_problems(dynamic)) == ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
    critic = {"critic": {"ppo_epochs": 0}}
    assert T.range_problems(critic, frozenset({"critic"})) == {}
    fixed = {"algorithm": {"kl_ctrl": {"type": "fixed", "horizon": 0}}}
    assert T.range_problems(fixed) == {}
    fixed["algorithm"]["kl_ctrl"]["type"] = "adaptive"
    assert T.range_problems(fixed) == {"algorithm.kl_ctrl.horizon": "algorithm.kl_ctrl.horizon: must be > 0 "
                                       "(verl's adaptive KL controller asserts horizon > 0), got 0"}


# -- the pack's schema --------------------------------------------------------------------------------------------


def _schema_classes():
    return [obj for obj in vars(S).values()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and issubclass(obj, S._Checked)]


def test_schema_classes_are_kw_only_slotted_and_document_every_field():
    classes = _schema_classes()
    assert {"Layout", "Cluster", "GPU", "KL", "Batching", "Monitor", "Stability", "Launcher", "NCCL", "Run",
            "Plan", "PackConfig"} <= {c.__name__ for c in classes}
    for cls in classes:
        assert "__slots__" in cls.__dict__, cls
        assert all(f.kw_only for f in dataclasses.fields(cls)), cls
        body = ast.parse(inspect.getsource(cls)).body[0].body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                doc = body[i + 1] if i + 1 < len(body) else None
                assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), \
                    f"{cls.__name__}.{node.target.id} has no docstring"


def test_load_schema_of_a_composed_config(composed):
    pack = S.load_schema(composed["grpo"][1])
    assert pack.cluster.gpu.memory_gib == 80 and pack.cluster.world_size == 8
    assert pack.kl.mode == "fixed" and pack.kl.target is None and pack.kl.guard.max_kl == 0.5
    assert pack.monitor.bands["kl_mean"].keys == ["actor/kl_loss", "actor/reward_kl_penalty"]
    assert pack.launcher.name == "local" and pack.plan.format == "table"
    assert pack.layout.train.dp >= 1


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["cluster.gpu.memory_gib=-1"], "cluster.gpu.memory_gib: must be > 0, got -1"),
        (["cluster.gpu=foo"], "cluster.gpu: expected a mapping, got 'foo'"),
        (["kl=adaptive", "kl.target=-0.1"], "kl.target: must be >= 0, got -0.1"),
        (["kl=ramp", "kl.ramp.steps=ten"], "kl.ramp.steps: expected an integer, got 'ten'"),
        (["kl.mode=strict"], "kl.mode: expected one of 'fixed', 'adaptive', 'ramp', got 'strict'"),
        (["monitor.bands.grad_norm.unstable=both"],
         "monitor.bands.grad_norm.unstable: expected one of 'low', 'high', got 'both'"),
        (["stability.degradations=[offload_on,faster]"],
         "stability.degradations: expected a list of values among 'forward_prefetch_off', 'batch_minus_20', "
         "'offload_on', got ['offload_on', 'faster']"),
        (["plan.format=yaml"], "plan.format: expected one of 'table', 'json', got 'yaml'"),
        (["+nccl.env.A=[1]"], "nccl.env: expected a mapping to strings or integers or floats or booleans, got "
                                "{'A': [1]}"),
    ],
)
def test_schema_problem_lines(overrides, line):
    container = OmegaConf.to_container(compose_recipe("grpo", overrides), resolve=True)
    built, problems = S.check_schema(container)
    assert built is None and problems == [line]
    with pytest.raises(S.SchemaError) as error:
        S.load_schema(container)
    assert error.value.problems == [line]


def test_schema_instances_check_themselves():
    with pytest.raises(S.SchemaError) as error:
        S.GPU(name="x", memory_gib=-1, nvlink_GBps="fast", network_GBps=1)
    assert error.value.problems == [("memory_gib", "must be > 0, got -1"),
                                    ("nvlink_GBps", "expected a float, got 'fast'")]
    assert S.KL().ramp.steps == 200  # the defaults are the only ones in Python
    with pytest.raises(TypeError):
        S.KLRamp(0.1)  # keyword-only


def test_missing_keys_and_sections():
    assert S.load_section(S.KL, None, "kl") == S.KL()
    assert S.load_section(S.Stability, {"mode": "auto"}, "stability").max_attempts == 3
    with pytest.raises(S.SchemaError) as error:
        S.load_section(S.Cluster, {"nnodes": 1, "gpus_per_node": 8, "world_size": 8}, "cluster")
    assert error.value.problems == ["cluster.gpu: missing (no default)"]
    # keys a group does not declare are left alone
    assert S.load_section(S.Plan, {"format": "json", "colour": "red"}, "plan").format == "json"


def test_resolve_reports_the_key_that_cannot_resolve():
    cfg = OmegaConf.create({"a": 1, "b": {"c": "${a}", "d": "${nope}"}, "e": "???"})
    container, problems = S.resolve(cfg)
    assert container == {"a": 1, "b": {"c": 1, "d": "???"}, "e": "???"}
    assert list(problems) == ["b.d"]


def test_references_follow_interpolations(composed):
    cfg = composed["grpo"][0]
    assert S.references(cfg, "algorithm.kl_ctrl.kl_coef") == []
    assert S.references(cfg, "trainer.nnodes") == ["cluster.nnodes"]
    assert S.depends_on(cfg, "layout.train.dp", {"cluster.nnodes"})  # via cluster.world_size
    assert S.depends_on(cfg, "actor_rollout_ref.actor.rollout_n", {"actor_rollout_ref.rollout.n"})  # oc.select
    assert not S.depends_on(cfg, "layout.train.dp", {"data.train_batch_size"})


# -- check(): one line per mistake --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "overrides", "lines"),
    [
        ("grpo", ["actor_rollout_ref.actor.clip_ratio=high"],
         ["actor_rollout_ref.actor.clip_ratio: expected a float (verl's ActorConfig.clip_ratio), got 'high'"]),
        ("kl_ppo", ["critic.ppo_epochs=0"], ["critic.ppo_epochs: must be >= 1 (a count), got 0"]),
        # the verl key copying kl.target (algorithm.kl_ctrl.target_kl) is not reported again
        ("grpo", ["kl=adaptive", "kl.target=-0.1"], ["kl.target: must be >= 0, got -0.1"]),
        # the keys computed from it (token budgets) are not reported either
        ("grpo", ["data.max_prompt_length=abc"],
         ["data.max_prompt_length: must be an integer >= 1 (a count: tokens), got 'abc'"]),
        # the pack's older check of a key keeps its line
        ("grpo", ["cluster.nnodes=0"], ["cluster.nnodes: must be a positive integer, got 0"]),
        ("grpo", ["actor_rollout_ref.model.mtp=foo"],
         ["actor_rollout_ref.model.mtp: expected a mapping (verl's HFModelConfig.mtp), got 'foo'"]),
        # critic keys of a run without a critic: verl never reads them
        ("grpo", ["critic.ppo_epochs=0", "critic.optim.lr=x"], []),
    ],
)
def test_check_lines(recipe, overrides, lines):
    cfg = compose_recipe(recipe, overrides)
    before = OmegaConf.to_container(cfg)
    run = check(cfg, run_verl=bool(lines))
    assert list(run.problems) == lines
    assert OmegaConf.to_container(cfg) == before  # pure
    assert (run.pack is None) == bool(lines)


# -- the command line ---------------------------------------------------------------------------------------------

CLI = [
    ("grpo", ["actor_rollout_ref.actor.clip_ratio=high"], "actor_rollout_ref.actor.clip_ratio"),
    ("kl_ppo", ["critic.ppo_epochs=0"], "critic.ppo_epochs"),
    ("grpo", ["data.max_prompt_length=-5"], "data.max_prompt_length"),
    ("grpo", ["actor_rollout_ref.rollout.gpu_memory_utilization=1.5"],
     "actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("kl_ppo", ["kl=adaptive", "kl.target=-0.2"], "kl.target"),
    ("grpo", ["cluster.gpu=foo"], "cluster.gpu"),
]


@pytest.mark.parametrize(("recipe", "argv", "key"), CLI, ids=[" ".join(a) for _, a, _ in CLI])
def test_cli_bad_value(recipe, argv, key, tmp_path, recipe_main):
    proc = recipe_main(recipe, *argv, "action=validate", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("config error")]
    assert len(errors) == 1 and errors[0].startswith(f"config error: {key}: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


# -- the property: any typed leaf, a wrong value: a problem naming it ---------------------------------------------

WRONG = ("not-a-value", 12345, 1.5, True, ["x"], {"x": 1})


def _wrong_value(expect):
    return next(value for value in WRONG if not T.conforms(value, expect))


@functools.cache
def _leaf_table():
    """(recipe, key, wrong value) for every typed leaf of both recipes, and (recipe, key, bad value) per range."""
    composed = _composed()
    typed, ranged = [], []
    for recipe, (_, container, inactive) in composed.items():
        for key, _, leaf in T.typed_leaves(container, inactive):
            if not _copied_node(composed[recipe][0], key):
                typed.append((recipe, key, _wrong_value(leaf.expect)))
        for entry in T.RANGES:
            if T._inside(entry.key, inactive) or T._at(container, entry.key, T._ABSENT) is T._ABSENT:
                continue
            if entry.when is not None and T._at(container, entry.when[0], T._ABSENT) != entry.when[1]:
                continue
            bad = entry.low - 1 if entry.low is not None else entry.high + 1
            ranged.append((recipe, entry.key, int(bad) if entry.integer else float(bad)))
    return typed, ranged


def _copied_node(cfg, key: str) -> bool:
    """Whether ``key`` lies inside a node that interpolates another one (``rollout.qat: ${oc.select:...}``): setting
    the key replaces that whole node by a plain mapping, which verl's annotation of it then types (or not)."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        parent = OmegaConf.select(cfg, ".".join(parts[: i - 1])) if i > 1 else cfg
        if OmegaConf.is_interpolation(parent, parts[i - 1]):
            return True
    return False


def _put(cfg, key, value):
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


def _assert_named(recipe, key, value):
    cfg = _put(_composed()[recipe][0], key, value)
    run = check(cfg)  # never raises
    named = {problem.split(":", 1)[0] for problem in run.problems}
    accepted = {key, REPEATED_KEYS.get(key)}  # a verl key repeating a layout key is adopted into it
    assert named & accepted, (recipe, key, value, run.problems)


def test_the_tables_cover_both_recipes():
    typed, ranged = _leaf_table()
    assert len(typed) > 600 and len(ranged) > 40
    assert {recipe for recipe, _, _ in typed} == {"grpo", "kl_ppo"}


def test_a_wrong_value_read_inside_a_resolver_is_named_as_typed():
    """Hypothesis drew it (2026-12-07): the CUDA-graph sizes' resolver reads max_num_seqs with int(), so its failure
    came first and named the computed key, not the one typed."""
    _assert_named("grpo", "actor_rollout_ref.rollout.max_num_seqs", "not-a-value")


@pytest.mark.slow  # 7.1-9.6 s on 2 cores (CI, 2026-12-05): 30 examples, each composed and validated
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_typed_leaf_with_a_wrong_type_is_a_problem_naming_it(data):
    recipe, key, value = data.draw(st.sampled_from(_leaf_table()[0]), label="typed leaf")
    _assert_named(recipe, key, value)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_any_ranged_key_out_of_range_is_a_problem_naming_it(data):
    recipe, key, value = data.draw(st.sampled_from(_leaf_table()[1]), label="ranged key")
    _assert_named(recipe, key, value)
