"""A hand-set induction circuit whose every edge is known: for the docs, tests, example and induction threshold."""

from __future__ import annotations

import math
import warnings

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.attention import attention_patterns
from interp.outside import PromptPairs, outside_head_scores

TOY_VOCAB = [chr(ord("a") + i) for i in range(10)]  # token names a..j
TOY_N_CTX = 8


def hand_set_induction_model(score: float = 8.0, unembed_scale: float = 4.0) -> HookedTransformer:
    """A 2-layer, 2-head, attention-only causal HookedTransformer (10 tokens, 8 positions, no
    norms) whose weights are set by hand, so its circuit is known. The residual stream has five
    subspaces of one-hot codes: token, position, previous token, answer, junk.

      L0H0  previous-token head: attends from position i to i-1 (positions through W_Q, W_K),
            copies that token into the previous-token subspace
      L1H0  induction head: its query (the current token) matches keys whose previous token is
            the same (the previous-token subspace, written by L0H0: K-composition); it copies
            the attended token into the answer subspace, the only one W_U reads
      L0H1  distractor: attends to itself, copies its token into the junk subspace
      L1H1  distractor: attends to position 0, copies that token into the junk subspace
    Nothing reads the junk subspace: the distractors' outputs never reach the logits.
    `score`: a matching key's attention score (larger: harder attention)."""
    n_vocab, n_ctx, d_head = len(TOY_VOCAB), TOY_N_CTX, 10
    tok, pos, prev, out, junk = (slice(i * 10, i * 10 + 10) for i in range(5))
    cfg = HookedTransformerConfig(n_layers=2, d_model=50, n_heads=2, d_head=d_head, d_vocab=n_vocab, n_ctx=n_ctx,
                                  attn_only=True, normalization_type=None, attention_dir="causal", act_fn="relu",
                                  positional_embedding_type="standard", seed=0)
    with warnings.catch_warnings():  # TL 3.x announces 4.0 on every construction
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg)
    a = math.sqrt(score * math.sqrt(d_head))  # q . k / sqrt(d_head) = score for a match
    eye_tok, eye_pos = torch.eye(n_vocab), torch.eye(n_ctx)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.embed.W_E[:, tok] = eye_tok
        model.pos_embed.W_pos[:, pos][:, :n_ctx] = eye_pos
        attn0, attn1 = model.blocks[0].attn, model.blocks[1].attn
        # L0H0: query at position i is e_i, key at position j is e_{j+1}: a match when j = i - 1
        attn0.W_Q[0, pos.start:pos.start + n_ctx, :n_ctx] = a * eye_pos
        attn0.W_K[0, pos.start:pos.start + n_ctx - 1, 1:n_ctx] = a * eye_pos[:-1, :-1]
        attn0.W_V[0, tok, :n_vocab] = eye_tok
        attn0.W_O[0, :n_vocab, prev] = eye_tok
        # L0H1: self
        attn0.W_Q[1, pos.start:pos.start + n_ctx, :n_ctx] = a * eye_pos
        attn0.W_K[1, pos.start:pos.start + n_ctx, :n_ctx] = a * eye_pos
        attn0.W_V[1, tok, :n_vocab] = eye_tok
        attn0.W_O[1, :n_vocab, junk] = eye_tok
        # L1H0: induction; query = current token, key = previous token (from L0H0)
        attn1.W_Q[0, tok, :n_vocab] = a * eye_tok
        attn1.W_K[0, prev, :n_vocab] = a * eye_tok
        attn1.W_V[0, tok, :n_vocab] = eye_tok
        attn1.W_O[0, :n_vocab, out] = eye_tok
        # L1H1: position 0 (a constant query matching the key of position 0)
        attn1.b_Q[1, 0] = a
        attn1.W_K[1, pos.start, 0] = a
        attn1.W_V[1, tok, :n_vocab] = eye_tok
        attn1.W_O[1, :n_vocab, junk] = eye_tok
        model.unembed.W_U[out, :] = unembed_scale * eye_tok
    return model


def calibrate_induction(seeds: range = range(3)) -> dict[str, float]:
    """Induction scores on 64 sequences of four random tokens (1-9) repeated: the hand-set
    induction head (L1H0 of `hand_set_induction_model`), the highest of any head of randomly
    initialised copies of its architecture, and their midpoint, OUTSIDE_THRESHOLDS' induction."""
    model = hand_set_induction_model()
    half = torch.randint(1, 10, (64, 4), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([half, half], dim=1)

    def induction(m: HookedTransformer) -> torch.Tensor:
        return outside_head_scores(attention_patterns(m, tokens), tokens, causal=True).score("induction")

    random_max = -1.0
    for seed in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            random = HookedTransformer(HookedTransformerConfig(**{**model.cfg.to_dict(), "seed": seed}))
        random_max = max(random_max, induction(random).max().item())
    planted = induction(model)[1, 0].item()
    return {"random_max": round(random_max, 4), "hand_set": round(planted, 4),
            "threshold": round((random_max + planted) / 2, 2)}


def induction_prompt_pairs(n: int = 16, seed: int = 0) -> PromptPairs:
    """Pairs for `hand_set_induction_model`: clean `p A B q D C r A` (answer B: the token after
    the earlier A) and corrupted `p D B q A C r A` (A and D swapped: answer C), seven distinct
    random tokens per pair. The corruption changes which earlier token precedes B and C, so only
    the previous-token head (L0H0) and the induction head (L1H0) carry the difference."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted, answers, wrong = [], [], [], []
    for _ in range(n):
        p, a, b, q, d, c, r = torch.randperm(len(TOY_VOCAB), generator=gen)[:7].tolist()
        clean.append(" ".join(TOY_VOCAB[t] for t in (p, a, b, q, d, c, r, a)))
        corrupted.append(" ".join(TOY_VOCAB[t] for t in (p, d, b, q, a, c, r, a)))
        answers.append(TOY_VOCAB[b])
        wrong.append(TOY_VOCAB[c])
    return PromptPairs.from_lists(clean, corrupted, answers, wrong, vocab=TOY_VOCAB)
