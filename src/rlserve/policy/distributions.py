"""The action distributions' names where they were imported from before the split (0.1).

The distribution and its layout live in :mod:`rlserve.policy.distribution`, the choice of one
for an action space in :mod:`rlserve.policy.space_distribution`, the Gaussian families'
arithmetic in :mod:`rlserve.policy.gaussian`, epsilon-greedy acting in
:mod:`rlserve.policy.greedy`, and the conversions to and from a space's form in
:mod:`rlserve.policy.action_layout`. Import them from there; this module re-exports them so
code written against the old path keeps working.
"""

from rlserve.policy.action_layout import action_from_wire, actions_to_space, encode_action
from rlserve.policy.distribution import (
    DISTRIBUTION_KINDS,
    MAX_ACTION_PARAMS,
    PART_KINDS,
    ActionDistribution,
    ActionPart,
)
from rlserve.policy.gaussian import (
    LOG_2PI,
    SQUASH_EPS,
    SQUASHED_LOG_STD_MAX,
    SQUASHED_LOG_STD_MIN,
    squashed_log_prob,
    squashed_sample,
)
from rlserve.policy.greedy import epsilon_greedy_choices, epsilon_greedy_log_prob
from rlserve.policy.space_distribution import (
    MAX_ACTION_HALF_RANGE,
    action_distribution,
    check_learnable,
    check_observations,
    epsilon_greedy,
    normalized_box_actions,
    squashed_gaussian_distribution,
)

__all__ = [
    "DISTRIBUTION_KINDS",
    "LOG_2PI",
    "MAX_ACTION_HALF_RANGE",
    "MAX_ACTION_PARAMS",
    "PART_KINDS",
    "SQUASHED_LOG_STD_MAX",
    "SQUASHED_LOG_STD_MIN",
    "SQUASH_EPS",
    "ActionDistribution",
    "ActionPart",
    "action_distribution",
    "action_from_wire",
    "actions_to_space",
    "check_learnable",
    "check_observations",
    "encode_action",
    "epsilon_greedy",
    "epsilon_greedy_choices",
    "epsilon_greedy_log_prob",
    "normalized_box_actions",
    "squashed_gaussian_distribution",
    "squashed_log_prob",
    "squashed_sample",
]
