"""AER, precision and recall of attention against gold word alignments, worked by hand."""

import numpy as np
import pytest

from nmt.errors import NmtError
from nmt.evaluation.alignment import (
    AlignmentScore,
    argmax_links,
    merge_to_words,
    parse_pharaoh,
    read_pharaoh,
    word_index,
)
from tests.conftest import write


def test_word_index_groups_pieces_at_the_word_start_mark():
    assert word_index(["\u2581a", "\u2581b", "c", "\u2581d"]) == [0, 1, 1, 2]
    assert word_index(["x", "y", "\u2581z"]) == [0, 0, 1]  # a first piece without the mark still opens word 0
    assert word_index([]) == []


def test_aer_on_a_hand_worked_example():
    # Sentence 1: source "a bc d" = pieces ▁a ▁b c ▁d (words 0 1 1 2); reference "xy z" = pieces ▁x y ▁z (words 0 0 1).
    # Rows: ▁x, y, ▁z, then the EOS step; columns: ▁a ▁b c ▁d </s>.
    attention = np.array(
        [
            [0.1, 0.2, 0.3, 0.1, 0.3],
            [0.5, 0.1, 0.1, 0.1, 0.2],
            [0.0, 0.1, 0.1, 0.7, 0.1],
            [0.0, 0.0, 0.0, 0.0, 1.0],
        ]
    )
    # Target word 0 = mean of rows ▁x and y = [0.3, 0.15, 0.2, 0.1] (</s> dropped);
    # source words: a 0.3, bc 0.15 + 0.2 = 0.35, d 0.1.
    # Its argmax is "bc" (word 1), although the single largest piece weight (0.3) is on ▁a: merging subwords matters.
    # Target word 1 = row ▁z = [0.0, 0.1, 0.1, 0.7]: a 0.0, bc 0.2, d 0.7 -> word 2.
    words = merge_to_words(attention, [0, 1, 1, 2], [0, 0, 1])
    np.testing.assert_allclose(words, [[0.3, 0.35, 0.1], [0.0, 0.2, 0.7]])
    predicted = argmax_links(words)
    assert predicted == {(1, 0), (2, 1)}
    # Gold "1-0 0-1 2?1": S = {(1,0), (0,1)}, P = S + {(2,1)}.
    # |A| = 2, |S| = 2, |A&S| = 1, |A&P| = 2: precision 2/2 = 1, recall 1/2, AER = 1 - (1 + 2) / (2 + 2) = 0.25.
    score = AlignmentScore()
    score.add(predicted, parse_pharaoh("1-0 0-1 2?1", "gold:1"))
    assert (score.precision, score.recall, score.aer) == (1.0, 0.5, 0.25)
    # Sentence 2: "e" -> "w", attention [[0.9, 0.1], [0, 1]], gold "0-0": A = {(0,0)}, one sure hit.
    # Summed over the corpus: |A| = 3, |S| = 3, |A&S| = 2, |A&P| = 3: precision 1, recall 2/3,
    # AER = 1 - (2 + 3) / (3 + 3) = 1/6.
    score.add(
        argmax_links(merge_to_words(np.array([[0.9, 0.1], [0.0, 1.0]]), [0], [0])), parse_pharaoh("0-0", "gold:2")
    )
    assert score.precision == 1.0 and score.recall == pytest.approx(2 / 3) and score.aer == pytest.approx(1 / 6)
    assert score.as_dict()["sentences"] == 2


def test_pharaoh_files_are_checked_against_the_sentences(tmp_path):
    src, tgt = ["a b", "c"], ["x y z", "w"]
    gold = read_pharaoh(write(tmp_path / "ok.align", ["0-0 1-2 1?1", ""]), src, tgt)
    assert gold[0].sure == {(0, 0), (1, 2)} and gold[0].possible == {(0, 0), (1, 2), (1, 1)} and gold[1].sure == set()
    with pytest.raises(NmtError, match=r"bad.align:1: '0:1' is not an alignment link"):
        read_pharaoh(write(tmp_path / "bad.align", ["0:1", ""]), src, tgt)
    with pytest.raises(
        NmtError, match=r"past.align:2: link 0-1 points past the sentence pair \(1 source words, 1 target words\)"
    ):
        read_pharaoh(write(tmp_path / "past.align", ["0-0", "0-1"]), src, tgt)
    with pytest.raises(NmtError, match=r"short.align: 1 lines, but the test set has 2 sentence pairs"):
        read_pharaoh(write(tmp_path / "short.align", ["0-0"]), src, tgt)
