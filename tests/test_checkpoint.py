import pickle
import zipfile

import pytest
import torch

from nmt.config import Config, DataConfig, ModelConfig
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.models.builders import build_model
from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(["a b c d", "b c d e"] * 5, ["x y z", "y z w"] * 5, 30, "unigram", True)


def test_round_trip_rebuilds_the_same_model(tmp_path, tokenizer):
    cfg = Config(data=DataConfig(train="corpus/train"), model=ModelConfig(dim=16, layers=1, heads=2, ffn_dim=32))
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True)
    save_checkpoint(tmp_path / "c.pt", model, cfg, tokenizer, step=7)
    payload = load_checkpoint(tmp_path / "c.pt")
    again, tok, cfg2 = model_from_checkpoint(payload, torch.device("cpu"))
    assert payload["step"] == 7 and cfg2.model == cfg.model and tok.state() == tokenizer.state()
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed away


class WritesAFile:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    target = tmp_path / "pwned.txt"
    torch.save({"format": "nmt-checkpoint", "model": WritesAFile(str(target))}, tmp_path / "evil.pt")
    with pytest.raises(NmtError, match="refused to load"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not target.exists()
    # the file really is a loader of code: plain unpickling would have run it
    with zipfile.ZipFile(tmp_path / "evil.pt") as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"open" in data and isinstance(pickle.loads(data), object) and target.exists()


def test_truncated_and_foreign_files(tmp_path, tokenizer):
    cfg = Config(data=DataConfig(train="corpus/train"), model=ModelConfig(dim=16, layers=1, heads=2, ffn_dim=32))
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True)
    save_checkpoint(tmp_path / "c.pt", model, cfg, tokenizer, step=1)
    data = (tmp_path / "c.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(NmtError, match="cut.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(NmtError, match="other.pt: not an nmt checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(NmtError, match="no checkpoints/best.pt or checkpoints/last.pt"):
        load_checkpoint(tmp_path)
