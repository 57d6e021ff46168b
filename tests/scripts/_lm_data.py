"""Token streams for the language-model scripts of this folder: a vocabulary
with Zipf frequencies (a few words make most of the text, most words are
rare) and some structure to learn (a word is often followed by the same
next word)."""
import torch


def zipf_stream(vocab: int, length: int, seed: int, follow: float = 0.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    draws = torch.multinomial(p / p.sum(), length, replacement=True, generator=g)
    nxt = torch.randperm(vocab, generator=g)                     # each word's usual successor
    keep = torch.rand(length, generator=g) < follow
    out = draws.clone()
    for i in range(1, length):                                   # (a few thousand tokens: fast enough)
        if keep[i]:
            out[i] = nxt[out[i - 1]]
    return out


def batches(stream: torch.Tensor, batch: int, bptt: int, g: torch.Generator):
    """Random (input, target) windows of ``bptt`` tokens, ``batch`` of them."""
    while True:
        start = torch.randint(0, stream.numel() - bptt - 1, (batch,), generator=g)
        idx = start[:, None] + torch.arange(bptt + 1)[None, :]
        w = stream[idx]
        yield w[:, :-1], w[:, 1:]
