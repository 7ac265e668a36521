"""Service-time profiles: how long a prefill and a decode step take.

Fitted from ``traces/splitwise_sim_perf_model.csv`` (Splitwise's measured prompt and
per-token times, 105 rows per model/hardware/TP): ordinary least squares of
``prompt_time_ms`` on ``prompt_size × batch_size`` (prefill tokens in the batch) and of
``token_time_ms`` on ``batch_size``, one fit per (model, hardware, tensor_parallel).
R² ≥ 0.96 for the TP4/TP8 fits carried here (TP2 fits were poor, R² ≈ 0.25–0.5, and are
left out). Negative intercepts of the A100 prefill fits are clamped to 5 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROFILES", "PerfProfile"]


@dataclass(frozen=True)
class PerfProfile:
    """Linear service-time model; all times in milliseconds."""

    prefill_base_ms: float
    prefill_ms_per_token: float
    decode_base_ms: float
    decode_ms_per_seq: float

    def prefill_ms(self, tokens: int) -> float:
        """Time of a prefill pass over ``tokens`` prompt tokens (0 tokens → 0 ms)."""
        if tokens <= 0:
            return 0.0
        return self.prefill_base_ms + self.prefill_ms_per_token * tokens

    def decode_ms(self, batch: int) -> float:
        """Time of one decode step of ``batch`` sequences (0 → 0 ms)."""
        if batch <= 0:
            return 0.0
        return self.decode_base_ms + self.decode_ms_per_seq * batch


#: Fitted profiles, ``model/hardware/tp`` → coefficients (see module docstring).
PROFILES: dict[str, PerfProfile] = {
    "llama2-70b/h100/tp4": PerfProfile(6.89, 0.10735, 28.91, 0.3343),
    "llama2-70b/h100/tp8": PerfProfile(10.10, 0.09099, 30.02, 0.3030),
    "llama2-70b/h100-pcap/tp4": PerfProfile(8.96, 0.13955, 28.91, 0.3343),
    "llama2-70b/a100/tp4": PerfProfile(5.0, 0.32893, 43.80, 0.4095),
    "llama2-70b/a100/tp8": PerfProfile(5.0, 0.23083, 44.46, 0.3875),
    "bloom-176b/h100/tp8": PerfProfile(6.56, 0.15433, 35.67, 0.4144),
    "bloom-176b/a100/tp8": PerfProfile(20.47, 0.35172, 48.32, 0.7048),
}
