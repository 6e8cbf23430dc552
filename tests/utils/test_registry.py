from enum import Enum

import pytest

from verl.utils.registry import Registry


class Mode(str, Enum):
    FAST = "fast"


def test_register_lookup_and_errors():
    reg = Registry("widget", "trainer.widget")

    @reg.register(Mode.FAST)
    def fast():
        return 1

    assert reg.lookup("fast") is fast and reg.lookup(Mode.FAST) is fast
    assert reg.register("fast")(fast) is fast  # the same object again is fine (module reloads)
    with pytest.raises(ValueError, match=r"widget 'fast' is already registered to .*fast; pick another name"):
        reg.register("fast")(lambda: 2)
    reg.register("slow")(lambda: 3)
    assert reg.names() == ["fast", "slow"] and dict(reg).keys() == {"fast", "slow"}
    with pytest.raises(ValueError, match=r"unknown widget 'fsat'; registered: fast, slow \(set by trainer.widget\)\. "
                                         r"Did you mean 'fast'\?"):
        reg.lookup("fsat")
    with pytest.raises(TypeError, match="registry names are strings"):
        reg.register(3)
