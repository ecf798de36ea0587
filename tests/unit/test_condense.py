"""The log condenser: parses the whole log (no pre-truncation), never evaluates log text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.judge.condense import ERROR_MAX_CHARS, MAX_WARNINGS, TAIL_MAX_CHARS, clean_log, condense_log

ESC = "\x1b"


def _info(msg: str, where: str = "trainer.py:2414") -> str:
    return f"{ESC}[32m[INFO|{where}] 2025-11-30 10:00:01,123 >> {msg}{ESC}[0m"


def _tqdm(total: int, upto: int) -> str:
    # tqdm writing to a pipe: one line, many \r redraws.
    frames = [
        f"{int(100 * i / total):3d}%|{'█' * (i * 10 // total):<10}| {i}/{total} [00:{i:02d}<00:10,  1.00it/s]"
        for i in range(0, upto + 1)
    ]
    return "\r".join(frames)


def success_log() -> str:
    lines = [
        _info("Process rank: 0, world size: 1, device: cuda:0, n_gpu: 1", "2025-11-30 10:00:00] llamafactory"),
        "[WARNING|2025-11-30 10:00:02] llamafactory.model.loader:162 >> `use_cache=True` is incompatible "
        "with gradient checkpointing. Setting `use_cache=False`.",
        "/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs "
        "have requires_grad=True. Gradients will be None",
        "[WARNING|2025-11-30 10:00:02] llamafactory.model.loader:162 >> `use_cache=True` is incompatible "
        "with gradient checkpointing. Setting `use_cache=False`.",
        _info("***** Running training *****"),
        _info("  Num examples = 1,234", "trainer.py:2415"),
        _info("  Num Epochs = 3", "trainer.py:2416"),
        _info("  Instantaneous batch size per device = 8", "trainer.py:2417"),
        _info("  Total optimization steps = 231", "trainer.py:2420"),
        _tqdm(231, 40),
        "{'loss': 1.9321, 'grad_norm': 0.812, 'learning_rate': 9.8e-05, 'epoch': 0.13}",
        _tqdm(231, 231),
        "{'train_runtime': 612.4051, 'train_samples_per_second': 6.045, 'train_steps_per_second': 0.377, "
        "'train_loss': 1.1032, 'epoch': 3.0}",
        "",
        "Training completed. Do not forget to share your model on huggingface.co/models =)",
        "",
        "***** train metrics *****",
        "  epoch                    =        3.0",
        "  train_loss               =     1.1032",
        "  train_runtime            = 0:10:12.40",
    ]
    return "\n".join(lines) + "\n"


def noise(n: int) -> str:
    return "".join(_info(f"step {i}: tokens processed {i * 4096}", "callbacks.py:143") + "\n" for i in range(n))


OOM_RANK0 = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/llamafactory/launcher.py", line 23, in <module>
[rank0]:     launch()
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2481, in _inner_training_loop
[rank0]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
[rank0]:                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 3104, in cross_entropy
[rank0]:     except ValueError:
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.2 GiB is free.
"""  # noqa: E501
OOM_RANK1 = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/llamafactory/launcher.py", line 23, in <module>
[rank1]:     launch()
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 1 has a total capacity of 79.10 GiB.
"""  # noqa: E501
ELASTIC = """\
E1130 10:20:00.123000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 4243)
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
llamafactory/launcher.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4243)
============================================================
"""  # noqa: E501


def test_success_log_facts() -> None:
    c = condense_log(success_log(), 0)
    assert c.status == "success" and c.exit_code == 0
    assert c.training_started and c.completed
    assert c.num_examples == 1234 and c.num_epochs == 3 and c.total_steps == 231
    assert c.final_metrics == {
        "train_runtime": 612.4051,
        "train_samples_per_second": 6.045,
        "train_steps_per_second": 0.377,
        "train_loss": 1.1032,
        "epoch": 3.0,
    }
    assert c.error is None and c.raw_log_tail is None
    assert not (c.timeout or c.oom_killed or c.cuda_oom)
    # Only the last redraw of a progress bar survives.
    assert c.last_progress is not None and "231/231" in c.last_progress
    # De-duplicated, first-seen order; the tag and the logger leader are stripped.
    assert c.warnings == [
        "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.",
        "UserWarning: None of the inputs have requires_grad=True. Gradients will be None",
    ]


def test_clean_log_strips_ansi_and_redraws() -> None:
    text = clean_log(f"{ESC}[1m{ESC}[31mred{ESC}[0m\n 10%|█| 1/10\r 50%|█████| 5/10\r100%|██████████| 10/10\r\nend\r\n")
    assert text == "red\n100%|██████████| 10/10\nend\n"
    assert ESC not in text and "\r" not in text


def test_metrics_block_fallback_without_dict() -> None:
    log = success_log().replace("{'train_runtime'", "{'other'")
    c = condense_log(log, 0)
    assert c.final_metrics == {"epoch": 3.0, "train_loss": 1.1032, "train_runtime": 612.4}


def test_metrics_dict_is_never_evaluated(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    log = (
        _info("***** Running training *****")
        + f"\n{{'train_runtime': __import__('os').system('touch {marker}'), 'train_loss': 1.0}}\n"
    )
    c = condense_log(log, 0)
    assert not marker.exists()
    assert c.final_metrics is None


def test_rank_prefixed_cuda_oom_mid_log_is_found() -> None:
    # The traceback sits in the middle of a long log: the reference's first+last 200 lines lost it.
    log = success_log().split("{'train_runtime'")[0] + noise(600) + OOM_RANK1 + OOM_RANK0 + noise(600) + ELASTIC
    c = condense_log(log, 1, "training")
    assert c.status == "failed" and c.failed_stage == "training"
    assert c.cuda_oom and not c.oom_killed and not c.timeout
    assert c.error is not None
    # Rank 0 preferred (even though rank 1 printed first), prefixes stripped.
    assert c.error.startswith("Traceback (most recent call last):")
    assert "GPU 0 has a total capacity" in c.error and "GPU 1" not in c.error
    assert "[rank" not in c.error
    assert "^^^^" in c.error  # frames kept with their indentation
    assert c.error.endswith("[Note: 3 total errors, showing root cause]")
    assert c.training_started and not c.completed and c.final_metrics is None


def test_first_traceback_is_root_cause_without_ranks() -> None:
    first = (
        "Traceback (most recent call last):\n"
        '  File "process_data.py", line 40, in <module>\n'
        "    rows = load(path)\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/assets/datasets/gsm8k/train.jsonl'\n"
    )
    second = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/atexit.py", line 3, in flush\n'
        "RuntimeError: writer closed\n"
    )
    c = condense_log(noise(5) + first + noise(5) + second, 1, "data_processing")
    assert c.error is not None
    assert "FileNotFoundError" in c.error and "writer closed" not in c.error
    assert "[Note: 2 total errors, showing root cause]" in c.error
    assert c.error_count == 2


def test_exception_line_with_error_word_in_frames() -> None:
    # The reference stopped at the first line containing "Error:" — here a frame's source line.
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "    except KeyError:\n"
        '  File "train.py", line 9, in parse\n'
        "    raise ValueError('Some keys are not used by the HfArgumentParser: [\"lora_rnk\"]')\n"
        "ValueError: Some keys are not used by the HfArgumentParser: ['lora_rnk']\n"
    )
    c = condense_log(log, 1, "training")
    assert c.error is not None and c.error.rstrip().endswith("['lora_rnk']")
    assert c.error_count == 1 and "[Note" not in c.error


def test_chained_exception_is_one_error_with_root_cause() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "process_data.py", line 10, in call_api\n'
        "    resp = client.chat.completions.create(**kw)\n"
        "openai.APIConnectionError: Connection error.\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "process_data.py", line 80, in <module>\n'
        "    main()\n"
        "RuntimeError: generation failed for 12 samples\n"
    )
    c = condense_log(log, 1, "data_processing")
    assert c.error is not None
    assert "APIConnectionError" in c.error and "generation failed" in c.error
    assert c.error_count == 1


def test_long_traceback_keeps_last_4000_chars_and_names_root() -> None:
    frames = "".join(f'  File "/x/mod{i}.py", line {i}, in f{i}\n    g{i}()\n' for i in range(300))
    log = (
        f"Traceback (most recent call last):\n{frames}KeyError: 'instruction'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        f"Traceback (most recent call last):\n{frames}RuntimeError: bad row 17\n"
    )
    c = condense_log(log, 1, "data_processing")
    assert c.error is not None
    assert c.error.startswith("Root cause: KeyError: 'instruction'\n...")
    assert c.error.endswith("RuntimeError: bad row 17")
    assert len(c.error) <= ERROR_MAX_CHARS + 100


def test_timeout_exit_124() -> None:
    log = "generating sample 1/2000 with gpt-4o-mini\n" + "".join(
        f"generating sample {i}/2000 with gpt-4o-mini\n" for i in range(2, 400)
    )
    c = condense_log(log, 124, "data_processing")
    assert c.timeout and c.failed_stage == "data_processing"
    assert c.error is None
    assert c.raw_log_tail is not None and c.raw_log_tail.endswith("399/2000 with gpt-4o-mini\n")
    assert len(c.raw_log_tail) <= TAIL_MAX_CHARS
    data = json.loads(c.as_prompt_json())
    assert data["timeout"] is True and data["failed_stage"] == "data_processing"
    assert "oom_killed" not in data and "cuda_oom" not in data


def test_sigkill_137_is_named_oom_killed() -> None:
    log = success_log().split("{'train_runtime'")[0]
    c = condense_log(log, 137, "training")
    assert c.oom_killed and not c.cuda_oom and not c.timeout
    assert c.error is None
    # Killed mid-training without a message: the tail shows where it stopped.
    assert c.raw_log_tail is not None and "231/231" in c.raw_log_tail
    assert json.loads(c.as_prompt_json())["oom_killed"] is True


def test_failure_without_traceback_keeps_error_lines() -> None:
    log = noise(3) + "usage: llamafactory-cli train [-h]\nllamafactory-cli: error: unrecognized arguments: --foo\n"
    c = condense_log(log, 2, "training")
    assert c.error == "llamafactory-cli: error: unrecognized arguments: --foo"


def test_warnings_dedup_order_and_cap() -> None:
    lines = [f"[WARNING|2025-11-30 10:00:00] llamafactory.data:{i} >> warning number {i % 30}" for i in range(90)]
    lines += ["WARNING:root:from stdlib logging", "2025-11-30 10:00:00,1 - WARNING - dashed style"]
    c = condense_log("\n".join(lines), 0)
    assert len(c.warnings) == MAX_WARNINGS
    assert c.warnings == [f"warning number {i}" for i in range(MAX_WARNINGS)]
    c2 = condense_log("\n".join(lines[-2:] + lines[-2:]), 0)
    assert c2.warnings == ["from stdlib logging", "dashed style"]


def test_raw_tail_when_nothing_found() -> None:
    log = "x" * 5000 + "\nwrote 1234 samples to data.json\n"
    c = condense_log(log, 0)
    assert c.raw_log_tail == log[-TAIL_MAX_CHARS:]
    assert not c.training_started and c.error is None


def test_empty_log() -> None:
    c = condense_log("", 1, "training")
    assert c.status == "failed" and c.error is None and c.raw_log_tail is None
    assert json.loads(c.as_prompt_json())["exit_code"] == 1


def test_prompt_json_is_small_for_a_huge_log() -> None:
    log = success_log().split("{'train_runtime'")[0] + noise(20000) + OOM_RANK0
    c = condense_log(log, 1, "training")
    assert len(log) > 1_500_000
    assert len(c.as_prompt_json()) < 3000
    assert c.log_chars > 1_000_000


# ---------------------------------------------------------------- real toolchain logs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LMEVAL_LOGS = sorted((FIXTURES / "lmeval").glob("*/lm_eval.log"))


def test_the_committed_lm_eval_fixtures_are_there() -> None:
    # They are committed: a missing one is a broken checkout, not a reason to skip.
    assert len(LMEVAL_LOGS) >= 2, LMEVAL_LOGS


@pytest.mark.parametrize("path", LMEVAL_LOGS, ids=lambda p: p.parent.name)
def test_real_lm_eval_log(path: Path) -> None:
    """A benchmark stage log from the real lm-eval: progress redraws gone, no false error."""
    log = path.read_bytes().decode("utf-8")  # read_text would turn the \r redraws into newlines
    assert "\r" in log  # tqdm redraws are really there
    c = condense_log(log, 0)
    assert c.status == "success" and c.error is None and not c.training_started
    assert c.raw_log_tail is not None and "\r" not in c.raw_log_tail
    assert "|Tasks" in c.raw_log_tail or "Tasks" in c.raw_log_tail  # the results table survives
    assert "Generating test split: 20 examples" in clean_log(log)
    assert "Generating test split: 0 examples" not in clean_log(log)
    # The same log from a failed run: the launcher's "fatal:" line is all there is to show.
    failed = condense_log(log, 1, "benchmark")
    assert failed.error is not None and "fatal: not a git repository" in failed.error


LOGS = FIXTURES / "logs"


def _real(name: str) -> str:
    path = LOGS / name
    assert path.is_file(), f"the committed log fixture {name} is missing (tests/fixtures/logs/README.md)"
    return path.read_bytes().decode("utf-8")  # keeps the \r redraws that read_text would translate


def test_real_lora_success() -> None:
    c = condense_log(_real("train_success_lora.log"), 0)
    assert c.status == "success" and c.error is None and c.raw_log_tail is None
    assert c.training_started and c.completed
    assert c.num_examples == 400 and c.num_epochs == 1 and c.total_steps == 15
    # transformers 5 prints the values as strings: still numbers here.
    assert c.final_metrics is not None and c.final_metrics["train_loss"] == pytest.approx(7.056)
    assert c.final_metrics["train_runtime"] == pytest.approx(0.2249)
    assert c.last_progress is not None and "15/15" in c.last_progress
    assert c.warnings[0] == "We recommend enable mixed precision training."
    assert len(c.warnings) == len(set(c.warnings))


def test_real_full_success_progress_is_the_trainer_bar() -> None:
    c = condense_log(_real("train_success_full.log"), 0)
    assert c.completed and c.num_examples == 200 and c.total_steps == 20
    # Not the later "Writing model shards" bar.
    assert c.last_progress is not None and c.last_progress.startswith("100%") and "20/20" in c.last_progress


def test_real_bad_key() -> None:
    c = condense_log(_real("train_bad_key.log"), 1, "training")
    assert c.error is not None and c.error.startswith("Traceback (most recent call last):")
    assert c.error.endswith("ValueError: Some keys are not used by the HfArgumentParser: ['lora_rnak']")
    assert c.error_count == 1 and not c.training_started


def test_real_missing_dataset() -> None:
    c = condense_log(_real("train_missing_dataset.log"), 1, "training")
    assert c.error is not None and c.error.endswith("ValueError: File ./data.json not found.")
    assert "We recommend enable mixed precision training." in c.warnings


def test_real_training_timeout() -> None:
    log = _real("train_timeout.log")
    c = condense_log(log, 124, "training")
    assert c.timeout and c.failed_stage == "training" and c.error is None
    assert c.training_started and not c.completed and c.final_metrics is None
    assert c.total_steps == 5000 and c.num_epochs == 100
    assert c.last_progress is not None and "429/5000" in c.last_progress
    assert c.last_train_log is not None and c.last_train_log["epoch"] == pytest.approx(8.58)
    assert c.raw_log_tail is not None and c.raw_log_tail.rstrip().endswith("71.31it/s]")
    assert len(c.as_prompt_json()) < len(log) / 20


def test_real_process_data_logs() -> None:
    c = condense_log(_real("process_data_exception.log"), 1, "data_processing")
    assert c.error is not None and c.error.endswith("KeyError: 'response'") and "~^^^" in c.error
    assert c.raw_log_tail is None
    ok = condense_log(_real("process_data_ok.log"), 0)
    assert ok.status == "success" and ok.raw_log_tail is not None and "wrote 400 to data.json" in ok.raw_log_tail


def _training_logs() -> list[Path]:
    if not LOGS.is_dir():
        return []
    return sorted(p for p in LOGS.iterdir() if p.is_file() and p.suffix in {".log", ".txt"})


@pytest.mark.skipif(not _training_logs(), reason="no real log fixtures in tests/fixtures/logs yet")
@pytest.mark.parametrize("path", _training_logs(), ids=lambda p: p.name)
def test_every_real_log_condenses(path: Path) -> None:
    log = path.read_bytes().decode("utf-8", errors="replace")
    c = condense_log(log, 0 if path.stem.endswith("_ok") or "success" in path.name else 1)
    out = c.as_prompt_json()
    json.loads(out)
    assert len(out) < max(12000, len(log))
    assert ESC not in out
