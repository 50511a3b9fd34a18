"""ktae inside stock verl: KTAE advantages and loss-time calibrations, no fork.

Installed with ``pip install "ktae[verl]"``, the ``verl.plugins`` entry point
(:mod:`ktae.integrations.verl.plugin`) runs on every ``import verl``, in the driver and in
every Ray worker, and

* loads users' credit rules (the ``ktae.plugins`` entry points and ``KTAE_PLUGINS``,
  :func:`ktae.integrations.verl.options.load_user_rules`), then registers the ``ktae``
  and ``gtpo`` advantage estimators and every user rule with
  ``core_algos.register_adv_est`` (multi-turn v1 batches: one response per trajectory,
  :mod:`ktae.integrations.verl.trajectories`) and
  every calibration of :data:`ktae.CALIBRATIONS` (``taco``, ``stapo``, ...) as a policy
  loss with ``core_algos.register_policy_loss``;
* installs four small wrappers around verl functions, each applied when verl imports the
  module that defines it (:mod:`ktae.integrations.verl.patches`): the response token ids
  reach the estimator on both trainer paths, the current policy's entropy reaches the
  calibrated loss, and the configuration is checked at start-up.

Configuration (see docs/verl.md)::

    algorithm.adv_estimator=ktae  +algorithm.ktae.h1=1.0 ...
    actor_rollout_ref.actor.policy_loss.loss_mode=taco
    +actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01 ...

Nothing here imports verl at module level: :mod:`.options` and :mod:`.fields` are usable
(and tested) without it.
"""

#: verl releases whose internals the wrappers were written against and tested with.
SUPPORTED_VERL_VERSIONS = ("0.9.1",)
