"""``agentenv export``: a run's checkpoint becomes a model folder that transformers and ``agentenv eval`` load."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agentenv.errors import CheckpointError, RunFolderError
from agentenv.trainer.checkpoint import save_checkpoint
from agentenv.trainer.export import export, main
from agentenv.trainer.resume import ensure_run_id
from tests.tiny_model_folder import write_tiny_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("base"))


def fake_run(folder, base, versions):
    """A run folder as train leaves it: config.yaml naming the base model, run.json, checkpoints of ``versions``
    whose weights are the base's plus ``version`` (so each version is told apart)."""
    from transformers import AutoModelForCausalLM

    folder.mkdir()
    ensure_run_id(folder)
    cfg = {"env": {"id": "python_tool"}, "model": {"name": str(base), "chat_template_kwargs": {"x": False}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    model = AutoModelForCausalLM.from_pretrained(base)
    for v in versions:
        with torch.no_grad():
            sd = {k: t + v for k, t in model.state_dict().items()}
        save_checkpoint(folder / "checkpoints", model=sd, optimizer=None, scheduler=None, version=v, keep=0)
    return folder


def test_export_writes_a_folder_transformers_loads_with_the_checkpoint_weights(base, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = fake_run(tmp_path / "run", base, [1, 2])
    assert main([str(run), "--version", "1", "--out", str(tmp_path / "v1")]) == 0
    assert "evaluate it: agentenv eval --env python_tool --model" in capsys.readouterr().out
    out = export(run, tmp_path / "latest")  # the latest: version 2
    reference = AutoModelForCausalLM.from_pretrained(base).state_dict()
    for folder, version in ((tmp_path / "v1", 1), (out, 2)):
        model = AutoModelForCausalLM.from_pretrained(folder)
        for k, t in model.state_dict().items():
            torch.testing.assert_close(t, reference[k] + version, rtol=0, atol=0)
        meta = json.loads((folder / "agentenv_export.json").read_text())
        assert (meta["version"], meta["env"], meta["chat_template_kwargs"]) == (version, "python_tool", {"x": False})
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == AutoTokenizer.from_pretrained(base).chat_template and "<tool_call>" in tok.chat_template
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")


def test_export_refuses_what_it_cannot_write(base, tmp_path, capsys):
    run = fake_run(tmp_path / "run", base, [1])
    with pytest.raises(CheckpointError, match="no checkpoint of version 7 \\(it has: 1;"):
        export(run, tmp_path / "o", version=7)
    with pytest.raises(RunFolderError, match="not an agentenv training run folder"):
        export(tmp_path, tmp_path / "o")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main([str(run), "--out", str(mine), "--overwrite"]) == 2
    assert "not an agentenv exported model folder" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    export(run, tmp_path / "o")
    with pytest.raises(RunFolderError, match="pass --overwrite"):
        export(run, tmp_path / "o")
    assert export(run, tmp_path / "o", overwrite=True) == tmp_path / "o"


def test_eval_plays_an_exported_model(base, tmp_path, guess_number):
    from agentenv.eval_command import main as eval_main

    run = fake_run(tmp_path / "run", base, [1])
    out = export(run, tmp_path / "model")
    report_dir = tmp_path / "eval"
    assert eval_main(["--env", guess_number, "--env-arg", "high=2", "--model", str(out), "--max-new-tokens", "4",
                      "--no-progress", "--out", str(report_dir), "--concurrency", "1"]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["overall"]["episodes"] == 2 and report["overall"]["errors"] == 0


def test_eval_names_the_export_for_a_checkpoint_folder(base, tmp_path, guess_number, capsys):
    from agentenv.eval_command import main as eval_main

    run = fake_run(tmp_path / "run", base, [3])
    checkpoint = next((run / "checkpoints").glob("v*"))
    assert eval_main(["--env", guess_number, "--model", str(checkpoint), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "is a training checkpoint" in err and f"agentenv export {run} --out MODEL_DIR" in err
    assert not (tmp_path / "e").exists()


def lora_run(folder, base, *, rank=2, alpha=4.0):
    """A LoRA run folder: adapters on q_proj and v_proj with B drawn at random (so they change the output)."""
    from transformers import AutoModelForCausalLM

    from agentenv.trainer.learners.lora import add_lora

    folder.mkdir()
    ensure_run_id(folder)
    cfg = {"env": {"id": "python_tool"}, "model": {"name": str(base)},
           "learner": {"lora_rank": rank, "lora_alpha": alpha, "lora_target_modules": ["q_proj", "v_proj"]}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.manual_seed(0)
    model = add_lora(AutoModelForCausalLM.from_pretrained(base), rank=rank, alpha=alpha, targets=("q_proj", "v_proj"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_checkpoint(folder / "checkpoints", model=model.state_dict(), optimizer=None, scheduler=None, version=3,
                    keep=0)
    return folder, model


def test_a_lora_run_exports_merged_or_as_a_peft_adapter_computing_what_the_policy_does(base, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, policy = lora_run(tmp_path / "run", base)
    ids = torch.tensor([[1, 5, 7, 9, 2, 11]])
    with torch.no_grad():
        expected = policy(ids).logits
        assert not torch.allclose(expected, AutoModelForCausalLM.from_pretrained(base)(ids).logits, atol=1e-3)
    assert main([str(run), "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert main([str(run), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert "load them over the base model" in capsys.readouterr().out
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], sorted(adapter["target_modules"])) == (2, 4.0, ["q_proj", "v_proj"])
    assert adapter["base_model_name_or_path"] == str(base) and not (tmp_path / "adapter" / "config.json").exists()
    over_base = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(over_base(ids).logits, expected, rtol=0, atol=1e-5)
    meta = json.loads((tmp_path / "adapter" / "agentenv_export.json").read_text())
    assert (meta["version"], meta["adapter"]) == (3, True)


def test_adapter_export_of_a_run_without_adapters_is_refused(base, tmp_path, capsys):
    run = fake_run(tmp_path / "run", base, [1])
    assert main([str(run), "--out", str(tmp_path / "o"), "--adapter"]) == 2
    assert "trained every weight (learner.lora_rank 0), so it has no adapter" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
