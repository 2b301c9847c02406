"""The emulator's engine: continuous batching on a modelled clock.

One asyncio task runs engine steps back to back while there is work. A step decodes every
running sequence together (one verification step each: A accepted drafts plus the bonus token)
and admits waiting requests up to ``max_num_seqs``, paying their prefill in the same step (the
prompt's tokens the prefix cache does not serve, ``emulator/prefix_cache.py``); the
step lasts the modelled time divided by the time scale. Everything a client or /metrics sees is in
wall-clock seconds, so at time scale X every rate reads X times the modelled one. Steps are scheduled against absolute
deadlines, so a late wake-up is made up by the next steps instead of accumulating, and the
lateness is recorded (``schedule_lag_s``).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate

from specsweep.emulator.content import VOCABULARY
from specsweep.emulator.metrics import Histogram
from specsweep.emulator.model import acceptance_curve, prefill_time_s, step_time_s
from specsweep.emulator.profile import Profile
from specsweep.engines import vllm
from specsweep.measurement.acceptance import accepted_length_distribution
from specsweep.types import SpeculativeConfig

CONTEXT_STEP = 64  # tokens: the resolution of a lookup drafter's acceptance by context


@dataclass(frozen=True, slots=True)
class Emission:
    """What one engine step gave one request: tokens as text, and whether it finished."""

    text: str
    num_tokens: int
    finish_reason: str | None


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters, as vLLM keeps them (read by /metrics and the periodic log)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    drafts_by_class: dict[str, int] = field(default_factory=dict)  # the emulator's own: which text each draft was on
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    ttft_s: Histogram = field(default_factory=lambda: Histogram(vllm.TTFT_BUCKETS_S))
    itl_s: Histogram = field(default_factory=lambda: Histogram(vllm.ITL_BUCKETS_S))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(vllm.E2E_BUCKETS_S))
    steps: int = 0
    schedule_lag_s: float = 0.0  # how late the last step ended (wall seconds)
    max_schedule_lag_s: float = 0.0
    # Over every busy period: wall time the schedule asked for, and wall time it took.
    scheduled_s: float = 0.0
    elapsed_s: float = 0.0


@dataclass(slots=True)
class Sequence:
    """One request inside the engine."""

    request_id: int
    content_class: str
    prompt_tokens: int
    max_tokens: int
    natural_tokens: int  # where the model would stop on its own (EOS)
    temperature: float
    arrival: float
    outbox: asyncio.Queue[Emission]
    generated: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    cancelled: bool = False
    cached_tokens: int = 0  # of the prompt, served by the prefix cache: no prefill for them


class Engine:
    """Continuous batching with speculative decoding, on a scaled modelled clock."""

    def __init__(
        self,
        profile: Profile,
        spec: SpeculativeConfig | None,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        start_index: int = 0,
    ) -> None:
        self.profile = profile
        self.spec = spec
        self.time_scale = time_scale
        self.stats = EngineStats()
        k_max = spec.num_speculative_tokens if spec and spec.num_speculative_tokens else 0
        self.stats.accepted_per_pos = [0] * k_max
        self._rng = random.Random(seed)
        # Run-to-run variation: one factor and one drift phase per start (a start is a new
        # process; ``start_index`` tells starts of one seeded study apart).
        variation = random.Random(f"variation:{seed}:{start_index}")
        sd = profile.timing.start_variation
        self.start_factor = math.exp(variation.gauss(0.0, sd) - sd * sd / 2) if sd else 1.0
        self._drift_phase = variation.uniform(0.0, 2 * math.pi)
        self._modelled_s = 0.0  # modelled time since the engine started
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._prefilling = 0  # admitted this step: their prefill runs in it, as vLLM's running requests
        self._wakeup = asyncio.Event()
        self._next_id = 0
        self._cdfs: dict[tuple[str, float, int, int], list[float]] = {}
        # Only a lookup drafter's acceptance depends on the context: then each sequence's curve is
        # taken at its context rounded to CONTEXT_STEP tokens (so curves can be kept), else at none.
        lookup = spec is not None and not vllm.drafts_from_a_distribution(spec)
        self._by_context = lookup and profile.context.lookup_logit_slope > 0
        self._reads_context = profile.context.memory_bandwidth_gb_s > 0  # else a step's time ignores it

    # -- requests -------------------------------------------------------------------------
    def tokens_in_cache(self, draft_tokens: int) -> int:
        """KV slots the running sequences hold: prompt, generated tokens and the draft buffer."""
        return sum(s.prompt_tokens + s.generated + draft_tokens for s in self._running)

    @property
    def num_running(self) -> int:
        """Requests in the running batch, those being prefilled included (vLLM counts them there)."""
        return len(self._running) + self._prefilling

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(
        self,
        *,
        content_class: str,
        prompt_tokens: int,
        max_tokens: int,
        temperature: float,
        arrival: float | None = None,
        cached_tokens: int = 0,
    ) -> Sequence:
        """Queue a request; its emissions arrive on the returned sequence's outbox.

        ``arrival`` is when the request reached the server (perf_counter); the engine's
        schedule counts from it, so the server's own handling time is part of the model's
        request overhead instead of an addition to it.
        """
        self._next_id += 1
        natural = max(
            1,
            round(self.profile.output_median_tokens * math.exp(self.profile.output_sigma * self._rng.gauss(0.0, 1.0))),
        )
        seq = Sequence(
            request_id=self._next_id,
            content_class=content_class,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            natural_tokens=natural,
            temperature=temperature,
            arrival=time.perf_counter() if arrival is None else arrival,
            outbox=asyncio.Queue(),
            cached_tokens=cached_tokens,
        )
        self._waiting.append(seq)
        self._wakeup.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Drop a request whose client went away (it leaves at the next step); one that had not
        finished counts as aborted, as vLLM counts it."""
        if not seq.cancelled and seq.generated < min(seq.max_tokens, seq.natural_tokens):
            self.stats.requests_finished["abort"] = self.stats.requests_finished.get("abort", 0) + 1
        seq.cancelled = True

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Run engine steps forever (cancel the task to stop)."""
        deadline = busy_start = time.perf_counter()
        scheduled_before = elapsed_before = 0.0
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                # Idle until now: the first step starts when its request was due, not when
                # this task woke up.
                due = self._waiting[0].arrival + self.profile.timing.request_overhead_s / self.time_scale
                deadline = busy_start = min(time.perf_counter(), due)
                scheduled_before, elapsed_before = self.stats.scheduled_s, self.stats.elapsed_s
            self._running = [s for s in self._running if not s.cancelled]
            admitted: list[Sequence] = []
            while self._waiting and len(self._running) + len(admitted) < self.profile.max_num_seqs:
                seq = self._waiting.popleft()
                if not seq.cancelled:
                    admitted.append(seq)
            batch = len(self._running)
            k = self.spec.k_for_batch_size(batch) if self.spec and batch else 0
            context = sum(s.prompt_tokens + s.generated for s in self._running) if self._reads_context else 0
            modelled = step_time_s(self.profile, self.spec, k, batch, context) * self._variation()
            jitter = self.profile.timing.jitter
            if jitter and modelled:
                modelled *= math.exp(self._rng.gauss(0.0, jitter) - jitter * jitter / 2)
            modelled += sum(prefill_time_s(self.profile, s.prompt_tokens - s.cached_tokens) for s in admitted)
            deadline += modelled / self.time_scale
            self._modelled_s += modelled
            self._prefilling = len(admitted)
            delay = deadline - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.perf_counter()
            lag = max(0.0, now - deadline)
            self.stats.schedule_lag_s = lag
            self.stats.max_schedule_lag_s = max(self.stats.max_schedule_lag_s, lag)
            self.stats.scheduled_s = scheduled_before + (deadline - busy_start)
            self.stats.elapsed_s = elapsed_before + (now - busy_start)
            self.stats.steps += 1
            self._decode(k, now)
            self._prefilling = 0
            for seq in admitted:
                self.stats.prompt_tokens += seq.prompt_tokens
                self._emit(seq, 1, now)
                if seq.generated < seq.max_tokens and seq.generated < seq.natural_tokens:
                    self._running.append(seq)

    def _variation(self) -> float:
        """This start's factor on the step time now: the per-start draw times the slow drift."""
        timing = self.profile.timing
        drift = timing.drift * math.sin(2 * math.pi * self._modelled_s / timing.drift_period_s + self._drift_phase)
        return self.start_factor * (1.0 + drift)

    def _decode(self, k: int, now: float) -> None:
        stats = self.stats
        still: list[Sequence] = []
        for seq in self._running:
            if seq.cancelled:
                continue
            accepted = 0
            if k > 0:
                cumulative = self._cumulative(seq, k)
                accepted = bisect.bisect_right(cumulative, self._rng.random())
                accepted = min(accepted, k)
                stats.num_drafts += 1
                stats.drafts_by_class[seq.content_class] = stats.drafts_by_class.get(seq.content_class, 0) + 1
                stats.num_draft_tokens += k
                stats.num_accepted_tokens += accepted
                per_pos = stats.accepted_per_pos
                for i in range(accepted):
                    per_pos[i] += 1
            self._emit(seq, accepted + 1, now)
            if seq.generated < seq.max_tokens and seq.generated < seq.natural_tokens:
                still.append(seq)
        self._running = still

    def _cumulative(self, seq: Sequence, k: int) -> list[float]:
        context = round((seq.prompt_tokens + seq.generated) / CONTEXT_STEP) * CONTEXT_STEP if self._by_context else 0
        key = (seq.content_class, seq.temperature, k, context)
        cdf = self._cdfs.get(key)
        if cdf is None:
            curve = acceptance_curve(
                self.profile, seq.content_class, self.spec, seq.temperature, k, context_tokens=context
            )
            cdf = list(accumulate(accepted_length_distribution(curve)))[:-1]
            self._cdfs[key] = cdf
        return cdf

    def _emit(self, seq: Sequence, tokens: int, now: float) -> None:
        limit = min(seq.max_tokens, seq.natural_tokens)
        count = min(tokens, limit - seq.generated)
        if count <= 0:
            return
        seq.generated += count
        stats = self.stats
        stats.generation_tokens += count
        if seq.first_token_at is None:
            seq.first_token_at = now
            stats.ttft_s.observe(now - seq.arrival)
        elif seq.last_token_at is not None:
            stats.itl_s.observe(now - seq.last_token_at)
        seq.last_token_at = now
        finish: str | None = None
        if seq.generated >= seq.max_tokens:
            finish = "length"
        elif seq.generated >= seq.natural_tokens:
            finish = "stop"
        if finish:
            stats.requests_finished[finish] = stats.requests_finished.get(finish, 0) + 1
            stats.e2e_s.observe(now - seq.arrival)
        vocab = VOCABULARY[seq.content_class]
        text = "".join(self._rng.choices(vocab, k=count))
        seq.outbox.put_nowait(Emission(text=text, num_tokens=count, finish_reason=finish))
