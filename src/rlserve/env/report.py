"""What :func:`rlserve.env.check.check_env` found: problems, warnings and episode statistics."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["EnvReport", "Problem", "plain_warning"]

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(slots=True)
class Problem:
    """One departure from the environment contract, or one suspicious but legal behaviour.

    Attributes:
        kind: A short code naming what is wrong, e.g. ``obs_shape`` or ``nondeterministic``.
        message: One plain sentence: what is wrong, where it was seen, and how to fix it.
        count: How many times a finding of this kind was seen; ``message`` is the first one.
    """

    kind: str
    message: str
    count: int = 1

    def line(self) -> str:
        """The finding as one line of text, e.g. ``[obs_shape] step() returned ... (seen 3x)``."""
        seen = f" (seen {self.count} times)" if self.count > 1 else ""
        return f"[{self.kind}] {self.message}{seen}"


@dataclass(slots=True)
class EnvReport:
    """The result of checking an environment.

    A problem breaks the contract rlserve relies on; a warning is legal but suspicious (rlserve
    copes with it). A kind is listed once, with its first message and how often it was seen.

    Attributes:
        env_name: What was checked: the registered id, or the class or creator's name.
        problems: Departures from the contract, in the order they were first seen.
        warnings: Legal but suspicious behaviour, in the order it was first seen.
        episodes: Episodes started (resets that returned).
        steps: ``step()`` calls that returned, over all episodes.
        episode_returns: The sum of rewards of each episode (over all agents, for multi-agent).
        episode_lengths: The number of steps of each episode.
        multi_agent: Whether the environment was checked as a multi-agent one.
    """

    env_name: str = "env"
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    episodes: int = 0
    steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    multi_agent: bool = False

    @property
    def ok(self) -> bool:
        """Whether no problem was found (warnings allowed)."""
        return not self.problems

    @property
    def mean_return(self) -> float | None:
        """The mean episode return, or None before any episode was run."""
        if not self.episode_returns:
            return None
        return sum(self.episode_returns) / len(self.episode_returns)

    @property
    def mean_length(self) -> float | None:
        """The mean episode length in steps, or None before any episode was run."""
        if not self.episode_lengths:
            return None
        return sum(self.episode_lengths) / len(self.episode_lengths)

    def kinds(self) -> set[str]:
        """The kinds of the problems found."""
        return {problem.kind for problem in self.problems}

    def warning_kinds(self) -> set[str]:
        """The kinds of the warnings found."""
        return {warning.kind for warning in self.warnings}

    def add_problem(self, kind: str, message: str, *, distinct: bool = False) -> None:
        """Record a problem; a kind seen before only counts up (see :meth:`add_warning`)."""
        _add(self.problems, kind, message, distinct)

    def add_warning(self, kind: str, message: str, *, distinct: bool = False) -> None:
        """Record a warning.

        Args:
            kind: The short code of the finding.
            message: One sentence saying what is suspicious and what to do about it.
            distinct: Keep each different message of this kind (for messages the env itself
                warned with); otherwise a kind seen before only counts up.
        """
        _add(self.warnings, kind, message, distinct)

    def summary(self) -> str:
        """The report as readable text: the statistics line, then one line per finding."""
        lines = [self._stats_line()]
        lines += [f"problem {p.line()}" for p in self.problems]
        lines += [f"warning {w.line()}" for w in self.warnings]
        verdict = "OK" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {_plural(len(self.problems), 'problem')}, "
            f"{_plural(len(self.warnings), 'warning')}"
        )
        return "\n".join(lines)

    def _stats_line(self) -> str:
        what = "multi-agent env" if self.multi_agent else "env"
        text = (
            f"{what} {self.env_name}: {_plural(self.episodes, 'episode')}, "
            f"{_plural(self.steps, 'step')}"
        )
        if self.mean_return is not None and self.mean_length is not None:
            text += f", mean return {self.mean_return:.4g}, mean length {self.mean_length:.4g}"
        return text


def _add(items: list[Problem], kind: str, message: str, distinct: bool) -> None:
    for item in items:
        if item.kind == kind and (not distinct or item.message == message):
            item.count += 1
            return
    items.append(Problem(kind, message))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def plain_warning(message: object) -> str:
    """A warning's text without gymnasium's colour codes and ``WARN:`` prefix."""
    text = _COLOUR.sub("", str(message)).strip()
    return text.removeprefix("WARN: ").strip()
