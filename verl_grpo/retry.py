"""Retry policies, declared once on tenacity instead of a hand-written loop at every call site.

A `Backoff` is the one shape every transient-failure retry here takes: at most `attempts` calls, the
delay before retry n being `backoff_s` × 2^(n-1) (no jitter, so a budget reads the same in the config
and in the logs), retries only for what `retry_on` accepts (anything else propagates at once, unchanged),
and, once the budget is spent, the caller's own error from `give_up` rather than tenacity's RetryError.
The same policy runs a blocking call (`call`) or a coroutine (`acall`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff within an attempt budget; see the module docstring."""

    attempts: int
    backoff_s: float
    retry_on: Callable[[BaseException], bool]
    """True for errors a retry may cure."""
    give_up: Callable[[RetryCallState], NoReturn]
    """Raises the error that ends a call whose every attempt failed (`last_error(state)` is the last one)."""
    on_retry: Callable[[RetryCallState], None] | None = None
    """Called before each sleep (`state.upcoming_sleep` is the delay), e.g. to log the retry."""

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) under this policy."""
        return Retrying(**self._settings())(fn, *args, **kwargs)

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """await fn(*args, **kwargs) under this policy; the delays are asyncio sleeps."""
        return await AsyncRetrying(**self._settings())(fn, *args, **kwargs)

    def _settings(self) -> dict[str, Any]:
        # A fresh Retrying per call: tenacity keeps per-call statistics on it, and calls run in many threads.
        return {
            "stop": stop_after_attempt(self.attempts),
            "wait": wait_exponential(multiplier=self.backoff_s),
            "retry": retry_if_exception(self.retry_on),
            "retry_error_callback": self.give_up,
            "before_sleep": self.on_retry,
        }


def last_error(state: RetryCallState) -> BaseException:
    """The error of the latest attempt."""
    assert state.outcome is not None and state.outcome.failed
    return state.outcome.exception()  # type: ignore[return-value]
