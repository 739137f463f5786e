"""Resume states (apps/train/resume.py): written whole, read back, dropped by --fresh."""

import torch

from apps.train.resume import RESUME_DIR, load_state, resume_from, save_state


def _model_and_opt():
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_a_saved_state_resumes_weights_optimizer_and_step(tmp_path, capsys):
    model, opt = _model_and_opt()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7}
    save_state(tmp_path / RESUME_DIR, state)
    assert not list((tmp_path / RESUME_DIR).glob("*.tmp"))  # renamed over, not left half-written

    other, other_opt = _model_and_opt()
    start = resume_from(tmp_path, False, other_opt, lambda st: other.load_state_dict(st["model"]))
    assert start == 7 and f"resuming {tmp_path} at step 7" in capsys.readouterr().out
    assert torch.equal(other.weight, model.weight)
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_fresh_drops_the_state_and_a_missing_one_starts_at_zero(tmp_path):
    model, opt = _model_and_opt()
    save_state(tmp_path / RESUME_DIR, {"optimizer": opt.state_dict(), "step": 3}, name="draft")
    assert load_state(tmp_path / RESUME_DIR, "draft")["step"] == 3
    assert load_state(tmp_path / RESUME_DIR, "target") is None
    assert resume_from(tmp_path, True, opt, lambda st: None) == 0
    assert not (tmp_path / RESUME_DIR).exists()
