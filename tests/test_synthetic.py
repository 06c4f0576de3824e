from nmt.data.synthetic import MAX_LEN, MIN_LEN, ToyLanguage, generate_toy_corpus


def read(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_same_seed_same_corpus_and_no_overlap_between_splits(tmp_path):
    a = generate_toy_corpus(tmp_path / "a", seed=7, sizes={"train": 200, "test": 50})
    b = generate_toy_corpus(tmp_path / "b", seed=7, sizes={"train": 200, "test": 50})
    c = generate_toy_corpus(tmp_path / "c", seed=8, sizes={"train": 200, "test": 50})
    assert read(a / "train.src") == read(b / "train.src")
    assert read(a / "train.tgt") != read(c / "train.tgt")
    assert not set(read(a / "train.src")) & set(read(a / "test.src"))


def test_lengths_and_alignments_are_consistent(tmp_path):
    out = generate_toy_corpus(tmp_path, seed=1, sizes={"train": 300})
    for src, tgt, align in zip(read(out / "train.src"), read(out / "train.tgt"), read(out / "train.align")):
        s, t = src.split(), tgt.split()
        assert MIN_LEN <= len(s) <= MAX_LEN
        links = [tuple(map(int, link.split("-"))) for link in align.split()]
        # every target word is aligned to exactly one source word, every source word to at least one
        assert sorted(j for _, j in links) == list(range(len(t)))
        assert {i for i, _ in links} == set(range(len(s)))


def test_lexicon_and_reordering_rules():
    lang = ToyLanguage(seed=1)
    translate = {tok.word: tok.translation for toks in lang.lexicon.values() for tok in toks}
    det, adj, noun, verb = (lang.lexicon[c][0] for c in ("DET", "ADJ", "NOUN", "VERB"))
    two = next(tok for toks in lang.lexicon.values() for tok in toks if len(tok.translation) == 2)
    assert len(two.translation) == 2
    # a clause "DET ADJ NOUN VERB" must come out as "DET' NOUN' ADJ' VERB'": check it on generated data
    import random

    rng = random.Random(0)
    for _ in range(200):
        src, tgt, align = lang.sentence(rng)
        words = src.split()
        links = [tuple(map(int, link.split("-"))) for link in align.split()]
        order = []
        for i, _ in links:
            if not order or order[-1] != i:
                order.append(i)
        # target words are the lexicon translations of the source words in the aligned order
        assert tgt.split() == [piece for i in order for piece in translate[words[i]]]
    assert det.word != adj.word != noun.word != verb.word


def test_adjectives_follow_nouns_and_verbs_go_last():
    import random

    lang = ToyLanguage(seed=1)
    category = {tok.word: tok.category for toks in lang.lexicon.values() for tok in toks}
    rng = random.Random(1)
    checked_adj = checked_verb = 0
    for _ in range(300):
        src, _, align = lang.sentence(rng)
        words = src.split()
        if any(category[w] == "CONJ" for w in words):
            continue
        first_target = {}
        for i, j in (map(int, link.split("-")) for link in align.split()):
            first_target.setdefault(i, j)
        verb = next(i for i, w in enumerate(words) if category[w] == "VERB")
        assert all(first_target[verb] > first_target[i] for i in first_target if i != verb)
        checked_verb += 1
        for i in range(len(words) - 1):
            if category[words[i]] == "ADJ":
                noun = next(k for k in range(i, len(words)) if category[words[k]] == "NOUN")
                assert first_target[noun] < first_target[i]
                checked_adj += 1
    assert checked_adj > 50 and checked_verb > 50
