"""A weight sync's broadcast in buckets (`weights.sync._broadcast_flat`): both sides of the pair cut the same buckets
from the names, shapes and the sender's dtypes, a receiver holding a tensor in another dtype casts it into place, and
each bucket is one broadcast, whatever the sizes. A loopback group stands in for the pair (one process: the sender's
broadcasts are recorded, the receiver's are served from them in order)."""

from __future__ import annotations

import torch

from digenrl_verl.weights.sync import _broadcast_flat, _buckets


class _Done:
    def wait(self) -> None:
        return None


class _Loopback:
    """The sender's side records each broadcast's tensor; the receiver's side gets them back in order."""

    def __init__(self, sent: list[torch.Tensor] | None = None) -> None:
        self.sent, self.calls = sent, []

    def rank(self) -> int:  # pair-rank 0 sends
        return 0 if self.sent is None else 1

    def broadcast(self, tensors, opts):
        [t] = tensors
        self.calls.append(t.numel())
        if self.sent is None:
            return _Done()
        src = self.sent[len(self.calls) - 1]
        assert src.shape == t.shape and src.dtype == t.dtype, (src.shape, t.shape, src.dtype, t.dtype)
        t.copy_(src)
        return _Done()


class _Recorder(_Loopback):
    def __init__(self) -> None:
        super().__init__()
        self.record: list[torch.Tensor] = []

    def broadcast(self, tensors, opts):
        self.record.append(tensors[0].clone())
        return super().broadcast(tensors, opts)


def test_buckets_hold_at_most_the_limit_and_a_larger_tensor_alone():
    assert _buckets([(4, 4), (4, 4), (4, 4)], 32) == [[0, 1], [2]]
    assert _buckets([(100, 4), (1, 4), (1, 4)], 32) == [[0], [1, 2]]
    assert _buckets([], 32) == []


def test_the_receiver_gets_the_senders_values_bucket_by_bucket_in_its_own_dtypes():
    g = torch.Generator().manual_seed(0)
    sent = {f"w{i}": torch.randn(n, generator=g) for i, n in enumerate((3, 5, 17, 2, 64, 2))}
    sent["z_half"] = torch.randn(9, generator=g).to(torch.bfloat16)
    held = {k: torch.zeros_like(v, dtype=torch.bfloat16 if k == "w1" else v.dtype) for k, v in sent.items()}
    sender = _Recorder()
    _broadcast_flat(sent, sender, bucket_bytes=48)  # 12 fp32 values a bucket: [3, 5], [17], [2], [64], [2]
    receiver = _Loopback(sender.record)
    _broadcast_flat(held, receiver, bucket_bytes=48)
    assert receiver.calls == sender.calls and len(sender.calls) == 1 + 5 + 1  # header, fp32 buckets, the bf16 one
    assert sender.calls[1:3] == [8, 17]
    for k, v in sent.items():
        assert held[k].dtype == (torch.bfloat16 if k == "w1" else v.dtype)
        assert torch.equal(held[k], v.to(held[k].dtype)), k
