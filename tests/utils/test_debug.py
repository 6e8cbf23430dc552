import logging
import time

import pytest

from verl.utils import logging_utils
from verl.utils.debug import (
    log_gpu_memory_usage,
    marked_timer,
    print_memory_usage,
    reduce_timing,
    simple_timer,
)


def test_simple_timer_accumulates_and_survives_errors():
    timing = {}
    with simple_timer("gen", timing):
        time.sleep(0.01)
    first = timing["gen"]
    assert first > 0
    with pytest.raises(RuntimeError), simple_timer("gen", timing):
        raise RuntimeError("boom")
    assert timing["gen"] >= first  # added to, and recorded despite the error
    with marked_timer("update_actor", timing, color="red"):
        pass
    assert set(timing) == {"gen", "update_actor"}


def test_reduce_timing_without_process_group_is_a_copy():
    timing = {"gen": 1.0, "step": 2.0}
    reduced = reduce_timing(timing)
    assert reduced == timing and reduced is not timing


def test_print_memory_usage(capsys):
    usage = print_memory_usage("after init", rank=3)
    line = capsys.readouterr().out.strip()
    assert line.startswith("[after init] rank=3 | cpu_rss=")
    assert usage["cpu_rss_gb"] > 0 and f"cpu_rss={usage['cpu_rss_gb']:.2f}GiB" in line
    assert all(isinstance(v, float) for v in usage.values())


def test_log_gpu_memory_usage_respects_logger_level(caplog):
    log = logging.getLogger("verl.test_debug")
    with caplog.at_level(logging.INFO, logger="verl"):
        assert log_gpu_memory_usage("skipped", logger=log, level=logging.DEBUG) is None
        usage = log_gpu_memory_usage("shown", logger=log, level=logging.INFO)
    assert usage is not None
    assert [r.getMessage().split(" |")[0] for r in caplog.records] == ["[shown]"]


@pytest.fixture
def verl_root_logger():
    root = logging.getLogger("verl")
    saved = root.level, list(root.handlers)
    yield root
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]


def test_get_logger_hierarchy(verl_root_logger):
    assert logging_utils.get_logger("verl.trainer.x").name == "verl.trainer.x"
    assert logging_utils.get_logger("__main__").name == "verl.__main__"
    assert logging_utils.get_logger().name == "verl"


@pytest.mark.parametrize("value,level", [("DEBUG", logging.DEBUG), ("info", logging.INFO),
                                         ("WARN", logging.WARNING), ("40", logging.ERROR)])
def test_logging_level_from_env(value, level, monkeypatch, verl_root_logger):
    monkeypatch.setenv("VERL_LOGGING_LEVEL", value)
    logging_utils.configure_logging()
    logging_utils.configure_logging()
    assert verl_root_logger.level == level
    ours = [h for h in verl_root_logger.handlers if getattr(h, "_verl_handler", False)]
    assert len(ours) == 1  # configuring twice adds no second handler


def test_invalid_logging_level_warns_and_uses_default(monkeypatch, verl_root_logger, caplog):
    monkeypatch.setenv("VERL_LOGGING_LEVEL", "LOUD")
    with caplog.at_level(logging.WARNING, logger="verl"):
        logging_utils.set_basic_config()
        assert verl_root_logger.level == logging.WARNING
    assert any("VERL_LOGGING_LEVEL" in r.getMessage() and "LOUD" in r.getMessage() for r in caplog.records)
    logging_utils.configure_logging("debug")  # an explicit level wins over the environment
    assert verl_root_logger.level == logging.DEBUG
