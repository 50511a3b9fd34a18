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
  calibrated loss, and the configuration is checked at start-up;
* on a verl outside :data:`SUPPORTED_VERL`, wraps nothing and refuses the plugin's names
  at start-up in one line naming the range (:mod:`ktae.integrations.verl.plugin`).

Configuration (see docs/verl.md)::

    algorithm.adv_estimator=ktae  +algorithm.ktae.h1=1.0 ...
    actor_rollout_ref.actor.policy_loss.loss_mode=taco
    +actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01 ...

Nothing here imports verl at module level: :mod:`.options` and :mod:`.fields` are usable
(and tested) without it.
"""

SUPPORTED_VERL = ">=0.9.0,<=0.9.1"
"""The verl releases the plugin supports, as a pip version specifier: every function it
wraps is the same, body and signature, in 0.9.0 and 0.9.1 (``validate_config`` gains one
router-replay check in 0.9.1), and ``.ci/verl`` runs the plugin's tests on both. A newer
verl is not promised until it is compared and tested. The ``verl`` extra of
``pyproject.toml`` requires the same range (a test checks it)."""


def verl_supported(version: str | None) -> bool:
    """Whether ``version`` (a verl ``__version__``) lies in :data:`SUPPORTED_VERL`; a
    pre-release or an unparsable version does not."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(str(version))
    except InvalidVersion:
        return False
    return SpecifierSet(SUPPORTED_VERL).contains(parsed, prereleases=False)


def unsupported_verl_message(version: str | None) -> str:
    """The one-line refusal of a verl outside :data:`SUPPORTED_VERL`."""
    return (f"ktae's verl plugin supports verl{SUPPORTED_VERL}, whose internals it wraps; "
            f"this is verl {version}: pip install 'verl{SUPPORTED_VERL}'")
