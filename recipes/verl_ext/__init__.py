"""Everything of the pack that touches verl's internals, pinned to verl 0.9.1, in three rooms.

=============  ======================================================================================================
room           what lives there
=============  ======================================================================================================
``plugin``     what verl imports in every process (entry-point group ``verl.plugins``): the CPU platform and device,
               the patches of verl internals, the ``hf`` rollout, the weight sync through hybrid_engine's resharder,
               the fast-poll replay buffer, the verl overrides of the embedded CPU default
``stability``  KL control (target schedules, coefficient controller), the KL guard in the worker's update loop, the
               trainer subclass, monitoring bands and the rollback supervisor
``demo``       the embedded default's assets (a tiny random Qwen2, a locally trained tokenizer, the "a+b=" task and
               its reward) and a runner that measures ``main_ppo`` on them
=============  ======================================================================================================

The rest of ``recipes`` reaches verl only through these rooms. Every patch checks verl's version and refuses
another one loudly (:func:`recipes.verl_ext.plugin.require_supported_verl`).
"""
