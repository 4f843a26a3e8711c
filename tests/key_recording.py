"""Which config keys the code reads: a tiny job run in one process with a config that records every field read.

`python tests/key_recording.py OUT.json` writes {"reads": {dotted key: [reading files]}}; tests/unit/test_config_keys.py
runs it and accounts for every leaf key of the schema.

How: each dataclass instance of the typed config gets its own subclass (named after its key path) whose
`__getattribute__` records a read of a leaf field together with the file of the reading frame; copies made by
`dataclasses.replace` or `copy` keep the subclass, so their reads count too. Reads by the config's rules
(rlx/config/validate.py, rules.py and each section's check_* functions: checking a key is not using it) and from
outside rlx (dataclasses.asdict, copy) are not recorded.

What runs (no Ray: the worker groups are replaced by the worker classes themselves, in this process, world size
1 over gloo): `rlx.trainer.launch.run` -- preflight, `init_ray` (ray.init stubbed), the trainer's loop with validation
before and after training, a checkpoint save, then a resume from it and a damaged-checkpoint lookup -- with GAE
(critic), a KL loss and a KL penalty (ref), the actor on FSDP1 and the ref and critic on FSDP2, activation offload
on both, dynamic batch sizes, cosine schedules, the dapo reward manager with a custom reward file, sampled
validation with n=2 and logged generations, the HF rollout, the torch profiler on step 1 (a trace per phase: the
roles share this one process, where torch's profiler cannot nest). Then the vLLM rollout is built from the same worker
with a stand-in `vllm` module (engine arguments and sampling parameters, once as on CPU and once as on CUDA), and an
actor engine with LoRA adapters (model.lora_*), a reward-model worker scoring a generated batch
(reward_model.*), and the torch_memory tool of each role with CUDA's allocator calls stood in for.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import types
from pathlib import Path

REPO = str(Path(__file__).resolve().parent.parent)
RLX_DIR = os.path.join(REPO, "rlx") + os.sep
CONFIG_DIR = os.path.join(RLX_DIR, "config") + os.sep
NOT_A_USE = (os.path.join(CONFIG_DIR, "validate.py"), os.path.join(CONFIG_DIR, "rules.py"))
RULE_PREFIXES = ("check_", "_check_")  # the sections' rules (rlx/config/<section>.py) and their helpers
RULE_HELPERS = ("_sp_roles", "valid_pool")


def _is_a_rule(frame_file: str, function: str) -> bool:
    """A read by a config rule checks the key; it is not a use."""
    return frame_file in NOT_A_USE or (frame_file.startswith(CONFIG_DIR) and (
        function.startswith(RULE_PREFIXES) or function in RULE_HELPERS))

READS: dict[str, set[str]] = {}


def _record(path: str, frame_file: str, function: str = "") -> None:
    if frame_file.startswith(RLX_DIR) and not _is_a_rule(frame_file, function):
        READS.setdefault(path, set()).add(os.path.relpath(frame_file, REPO))


def record_reads(obj, prefix: str = "") -> None:
    """Give `obj` (a dataclass tree, changed in place) a recording subclass at every node."""
    fields = {f.name for f in dataclasses.fields(obj)}

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if name in fields and not dataclasses.is_dataclass(value):
            code = sys._getframe(1).f_code
            _record(prefix + name, code.co_filename, code.co_name)
        return value

    base = type(obj)
    obj.__class__ = type(f"Recording[{prefix.rstrip('.') or 'root'}]", (base,),
                         {"__getattribute__": __getattribute__, "__module__": base.__module__})
    for name in fields:
        value = object.__getattribute__(obj, name)
        if dataclasses.is_dataclass(value):
            record_reads(value, f"{prefix}{name}.")


class InProcessPool:
    def __init__(self, nnodes, n_gpus_per_node, device, roles, ranks_per_bundle=1):
        self.ranks_per_bundle = ranks_per_bundle
        self.world_size = nnodes * n_gpus_per_node * ranks_per_bundle
        assert self.world_size == 1, "the recording run is one process"


class InProcessGroup:
    """`WorkerGroup`'s methods for one rank living in this process (patched into the class, so that the role
    groups deriving from it use them)."""

    def __init__(self, worker_cls, pool, *args, lone=False):
        import socket

        self.pool, self.world_size = pool, 1
        self.worker = worker_cls(*args, 0, 1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.worker.init_distributed("127.0.0.1", port)

    def _method(self, method):
        return getattr(self.worker, method if isinstance(method, str) else method.__name__)

    def run_all(self, method, *args, **kwargs):
        return [self._method(method)(*args, **kwargs)]

    def run_dp(self, method, batch, replicas=1, **kwargs):
        return self._method(method)(batch, **kwargs)

    def run_dp_metrics(self, method, batch, replicas=1, **kwargs):
        return self._method(method)(batch, **kwargs)

    def shutdown(self):
        pass


def fake_vllm_module():
    """What VLLMRollout imports from vLLM, minus the engine."""
    import importlib.machinery

    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # "installed" for vllm_available()

    class LLM:
        def __init__(self, model, **kwargs):
            self.model, self.kwargs = model, kwargs

        def sleep(self, level):
            pass

        def wake_up(self, tags=None):
            pass

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    import dataclasses

    @dataclasses.dataclass
    class EngineArgs:  # the engine arguments a user's rollout.engine_kwargs may name (none here)
        pass

    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = EngineArgs
    engine = types.ModuleType("vllm.engine")
    engine.arg_utils = arg_utils
    sys.modules["vllm.engine"], sys.modules["vllm.engine.arg_utils"] = engine, arg_utils
    vllm.LLM, vllm.SamplingParams, vllm.engine, vllm.__version__ = LLM, SamplingParams, engine, "0.32.0"
    return vllm


def agent_multi_turn(worker, work: str) -> None:
    import copy

    import torch

    import agent_helpers
    from rlx.protocol import Batch
    from rlx.workers.rollout.agent.runner import AgentRollout

    loops = os.path.join(work, "loops.yaml")
    with open(loops, "w") as f:
        f.write("- name: forced\n  _target_: agent_helpers.ForcedToolAgent\n  turn_tokens: 2\n")
    r = worker.cfg.actor_rollout_ref.rollout
    multi_turn = dataclasses.replace(r.multi_turn, enable=True, max_assistant_turns=3, max_user_turns=2,
                                     function_tool_path=agent_helpers.__file__)
    agent = dataclasses.replace(r.agent, agent_loop_config_path=loops)
    rollout_cfg = dataclasses.replace(r, mode="async", multi_turn=multi_turn, agent=agent)
    tok = copy.deepcopy(worker.tokenizer)
    tok.chat_template = agent_helpers.TEMPLATE
    runner = AgentRollout(worker.rollout, worker.plan.rollout.engine, tok, rollout_cfg, max_prompt_length=64, max_response_length=48,
                          pad_token_id=tok.pad_token_id)
    ids = torch.tensor([tok.encode("1 2 ->", add_special_tokens=False)])
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                  {"raw_chat": [[{"role": "user", "content": "1 2 ->"}]], "agent_name": ["forced"],
                   "extra_info": [{}]}, meta={"n": 1, "do_sample": True, "temperature": 1.0, "seed": 0})
    out = runner.generate_sequences(batch)
    assert out.meta["agent_metrics"]["agent/tool_calls/mean"] > 0


def main(out_path: str) -> None:
    import ray
    import torch

    from rlx import checkpoint as ckpt
    from rlx.config import load_config
    from rlx.plan import make_plan
    from rlx.trainer import console, launch
    from rlx.workers import group

    work = tempfile.mkdtemp(prefix="rlx_keys_")
    reward_file = os.path.join(work, "reward.py")
    with open(reward_file, "w") as f:
        f.write("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    return {'score': float(ground_truth in solution_str), 'has_digit': 1.0}\n")
    buffer = "reward_model.reward_kwargs.overlong_buffer_cfg"
    cfg = load_config([
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=null",
        "trainer.total_epochs=1", "trainer.save_freq=1", "trainer.test_freq=1", "trainer.log_val_generations=1",
        "trainer.logger=[console,file,tensorboard]", f"trainer.default_local_dir={work}/ckpt",
        f"ray_init.timeline_json_file={work}/timeline.json",
        "data.train_files=synthetic://digits/size:2/seed:0", "data.val_files=synthetic://digits/size:2/seed:1",
        "data.train_batch_size=2", "data.max_response_length=4", "data.return_raw_chat=True",
        "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.ref.strategy=fsdp2", "critic.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.actor.optim.warmup_style=cosine", "critic.optim.warmup_style=cosine",
        "actor_rollout_ref.model.enable_activation_offload=True", "critic.model.enable_activation_offload=True",
        "critic.use_dynamic_bsz=True",
        "reward_model.reward_manager=dapo", f"{buffer}.enable=True", f"{buffer}.len=2", f"{buffer}.penalty_factor=1.0",
        f"{buffer}.log=True", f"custom_reward_function.path={reward_file}",
        "global_profiler.tool=torch", "global_profiler.steps=[1]", f"global_profiler.save_path={work}/profile",
        "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.ref.profiler.enable=True",
        "critic.profiler.enable=True", "critic.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",  # (one process here: no nested traces)
        "actor_rollout_ref.ref.profiler.tool_config.torch.discrete=True",
    ], config_name="quickstart")
    record_reads(cfg)

    # the worker groups in this process; Ray itself is not started
    group.ResourcePool = InProcessPool
    for name in ("__init__", "run_all", "run_dp", "run_dp_metrics", "shutdown", "_method"):
        setattr(group.WorkerGroup, name, getattr(InProcessGroup, name))
    console.announce_worker_logs = lambda: None
    ray.is_initialized = lambda: False
    ray.init = lambda *a, **k: None
    ray.shutdown = lambda: None

    from rlx.trainer.ppo_trainer import RayPPOTrainer

    shutdown = RayPPOTrainer.shutdown

    def keep_groups(self):  # the in-process workers live on for the resume below
        self.kept = (self.actor, self.critic)
        shutdown(self)

    RayPPOTrainer.shutdown = keep_groups
    trainer = launch.run(cfg, make_plan(cfg))
    trainer.actor, trainer.critic = trainer.kept
    # resume from the checkpoint just saved (load_contents), then look for one after damaging it
    trainer.resume_dir = ckpt.find_resume_dir(cfg.trainer)
    assert trainer.resume_dir is not None
    trainer.resume()
    with open(os.path.join(trainer.resume_dir, "driver_state.json"), "a") as f:
        f.write(" ")
    try:
        ckpt.find_resume_dir(cfg.trainer)
    except ckpt.DamagedCheckpointError:
        pass

    # LoRA on the policy (its keys are read only with a rank): an actor engine with adapters, its ref pass
    from rlx.engine.actor import ActorEngine

    arr = cfg.actor_rollout_ref
    lora_model = dataclasses.replace(arr.model, lora_rank=2, enable_activation_offload=False)
    lora = ActorEngine(role="actor", model_cfg=lora_model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                       strategy=arr.actor.strategy, device=trainer.actor.worker.device, world_size=1, rollout_n=1,
                       temperature=1.0)
    with lora.adapters_disabled():
        pass

    # the rollout on GPUs of its own (rollout.*, async_training.*: read when the plan of such a job is made)
    disagg = dataclasses.replace(cfg, actor_rollout_ref=dataclasses.replace(arr, hybrid_engine=False),
                                 rollout=dataclasses.replace(cfg.rollout, n_gpus_per_node=1))
    assert make_plan(disagg).async_ is not None

    # a reward model (its keys are read only when enabled): its worker scores a generated batch for the trainer
    from rlx.workers.reward_model_worker import RewardModelGroup

    rm = cfg.reward_model
    rm_cfg = dataclasses.replace(cfg, reward_model=dataclasses.replace(
        rm, enable=True, use_dynamic_bsz=True,
        rollout=dataclasses.replace(rm.rollout, prompt_length=32, response_length=32),
        model=dataclasses.replace(rm.model, path="builtin://tiny-qwen2-rm", input_tokenizer=arr.model.path)))
    own_pool = dataclasses.replace(rm_cfg, reward_model=dataclasses.replace(  # on a pool of its own (of one rank)
        rm_cfg.reward_model, enable_resource_pool=True, nnodes=1, n_gpus_per_node=1),
        custom_reward_function=dataclasses.replace(rm_cfg.custom_reward_function, path=None))  # (the rm scores)
    plan = make_plan(own_pool)
    assert plan.placement.pool_of("reward_model").world_size == 1
    trainer.rm = RewardModelGroup(InProcessPool(1, 1, "cpu", 1), rm_cfg, plan)
    trainer.rm.init_model()
    trainer.score(trainer.generate(trainer.train_loader.next_batch(), validate=False), {})
    # the reward model as a generative judge (reward_model.judge.*) on the HF engine; its vLLM engine further down
    judge_cfg = dataclasses.replace(cfg, reward_model=dataclasses.replace(
        rm, enable=True, judge=dataclasses.replace(rm.judge, enable=True, prompt_template="{question}={response}?",
                                                 do_sample=True),
        rollout=dataclasses.replace(rm.rollout, name="hf", prompt_length=32, response_length=4),
        model=dataclasses.replace(rm.model, path=arr.model.path)))
    trainer.rm = RewardModelGroup(InProcessPool(1, 1, "cpu", 1), judge_cfg, make_plan(judge_cfg))
    assert trainer.rm.judge.engine == "hf"
    trainer.rm.init_model()
    trainer.score(trainer.generate(trainer.train_loader.next_batch(), validate=False), {})
    # the agent loop (rollout.mode=async, multi_turn.*) on the worker's HF rollout: a tool_agent that calls a tool
    agent_multi_turn(trainer.actor.worker, work)
    # the torch_memory tool of each role, with CUDA's allocator history stood in for
    from rlx.workers.profiling import TorchMemory

    torch.cuda.memory._record_memory_history = lambda *a, **k: None
    torch.cuda.memory._dump_snapshot = lambda path: open(path, "wb").close()
    torch.cuda.synchronize = lambda *a: None
    torch._C._cuda_attach_out_of_memory_observer = lambda callback: None
    for role in (arr.actor.profiler, arr.ref.profiler, cfg.critic.profiler):
        memory = TorchMemory(role, cfg.global_profiler, rank=0, chosen=True)
        memory.start(1)
        memory.stop()

    # the vLLM rollout of the same worker, with a stand-in engine: as on this CPU, then as on a GPU
    sys.modules["vllm"] = fake_vllm_module()
    worker = trainer.actor.worker
    meta = {"n": 2, "do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "seed": 0}
    rollout = worker._build_rollout("vllm")
    rollout._sampling_params(meta, 2)
    worker.device = torch.device("cuda")
    torch.cuda.mem_get_info = lambda *a: (1 << 40, 1 << 40)
    torch.cuda.memory_reserved = lambda *a: 0
    torch.cuda.empty_cache = lambda: None
    worker._build_rollout("vllm")
    from rlx.workers.judge import Judge

    vllm_judge = dataclasses.replace(judge_cfg, reward_model=dataclasses.replace(
        judge_cfg.reward_model, rollout=dataclasses.replace(judge_cfg.reward_model.rollout, name="vllm")))
    Judge(vllm_judge, worker.tokenizer, rank=0, world_size=1, device=worker.device,
          engine=make_plan(vllm_judge).judge.engine)

    with open(out_path, "w") as f:
        json.dump({"reads": {k: sorted(v) for k, v in sorted(READS.items())}}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
