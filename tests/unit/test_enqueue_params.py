import pytest

from skiplock import Settings
from skiplock.errors import EnqueueError
from skiplock.store.validation import ENQUEUE_MANY_OPTIONS, ENQUEUE_OPTIONS, _common_params, enqueue_params

SETTINGS = Settings(schema="t", max_attempts=7)
DEFAULTS_GIVEN = {"delay": 0, "priority": 0, "serial_key": None, "task": None, "run_at": None}


def test_an_enqueue_without_options_gets_the_parameters_its_defaults_given_explicitly_get():
    assert enqueue_params(SETTINGS, "q", {"a": 1}, {}) == enqueue_params(SETTINGS, "q", {"a": 1}, DEFAULTS_GIVEN)
    for known in (ENQUEUE_OPTIONS, ENQUEUE_MANY_OPTIONS):
        assert _common_params(SETTINGS, "q", {}, known) == _common_params(SETTINGS, "q", DEFAULTS_GIVEN, known)


def test_an_enqueue_without_options_still_checks_its_queue_name():
    with pytest.raises(EnqueueError, match="queue name"):
        enqueue_params(SETTINGS, "no spaces allowed", {}, {})
