"""Labels joined with causal evidence (interp.head_evidence) and the depth and gathering kinds
(interp.attention): each is recognised on hand-set patterns, and a label's status follows its share."""

import torch

from interp.attention import (
    DEFAULT_THRESHOLDS,
    HEAD_KINDS,
    HeadScores,
    depth_pattern,
    gathering_pattern,
    score_heads,
)
from interp.head_evidence import CARRIES, USED, ShareProbe, describe, head_evidence, head_evidence_html
from models.config import ModelConfig
from models.factory import build_model
from tasks import LegoConfig, LegoTask, seeded_generator

LEGO = LegoTask(LegoConfig(n_vars=8, n_supervised=5))
MODEL = build_model(ModelConfig(n_layers=1, d_model=20, n_heads=5, d_head=4), LEGO)  # the probe below never runs it


def test_segment_depth_reads_each_clauses_chain_depth_from_the_tokens_alone():
    batch = LEGO.sample(64, seeded_generator(0), split="train")  # shuffled clauses, some rows shorter
    depth = LEGO.segment_depth(batch.tokens)
    rows = torch.arange(64).unsqueeze(1)
    assert ((depth[rows, batch.label_pos] == torch.arange(8)) | ~batch.label_mask).all()
    assert (depth[batch.tokens == 1] == -1).all()  # BOS belongs to no clause


def test_hand_set_depth_and_gathering_heads_get_their_label_and_what_they_read():
    tokens = LEGO.sample(64, seeded_generator(1), split="test").tokens
    patterns = torch.stack([depth_pattern(tokens, LEGO, 2), gathering_pattern(tokens, LEGO, 2),
                            gathering_pattern(tokens, LEGO, 3)], dim=1).unsqueeze(0)  # layer batch head q k
    scores = score_heads(patterns, tokens, LEGO)
    assert scores.labels == [["depth", "gathering", "gathering"]]
    assert scores.where == [[2, 2, 3]]  # #2's clause; every clause's element; every right-hand variable
    assert scores.score("depth")[0, 0] > 0.99 and scores.score("gathering")[0, 1] > 0.99


class FakeProbe(ShareProbe):
    """Shares and pair effects given by hand: heads (0, 0) and (0, 1) are redundant twins."""

    def __init__(self, joint):
        super().__init__([], "by hand")
        self.pairs = joint

    def joint(self, model, heads):
        return self.pairs.get(frozenset(heads), 0.0)


def _scores(labels):
    n_layers, n_heads = len(labels), len(labels[0])
    return HeadScores(torch.full((len(HEAD_KINDS), n_layers, n_heads), 0.6), labels, dict(DEFAULT_THRESHOLDS),
                      where=[[None] * n_heads for _ in range(n_layers)])


def test_a_labels_status_follows_its_share_and_twins_are_found_by_patching_the_pair():
    labels = [["manipulation", "manipulation", "association", "mixed", "mixed"]]
    shares = torch.tensor([[0.01, 0.02, 0.0, 0.5, 0.1]])
    probe = FakeProbe({frozenset([(0, 0), (0, 1)]): 0.9})
    evidence = head_evidence(MODEL, _scores(labels), probe, shares)
    assert evidence.status == [["twin", "twin", "not used", "unnamed", "idle"]]
    assert evidence.partner[0][:2] == ["L0H1", "L0H0"] and evidence.joint[0][0] == 0.9
    alone = head_evidence(MODEL, _scores(labels), FakeProbe({}), shares)  # the pair moves no more than the two
    assert alone.status[0][:2] == ["not used", "not used"]
    used = head_evidence(MODEL, _scores(labels), FakeProbe({}), torch.tensor([[USED, 0.02, CARRIES, 0.0, 0.0]]))
    assert used.status == [["used", "not used", "used", "idle", "idle"]]


def test_the_report_says_which_labels_the_answer_depends_on():
    labels = [["manipulation", "manipulation", "association", "mixed", "mixed"]]
    evidence = head_evidence(MODEL, _scores(labels), FakeProbe({frozenset([(0, 0), (0, 1)]): 0.9}),
                             torch.tensor([[0.01, 0.02, 0.0, 0.5, 0.1]]))
    page = head_evidence_html({"labels": labels, "evidence": evidence.to_dict()})
    assert "1 looks like its kind, and the answer does not depend on it" in page
    assert "2 looks like its kind; alone it moves nothing" in page and "with L0H1: together 0.90" in page
    assert "1 carries the answer, and no kind names its pattern" in page and "L0H4" not in page  # idle: left out
    assert describe("association", "not used", 0.01) == "looks like association, not used (share 0.01)"
    assert head_evidence_html({"labels": labels, "evidence": None}) == ""  # an analysis written before evidence
